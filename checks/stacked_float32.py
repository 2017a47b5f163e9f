"""Stacked (vmap) training against the one-client loop in float32, over many draws of clients (docs/benchmarks.md).

    python -m checks.stacked_float32 --model cnn --draws 25
    python -m checks.stacked_float32 --model logreg --draws 25 --algorithms fedavgm ghbm fedcm

For each draw d, tests/client/test_stacked.py's three unequal random clients
(``checks.engine_cases.stacked_clients`` with ``rng(d)``: at most 3 steps of B = 8 at lr 0.05, augmentation,
μ = 1e-3) are trained both ways on the CPU; prints the
normwise relative difference of each case (max over clients and arrays of max|a − b| / max|b|), how many exceed
``--tol`` and the largest. It measures how far float32 rounding alone carries the two paths apart, which is what a
float32 tolerance in a test must allow for.
"""

from __future__ import annotations

import argparse
import json
import sys

ALGORITHMS = ("fedavgm", "fedcm", "localupdate", "ghbm", "localghbm", "fedhbm")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("logreg", "cnn", "resnet20"), default="cnn")
    parser.add_argument("--draws", type=int, default=25)
    parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=["fedavgm", "ghbm"])
    parser.add_argument("--tol", type=float, default=1e-5)
    args = parser.parse_args(argv)
    if args.draws < 1 or args.tol <= 0:
        parser.error("--draws and --tol must be positive")

    import numpy as np
    import torch

    from checks.engine_cases import MEAN, STD, stacked_clients, train_one_by_one
    from checks.gpu_equality import relative
    from client.models import build_model
    from client.stacked import stacked_local_train

    def arrays(result) -> dict:
        return {k: v.numpy() for k, v in result.arrays.items()}

    torch.set_num_threads(1)
    differences = []
    for draw in range(args.draws):
        for algorithm in args.algorithms:
            torch.manual_seed(0)
            model = build_model(args.model)
            clients = stacked_clients(algorithm, model, np.random.default_rng(draw), weight_decay=1e-3, augment=True)
            loop = train_one_by_one(args.model, clients)
            stacked = stacked_local_train(model, clients, MEAN, STD, torch.device("cpu"))
            diff = max(relative(arrays(s), arrays(e)) for e, s in zip(loop, stacked))
            differences.append(diff)
            print(f"draw {draw:3d}  {algorithm:12s} {diff:.3g}")
    values = np.array(differences)
    print(
        json.dumps(
            {
                "model": args.model,
                "cases": len(values),
                "tol": args.tol,
                "above_tol": int((values > args.tol).sum()),
                "max": float(values.max()),
                "median": float(np.median(values)),
                "torch": torch.__version__,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
