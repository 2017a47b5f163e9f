"""What a run prints: one line per round and a final summary on the console, every detail in ``run.log``.

The console (Flower's console handler, whose output ``flower-deploy`` streams from its ServerApp) shows the run's
start, one line per round (accuracy and loss when evaluated, the non-zero counters, time, run ETA), the 1st, 2nd,
4th, … in-round progress line of a round and of the start-up wait for nodes, warnings and errors. ``run.log``
keeps every line: the full round line with all its counters, which node serves which partition, the partitions
of each round and the strategies' per-round messages. ``cli.log`` (Hydra's job log) holds what the console
shows. ``verbose=true`` shows every ``run.log`` line on the console too, and keeps the DEBUG lines of Flower and
other libraries in ``cli.log``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROUTE = "fm_route"  # LogRecord attribute: FILE_ONLY (run.log, verbose consoles) or CONSOLE_ONLY
FILE_ONLY = "file"
CONSOLE_ONLY = "console"
TO_FILE = {ROUTE: FILE_ONLY}  # log(..., extra=TO_FILE)
TO_CONSOLE = {ROUTE: CONSOLE_ONLY}

# per-round details kept out of the console, by their format string (the messages themselves stay as they are)
DETAIL_FORMATS = frozenset(
    {
        "Round %d: node %s serves partition %d",  # strategies/client_manager.py
        "Round %d: partitions %s on %d nodes",
        "configure_train: round %d, %d nodes",  # strategies/base.py
        "%s: Received %s results and %s failures",  # Flower's FedAvg (aggregate_train / aggregate_evaluate)
    }
)
# repeated waiting lines: the console shows their 1st, 2nd, 4th, 8th, … occurrence (run.log every one)
THINNED_FORMATS = frozenset({"Waiting for nodes: %d of %d partitions answered"})  # strategies/client_manager.py
_FLOWER = logging.getLogger("flwr")  # Flower's logger: its handlers, run.log's and the console's
COUNTERS = ("rejected", "failures", "skipped", "refused", "reassigned", "silent")  # num_<name> of a metrics row


def strategy_label(strategy: dict[str, Any]) -> str:
    """The algorithm a ``strategy`` config runs: ``FedAvg (FedAvgM, momentum 0)`` for FedAvgM with β = 0 (what
    ``strategy=fedavg`` selects), else the strategy's class name, with its server optimizer when not SGD."""
    from strategies.registry import STRATEGIES

    name = str(strategy.get("name"))
    label = STRATEGIES[name].cls.__name__ if name in STRATEGIES else name
    optimizer = str(strategy.get("server_optimizer") or "sgd")
    if name == "fedavgm" and float(strategy.get("momentum") or 0.0) == 0.0 and optimizer == "sgd":
        return "FedAvg (FedAvgM, momentum 0)"
    if optimizer != "sgd":
        label += f" with a server {optimizer.capitalize()} step"
    return label


def run_label(cfg: dict[str, Any]) -> str:
    """``FedAvg (FedAvgM, momentum 0), cnn, 20 clients``: what a run trains."""
    n = cfg["num_clients"]
    return f"{strategy_label(cfg['strategy'])}, {cfg['model']['name']}, {n} client{'' if n == 1 else 's'}"


def _metrics_text(row: dict[str, Any]) -> str:
    """' accuracy … loss …' and the population / averaged-model figures a row holds ('' when not evaluated)."""
    parts = [f"{key} {row[key]:.4f}" for key in ("accuracy", "loss") if row.get(key) is not None]
    parts += [f"{key} {row[key]:.4f}" for key in ("pop_loss", "pop_accuracy") if row.get(key) is not None]
    parts += [f"{key} {row[key]:.4e}" for key in ("pop_gap",) if row.get(key) is not None]
    parts += [f"{key} {row[key]:.4f}" for key in ("avg_accuracy", "avg_loss") if row.get(key) is not None]
    parts += [f"{key} {row[key]:.4e}" for key in ("avg_pop_gap",) if row.get(key) is not None]
    return " ".join(parts)


def round_line(rnd: int, num_rounds: int, row: dict[str, Any], eta: float | None) -> str:
    """The console's line of a finished round: ``[round 3/10] accuracy 0.21 loss 2.1, 12.3 s, run ETA 2 min``;
    the replies only when some are missing, the counters only when non-zero, no ETA after the last round."""
    parts = [f"[round {rnd}/{num_rounds}]", _metrics_text(row) or "not evaluated"]
    tail: list[str] = []
    if row["num_replies"] != row["num_selected"]:
        tail.append(f"replies {row['num_replies']}/{row['num_selected']}")
    tail += [f"{name} {row[f'num_{name}']}" for name in COUNTERS if row.get(f"num_{name}")]
    tail.append(f"{row['seconds']:.1f} s")
    if rnd < num_rounds:
        tail.append(f"run ETA {'?' if eta is None else format_duration(eta)}")
    return " ".join(parts) + ", " + ", ".join(tail)


def pop_text(row: dict[str, Any]) -> str:
    """' pop_loss … pop_accuracy … [pop_gap …]' when the population was evaluated this round (eval_train, eval_gap)."""
    if row.get("pop_loss") is None:
        return ""
    gap = f" pop_gap {row['pop_gap']:.4e}" if row.get("pop_gap") is not None else ""
    return f" pop_loss {row['pop_loss']:.4f} pop_accuracy {row['pop_accuracy']:.4f}{gap}"


def avg_text(row: dict[str, Any]) -> str:
    """' avg_accuracy … avg_loss … [avg_pop_gap …]' when the mean of the last eval_average models was evaluated."""
    if row.get("avg_accuracy") is None:
        return ""
    gap = f" avg_pop_gap {row['avg_pop_gap']:.4e}" if row.get("avg_pop_gap") is not None else ""
    return f" avg_accuracy {row['avg_accuracy']:.4f} avg_loss {row['avg_loss']:.4f}{gap}"


def log_round(rnd: int, num_rounds: int, row: dict[str, Any], eta: float | None = None) -> None:
    """The round's lines: every figure and counter in run.log, the short line of :func:`round_line` on
    the console; ``eta``: :meth:`ProgressGrid.run_eta`, seconds left at the mean pace of this process's rounds
    (with evaluations; None: not known yet)."""

    def fmt(key: str, spec: str = ".4f") -> str:
        value = row.get(key)
        return "-" if value is None else format(value, spec)

    _FLOWER.log(
        logging.INFO,
        "[round %d/%d] accuracy %s loss %s train_loss %s server_lr %s client_lr %s replies %d/%d "
        "rejected %d failures %d skipped %d refused %d reassigned %d silent %d %.1fs%s%s",
        rnd,
        num_rounds,
        fmt("accuracy"),
        fmt("loss"),
        fmt("train_loss"),
        fmt("server_lr", ".4g"),
        fmt("client_lr", ".4g"),
        row["num_replies"],
        row["num_selected"],
        row["num_rejected"],
        row["num_failures"],
        row["num_skipped"],
        row["num_refused"],
        row["num_reassigned"],
        row["num_silent"],
        row["seconds"],
        pop_text(row) + avg_text(row),
        f", run ETA {'?' if eta is None else format_duration(eta)}" if rnd < num_rounds else "",
        extra=TO_FILE,
    )
    _FLOWER.log(logging.INFO, "%s", round_line(rnd, num_rounds, row, eta), extra=TO_CONSOLE)


def summary_line(program: str, cfg: dict[str, Any], summary: dict[str, Any], wall: float, run_id: Any = None) -> str:
    """The final line: what ran, its final figures, the wall time and where the results are."""
    figures = [f"{key} {summary[key]:.4f}" for key in ("accuracy", "loss") if summary.get(key) is not None]
    run = f" run {run_id}" if run_id is not None else ""
    return (
        f"{program}: finished{run}: {run_label(cfg)}, {summary.get('rounds')} rounds, "
        f"{', '.join(figures) or 'no evaluation'}, {format_wall(wall)}; results in {summary.get('run_dir')}"
        f"{idle_note(summary)}"
    )


def idle_note(summary: dict[str, Any]) -> str:
    """``; 2 of 3 rounds aggregated no reply (run.log says why)`` for a run some of whose rounds changed nothing (every
    reply failed or was rejected), else ''."""
    idle = summary.get("rounds_without_replies")
    return f"; {idle} of {summary.get('rounds')} rounds aggregated no reply (run.log says why)" if idle else ""


def process_age() -> float:
    """Seconds since this process started (Linux /proc; 0.0 where unknown): a command's wall time includes its
    imports."""
    import os

    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def format_wall(seconds: float) -> str:
    """``48 s`` or ``3 min 29 s``."""
    whole = round(seconds)
    return f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60} s"


def is_detail(record: logging.LogRecord) -> bool:
    """A line for run.log (and verbose consoles) only."""
    return getattr(record, ROUTE, None) == FILE_ONLY or record.msg in DETAIL_FORMATS


class ConsoleFilter(logging.Filter):
    """The console's lines: without run.log's details, or with ``verbose`` exactly the lines of run.log."""

    def __init__(self, verbose: bool = False) -> None:
        super().__init__()
        self.verbose = verbose
        self.seen: dict[str, int] = {}  # occurrences of each of THINNED_FORMATS

    def filter(self, record: logging.LogRecord) -> bool:
        if self.verbose:
            return getattr(record, ROUTE, None) != CONSOLE_ONLY
        if record.msg in THINNED_FORMATS:
            count = self.seen[record.msg] = self.seen.get(record.msg, 0) + 1
            return count & (count - 1) == 0
        return not is_detail(record)


class RunLogFilter(logging.Filter):
    """run.log: every line but the console's short copies."""

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, ROUTE, None) != CONSOLE_ONLY


class CliLogFilter(ConsoleFilter):
    """cli.log (Hydra's job log): the console's lines; without ``verbose`` no DEBUG line and no INFO chatter of
    other libraries (their warnings stay)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.verbose:
            if record.levelno < logging.INFO:
                return False
            if record.levelno < logging.WARNING and not record.name.startswith("flwr"):
                return False
        return super().filter(record)


def format_duration(seconds: float) -> str:
    """``45 s``, ``41 min`` or ``2.3 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@contextlib.contextmanager
def console_routing(verbose: bool) -> Iterator[None]:
    """Filter Flower's console handler(s) of this process for the duration of a run. Runs side by side in threads
    (a stacked group) share one filter: each record passes one, not one per run."""
    from server.internals.flower_logger import console_handlers

    with _ROUTING_LOCK:
        if verbose not in _ROUTING:
            flt, handlers = ConsoleFilter(verbose), console_handlers()
            for handler in handlers:
                handler.addFilter(flt)
            _ROUTING[verbose] = (flt, handlers, 0)
        flt, handlers, users = _ROUTING[verbose]
        _ROUTING[verbose] = (flt, handlers, users + 1)
    try:
        yield
    finally:
        with _ROUTING_LOCK:
            flt, handlers, users = _ROUTING.pop(verbose)
            if users > 1:
                _ROUTING[verbose] = (flt, handlers, users - 1)
            else:
                for handler in handlers:
                    handler.removeFilter(flt)


class RunLog(logging.FileHandler):
    """A run's ``run.log``: a line that cannot be written for lack of room (``errnos``: a full disk, a quota, a
    file-size limit) is kept in :attr:`failure` (raised by the run at the end of its round, as its other files'
    failures are) instead of printed as logging's trace; any other error is logging's as usual."""

    def __init__(self, path: str | Path, errnos: frozenset[int]) -> None:
        super().__init__(path)
        self.errnos = errnos
        self.failure: OSError | None = None

    def handleError(self, record: logging.LogRecord) -> None:
        err = sys.exc_info()[1]
        if isinstance(err, OSError) and err.errno in self.errnos:
            if self.failure is None:
                err.filename = err.filename or self.baseFilename
                self.failure = err
            return
        super().handleError(record)

    def close(self) -> None:
        """Close the file; the lines a failed write left in its buffer are dropped (that failure is kept above)."""
        try:
            super().close()
        except OSError as err:
            if err.errno not in self.errnos:
                raise


# verbose -> (the console filter, the handlers it is installed on, runs using it)
_ROUTING: dict[bool, tuple[ConsoleFilter, list[logging.Handler], int]] = {}
_ROUTING_LOCK = threading.Lock()


class ThreadRunLogs(logging.Handler):
    """One handler on Flower's logger for the ``run.log`` of every run that runs in a thread of its own: a record
    goes to the file of the thread that logged it (a record visits one handler, not one per run)."""

    def __init__(self) -> None:
        super().__init__()
        self.files: dict[int, logging.Handler] = {}

    def emit(self, record: logging.LogRecord) -> None:
        handler = self.files.get(record.thread)  # type: ignore[arg-type]
        if handler is not None:
            handler.handle(record)


_THREAD_LOGS = ThreadRunLogs()


@contextlib.contextmanager
def thread_run_log(handler: logging.Handler) -> Iterator[None]:
    """``handler`` (a run's ``run.log``) takes the records of this thread while the block runs."""
    flwr_logger, ident = logging.getLogger("flwr"), threading.get_ident()
    with _ROUTING_LOCK:
        if not _THREAD_LOGS.files:
            flwr_logger.addHandler(_THREAD_LOGS)
        _THREAD_LOGS.files[ident] = handler
    try:
        yield
    finally:
        with _ROUTING_LOCK:
            _THREAD_LOGS.files.pop(ident, None)
            if not _THREAD_LOGS.files:
                flwr_logger.removeHandler(_THREAD_LOGS)


def quiet_job_log(verbose: bool) -> None:
    """Filter Hydra's job log handlers (``<job>.log``) of the root logger: call once per job."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and not any(isinstance(f, CliLogFilter) for f in handler.filters):
            handler.addFilter(CliLogFilter(verbose))
