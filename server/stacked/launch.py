"""Run a multirun's validated job configs: the jobs that share a shape as one program per group
(:func:`run_group`), a job that fits no group alone on the batched engine.

A group's jobs run side by side, each in its own thread through :func:`server.run.app.run_experiment` on a
:class:`~server.stacked.grid.JobGrid`; their rounds advance together and the clients of all jobs train in one pass
(:mod:`server.stacked.trainer`). Jobs that evaluate the same data share one evaluator, and the evaluations of a round
are done together at the same barrier. A job that diverges or fails leaves the group and the others go on; every job
writes its own run directory as a lone run does. With ``processes`` > 1 each group is split into that many programs,
run side by side in worker processes (:mod:`server.stacked.processes`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import torch
from flwr.common.logger import log

from client.environment import DEVICE_ENV
from client.models import build_model
from client.train import get_device
from server.batched.engine import STACKED_CPU_THREADS, chunk_size, device_of
from server.batched.memory import ClientDoesNotFit
from server.batched.workers import available_cores
from server.run import config as config_lib
from server.run import quiet
from server.run.app import DivergenceError, run_experiment, write_status, written_round
from server.run.config import RunConfig
from server.run.console import TO_CONSOLE
from server.run.data import prepare_data
from server.run.errors import RunStorageError
from server.run.evaluator import Evaluator
from server.run.run_lock import RunDirRefused
from server.stacked.grid import JobGrid
from server.stacked.trainer import GroupStopped, GroupTrainer
from strategies.client_manager import NoNodesError

JOB_THREAD = "stacked-job-"  # thread names of a group's jobs
GROUP_MARK = "stacked_group"  # a log record's attribute: the group's own lines pass the console filter
# what the jobs of one group share (besides the strategy, seed and learning rates, which may differ)
SHAPE_KEYS = ("model", "data", "num_clients", "participation", "num_rounds", "eval_every", "eval_tail", "eval_tail_at")
SHAPE_CLIENT_KEYS = ("batch_size", "local_epochs", "local_steps", "augment", "torch_threads")
EVAL_KEYS = ("data", "model", "num_clients", "seed", "client", "eval_train", "eval_gap", "eval_fstar")
EVAL_KEYS += ("eval_max_examples", "eval_train_max_examples")


class NotStackable(ValueError):
    """A job that cannot join a group, and why."""


@dataclass
class Outcome:
    """How a job ended: ``finished``, ``diverged``, ``failed`` (no node answered), ``invalid`` (an invalid
    configuration found as it ran, e.g. a checkpoint that cannot be read or a client that does not fit; exit 2 as for
    a lone run), ``stopped`` (its group was stopped) or ``error``."""

    run_dir: str
    status: str
    message: str = ""
    summary: dict[str, Any] = field(default_factory=dict)


def stackable(cfg: Mapping[str, Any]) -> None:
    """Raise :class:`NotStackable` unless ``cfg`` can run in a group (the batched engine's jobs only)."""
    engine = config_lib.engine_name(cfg)
    if engine != "batched":
        raise NotStackable(f"engine={engine}: a group runs the batched engine's rounds (set engine=batched)")


def shape_key(cfg: Mapping[str, Any]) -> str:
    """The jobs of one group have equal keys: model, data and partitions, clients, schedule, local steps, rounds,
    evaluation rounds and engine."""
    shape = {k: cfg.get(k) for k in SHAPE_KEYS}
    shape["client"] = {k: cfg["client"].get(k) for k in SHAPE_CLIENT_KEYS}
    shape["engine"] = cfg.get("engine")
    return json.dumps(shape, sort_keys=True)


def plan(cfgs: Sequence[Mapping[str, Any]], max_jobs: int | None = None) -> tuple[list[list[int]], dict[int, str]]:
    """(groups of job indices in order of first appearance, at most ``max_jobs`` each; {index: why it runs alone}
    for the jobs that cannot be stacked)."""
    alone: dict[int, str] = {}
    groups: dict[str, list[int]] = {}
    for i, cfg in enumerate(cfgs):
        try:
            stackable(cfg)
        except NotStackable as err:
            alone[i] = str(err)
            continue
        groups.setdefault(shape_key(cfg), []).append(i)
    size = max_jobs or max((len(g) for g in groups.values()), default=1)
    return [g[s : s + size] for g in groups.values() for s in range(0, len(g), size)], alone


class SharedEvaluator:
    """One :class:`server.run.evaluator.Evaluator` for the jobs that evaluate the same data. A job evaluates at the
    group's barrier (:meth:`GroupTrainer.evaluate`: the evaluations handed in before every job waits are done in one
    pass where they share data); a job still starting first leaves the start-up lock (its initial model exists once
    it evaluates round 0), so the next job can start while it waits."""

    def __init__(self, evaluator: Evaluator, trainer: GroupTrainer) -> None:
        self.evaluator, self.trainer, self.lock = evaluator, trainer, threading.Lock()

    def metrics(self, arrays: Any) -> dict[str, float]:
        job = threading.current_thread()
        grid = job.grid if isinstance(job, _Job) else None
        if grid is None:
            with self.lock:
                return self.evaluator.metrics(arrays)
        grid.release_startup()
        return self.trainer.evaluate(grid, self.evaluator, arrays, self.lock)


class _Evaluators:
    """Evaluators keyed by what evaluation reads (:data:`EVAL_KEYS`)."""

    def __init__(self, trainer: GroupTrainer) -> None:
        self.made: dict[str, SharedEvaluator] = {}
        self.lock = threading.Lock()
        self.trainer = trainer

    def __call__(self, cfg: dict[str, Any], dataset: Any) -> SharedEvaluator:
        key = json.dumps({k: cfg.get(k) for k in EVAL_KEYS}, sort_keys=True)
        with self.lock:
            if key not in self.made:
                self.made[key] = SharedEvaluator(Evaluator(cfg, dataset), self.trainer)
            return self.made[key]


@contextlib.contextmanager
def _quiet_jobs(jobs: dict[str, str]) -> Iterator[None]:
    """The console shows the group's lines and the jobs' warnings, each named by its job (``jobs``: thread name ->
    "job i (run dir)"); each job's round lines go to its run.log as they are."""

    def keep(record: logging.LogRecord) -> bool:
        job_thread = record.threadName.startswith(JOB_THREAD)
        return getattr(record, GROUP_MARK, False) or record.levelno >= WARNING or not job_thread

    handlers = [h for h in logging.getLogger("flwr").handlers if not isinstance(h, logging.FileHandler)]
    own = {h: vars(h).get("format") for h in handlers}  # an instance's own format function, if it has one
    for h in handlers:
        h.addFilter(keep)
        h.format = functools.partial(_named, h.format, jobs)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(keep)
            if own[h] is None:
                del h.format  # the class's own again
            else:
                h.format = own[h]  # type: ignore[method-assign]


def _named(format_record: Callable[[logging.LogRecord], str], jobs: dict[str, str], record: logging.LogRecord) -> str:
    """``record`` formatted by ``format_record``, its message led by the job whose thread logged it (a copy: the
    job's run.log keeps the line as a lone run writes it)."""
    job = None if getattr(record, GROUP_MARK, False) else jobs.get(record.threadName)
    if job is None:
        return format_record(record)
    named = logging.makeLogRecord(record.__dict__)
    named.msg, named.args = f"{job}: {record.getMessage()}", None
    return format_record(named)


def _say(message: str, *args: Any) -> None:
    """A line of the group: on the console, not in the run.log of the job whose thread happens to log it."""
    log(INFO, message, *args, extra={GROUP_MARK: True, **TO_CONSOLE})


class _Job(threading.Thread):
    def __init__(
        self, index: int, run_cfg: RunConfig, grid: JobGrid, evaluators: _Evaluators, torch_threads: int
    ) -> None:
        super().__init__(name=f"{JOB_THREAD}{index}", daemon=True)
        self.index, self.run_cfg, self.grid, self.evaluators = index, run_cfg, grid, evaluators
        self.torch_threads = torch_threads
        self.outcome = Outcome(run_cfg.values["run_dir"], "error", "did not start")

    def run(self) -> None:
        if self.torch_threads:  # per thread: each job thread would otherwise run an OpenMP team of every core
            torch.set_num_threads(self.torch_threads)
        with self.grid.trainer.run_turn():
            self.outcome = self._run(self.run_cfg.values["run_dir"])

    def _run(self, run_dir: str) -> Outcome:
        try:
            self.grid.hold_startup()
            summary = run_experiment(self.grid, self.run_cfg, run_dir, evaluator=self.evaluators, thread_log=True)
            return Outcome(run_dir, "finished", summary=summary)
        except DivergenceError as err:
            return Outcome(run_dir, "diverged", str(err))
        except (NoNodesError, RunStorageError) as err:
            return Outcome(run_dir, "failed", str(err))
        except config_lib.ConfigError as err:
            if not isinstance(err, ClientDoesNotFit | RunDirRefused):  # a round wrote status.json / another run's
                Path(run_dir).mkdir(parents=True, exist_ok=True)
                write_status(Path(run_dir), "failed", written_round(Path(run_dir)), f"invalid configuration: {err}")
            return Outcome(run_dir, "invalid", f"job {self.index} ({run_dir}): invalid configuration: {err}")
        except GroupStopped as err:
            return Outcome(run_dir, "stopped", str(err))
        except Exception as err:  # noqa: BLE001 - one job's failure ends that job only
            logging.getLogger("flwr").exception(
                "job %d (%s) failed", self.index, run_dir, extra={GROUP_MARK: True}
            )  # names its job already: not led by it again on the console
            return Outcome(run_dir, "error", f"{type(err).__name__}: {err}")
        finally:
            self.grid.release_startup()
            self.grid.trainer.leave(self.grid)
            self.grid.close()


def run_group(
    runs: Sequence[RunConfig],
    indices: Sequence[int] | None = None,
    share_chunks: bool | None = None,
    label: str = "stacked",
) -> list[Outcome]:
    """Run validated configs of one shape (:func:`shape_key`) as one program; one :class:`Outcome` per job.
    ``share_chunks``: clients of different jobs in one chunk (None: on an accelerator, not on a CPU); ``label``: what
    its progress lines start with, in brackets."""
    cfgs = [r.values for r in runs]
    indices = list(indices if indices is not None else range(len(cfgs)))
    first = cfgs[0]
    quiet.install()
    prepare_data(first)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    previous = os.environ.get(DEVICE_ENV)
    device = device_of(first)
    os.environ[DEVICE_ENV] = device.type
    get_device.cache_clear()
    started, rounds = time.monotonic(), int(first["num_rounds"])
    every = float(first.get("progress_every", 10))
    next_line = [started + every]

    def on_round(rnd: int, clients: int, chunks: int) -> None:
        now = time.monotonic()
        if now >= next_line[0] or rnd == rounds:
            next_line[0] = now + every
            eta = (now - started) / rnd * (rounds - rnd)
            _say("[%s] round %d/%d: %d clients of %d jobs in %d chunks, %.0f s, ETA %.0f s", label, rnd, rounds,
                 clients, len(cfgs), chunks, now - started, eta)  # fmt: skip

    share = device.type != "cpu" if share_chunks is None else bool(share_chunks)
    workers = first["engine"].get("workers", "auto")
    workers = available_cores() if workers == "auto" else int(workers)
    trainer = GroupTrainer(device, chunk_size(first, device), on_round, share=share)
    startup = threading.Lock()
    evaluators = _Evaluators(trainer)
    grids = [JobGrid(int(c["num_clients"]), trainer, startup, vectorize=_vectorize(c), device=device) for c in cfgs]
    stacked = grids[0].stacks(build_model(first["model"]["name"]))
    threads = int(first["client"].get("torch_threads", 0)) or (STACKED_CPU_THREADS if stacked else 0)
    threads = threads if device.type == "cpu" else 0
    if stacked:  # otherwise there are no chunks: each client is trained one after another by the ClientApp
        trainer.use_threads(workers, threads)
    jobs = [_Job(i, r, g, evaluators, threads) for i, r, g in zip(indices, runs, grids)]
    for g in grids:
        trainer.join(g)
    how = ("stacked clients, " + ("jobs sharing chunks" if share else "a chunk per job")) if stacked else "one by one"
    how += f", {trainer.workers} chunk threads" if trainer.workers > 1 else ""
    _say("[%s] %d jobs as one program on %s (%s)", label, len(jobs), device, how)
    try:
        with _quiet_jobs({job.name: f"job {job.index} ({job.run_cfg.values['run_dir']})" for job in jobs}):
            for job in jobs:
                job.start()
            for job in jobs:
                job.join()
    finally:
        trainer.stop("the group ended")
        if trainer.evaluation_passes:
            _say("[%s] %d evaluations in %d passes (those of a round together)", label, trainer.evaluations,
                 trainer.evaluation_passes)  # fmt: skip
        if previous is None:
            os.environ.pop(DEVICE_ENV, None)
        else:
            os.environ[DEVICE_ENV] = previous
        get_device.cache_clear()
    return [j.outcome for j in jobs]


def _vectorize(cfg: Mapping[str, Any]) -> bool | None:
    value = cfg["engine"].get("vectorize", "auto")
    return None if value == "auto" else bool(value)


def run_lone(run_cfg: RunConfig) -> Outcome:
    """A job that fits no group: its own engine, as a lone run. An error it raises is its ``error`` outcome (logged
    with its traceback); the launcher goes on with the next job."""
    from server.run.cli import simulate

    cfg = run_cfg.values
    try:
        return Outcome(cfg["run_dir"], "finished", summary=simulate(run_cfg))
    except DivergenceError as err:
        return Outcome(cfg["run_dir"], "diverged", str(err))
    except (NoNodesError, RunStorageError) as err:
        return Outcome(cfg["run_dir"], "failed", str(err))
    except config_lib.ConfigError as err:  # raised by a round (e.g. a client that does not fit): status.json says it
        return Outcome(cfg["run_dir"], "invalid", f"{cfg['run_dir']}: invalid configuration: {err}")
    except Exception as err:  # noqa: BLE001 - one job's failure ends that job only, as in a group
        logging.getLogger("flwr").exception("%s failed", cfg["run_dir"])
        return Outcome(cfg["run_dir"], "error", f"{type(err).__name__}: {err}")


def split(group: Sequence[int], parts: int) -> list[list[int]]:
    """``group`` in ``parts`` contiguous parts of near-equal size (as many as it has jobs, at most)."""
    parts = max(1, min(parts, len(group)))
    size, larger = divmod(len(group), parts)
    bounds = [p * size + min(p, larger) for p in range(parts + 1)]
    return [list(group[a:b]) for a, b in zip(bounds, bounds[1:])]


def run_jobs(
    jobs: Sequence[RunConfig | dict[str, Any]],
    max_jobs: int | None = None,
    require_stacked: bool = False,
    share_chunks: bool | None = None,
    processes: int = 1,
) -> list[Outcome]:
    """Every job of a multirun: groups as one program each, the others alone. ``require_stacked``: a job that
    cannot be stacked is an error (:class:`NotStackable`, before anything runs). ``processes`` > 1: each group split
    into that many programs, and the programs and lone jobs run that many at a time in worker processes
    (:mod:`server.stacked.processes`)."""
    runs = [RunConfig.of(j) for j in jobs]  # a plain dict is validated here, a RunConfig is not again
    cfgs = [r.values for r in runs]
    groups, alone = plan(cfgs, max_jobs)
    if require_stacked and alone:
        i, why = next(iter(alone.items()))
        raise NotStackable(f"job {i} ({cfgs[i]['run_dir']}) cannot be stacked: {why}")
    if processes > 1:
        groups = [part for g in groups for part in split(g, processes)]
    units: list[tuple[str, list[int]]] = []
    for group in groups:
        if len(group) == 1:
            log(INFO, "[stacked] job %d (%s) has no other job of its shape%s: it runs alone", group[0],
                cfgs[group[0]]["run_dir"], " in its process" if processes > 1 else "")  # fmt: skip
        units.append(("group" if len(group) > 1 else "lone", group))
    for i, why in alone.items():
        log(INFO, "[stacked] job %d (%s) runs alone: %s", i, cfgs[i]["run_dir"], why)
        units.append(("lone", [i]))
    if processes > 1:
        from server.stacked.processes import core_sets, run_units

        for cfg in {json.dumps(c["data"], sort_keys=True): c for c in cfgs}.values():
            prepare_data(cfg)  # a download once, here, not in every process at the same time
        cores = len(core_sets(processes)[0])
        _say("[stacked] %d programs, %d at a time in worker processes of %d core%s each: %s", len(units),
             min(processes, len(units)), cores, "s" if cores > 1 else "",
             ", ".join(span(unit) for _, unit in units))  # fmt: skip
        outcomes = run_units(units, runs, processes, share_chunks, work=run_unit, outcome=Outcome)
    else:
        outcomes = {}
        for kind, unit in units:
            if kind == "lone":
                outcomes[unit[0]] = run_lone(runs[unit[0]])
                continue
            outcomes.update(zip(unit, run_group([runs[i] for i in unit], unit, share_chunks)))
    return [outcomes[i] for i in range(len(cfgs))]


def run_unit(kind: str, runs: Sequence[RunConfig], indices: Sequence[int], share: bool | None) -> dict[int, Outcome]:
    """A worker process's program (``kind`` "group") or lone job; an error that escapes is each job's outcome."""
    try:
        if kind == "group":
            outcomes = run_group(runs, indices, share, label=f"stacked {span(indices)}")
        else:
            outcomes = [run_lone(runs[0])]
    except Exception as err:  # noqa: BLE001 - reported as each job's outcome
        outcomes = [Outcome(r.values["run_dir"], "error", f"{type(err).__name__}: {err}") for r in runs]
    return dict(zip(indices, outcomes))


def span(indices: Sequence[int]) -> str:
    """The jobs of a program as text: "jobs 3-7" for consecutive indices, else "jobs 1, 4"."""
    if len(indices) > 1 and list(indices) == list(range(indices[0], indices[-1] + 1)):
        return f"jobs {indices[0]}-{indices[-1]}"
    return ("job " if len(indices) == 1 else "jobs ") + ", ".join(map(str, indices))
