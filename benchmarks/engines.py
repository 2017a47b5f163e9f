"""Seconds per round of ``engine=ray`` vs ``engine=batched`` in paper 1's Figure 1 setting, and the compute floor.

Setting: CIFAR-10, 100 one-class clients (alpha = 0), cyclic C = 0.1 (10 clients per round), 1 epoch of B = 64
(8 steps of 500 images), FedAvg, CPU. Models: ``logreg`` with augmentation off, ``cnn`` and ``resnet20`` (with
augmentation, the papers' setting). Each engine runs ``flower-simulation`` as a user would (evaluation and
checkpoints only after the last round, so rounds are the clients' work plus the engine); seconds per round are
the median of ``metrics.jsonl``'s ``seconds`` over rounds 2..R (round 1 warms up). The compute floor is the fastest
plain loop over the same clients with no FL around it: ``client.train.local_train`` one client after another in
this process (1 and all torch threads), the same in one process per core (1 thread each, clients spread over
them), and for the linear model ``client.stacked.stacked_local_train`` of the round's clients at once (its
closed-form gradients, client/linear.py, and the generic vmap of autograd); the best of those is the floor.

    python -m benchmarks.engines --data /data/cifar10-jpeg.tar.gz            # all three models
    python -m benchmarks.engines --models logreg --rounds-logreg 300 --json out.json
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
from pathlib import Path

import numpy as np
import torch

from benchmarks.cli_args import require_data

NUM_CLIENTS, FRACTION, BATCH, SEED = 100, 0.1, 64, 0
LR = {"logreg": (1.0, 0.01), "cnn": (1.5, 0.01), "resnet20": (1.0, 0.5)}  # (eta, eta_l); paper 1 App. A for CNNs


def engine_seconds(engine: str, model: str, rounds: int, data: Path, cache: Path, out: Path) -> list[float]:
    """Per-round seconds of one ``flower-simulation`` run of the setting on ``engine``."""
    eta, eta_l = LR[model]
    cmd = [
        str(Path(sys.executable).parent / "flower-simulation"),
        f"engine={engine}",
        f"model={model}",
        f"data.root={data}",
        f"data.cache_dir={cache}",
        f"num_clients={NUM_CLIENTS}",
        f"num_rounds={rounds}",
        f"participation.fraction={FRACTION}",
        f"client.batch_size={BATCH}",
        "client.local_epochs=1",
        f"client.augment={str(model != 'logreg').lower()}",
        "data.alpha=0.0",
        f"strategy.server_lr={eta}",
        f"strategy.client_lr={eta_l}",
        f"eval_every={rounds}",
        "eval_max_examples=100",
        f"checkpoint_every={rounds}",
        f"seed={SEED}",
        f"hydra.run.dir={out}",
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["seconds"] for r in rows if r["round"] >= 1]


def floor_seconds(model: str, rounds: int, data: Path, cache: Path) -> dict[str, float]:
    """Median seconds per round of the plain loops (see the module docstring), keyed by loop."""
    from client.app import get_dataset, get_partition
    from client.config import resolve
    from client.models import build_model
    from client.stacked import ClientInput, can_stack, stacked_local_train
    from client.train import TrainConfig, local_train
    from strategies.participation import CyclicSchedule

    cfg = resolve(
        {
            "model": model,
            "dataset": "cifar10_folder",
            "data-root": str(data),
            "cache-dir": str(cache),
            "num-partitions": NUM_CLIENTS,
            "alpha": 0.0,
            "partition-seed": SEED,
        }
    )
    ds = get_dataset(cfg)
    parts = get_partition(cfg)
    schedule = CyclicSchedule(NUM_CLIENTS, FRACTION, SEED)
    torch.manual_seed(SEED)
    net = build_model(model)
    state = {k: v.clone() for k, v in net.state_dict().items()}

    def tc(pid: int, rnd: int) -> TrainConfig:
        return TrainConfig(
            algorithm="fedavgm",
            client_lr=LR[model][1],
            batch_size=BATCH,
            augment=model != "logreg",
            seed=SEED,
            server_round=rnd,
            partition_id=pid,
        )

    def one_by_one(threads: int) -> float:
        torch.set_num_threads(threads)
        times = []
        for rnd in range(1, rounds + 1):
            t0 = time.perf_counter()
            for pid in schedule.clients_for_round(rnd):
                net.load_state_dict(state)
                local_train(
                    net,
                    ds.x_train[parts[pid]],
                    ds.y_train[parts[pid]],
                    ds.mean,
                    ds.std,
                    tc(pid, rnd),
                    device=torch.device("cpu"),
                )
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    def stacked(generic: bool = False) -> float:
        """Stacked training of the round's clients; ``generic``: vmap of autograd instead of the closed form."""
        torch.set_num_threads(1)  # as the batched engine's stacked CPU steps
        initial = {k: v.numpy() for k, v in state.items()}
        times = []
        for rnd in range(1, rounds + 1):
            t0 = time.perf_counter()
            clients = [
                ClientInput(ds.x_train[parts[p]], ds.y_train[parts[p]], tc(p, rnd), initial, key=("bench", p))
                for p in schedule.clients_for_round(rnd)
            ]
            stacked_local_train(net, clients, ds.mean, ds.std, torch.device("cpu"), generic=generic)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    def processes(count: int) -> float:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        initial = {k: v.numpy() for k, v in state.items()}
        with ProcessPoolExecutor(count, mp_context=get_context("spawn")) as pool:
            times = []
            for rnd in range(1, rounds + 1):
                t0 = time.perf_counter()
                jobs = [
                    pool.submit(_plain_client, model, str(data), str(cache), pid, rnd, initial)
                    for pid in schedule.clients_for_round(rnd)
                ]
                [job.result() for job in jobs]
                times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    cores = os.cpu_count() or 1
    out = {"loop, 1 thread": one_by_one(1), f"loop, {cores} threads": one_by_one(cores)}
    if cores > 1:
        out[f"{cores} processes, 1 thread each"] = processes(cores)
    if model == "logreg" and can_stack(net):
        out["stacked (closed form), 1 thread"] = stacked()
        out["stacked (vmap), 1 thread"] = stacked(generic=True)
    return out


def _plain_client(model: str, data: str, cache: str, pid: int, rnd: int, initial: dict) -> float:
    """One client's plain local training in a worker process (1 torch thread); returns its seconds."""
    from client.app import get_dataset, get_partition
    from client.config import resolve
    from client.models import build_model
    from client.train import TrainConfig, local_train

    torch.set_num_threads(1)
    cfg = resolve(
        {
            "model": model,
            "dataset": "cifar10_folder",
            "data-root": data,
            "cache-dir": cache,
            "num-partitions": NUM_CLIENTS,
            "alpha": 0.0,
            "partition-seed": SEED,
        }
    )
    ds, idx = get_dataset(cfg), get_partition(cfg)[pid]
    net = build_model(model)
    net.load_state_dict({k: torch.as_tensor(v) for k, v in initial.items()})
    tc = TrainConfig(
        algorithm="fedavgm",
        client_lr=LR[model][1],
        batch_size=BATCH,
        augment=model != "logreg",
        seed=SEED,
        server_round=rnd,
        partition_id=pid,
    )
    t0 = time.perf_counter()
    local_train(net, ds.x_train[idx], ds.y_train[idx], ds.mean, ds.std, tc, device=torch.device("cpu"))
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="CIFAR-10 ImageFolder tree or .tar.gz")
    parser.add_argument("--cache", type=Path, default=None)
    parser.add_argument("--models", nargs="+", default=["logreg", "cnn", "resnet20"])
    parser.add_argument("--rounds-logreg", type=int, default=200, help="rounds of the batched logreg run")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of every other run")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    data = require_data(parser, "--data", args.data)
    cache = args.cache or Path(os.environ.get("FEDMOMENTUM_CACHE", Path.home() / ".cache" / "fedmomentum"))
    results = {}
    print(
        f"Figure 1 setting: {NUM_CLIENTS} clients, alpha=0, cyclic C={FRACTION}, 1 epoch, B={BATCH}, "
        f"{os.cpu_count()} cores"
    )
    print("| model | ray s/round | batched s/round | ray / batched | floor s/round (loop) | batched / floor |")
    print("| --- | --- | --- | --- | --- | --- |")
    for model in args.models:
        with tempfile.TemporaryDirectory() as tmp:
            ray = engine_seconds("ray", model, args.rounds if model != "logreg" else 30, data, cache, Path(tmp) / "ray")
            batched = engine_seconds(
                "batched",
                model,
                args.rounds_logreg if model == "logreg" else args.rounds,
                data,
                cache,
                Path(tmp) / "batched",
            )
        floors = floor_seconds(model, 20 if model == "logreg" else 3, data, cache)
        r, b = statistics.median(ray[1:]), statistics.median(batched[1:])
        best = min(floors, key=floors.get)
        results[model] = {
            "ray": r,
            "batched": b,
            "speedup": r / b,
            "floor": floors,
            "floor_best": best,
            "batched_over_floor": b / floors[best],
            "ray_rounds": ray,
            "batched_rounds": batched,
        }
        print(f"| {model} | {r:.4f} | {b:.4f} | {r / b:.2f}x | {floors[best]:.4f} ({best}) | {b / floors[best]:.2f} |")
    for model, res in results.items():
        print(f"{model} floors: " + ", ".join(f"{k} {v:.4f} s" for k, v in res["floor"].items()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=lambda v: np.asarray(v).tolist()))


if __name__ == "__main__":
    main()
