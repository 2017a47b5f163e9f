"""Where the oscillation is centred: the cycle mean of each method when the two clients' curvatures differ.

Lemma III.4's clients share the curvature mu, so every method's period-2 steady state is centred on x* = 0 (its input
±G has mean 0: ``seed000.limit_cycle``'s ``cycle_mean_sim``). Give client 2 the curvature mu (1 + h) and client 1
mu (1 − h): f = (f_1 + f_2)/2 is still minimised at x* = 0, but the round map now alternates, and the cycle mean
(θ^T + θ^{T−1})/2 moves off x*. On real data (docs/findings.md) FedAvg's and FedAvgM's cycle
means coincide and GHBM's lies lower; this experiment asks whether unequal curvature alone reproduces either.
Every round goes through ``strategies.math`` (``MomentumRound``, ``GHBMRound``); FedAvg's cycle is also checked
against its closed form (``closed_forms.fedavg_cycle``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from theory import closed_forms as cf
from theory.driver import Schedule, run_fast
from theory.ghbm import GHBMRound
from theory.output import write_outputs
from theory.problems import MomentumRound
from theory.state_driver import run_state_fast

MU, G, CLIENT_LR = 2.0, 1.0, 0.1  # J eta_l = CLIENT_LR held fixed as J varies; server lr 1
BETA = 0.9


def methods(mu_odd: float, mu_even: float, J: int) -> dict[str, tuple[Any, float]]:
    """name -> (round, its scheduled lr): every method takes J steps of eta_l = CLIENT_LR / J and server lr 1 (the
    heavy ball's steady step is the server lr whatever beta); FedAvg/FedAvgM/FedCM schedule the server lr, the GHBM
    family the client lr."""
    lr = CLIENT_LR / J
    kw = {"mu": mu_odd, "mu_even": mu_even, "local_steps": J}
    rounds: dict[str, tuple[Any, float]] = {
        "fedavg": (MomentumRound("fedavgm", client_lr=lr, momentum=0.0, **kw), 1.0),
        "fedavgm": (MomentumRound("fedavgm", client_lr=lr, momentum=BETA, **kw), 1.0),
        "fedcm": (MomentumRound("fedcm", client_lr=lr, momentum=BETA, **kw), 1.0),
    }
    for tau in (1, 2, 3):
        rounds[f"ghbm_tau{tau}"] = (GHBMRound("ghbm", tau=tau, momentum=BETA, **kw), lr)
    rounds["localghbm"] = (GHBMRound("localghbm", momentum=BETA, **kw), lr)
    rounds["fedhbm"] = (GHBMRound("fedhbm", momentum=1.0, **kw), lr)
    return rounds


def last_cycle(rf: Any, lr: float, T: int) -> tuple[float, float]:
    """(θ^T + θ^{T−1})/2 and |θ^T − θ^{T−1}|/2 from θ^0 = 0 with input G."""
    sched = Schedule(np.array([lr]), "constant", np.array([1.0]))
    if isinstance(rf, MomentumRound):
        theta, prev = run_fast(rf, sched, 0.0, G, T)
        a, b = float(theta[0, 0]), float(prev[0, 0])
    else:
        out = run_state_fast(rf, rf.dim, sched, rf.initial_state(0.0), G, T, [T - 1, T])
        b, a = float(out[0][0]), float(out[1][0])
    return (a + b) / 2.0, abs(a - b) / 2.0


def cycle_mean(hs: tuple[float, ...] = (0.0, 0.25, 0.5), Js: tuple[int, ...] = (1, 5), T: int = 20_000) -> dict:
    """Every method's cycle mean and half-spread for each curvature split h and J."""
    rows = []
    for h in hs:
        mu_odd, mu_even = MU * (1.0 - h), MU * (1.0 + h)
        for J in Js:
            closed = cf.fedavg_cycle(1.0, CLIENT_LR / J, mu_odd, mu_even, J, G)
            for name, (rf, lr) in methods(mu_odd, mu_even, J).items():
                with np.errstate(over="ignore", invalid="ignore"):
                    mean, spread = last_cycle(rf, lr, T)
                rows.append(
                    {
                        "h": h,
                        "mu_odd": mu_odd,
                        "mu_even": mu_even,
                        "J": J,
                        "algorithm": name,
                        "cycle_mean": mean,
                        "half_spread": spread,
                        "mean_over_spread": mean / spread if spread else None,
                        "fedavg_closed_mean": float(closed[0]),
                        "fedavg_closed_spread": float(closed[1]),
                    }
                )
    return {"rows": rows, "setup": {"mu": MU, "G": G, "J_client_lr": CLIENT_LR, "beta": BETA, "T": T, "x_star": 0.0}}


def run_cycle_mean(outdir: str | os.PathLike, T: int = 20_000) -> dict:
    payload = cycle_mean(T=T)
    columns = ["h", "J", "algorithm", "cycle_mean", "half_spread", "mean_over_spread", "fedavg_closed_mean"]
    notes = [
        "x* = 0 for every h; cycle_mean = (θ^T + θ^{T−1})/2 from θ^0 = 0, G = 1, server lr 1, J η_l = 0.1, "
        "β = 0.9 (FedHBM β = 1); fedavg_closed_mean: closed_forms.fedavg_cycle"
    ]
    payload["paths"] = write_outputs(outdir, "cycle_mean", payload["rows"], payload, columns, notes)
    return payload
