"""Speed of the GHBM theory runs against paper 1's Table I, measured in the same run.

Usage: python -m benchmarks.ghbm_theory_speed [--loop-rounds N] [--skip-cli]

Prints: the FedAvgM/FedCM Table I driver (theory.driver, 2x3 maps, 90 lanes x 10^6 rounds) as the baseline; the
state driver (theory.state_driver) for each GHBM variant on Table I's 9 schedules x 10^6 rounds, with the state
dimension d; the per-round loop through the same shared functions (extrapolated from N rounds) for GHBM(tau=4);
and `flower-theory ghbm` end to end (Table I, limit cycle, rates at T = 10^6).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from theory import paper_values as pv
from theory.driver import Schedule
from theory.experiments import ghbm as exp
from theory.experiments import tables
from theory.state_driver import run_state_loop, state_segment_map

T = 10**6


def table_schedule() -> Schedule:
    kinds = [tables.KIND[r[0]] for r in pv.ROWS]
    step0 = tables.initial_step(exp.BETA, exp.MU, exp.EPS) * (1 - exp.BETA)
    base = np.array([step0 / T if k == "constant" else step0 for k in kinds])
    return Schedule(base, kinds, np.array([1.0 if p is None else p for _, p in pv.ROWS]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop-rounds", type=int, default=20_000)
    parser.add_argument("--skip-cli", action="store_true")
    args = parser.parse_args()

    start = time.perf_counter()
    tables.table1()
    base = time.perf_counter() - start
    print(f"baseline: FedAvgM/FedCM Table I, 2x3 maps, 90 lanes x 10^6 rounds: {base:.2f} s")
    sched, total = table_schedule(), 0.0
    for name, rf in exp.family().items():
        start = time.perf_counter()
        state_segment_map(rf, rf.dim, sched, 1, T)
        took = time.perf_counter() - start
        total += took
        print(f"{name} (d = {rf.dim}), 9 lanes x 10^6 rounds: {took:.2f} s")
    print(
        f"GHBM family on Table I (5 variants x 9 lanes x 10^6 rounds): {total:.2f} s = x{total / base:.1f} the baseline"
    )
    rf = exp.family()["ghbm_tau4"]
    start = time.perf_counter()
    run_state_loop(rf, sched, rf.initial_state(0.0), 10.0, args.loop_rounds)
    loop = (time.perf_counter() - start) * T / args.loop_rounds
    print(
        f"per-round loop through the same functions, GHBM(tau=4), 9 lanes: {loop:.1f} s for 10^6 rounds "
        f"(extrapolated from {args.loop_rounds})"
    )
    if not args.skip_cli:
        from theory.cli import main as cli_main

        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            cli_main(["ghbm", "--out", os.path.join(out, "theory")])
            print(f"flower-theory ghbm: {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
