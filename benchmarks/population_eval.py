"""The convex study's evaluation (``pop_gap``: float64 logits of every training example, plus the float32 test set)
of several models: one pass over the shared data for all of them (what a stacked group does with the evaluations
of a round, :func:`server.run.evaluator.metrics_of_many`) against one model at a time (a lone run's evaluator),
interleaved, medians of ``--repeats``, the ratio measured in the same run.

The models are ``--jobs`` random logistic regressions, evaluated by the evaluators of ``--seeds`` seeds (their
splits weigh the examples differently; the features are shared), as 4 methods x 5 seeds of the convex study.
``--population train`` evaluates paper 2's population loss instead (``eval_train`` without ``pop_gap``: each
client's mean loss in float32, batch by batch): the models of one seed share an evaluator, and the pass prepares
each client's batches once for all of them (:meth:`server.run.evaluator.Evaluator.populations`).

    python -m benchmarks.population_eval --data cifar10.tar.gz --jobs 20 --seeds 5 --repeats 3
    python -m benchmarks.population_eval --data cifar10.tar.gz --jobs 20 --seeds 1 --repeats 3 --population train

Prints seconds per evaluation round of each mode, their ratio, and the largest relative difference of the pop_*
columns between the modes (the other columns are equal).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import numpy as np

from benchmarks.cli_args import require_data
from server.run.data import server_dataset
from server.run.evaluator import Evaluator, metrics_of_many


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="CIFAR-10 ImageFolder tree or .tar.gz")
    parser.add_argument("--cache", default=None, help="data cache dir (default: a temp dir)")
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--population", choices=("gap", "train"), default="gap", help="pop_gap, or eval_train alone")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.seeds < 1 or args.repeats < 1:
        parser.error("--jobs, --seeds and --repeats must be >= 1")
    require_data(parser, "--data", args.data)
    from benchmarks.stacked_sweep import composed

    cache = args.cache or tempfile.mkdtemp(prefix="population-eval-")
    cfgs = [
        composed(
            [
                "+sweep=convex_seed000",
                "data=cifar10_folder",
                f"data.root={args.data}",
                f"data.cache_dir={cache}",
                f"seed={seed}",
                f"run_dir={cache}/run",
                *(["eval_gap=false"] if args.population == "train" else []),
            ]
        )  # fmt: skip
        for seed in range(args.seeds)
    ]
    ds = server_dataset(cfgs[0])
    start = time.perf_counter()
    evaluators = [Evaluator(cfg, ds) for cfg in cfgs]
    print(f"evaluators of {args.seeds} seeds built in {time.perf_counter() - start:.1f} s", flush=True)
    rng = np.random.default_rng(0)
    shapes = {k: v.shape for k, v in evaluators[0].model.state_dict().items()}
    models = [{k: rng.normal(0, 1e-3, s).astype(np.float32) for k, s in shapes.items()} for _ in range(args.jobs)]
    pairs = [(evaluators[j % args.seeds], m) for j, m in enumerate(models)]
    times: dict[str, list[float]] = {"one at a time": [], "one pass": []}
    for _ in range(args.repeats):
        t = time.perf_counter()
        alone = [e.metrics(m) for e, m in pairs]
        times["one at a time"].append(time.perf_counter() - t)
        t = time.perf_counter()
        together = metrics_of_many(pairs)
        times["one pass"].append(time.perf_counter() - t)
    diff = max(
        abs(a[k] - b[k]) / max(abs(a[k]), 1e-300) for a, b in zip(alone, together) for k in a if k.startswith("pop_")
    )
    same = all(a[k] == b[k] for a, b in zip(alone, together) for k in a if not k.startswith("pop_"))
    medians = {mode: statistics.median(ts) for mode, ts in times.items()}
    result = {
        "population": args.population,
        "jobs": args.jobs,
        "seeds": args.seeds,
        "seconds": medians,
        "ratio": medians["one at a time"] / medians["one pass"],
        "max_rel_diff_pop": diff,
        "other_columns_equal": same,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
