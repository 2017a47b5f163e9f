"""Host time per job-round with near-zero compute: ``--jobs`` jobs one after another on ``engine=batched`` (lone
runs) and as one stacked group (``hydra/launcher=stacked``, shared chunks), each mode timed at ``--rounds`` + 10
rounds minus 10 rounds, so start-up (data, strategy, round 0) cancels out; medians of ``--repeats``, interleaved,
both modes in the same run. Each mode's time is split into the stacked step (the clients' arithmetic and its Python,
:func:`server.batched.grid.stacked_results`), the clients' requests (decoding, data: ``prepare_stacked``), their
replies (encoding, client state: ``store_stacked``) and the host's rest (strategy, Flower messages, validation, the
server rule, metrics rows, logging; in a group, the jobs' turns at the barrier): host time = the whole minus the step.

The setting is :mod:`benchmarks.stacked_sweep`'s ``host`` one: logistic regression, 6 generated clients of 12 images
(3 a round, B = 8), no evaluation but round 0's and the last round's (both runs of a mode have them: they cancel out),
FedAvg / FedCM / GHBM / FedHBM by turns. What a round costs there is the host's work: strategy, Flower messages, reply
validation, metrics rows, logging and the stacked step's Python.

    python -m benchmarks.host_round --jobs 8 --rounds 200 --repeats 3

Prints ms per job-round of each mode and its split, a cProfile split of a lone run's rounds (FedCM), ms to write and
read a client's state (FedHBM, LocalGHBM) of each model, µs to write and read a model array as a Flower Array
(``Array(ndarray)`` / ``Array.numpy()`` against :mod:`strategies.npy`), and µs of a run.log line and of that array
code in a loop and right after a pass over 16 MB (``cold_us``: the host's Python between a round's arithmetic runs
from evicted caches, slower than a loop of it shows).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import logging
import os
import pstats
import statistics
import tempfile
import time
import timeit
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

from benchmarks.stacked_sweep import jobs
from server.batched import grid as batched_grid
from server.run.cli import simulate
from server.stacked.launch import run_jobs
from strategies import npy
from strategies.client_state import ClientStateStore, Lineage, forget

PARTS = {  # cProfile's cumulative time of these functions, as shares of a lone run's rounds
    "configure_train (strategy, messages out)": "configure_train",
    "stacked step (clients' arithmetic)": "stacked_local_train",
    "client requests (decode, data)": "prepare_stacked",
    "client replies (encode)": "train_reply",
    "aggregate_train (validation, server rule)": "aggregate_train",
    "metrics row, status, progress": "record",
}


SPLIT = {  # a part of a round: the function of server.batched.grid whose wall time it is
    "step": "stacked_results",
    "requests": "prepare_stacked",
    "replies": "store_stacked",
}


@contextlib.contextmanager
def split_timers(seconds: dict[str, float]) -> Iterator[None]:
    """Add the wall time of each :data:`SPLIT` function to ``seconds`` while the block runs (a group's chunks are
    computed one at a time with ``--workers 1``, so the parts do not overlap)."""
    owners = {
        "stacked_results": batched_grid,
        "store_stacked": batched_grid,
        "prepare_stacked": batched_grid.BatchedGrid,
    }
    originals = {name: getattr(owners[name], name) for name in SPLIT.values()}

    def timed(part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[part] += time.perf_counter() - start

        return wrapper

    for part, name in SPLIT.items():
        setattr(owners[name], name, timed(part, originals[name]))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(owners[name], name, fn)


def _timed(out: Path, tag: str, args: argparse.Namespace, rounds: int, group: bool) -> dict[str, float]:
    """Seconds of the jobs at ``rounds`` rounds: the whole and each part of :data:`SPLIT`."""
    ns = sweep_args(args.jobs, rounds, args.workers)
    cfgs = jobs("host", out / tag, "stacked" if group else "batched", ns, str(out / "tiny"), str(out / "cache"))
    seconds = dict.fromkeys(SPLIT, 0.0)
    with split_timers(seconds):
        start = time.perf_counter()
        if group:
            outcomes = run_jobs(cfgs, share_chunks=True)
            assert all(o.status == "finished" for o in outcomes), [o.message for o in outcomes]
        else:
            for cfg in cfgs:
                simulate(cfg)
        seconds["whole"] = time.perf_counter() - start
    return seconds


def sweep_args(num_jobs: int, rounds: int, workers: str = "auto") -> argparse.Namespace:
    """The arguments :func:`benchmarks.stacked_sweep.jobs` reads for the host setting."""
    return argparse.Namespace(jobs=num_jobs, host_rounds=rounds, workers=workers)


def per_round(out: Path, args: argparse.Namespace, group: bool, repeat: int) -> dict[str, float]:
    """ms per job-round of the whole and of each part: the jobs at rounds + 10 minus the jobs at 10 rounds; ``host``
    is the whole minus the step."""
    short = _timed(out, f"{group}-{repeat}-short", args, 10, group)
    long = _timed(out, f"{group}-{repeat}-long", args, 10 + args.rounds, group)
    ms = {part: 1e3 * (long[part] - short[part]) / (args.rounds * args.jobs) for part in long}
    ms["host"] = ms["whole"] - ms["step"]
    return ms


def profile_split(out: Path, args: argparse.Namespace) -> dict[str, float]:
    profile = cProfile.Profile()
    ns = sweep_args(2, args.rounds, args.workers)
    cfg = jobs("host", out / "profiled", "batched", ns, str(out / "tiny"), str(out / "cache"))[1]
    profile.enable()
    simulate(cfg)
    profile.disable()
    stats = pstats.Stats(profile).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    total = sum(v[3] for k, v in stats.items() if k[2] == "train_round")
    return {part: round(sum(v[3] for k, v in stats.items() if k[2] == name) / total, 3) for part, name in PARTS.items()}


class _ThroughMemory(ClientStateStore):
    """The store with its state file built in memory first (``np.savez`` to a BytesIO), then written, renamed into
    place and pruned as the store does: the alternative :func:`state_ms` compares with."""

    def save(self, server_round: int, arrays: Mapping[str, np.ndarray]) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        final = self.path / f"r{int(server_round):08d}-{self.lineage.current}.npz"
        tmp = self.path / f".tmp-{os.getpid()}-memory.npz"
        buffer = io.BytesIO()
        np.savez(buffer, **{k: np.asarray(v) for k, v in arrays.items()})
        tmp.write_bytes(buffer.getvalue())
        os.replace(tmp, final)
        self.prune()
        return final


def _load_all(path: Path, like: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every array of a state file through ``np.load`` (what the store does with a file it does not expect)."""
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def state_ms(models: tuple[str, ...] = ("logreg", "resnet20", "cnn"), rounds: int = 30) -> dict[str, dict[str, float]]:
    """ms to write and read one client's state (FedHBM, LocalGHBM) of each model: medians over ``rounds`` rounds of
    :class:`strategies.client_state.ClientStateStore` (written to a file, renamed into place, pruned; the newest valid
    state read and checked), the write of :class:`_ThroughMemory`, the read of the same file through ``np.load``, and
    the store of a node in the server's process (``in_memory``: the state kept in memory, files only at checkpoints),
    interleaved."""
    from client.models import build_model

    out = {}
    for name in models:
        arrays = {k: v.detach().numpy().copy() for k, v in build_model(name).state_dict().items()}
        seconds: dict[str, list[float]] = {
            k: [] for k in ("write", "read", "write through a BytesIO", "read through np.load", "keep", "read kept")
        }
        with tempfile.TemporaryDirectory() as root:
            store = ClientStateStore(root, "bench", 0, Lineage((1,), ("segment",)), 0)
            memory = _ThroughMemory(root, "memory", 0, Lineage((1,), ("segment",)), 0)
            kept = ClientStateStore(root, "kept", 0, Lineage((1,), ("segment",)), 0, in_memory=True)
            for r in range(1, rounds + 1):
                calls = [
                    ("write", store.save, r),
                    ("read", store.load, r + 1),
                    ("write through a BytesIO", memory.save, r),
                    ("read through np.load", _load_all, store.path / f"r{r:08d}-segment.npz"),
                    ("keep", kept.save, r),
                    ("read kept", kept.load, r + 1),
                ]
                for part, call, rnd in calls:
                    start = time.perf_counter()
                    call(rnd, arrays)
                    seconds[part].append(time.perf_counter() - start)
            forget("kept")
        out[name] = {part: round(1e3 * statistics.median(v), 3) for part, v in seconds.items()}
    return out


def _medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {part: round(statistics.median(r[part] for r in rows), 3) for part in rows[0]}


def codec_us(repeats: int = 2000) -> dict[str, dict[str, float]]:
    """µs to write and read one array as a Flower Array: ``Array(ndarray)`` / ``Array.numpy()`` against
    :mod:`strategies.npy`, for the logistic regression's weight and bias; and to build a record of both."""
    arrays = {
        "weight (10, 3072) float32": np.zeros((10, 3072), np.float32),
        "bias (10,) float32": np.zeros(10, np.float32),
    }
    out = {}
    for name, a in arrays.items():
        array = Array(a)
        ways = {
            "write: Array(ndarray)": lambda a=a: Array(a),
            "write: npy.to_array": lambda a=a: npy.to_array(a),
            "read: Array.numpy": array.numpy,
            "read: npy.to_numpy": lambda array=array: npy.to_numpy(array),
        }
        out[name] = {
            way: round(1e6 * min(timeit.repeat(fn, number=repeats, repeat=3)) / repeats, 2) for way, fn in ways.items()
        }
    keys, values = ["weight", "bias"], list(arrays.values())
    records = {
        "write: ArrayRecord(dict of npy.to_array)": lambda: ArrayRecord(
            {k: npy.to_array(v) for k, v in zip(keys, values)}
        ),
        "write: npy.to_record": lambda: npy.to_record(keys, values),
    }
    out["record of both"] = {
        way: round(1e6 * min(timeit.repeat(fn, number=repeats, repeat=3)) / repeats, 2) for way, fn in records.items()
    }
    return out


EVICT_MB = 16  # a pass over this much data between two timed calls: what a round's arithmetic does to the caches


def cold_us(repeats: int = 2000) -> dict[str, dict[str, float]]:
    """µs of host operations of a round, called in a loop (``warm``) and each right after a pass over
    :data:`EVICT_MB` MB (``after a pass``, as between a round's steps): a run.log line (a FileHandler with a run's
    format, flushed), writing the logistic regression's weight as a Flower Array (:func:`strategies.npy.to_array`)
    and reading it back (:func:`strategies.npy.to_numpy`); medians of ``repeats`` calls."""
    weight = np.zeros((10, 3072), np.float32)
    array = npy.to_array(weight)
    evict = np.ones(EVICT_MB * 2**20 // 8)
    logger = logging.getLogger("benchmarks.host_round.cold")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    with tempfile.TemporaryDirectory() as root:
        handler = logging.FileHandler(Path(root) / "run.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        ops = {
            "run.log line": lambda: logger.info("%s: Received %s results and %s failures", "aggregate_train", 3, 0),
            "write: npy.to_array (weight)": lambda: npy.to_array(weight),
            "read: npy.to_numpy (weight)": lambda: npy.to_numpy(array),
        }
        out: dict[str, dict[str, float]] = {}
        try:
            for name, op in ops.items():
                times: dict[str, list[float]] = {"warm": [], "after a pass": []}
                for i in range(2 * repeats):
                    cold = i % 2 == 1
                    if cold:
                        evict.sum()
                    start = time.perf_counter()
                    op()
                    times["after a pass" if cold else "warm"].append(time.perf_counter() - start)
                out[name] = {k: round(1e6 * statistics.median(v), 2) for k, v in times.items()}
        finally:
            logger.removeHandler(handler)
            handler.close()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="run dirs (default: a temp dir)")
    parser.add_argument(
        "--workers",
        default="1",
        help="engine.workers: a group's chunk threads on a CPU (1: the split's parts do not overlap)",
    )
    args = parser.parse_args(argv)
    if args.jobs < 2 or args.rounds < 1 or args.repeats < 1:
        parser.error("--jobs must be >= 2, --rounds and --repeats >= 1")
    out = args.out or Path(tempfile.mkdtemp(prefix="host-round-"))
    from tools.datagen import make_image_folder

    if not (out / "tiny").exists():
        make_image_folder(out / "tiny", per_class=12, test_per_class=4, seed=1)
    _timed(out, "warm", sweep_args(1, 0), 3, group=False)
    lone, group = [], []
    for r in range(args.repeats):  # interleaved
        lone.append(per_round(out, args, False, r))
        group.append(per_round(out, args, True, r))
    result = {
        "rounds": args.rounds,
        "jobs": args.jobs,
        "lone_ms_per_job_round": _medians(lone),
        "group_ms_per_job_round": _medians(group),
        "all": {"lone": [round(x["whole"], 2) for x in lone], "group": [round(x["whole"], 2) for x in group]},
        "lone_round_split": profile_split(out, args),
        "codec_us": codec_us(),
        "cold_us": cold_us(),
        "client_state_ms": state_ms(),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
