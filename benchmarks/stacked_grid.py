"""A learning-rate grid's round: its jobs' clients in one stacked chunk (client learning rates and β per client, as
``hydra/launcher=stacked`` trains them) against one chunk per grid value (what a stacked group trains when those
values must be shared), interleaved, medians of ``--repeats``, the ratio measured in the same run.

Each job is FedCM at its own (eta_l, beta) (``--same-values``: every job the same, a sweep over seeds) with
``--clients`` clients of ``--examples`` generated images (the same clients in every job), one epoch of B =
``--batch``; the clients' inputs are cached between rounds, as the engines cache them.

    python -m benchmarks.stacked_grid --model logreg --jobs 8 --clients 10 --examples 500
    python -m benchmarks.stacked_grid --model cnn --jobs 4 --clients 10 --examples 128

Prints seconds per round of each mode, their ratio, and whether the two gave bitwise the same models.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from client.chunk import ClientInput, clear_cache
from client.models import build_model
from client.stacked import stacked_local_train
from client.train import TrainConfig

MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


def grid_clients(args: argparse.Namespace, model: torch.nn.Module) -> list[list[ClientInput]]:
    """The clients of each job of the grid: the same data and model, each job its own (eta_l, beta)."""
    rng = np.random.default_rng(0)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    data = [
        (rng.integers(0, 256, (args.examples, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, args.examples))
        for _ in range(args.clients)
    ]
    correction = {k: (rng.normal(size=v.shape) * 1e-3).astype(np.float32) for k, v in state.items()}
    jobs = []
    for j in range(args.jobs):
        lr, beta = (0.001, 0.5) if args.same_values else (0.001 * (1 + j), 0.5 + 0.4 * j / max(args.jobs - 1, 1))
        jobs.append(
            [
                ClientInput(
                    x,
                    y,
                    TrainConfig(
                        "fedcm", lr, beta, batch_size=args.batch, augment=False, seed=j, server_round=1, partition_id=i
                    ),
                    state,
                    correction=correction,
                    key=("grid", i),
                )
                for i, (x, y) in enumerate(data)
            ]
        )
    return jobs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="logreg", choices=["logreg", "cnn"])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--clients", type=int, default=10, help="clients a round per job")
    parser.add_argument("--examples", type=int, default=500, help="examples per client")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--same-values", action="store_true", help="every job the same (eta_l, beta)")
    args = parser.parse_args(argv)
    if min(args.jobs, args.clients, args.examples, args.batch, args.repeats, args.threads) < 1:
        parser.error("every count must be >= 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build_model(args.model)
    jobs = grid_clients(args, model)
    cpu = torch.device("cpu")

    def one_chunk() -> list:
        return stacked_local_train(model, [c for job in jobs for c in job], MEAN, STD, cpu)

    def chunk_per_job() -> list:
        return [r for job in jobs for r in stacked_local_train(model, job, MEAN, STD, cpu)]

    modes = {"one chunk": one_chunk, "a chunk per value": chunk_per_job}
    seconds: dict[str, list[float]] = {m: [] for m in modes}
    results = {m: f() for m, f in modes.items()}  # warm-up (caches the inputs), and the models compared below
    for _ in range(args.repeats):
        for mode, f in modes.items():
            start = time.perf_counter()
            f()
            seconds[mode].append(time.perf_counter() - start)
    same = all(
        torch.equal(a.arrays[k], b.arrays[k])
        for a, b in zip(results["one chunk"], results["a chunk per value"])
        for k in a.arrays
    )
    median = {m: statistics.median(s) for m, s in seconds.items()}
    print(
        json.dumps(
            {
                "model": args.model,
                "jobs": args.jobs,
                "clients_per_job": args.clients,
                "examples": args.examples,
                "batch": args.batch,
                "threads": args.threads,
                "same_values": args.same_values,
                "seconds_per_round_median": median,
                "seconds_per_round_all": seconds,
                "ratio": median["a chunk per value"] / median["one chunk"],
                "bitwise_equal_models": same,
            },
            indent=1,
        )
    )
    clear_cache()


if __name__ == "__main__":
    main()
