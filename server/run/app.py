"""Flower ServerApp of the experiments and the round loop shared by simulation and deployment.

One round: the strategy selects nodes and packs the message (``configure_train``),
the grid delivers it, the strategy applies its server rule (``aggregate_train``),
then the server evaluates the global model on the test set every ``eval_every``
rounds, appends a metrics row (CSV + JSONL, flushed), logs a progress line and
checkpoints every ``checkpoint_every`` rounds. ``resume=true`` restarts from the last
checkpoint with the same results as an uninterrupted run.

:class:`Run` holds one run's state and has one public method per step (resume, train a round, evaluate, record,
stop when diverged, checkpoint, finish); :meth:`Run.run` is the loop over them and a driver may call them itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from server.report.metrics import MetricsWriter
from server.report.run_plots import plot_run
from server.run import checkpoint, console, strategy_factory
from server.run.config import RunConfig
from server.run.data import server_dataset, train_size
from server.run.errors import STORAGE_ERRNOS, ConfigError, RunStopped, first_line
from server.run.evaluator import Evaluator
from server.run.messages import train_record
from server.run.partitions import save_partition_summary
from server.run.progress import ProgressGrid
from server.run.run_lock import run_dir_lock
from server.run.window import ModelWindow
from strategies import protocol
from strategies.client_manager import NoNodesError

EARLIER_RESULTS = ("summary.json", "final_model.npz", "final_model_avg.npz")  # written at a run's end


class DivergenceError(RuntimeError):
    """The global model or its evaluation became NaN/inf; everything written so far is kept."""


def _metric(metrics: Any, key: str) -> float | None:
    return float(metrics[key]) if metrics is not None and key in metrics else None


def run_experiment(
    grid: Grid,
    cfg: RunConfig | dict[str, Any],
    run_dir: Path | str | None = None,
    evaluator: Callable[[dict[str, Any], Any], Evaluator] | None = None,
    thread_log: bool = False,
) -> dict[str, Any]:
    """Run (or resume) the configured experiment on ``grid``; returns a summary dict. A plain dict is validated
    here (:meth:`RunConfig.of`), a :class:`RunConfig` is not again.

    ``evaluator``: builds the server-side evaluator from (config, dataset) (default :class:`Evaluator`; runs
    of one process that evaluate the same data share one). ``thread_log``: run.log takes only this thread's records
    (runs side by side in threads of one process).
    """
    run = Run(RunConfig.of(cfg), run_dir, evaluator)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    with run_dir_lock(run.run_dir):  # one run per run directory (RunDirInUse before anything is written)
        try:
            return _run_logged(run, grid, thread_log)
        except OSError as err:  # a full disk, ...: RunStorageError naming what is kept (in status.json too, if it can)
            if err.errno not in STORAGE_ERRNOS:
                _mark_crashed(run, err)
                raise
            stopped, last = checkpoint.storage_failure(run.run_dir, err)
            with contextlib.suppress(OSError):
                write_status(run.run_dir, "failed", last, str(stopped))
            raise stopped from None
        except Exception as err:
            _mark_crashed(run, err)
            raise


def _mark_crashed(run: Run, err: Exception) -> None:
    """status.json ``failed`` with ``crashed: <type>: <message>`` for an error no part of the run accounted for (it
    said ``running`` for ever: a report took the run for one still going); a status the run wrote (diverged, failed),
    a stopped run's ``running`` and the files of a run refused as configured (:class:`ConfigError`, e.g. a resume
    that is not the checkpoint's) stay."""
    if isinstance(err, RunStopped | ConfigError):
        return
    try:
        status = json.loads((run.run_dir / "status.json").read_text()).get("status")
    except FileNotFoundError:
        status = None
    except (OSError, ValueError, AttributeError):
        return
    if status not in (None, "running"):
        return
    rows = run.writer.rows if run.writer is not None else []
    last = rows[-1]["round"] if rows else written_round(run.run_dir)
    with contextlib.suppress(OSError):
        write_status(run.run_dir, "failed", last, f"crashed: {type(err).__name__}: {first_line(err)}")


def _run_logged(run: Run, grid: Grid, thread_log: bool) -> dict[str, Any]:
    """:meth:`Run.run` with its run.log (this thread's records only, with ``thread_log``) and console routing."""
    handler = run.run_log = console.RunLog(run.run_dir / "run.log", STORAGE_ERRNOS)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    handler.addFilter(console.RunLogFilter())  # every line but the console's short round lines
    flwr_logger = logging.getLogger("flwr")
    try:
        with contextlib.ExitStack() as routed:
            if thread_log:
                routed.enter_context(console.thread_run_log(handler))
            else:
                flwr_logger.addHandler(handler)
                routed.callback(flwr_logger.removeHandler, handler)
            routed.enter_context(console.console_routing(bool(run.cfg.get("verbose", False))))
            return run.run(grid)
    finally:
        run.close()
        handler.close()


def tail_rounds(cfg: dict[str, Any]) -> set[int]:
    """The rounds evaluated whatever ``eval_every`` says: the last ``eval_tail`` rounds before R and before each
    horizon of ``eval_tail_at`` (the oscillation over the last cycles at an earlier horizon of the same run too)."""
    tail = int(cfg.get("eval_tail", 0))
    ends = {int(cfg["num_rounds"]), *(int(t) for t in cfg.get("eval_tail_at") or ())}
    return {r for end in ends for r in range(max(1, end - tail + 1), end + 1)}


class Run:
    """One experiment in ``run_dir``: its strategy, model window, evaluator and metrics writer, and the steps of
    its round loop. Every step but :meth:`train_round` works without a Flower Grid.

    A driver calls :meth:`resume` once, then for each round r: :meth:`train_round`, :meth:`evaluate`,
    :meth:`record`, :meth:`stop_if_diverged`, :meth:`checkpoint`; then :meth:`finish` (what :meth:`run` does), and
    :meth:`close` however the run ended.
    """

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path | str | None = None,
        evaluator: Callable[[dict[str, Any], Any], Evaluator] | None = None,
    ) -> None:
        self.config = cfg
        self.cfg = cfg.values
        self.run_dir = Path(run_dir or self.cfg["run_dir"]).resolve()
        self.num_rounds = cfg.num_rounds
        self.tail_rounds = tail_rounds(self.cfg)  # evaluated every round: the eval_tail rounds up to R and eval_tail_at
        self.strategy: Any = None
        self.window = ModelWindow(int(self.cfg.get("eval_average", 0)))  # the last W server models (eval_average)
        self.arrays: ArrayRecord | None = None  # the global model after the last completed round
        self.make_evaluator = evaluator or Evaluator  # (config, dataset) -> the evaluator
        self.evaluator: Evaluator | None = None
        self.writer: MetricsWriter | None = None
        self.run_log: console.RunLog | None = None  # its run.log handler (set by run_experiment)
        self.train_config = train_record(self.cfg)
        self.started = time.time()  # set by resume(): the run's elapsed time counts from there
        self.round_started = self.started
        self.gap_warned = False  # a pop_gap below zero was warned of (once a run)

    def progress_grid(self, grid: Grid) -> ProgressGrid:
        """``grid`` with in-round progress lines and the run ETA (:class:`ProgressGrid`)."""
        fast = bool((self.cfg.get("deploy") or {}).get("fast", True))  # false: the grid's own interval (HttpGrid: 3 s)
        return ProgressGrid(
            grid,
            poll_interval=0.1 if fast else float(getattr(grid, "pull_interval", 3.0)),
            report_every=float(self.cfg.get("progress_every", 10)),
        )

    def resume(self) -> int:
        """Build the dataset and strategy, load the checkpoint with ``resume=true``, write config.json, build the
        evaluator (a fresh run: write the partition summary, evaluate round 0); the last completed round (0: fresh)."""
        cfg, run_dir = self.cfg, self.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        dataset = server_dataset(cfg)
        self.strategy = strategy_factory.build_strategy(cfg, num_train=train_size(dataset))
        start = checkpoint.resume(cfg, run_dir, self.strategy, self.window)
        (run_dir / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True))  # once the run is this one
        self.arrays = self.strategy.model_record() if start else strategy_factory.initial_model(cfg)
        if not cfg.get("resume"):  # a fresh run (overwrite=true): nothing of an earlier run may outlive its start
            checkpoint.discard(run_dir)
            for name in EARLIER_RESULTS:
                (run_dir / name).unlink(missing_ok=True)
        if not start:
            save_partition_summary(cfg, dataset, run_dir)
        self.evaluator = self.make_evaluator(cfg, dataset)
        self.writer = MetricsWriter(run_dir, keep_rounds_upto=start if start else None)
        self.started = time.time() - _elapsed(self.writer.rows)  # a resumed run's time goes on from its checkpoint's
        todo = f"rounds {start + 1}..{self.num_rounds}" if start < self.num_rounds else f"finished at round {start}"
        log(INFO, "Run dir %s: %s, %s", run_dir, console.run_label(cfg), todo)  # the latter: resume of a finished run
        write_status(run_dir, "running", start)
        if start == 0:
            row0 = {"round": 0, **self.evaluator.metrics(self.arrays), "seconds": 0.0, "elapsed": 0.0}
            self.writer.append(row0)
            self._log_round0(row0)
        return start

    def _log_round0(self, row0: dict[str, Any]) -> None:
        accuracy, loss, pop = row0["accuracy"], row0["loss"], console.pop_text(row0)
        log(INFO, "[round 0/%d] accuracy %.4f loss %.4f%s", self.num_rounds, accuracy, loss, pop)
        self._check_gap(row0)

    def _check_gap(self, row: dict[str, Any]) -> None:
        """Warn once a run when its pop_gap proves f* wrong (:meth:`Evaluator.gap_below_zero`)."""
        check = getattr(self.evaluator, "gap_below_zero", None)  # a caller's own evaluator may have none
        if not self.gap_warned and check is not None and (why := check(row)):
            self.gap_warned = True
            log(WARNING, "%s", why)

    def f_star(self) -> float | None:
        """The f* of this run's ``pop_gap`` (None without one)."""
        return getattr(getattr(self.evaluator, "gap", None), "f_star", None)

    def train_round(self, grid: ProgressGrid, rnd: int) -> dict[str, Any]:
        """Round ``rnd`` on ``grid``: select and message the nodes, aggregate their replies into the global model;
        returns the round's metrics row without evaluation (status.json says ``failed`` when no node answers)."""
        strategy, arrays, num_rounds = self.strategy, self.arrays, self.num_rounds
        self.round_started = time.time()
        grid.begin_round(rnd, num_rounds)
        try:
            messages = list(strategy.configure_train(rnd, arrays, self.train_config, grid))
        except NoNodesError as err:
            write_status(self.run_dir, "failed", rnd - 1, str(err))
            raise
        try:
            replies = list(grid.send_and_receive(messages, timeout=self.config.round_timeout)) if messages else []
        except ConfigError as err:  # e.g. one client does not fit the device's memory
            write_status(self.run_dir, "failed", rnd - 1, f"invalid configuration: {err}")
            raise
        with np.errstate(over="ignore", invalid="ignore"):  # a diverging model: said once, by stop_if_diverged
            new_arrays, metrics = strategy.aggregate_train(rnd, replies)
        manager = getattr(strategy, "client_manager", None)
        if manager is not None and metrics is not None:  # silent nodes, query answers that came in meanwhile
            manager.note_replies(rnd, messages, replies, grid)
            metrics.update(manager.round_counts(rnd))
        self.arrays = new_arrays if new_arrays is not None else arrays
        self.window.push(rnd, self.arrays)
        return {
            "round": rnd,
            "server_lr": _metric(metrics, protocol.SERVER_LR),
            "client_lr": _metric(metrics, protocol.CLIENT_LR),
            "train_loss": _metric(metrics, protocol.TRAIN_LOSS),
            "loss_before": _metric(metrics, protocol.LOSS_BEFORE),
            "num_selected": len(messages),
            "num_replies": int(_metric(metrics, protocol.NUM_REPLIES) or 0),
            "num_rejected": int(_metric(metrics, protocol.NUM_REJECTED) or 0),
            "num_failures": int(_metric(metrics, protocol.NUM_FAILURES) or 0),
            "num_skipped": int(_metric(metrics, protocol.NUM_SKIPPED) or 0),
            "update_norm": _metric(metrics, protocol.UPDATE_NORM),
            "client_update_norm": _metric(metrics, protocol.CLIENT_UPDATE_NORM),
            "num_refused": int(_metric(metrics, protocol.NUM_REFUSED) or 0),
            "num_reassigned": int(_metric(metrics, protocol.NUM_REASSIGNED) or 0),
            "num_silent": int(_metric(metrics, protocol.NUM_SILENT) or 0),
        }

    def evaluate(self, rnd: int, row: dict[str, Any]) -> str:
        """Add the evaluations of round ``rnd`` to ``row`` when it is due (every ``eval_every`` rounds, the last round
        and the tail rounds) and the global model is finite; returns why the run diverged ('' when it did not)."""
        window, evaluator = self.window, self.evaluator
        diverged = _divergence(self.strategy)
        due = rnd % self.config.eval_every == 0 or rnd == self.num_rounds or rnd in self.tail_rounds
        if not diverged and due:
            row.update(evaluator.metrics(self.arrays))
            if not math.isfinite(row["loss"]):
                diverged = f"the test loss of the global model is {row['loss']}"
            elif window.full():  # the mean of the last W server models (paper 1's cycle, docs/convex.md)
                row.update({f"avg_{k}": v for k, v in evaluator.metrics(window.mean()).items()})
        return diverged

    def record(self, row: dict[str, Any], eta: float | None = None) -> None:
        """Append ``row`` (with its round's ``seconds`` and the run's ``elapsed``) to metrics.csv/jsonl and log its
        line; ``eta``: seconds left in the run (:meth:`ProgressGrid.run_eta`; None: not known)."""
        row["seconds"] = time.time() - self.round_started
        row["elapsed"] = time.time() - self.started
        self.writer.append(row)
        console.log_round(row["round"], self.num_rounds, row, eta=eta)  # the in-round lines' estimate
        self._check_gap(row)
        if self.run_log is not None and self.run_log.failure is not None:
            raise self.run_log.failure  # run.log could not be written (a full disk, ...): stop as for any file

    def stop_if_diverged(self, rnd: int, diverged: str) -> None:
        """With a reason ``diverged``: status.json ``diverged``, the plots, and :class:`DivergenceError`."""
        run_dir = self.run_dir
        if diverged:
            write_status(run_dir, "diverged", rnd, diverged)
            if self.config.plots:
                plot_run(run_dir, self.f_star())
            raise DivergenceError(
                f"training diverged at round {rnd} ({diverged}); metrics up to this round and "
                f"the last checkpoint are in {run_dir}"
            )

    def checkpoint(self, rnd: int) -> None:
        """Save the checkpoint after round ``rnd`` when it is due (every ``checkpoint_every`` rounds and the last)."""
        strategy, window = self.strategy, self.window
        if rnd % self.config.checkpoint_every == 0 or rnd == self.num_rounds:
            strategy.checkpoint_due(rnd)
            meta, state_arrays = strategy.state_dict()
            window_rounds, window_arrays = window.state()
            checkpoint.save(self.run_dir, rnd, meta, {**state_arrays, **window_arrays}, self.cfg, window_rounds)
            strategy.checkpoint_saved(rnd)

    def finish(self) -> dict[str, Any]:
        """The plots, final_model.npz (and final_model_avg.npz), summary.json and status.json ``finished``;
        returns the summary."""
        run_dir, window, num_rounds = self.run_dir, self.window, self.num_rounds
        if self.config.plots:
            plot_run(run_dir, self.f_star())
        final = {k: v.numpy() for k, v in self.arrays.items()}
        np.savez(run_dir / "final_model.npz", **final)
        if window.full():  # the mean of the last W models, in the model's dtypes
            np.savez(run_dir / "final_model_avg.npz", **{k: v.astype(final[k].dtype) for k, v in window.mean().items()})
        last = self.writer.rows[-1] if self.writer.rows else {}
        idle = [r["round"] for r in self.writer.rows if r["round"] >= 1 and not r.get("num_replies")]
        summary = {
            "run_dir": str(run_dir),
            "rounds": num_rounds,
            "accuracy": last.get("accuracy"),
            "loss": last.get("loss"),
            "seconds": time.time() - self.started,
            "rounds_without_replies": len(idle),  # rounds that changed nothing: every reply failed or was rejected
        }
        if idle:
            log(WARNING, "%d of %d rounds aggregated no reply (first: round %d); see the lines above", len(idle),
                num_rounds, idle[0])  # fmt: skip
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        write_status(run_dir, "finished", num_rounds)
        return summary

    def close(self) -> None:
        """Release what the run holds beyond its run directory (its clients' states kept in memory); the run is over."""
        if self.strategy is not None:
            self.strategy.run_closed()
        if self.writer is not None:
            self.writer.close()

    def run(self, grid: Grid) -> dict[str, Any]:
        """The whole loop on ``grid``: resume, then every round's steps, then finish; returns the summary."""
        grid = self.progress_grid(grid)
        start = self.resume()
        for rnd in range(start + 1, self.num_rounds + 1):
            row = self.train_round(grid, rnd)
            diverged = self.evaluate(rnd, row)
            self.record(row, eta=grid.run_eta(1, 1))
            self.stop_if_diverged(rnd, diverged)
            self.checkpoint(rnd)
        return self.finish()


def write_status(run_dir: Path, status: str, last_round: int, reason: str = "") -> None:
    """status.json: "running" (also what a killed run leaves), "diverged" (exit 3, with the reason),
    "failed" (no node answered, an invalid configuration, a checkpoint that cannot be read or an error nothing
    accounted for, "crashed: ..."; with the reason) or
    "finished"; ``round`` = the last round whose metrics were written. ``flower-report`` reads it."""
    record = {"status": status, "round": last_round, "reason": reason}
    (run_dir / "status.json").write_text(json.dumps(record))


def written_round(run_dir: Path) -> int:
    """The last round whose metrics status.json says were written (0 without a readable one): the round of a
    ``failed`` status that a run which cannot go on (a checkpoint that cannot be read) writes over it."""
    try:
        last = json.loads((run_dir / "status.json").read_text())["round"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    return last if isinstance(last, int) and last >= 0 else 0


def _elapsed(rows: list[dict[str, Any]]) -> float:
    """The ``elapsed`` seconds of the last of ``rows`` (the rows a resumed run keeps; 0 without one)."""
    value = rows[-1].get("elapsed") if rows else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0 else 0.0


def _divergence(strategy: Any) -> str:
    """Why the run counts as diverged ('' when it does not): only the *global* model decides.

    Client replies with NaN/inf never reach the model (the strategy rejects them), so one diverging client
    cannot end a run; the test loss is checked after each evaluation.
    """
    if strategy.model is not None and not all(np.isfinite(a).all() for a in strategy.model):
        return "the global model has non-finite weights"
    return ""


def make_server_app(cfg: RunConfig | dict[str, Any], result: dict[str, Any]) -> ServerApp:
    """A ServerApp running ``cfg`` (simulation passes the config by closure); the summary lands in ``result``."""
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        try:
            run_cfg = RunConfig.of(cfg)
            result.update(run_experiment(grid, run_cfg, run_cfg.values["run_dir"]))
        except Exception as err:  # surfaced by flower-simulation after Ray shuts down
            result["error"] = err
            raise

    return server_app
