"""Timing of the stacked launcher against the same jobs one after another on ``engine=batched`` (in one process,
as Hydra's basic launcher runs them), ratios measured in the same run.

Two settings:

- ``host``: near-zero compute (logistic regression, 6 generated clients of 12 images, 3 a round, no evaluation past
  round 0): what remains is the host's work per job-round (strategy, messages, metrics, checkpoints).
- ``convex`` (with ``--data``, a CIFAR-10 ImageFolder tree or .tar.gz): the convex study's setting
  (``+sweep=convex_seed000``: 100 one-class clients, cyclic C = 0.1, one epoch of B = 64, ``pop_gap`` every
  ``eval_every`` rounds and every one of the last ``--tail``), 4 methods x 5 seeds.

    python -m benchmarks.stacked_sweep --out /tmp/stacked-bench                     # host setting only
    python -m benchmarks.stacked_sweep --data cifar10.tar.gz --rounds 100 --out /tmp/stacked-bench
    python -m benchmarks.stacked_sweep --data cifar10.tar.gz --skip-host --processes 1 2

``--lone-at-once K`` runs the baseline's lone runs K at a time in spawned processes, each with
``client.torch_threads=1`` (what ``studies/convex_study.py --jobs 2`` does on 2 cores) instead of one after another.
``--processes 1 2`` runs the stacked mode once per value of ``hydra.launcher.processes`` (programs side by side in
worker processes), each against the same baseline.

Prints, per setting: seconds of each mode, job-rounds/s, the ratio, and host µs per job-round (host setting).
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir

from server.run import config as config_lib
from server.run.cli import simulate
from server.run.config import CONF_DIR
from server.stacked.launch import run_jobs

METHODS = ("fedavg", "fedcm", "ghbm", "fedhbm")


def composed(overrides: list[str]) -> dict[str, Any]:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    return config_lib.validate(config_lib.to_plain(cfg))


def jobs(setting: str, out: Path, mode: str, args: argparse.Namespace, data: str, cache: str) -> list[dict[str, Any]]:
    cfgs = []
    for i in range(args.jobs):
        method, seed = METHODS[i % len(METHODS)], i // len(METHODS)
        common = [f"run_dir={out / setting / mode / f'{method}_seed{seed}'}", f"seed={seed}", "plots=false"]
        common.append("overwrite=true")  # a measurement run again into the same --out replaces the last one
        common.append(f"engine.workers={args.workers}")
        if setting == "host":
            extra = [
                f"+method={method}",
                "engine=batched",
                "model=logreg",
                "data=cifar10_folder",
                f"data.root={data}",
                f"data.cache_dir={cache}",
                "num_clients=6",
                "participation.fraction=0.5",
                "client.batch_size=8",
                "client.augment=false",
                f"num_rounds={args.host_rounds}",
                f"eval_every={args.host_rounds + 1}",
                "eval_tail=0",
                f"checkpoint_every={args.host_rounds}",
            ]
        else:
            extra = [
                "+sweep=convex_seed000",
                f"method={method}",
                "data=cifar10_folder",
                f"data.root={data}",
                f"data.cache_dir={cache}",
                f"num_rounds={args.rounds}",
                f"eval_every={args.eval_every}",
                f"eval_tail={args.tail}",
                f"checkpoint_every={args.rounds}",
                "strategy.server_lr=1.0",
                "strategy.client_lr=0.003",
            ]
        cfgs.append(composed([*common, *extra]))
    return cfgs


def measure(setting: str, out: Path, args: argparse.Namespace, data: str, cache: str) -> dict[str, Any]:
    rounds = args.host_rounds if setting == "host" else args.rounds
    seconds = {}
    modes = ["batched", *(f"stacked_p{p}" if p > 1 else "stacked" for p in args.processes)]
    for mode, processes in zip(modes, [1, *args.processes]):
        cfgs = jobs(setting, out, mode, args, data, cache)
        start = time.perf_counter()
        if mode == "batched" and args.lone_at_once > 1:
            for cfg in cfgs:
                cfg["client"]["torch_threads"] = 1
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(args.lone_at_once, mp_context=context) as pool:
                list(pool.map(simulate, cfgs))
        elif mode == "batched":
            for cfg in cfgs:
                simulate(copy.deepcopy(cfg))
        else:
            share = {"auto": None, "true": True, "false": False}[args.share_chunks]
            outcomes = run_jobs(cfgs, share_chunks=share, processes=processes)
            assert all(o.status == "finished" for o in outcomes), [o.message for o in outcomes]
        seconds[mode] = time.perf_counter() - start
    job_rounds = args.jobs * rounds
    result = {
        "setting": setting,
        "jobs": args.jobs,
        "rounds": rounds,
        "seconds": seconds,
        "job_rounds_per_s": {m: job_rounds / s for m, s in seconds.items()},
        "lone_at_once": args.lone_at_once,
        "speedup": {m: seconds["batched"] / s for m, s in seconds.items() if m != "batched"},
        "us_per_job_round": {m: 1e6 * s / job_rounds for m, s in seconds.items()},
    }
    print(json.dumps(result, indent=1), flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="run dirs and results.json (default: a temp dir)")
    parser.add_argument("--data", help="CIFAR-10 ImageFolder tree or .tar.gz: adds the convex setting")
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=300, help="rounds of the convex setting")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--tail", type=int, default=100, help="rounds evaluated every round at the end")
    parser.add_argument("--host-rounds", type=int, default=100)
    parser.add_argument(
        "--share-chunks", default="auto", choices=["auto", "true", "false"], help="hydra.launcher.share_chunks"
    )
    parser.add_argument("--workers", default="auto", help="engine.workers: a group's chunk threads on a CPU")
    parser.add_argument("--skip-host", action="store_true", help="only the convex setting")
    parser.add_argument("--lone-at-once", type=int, default=1, help="the baseline's lone runs at once (processes)")
    parser.add_argument(
        "--processes", type=int, nargs="+", default=[1], help="hydra.launcher.processes: the stacked mode once each"
    )
    args = parser.parse_args(argv)
    if min(args.jobs, args.rounds, args.host_rounds, args.lone_at_once, *args.processes) < 1:
        parser.error("--jobs, --rounds, --host-rounds, --lone-at-once and --processes must be >= 1")
    out = args.out or Path(tempfile.mkdtemp(prefix="stacked-bench-"))
    from tools.datagen import make_image_folder  # generated data of the host setting

    tiny = out / "tiny"
    if not tiny.exists():
        make_image_folder(tiny, per_class=12, test_per_class=4, seed=1)
    results = [] if args.skip_host else [measure("host", out, args, str(tiny), str(out / "cache"))]
    if args.data:
        results.append(measure("convex", out, args, args.data, str(out / "cache")))
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"stacked_sweep: results in {out / 'results.json'}")


if __name__ == "__main__":
    main()
