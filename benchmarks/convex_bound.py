"""How long the convex study must take on this machine: a compute bound from measured matrix throughput.

The study's cost is its local steps. One step of the convex setting (docs/convex.md: ``model=logreg`` on CIFAR-10,
C = 10 classes, D = 3·32·32 inputs, B = 64, A = 10 clients of a round stacked) is two batched matrix products,
logits = W Xᵀ and ∇W = G X, i.e. 2 · 2ACBD flops; everything else in a step is O(ACB + ACD). This script times

- the project's own stacked step (``client.linear.LinearChunk._grads``, what ``engine=batched`` runs) on tensors of
  that shape, and
- a square float32 matrix product (n = 2048), the most this CPU's BLAS gets out of a core,

both with one thread (the study runs one process per core), then prints the study's total flops (the default of
``studies/convex_study.py``, counted from its grids: 550,000 final + 39,500 tuning rounds of 8 steps) and the
time they need at each rate, with every core busy. The second figure is a floor no implementation on these cores goes
below; the measured per-round time of a real run (``--runs``: run dirs, ``metrics.jsonl`` ``seconds`` of rounds
without evaluation) is what the study costs today.

    python -m benchmarks.convex_bound [--cores 2] [--repeat 200] [--runs RUN_DIR ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

import torch

from client.linear import BIAS, WEIGHT, LinearChunk
from studies import convex_study  # the study whose rounds are counted

A, B, C, D = 10, 64, 10, 3 * 32 * 32
STEPS_PER_ROUND = 8  # one epoch of 500 examples at B = 64


def study_rounds() -> int:
    """Rounds of convex_study.py's default: final (6 methods x 3 variants + 4 paper 2 methods) + tuning grids."""
    full, seed001_grid = convex_study.SCALES["full"], math.prod(len(v) for v in convex_study.ETA_GRID.values())
    tune_jobs = sum(math.prod(len(v) for v in grid.values()) for grid in convex_study.GRIDS.values())
    tune_jobs += len(convex_study.SEED001) * seed001_grid
    final_jobs = (3 * len(convex_study.METHODS) + len(convex_study.SEED001)) * full["seeds"]
    return final_jobs * full["rounds"] + tune_jobs * full["tune_rounds"]


ROUNDS = study_rounds()


def _best(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def step_seconds(repeat: int) -> float:
    """Seconds of one stacked logreg step's gradient (the engine's code), best of ``repeat``."""
    g = torch.Generator().manual_seed(0)
    params = {WEIGHT: torch.randn(A, C, D, generator=g) * 0.01, BIAS: torch.zeros(A, C)}
    xs, ys = torch.randn(A, B, D, generator=g), torch.randint(0, C, (A, B), generator=g)
    masks = torch.ones(A, B, dtype=torch.bool)
    return _best(lambda: LinearChunk._grads(None, params, xs, ys, masks), repeat)  # type: ignore[arg-type]


def gemm_gflops(n: int = 2048, repeat: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / _best(lambda: a @ b, repeat) / 1e9


def run_round_seconds(run_dirs: list[str]) -> list[float]:
    """Median seconds of the rounds without evaluation of each run."""
    out = []
    for d in run_dirs:
        rows = [json.loads(line) for line in open(Path(d) / "metrics.jsonl")]
        out.append(statistics.median(r["seconds"] for r in rows[1:] if "pop_gap" not in r and "seconds" in r))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cores", type=int, default=os.cpu_count(), help="processes running the study at once")
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--runs", nargs="*", default=[], help="run dirs of study runs (their per-round seconds)")
    args = p.parse_args()
    if args.cores < 1 or args.repeat < 1:
        p.error("--cores and --repeat must be >= 1")
    torch.set_num_threads(1)
    flops_step = 2 * (2 * A * C * B * D)
    total = flops_step * STEPS_PER_ROUND * ROUNDS
    step = step_seconds(args.repeat)
    peak = gemm_gflops()
    print(
        f"stacked logreg step (A={A}, B={B}, C={C}, D={D}): {step * 1e3:.2f} ms, {flops_step / step / 1e9:.1f} "
        f"GFLOP/s on one thread; float32 GEMM n=2048: {peak:.1f} GFLOP/s"
    )
    print(
        f"study: {ROUNDS:,} rounds x {STEPS_PER_ROUND} steps x {flops_step / 1e6:.1f} MFLOP = {total / 1e12:.0f} "
        f"TFLOP; on {args.cores} cores: {total / (flops_step / step) / args.cores / 60:.0f} min at the step's rate, "
        f"{total / (peak * 1e9) / args.cores / 60:.0f} min at the GEMM rate (a floor), 90 min allowed"
    )
    for d, s in zip(args.runs, run_round_seconds(args.runs)):
        print(
            f"run {d}: {s * 1e3:.0f} ms per round without evaluation -> {ROUNDS * s / args.cores / 3600:.1f} h "
            f"for the study's rounds on {args.cores} cores"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
