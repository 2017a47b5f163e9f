"""Speed of the theory package: full Table I (90 runs x 10^6 rounds) vs naive loops, and `flower-theory all`.

Usage: python -m benchmarks.theory_speed [--naive-rounds N] [--full-naive] [--skip-all]

Naive baselines (same run, same machine), each one configuration at a time:
  * "formula loop": the Corollary B.12 recurrence written inline with Python floats (no shared functions);
  * "shared-function loop": one round = the shared strategies.math calls (theory.problems.MomentumRound).
They are timed on N rounds of every configuration and extrapolated linearly to 10^6 rounds
(--full-naive runs them for the full 10^6 rounds instead; the formula loop then takes about a minute).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from theory import paper_values as pv
from theory.experiments import tables
from theory.problems import MomentumRound

T = 10**6
MU, EPS, BETA = 2.0, 1e-2, 0.9


def configurations() -> list[tuple[float, str, float | None, float, float, float]]:
    """(beta, schedule, param, eta0, G, theta0) for the 90 Table I runs."""
    out = []
    for beta in (BETA, 0.0):
        eta0 = tables.initial_step(beta, MU, EPS)
        for schedule, param in pv.ROWS:
            for G, th0 in pv.COLUMNS:
                out.append((beta, schedule, param, eta0, G, th0))
    return out


def eta_t(schedule: str, param: float | None, eta0: float, t: int) -> float:
    if schedule == "const":
        return eta0 / T
    return eta0 / t**param if schedule == "poly" else eta0 * param**t


def formula_loop(cfg, rounds: int) -> float:
    beta, schedule, param, eta0, G, th0 = cfg
    th = prev = th0
    for t in range(1, rounds + 1):
        e = eta_t(schedule, param, eta0, t) * (1 - beta)
        th, prev = (1 + beta - MU * e) * th - beta * prev + (-1) ** t * e * G, th
    return th


def shared_loop(cfg, rounds: int) -> float:
    beta, schedule, param, eta0, G, th0 = cfg
    rf = MomentumRound("fedavgm", mu=MU, client_lr=1.0, momentum=beta)
    th = prev = th0
    for t in range(1, rounds + 1):
        th, prev = rf(th, prev, G, t, eta_t(schedule, param, eta0, t)), th
    return th


def time_naive(fn, rounds: int) -> float:
    """Seconds for all 90 configurations x 10^6 rounds, extrapolated from ``rounds`` rounds each."""
    start = time.perf_counter()
    for cfg in configurations():
        fn(cfg, rounds)
    return (time.perf_counter() - start) * T / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--naive-rounds", type=int, default=20_000)
    parser.add_argument("--full-naive", action="store_true")
    parser.add_argument("--skip-all", action="store_true")
    args = parser.parse_args()
    rounds = T if args.full_naive else args.naive_rounds

    start = time.perf_counter()
    payload = tables.table1()
    fast = time.perf_counter() - start
    matched = sum(e["match"] for e in payload["entries"])
    print(f"fast driver, Table I (90 runs x 10^6 rounds): {fast:.2f} s ({matched}/90 entries match the paper)")

    formula = time_naive(formula_loop, rounds)
    shared = time_naive(shared_loop, min(rounds, 2000) if not args.full_naive else rounds)
    how = "measured" if args.full_naive else f"extrapolated from {rounds} rounds per configuration"
    print(f"naive formula loop: {formula:.1f} s ({how}); speed-up x{formula / fast:.0f}")
    print(f"naive shared-function loop: {shared:.1f} s (extrapolated); speed-up x{shared / fast:.0f}")

    if not args.skip_all:
        from theory.cli import main as cli_main

        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            cli_main(["all", "--out", os.path.join(out, "theory")])
            print(f"flower-theory all: {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
