"""Cost of the pre-training loss ("loss-before") in one client's round, default vs full pass.

The setting: a client with 25,000 CIFAR-10 images, ``client.local_steps=2``, batch 16, CNN. One round
of ``client.train.local_train`` is timed with ``loss_before_batches`` 0 (the default: the examples the round
trains on) and -1 (a full pass, the old default), interleaved, in this process and on one torch thread.

    python -m benchmarks.loss_before --data /data/cifar10-jpeg.tar.gz
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.cli_args import require_data
from client.data import load_dataset
from client.models import build_model
from client.train import LOSS_BEFORE_ALL, TrainConfig, local_train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="CIFAR-10 ImageFolder tree or .tar.gz")
    parser.add_argument("--cache", type=Path, default=None, help="decoded-array cache (default: the client's)")
    parser.add_argument("--examples", type=int, default=25_000)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if min(args.examples, args.steps, args.batch, args.repeats) < 1:
        parser.error("--examples, --steps, --batch and --repeats must be >= 1")
    data = require_data(parser, "--data", args.data)
    torch.set_num_threads(1)
    ds = load_dataset("cifar10_folder", data, args.cache)
    x, y = np.array(ds.x_train[: args.examples]), np.array(ds.y_train[: args.examples])  # as a client holds them
    seconds: dict[str, list[float]] = {"round's examples (0)": [], "full pass (-1)": []}
    losses: dict[str, float] = {}
    for rep in range(args.repeats):
        for name, setting in (("round's examples (0)", 0), ("full pass (-1)", LOSS_BEFORE_ALL)):
            torch.manual_seed(0)
            cfg = TrainConfig(
                "fedavgm",
                0.05,
                local_steps=args.steps,
                batch_size=args.batch,
                loss_before_batches=setting,
                server_round=rep + 1,
            )
            t0 = time.perf_counter()
            result = local_train(build_model("cnn"), x, y, ds.mean, ds.std, cfg, device=torch.device("cpu"))
            seconds[name].append(time.perf_counter() - t0)
            losses[name] = result.metrics["loss-before"]
    medians = {k: statistics.median(v) for k, v in seconds.items()}
    print(
        json.dumps(
            {
                "examples": args.examples,
                "steps": args.steps,
                "batch": args.batch,
                "seconds_per_round_median": medians,
                "all": seconds,
                "last_loss_before": losses,
            },
            indent=1,
        )
    )
    ratio = medians["full pass (-1)"] / medians["round's examples (0)"]
    print(f"full pass / default: {ratio:.0f}x")


if __name__ == "__main__":
    main()
