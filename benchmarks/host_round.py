"""Host time per job-round with near-zero compute: ``--jobs`` jobs one after another on ``engine=batched`` (lone
runs) and as one stacked group (``hydra/launcher=stacked``, shared chunks), each mode timed at ``--rounds`` + 10
rounds minus 10 rounds, so start-up (data, strategy, round 0) cancels out; medians of ``--repeats``, interleaved,
both modes in the same run.

The setting is :mod:`benchmarks.stacked_sweep`'s ``host`` one: logistic regression, 6 generated clients of 12 images
(3 a round, B = 8), no evaluation after round 0, FedAvg / FedCM / GHBM / FedHBM by turns. What a round costs there is
the host's work: strategy, Flower messages, reply validation, metrics rows, logging and the stacked step's Python.

    python -m benchmarks.host_round --jobs 8 --rounds 200 --repeats 3

Prints ms per job-round of each mode, a cProfile split of a lone run's rounds (FedCM), and µs to write and read a
model array as a Flower Array (``Array(ndarray)`` / ``Array.numpy()`` against :mod:`strategies.npy`).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import tempfile
import time
import timeit
from pathlib import Path

import numpy as np
from flwr.app import Array

from benchmarks.stacked_sweep import jobs
from server.run.cli import simulate
from server.stacked.launch import run_jobs
from strategies import npy

PARTS = {  # cProfile's cumulative time of these functions, as shares of a lone run's rounds
    "configure_train (strategy, messages out)": "configure_train",
    "stacked step (clients' arithmetic)": "stacked_local_train",
    "client requests (decode, data)": "prepare_stacked",
    "client replies (encode)": "train_reply",
    "aggregate_train (validation, server rule)": "aggregate_train",
    "metrics row, status, progress": "record",
}


def _timed(out: Path, tag: str, args: argparse.Namespace, rounds: int, group: bool) -> float:
    ns = _ns(args.jobs, rounds, args.workers)
    cfgs = jobs("host", out / tag, "stacked" if group else "batched", ns, str(out / "tiny"), str(out / "cache"))
    start = time.perf_counter()
    if group:
        outcomes = run_jobs(cfgs, share_chunks=True)
        assert all(o.status == "finished" for o in outcomes), [o.message for o in outcomes]
    else:
        for cfg in cfgs:
            simulate(cfg)
    return time.perf_counter() - start


def _ns(num_jobs: int, rounds: int, workers: str = "auto") -> argparse.Namespace:
    return argparse.Namespace(jobs=num_jobs, host_rounds=rounds, workers=workers)


def per_round(out: Path, args: argparse.Namespace, group: bool, repeat: int) -> float:
    """ms per job-round: the jobs at rounds + 10 minus the jobs at 10 rounds."""
    short = _timed(out, f"{group}-{repeat}-short", args, 10, group)
    long = _timed(out, f"{group}-{repeat}-long", args, 10 + args.rounds, group)
    return 1e3 * (long - short) / (args.rounds * args.jobs)


def profile_split(out: Path, args: argparse.Namespace) -> dict[str, float]:
    profile = cProfile.Profile()
    ns = _ns(2, args.rounds, args.workers)
    cfg = jobs("host", out / "profiled", "batched", ns, str(out / "tiny"), str(out / "cache"))[1]
    profile.enable()
    simulate(cfg)
    profile.disable()
    stats = pstats.Stats(profile).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    total = sum(v[3] for k, v in stats.items() if k[2] == "train_round")
    return {part: round(sum(v[3] for k, v in stats.items() if k[2] == name) / total, 3) for part, name in PARTS.items()}


def codec_us(repeats: int = 2000) -> dict[str, dict[str, float]]:
    """µs to write and read one array as a Flower Array: ``Array(ndarray)`` / ``Array.numpy()`` against
    :mod:`strategies.npy`, for the logistic regression's weight and bias."""
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
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="run dirs (default: a temp dir)")
    parser.add_argument("--workers", default="auto", help="engine.workers: a group's chunk threads on a CPU")
    args = parser.parse_args(argv)
    if args.jobs < 2 or args.rounds < 1 or args.repeats < 1:
        parser.error("--jobs must be >= 2, --rounds and --repeats >= 1")
    out = args.out or Path(tempfile.mkdtemp(prefix="host-round-"))
    from tools.datagen import make_image_folder

    if not (out / "tiny").exists():
        make_image_folder(out / "tiny", per_class=12, test_per_class=4, seed=1)
    _timed(out, "warm", _ns(1, 0), 3, group=False)
    lone, group = [], []
    for r in range(args.repeats):  # interleaved
        lone.append(per_round(out, args, False, r))
        group.append(per_round(out, args, True, r))
    result = {
        "rounds": args.rounds,
        "jobs": args.jobs,
        "lone_ms_per_job_round": round(statistics.median(lone), 2),
        "group_ms_per_job_round": round(statistics.median(group), 2),
        "all": {"lone": [round(x, 2) for x in lone], "group": [round(x, 2) for x in group]},
        "lone_round_split": profile_split(out, args),
        "codec_us": codec_us(),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
