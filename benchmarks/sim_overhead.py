"""Overhead of Flower's Ray simulation over a plain PyTorch loop doing the same client work.

Work per round: 10 clients x 500 images x 1 epoch (B=64, CNN, CPU) = 100 CIFAR-10 partitions, C = 0.1,
cyclic participation, FedAvg server rule. The plain loop trains the same clients one after the other
in this process (torch using all cores) through ``client.app.train_on_partition`` and aggregates with
``strategies.math``; the simulation runs ``flower-simulation`` with one Ray actor per core. Prints
seconds per round (median over rounds 2..R; round 1 includes warm-up) and the ratio.

    python -m benchmarks.sim_overhead --data /data/cifar10-jpeg.tar.gz --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from benchmarks.cli_args import require_data
from client.app import train_on_partition
from strategies import math as fm
from strategies.participation import CyclicSchedule

NUM_CLIENTS, FRACTION, BATCH, SEED = 100, 0.1, 64, 0


@dataclass
class PlainRun:
    """What the plain loop measured: seconds per round, the final weights, and each client's training."""

    seconds: list[float]
    weights: list[np.ndarray]
    client_images: list[int] = field(default_factory=list)  # examples x epochs of each client trained
    client_seconds: list[float] = field(default_factory=list)  # its train-time


def plain_loop(
    data: Path,
    cache: Path,
    rounds: int,
    model: str = "cnn",
    server_lr: float = 1.5,
    client_lr: float = 0.01,
    threads: int | None = None,
    alpha: float = 0.0,
) -> PlainRun:
    """The same rounds without Flower: clients one after another in this process, FedAvg on the server."""
    torch.set_num_threads(threads or os.cpu_count() or 1)
    torch.manual_seed(SEED)  # theta^0 exactly as server.run.strategy_factory.initial_model makes it
    from client.models import build_model

    state = build_model(model).state_dict()
    keys = list(state)
    weights = [v.numpy().copy() for v in state.values()]
    schedule = CyclicSchedule(NUM_CLIENTS, FRACTION, SEED)
    cfg = {
        "model": model,
        "dataset": "cifar10_folder",
        "data-root": str(data),
        "cache-dir": str(cache),
        "num-partitions": NUM_CLIENTS,
        "alpha": alpha,
        "partition-seed": SEED,
        "seed": SEED,
        "batch-size": BATCH,
        "local-epochs": 1,
        "local-steps": 0,
        "algorithm": "fedavgm",
        "client-lr": client_lr,
        "momentum": 0.0,
    }
    run = PlainRun([], weights)
    for rnd in range(1, rounds + 1):
        t0 = time.perf_counter()
        replies, sizes = [], []
        for pid in schedule.clients_for_round(rnd):
            arrays, metrics = train_on_partition({**cfg, "server-round": rnd}, dict(zip(keys, run.weights)), pid)
            replies.append([arrays[k] for k in keys])
            sizes.append(metrics["num-examples"])
            run.client_images.append(int(metrics["num-examples"]))
            run.client_seconds.append(float(metrics["train-time"]))
        delta = fm.model_delta(run.weights, fm.weighted_mean(replies, sizes))
        run.weights = fm.fedavgm_server_update(run.weights, run.weights, delta, server_lr, 0.0)
        run.seconds.append(time.perf_counter() - t0)
    return run


def simulation(data: Path, cache: Path, rounds: int, out: Path) -> list[float]:
    """Seconds per round reported by flower-simulation's metrics.csv for the same work."""
    cpus = os.cpu_count() or 1
    cmd = [
        str(Path(sys.executable).parent / "flower-simulation"),
        f"data.root={data}",
        f"data.cache_dir={cache}",
        f"num_clients={NUM_CLIENTS}",
        f"num_rounds={rounds}",
        f"participation.fraction={FRACTION}",
        f"client.batch_size={BATCH}",
        "client.local_epochs=1",
        "data.alpha=0.0",
        "strategy.server_lr=1.5",
        "strategy.client_lr=0.01",
        "eval_every=100000",
        "eval_max_examples=10",
        "checkpoint_every=100000",
        "backend.num_cpus=1",
        f"backend.init_num_cpus={cpus}",
        f"hydra.run.dir={out}",
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["seconds"] for r in rows if r["round"] >= 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="CIFAR-10 ImageFolder tree or .tar.gz")
    parser.add_argument("--cache", type=Path, default=None, help="decoded-array cache (default: the client's)")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    data = require_data(parser, "--data", args.data)
    cache = args.cache or Path(os.environ.get("FEDMOMENTUM_CACHE", Path.home() / ".cache" / "fedmomentum"))
    plain = plain_loop(data, cache, args.rounds).seconds
    with tempfile.TemporaryDirectory() as tmp:
        sim = simulation(data, cache, args.rounds, Path(tmp) / "run")
    p, s = statistics.median(plain[1:]), statistics.median(sim[1:])
    print(f"rounds={args.rounds} clients/round=10 images/client=500 epochs=1 cores={os.cpu_count()}")
    print(f"plain loop     s/round: median {p:.2f}  all {np.round(plain, 2).tolist()}")
    print(f"flower-sim     s/round: median {s:.2f}  all {np.round(sim, 2).tolist()}")
    print(f"ratio simulation/plain: {s / p:.3f}  (goal <= 1.15)")


if __name__ == "__main__":
    main()
