"""Paper 2 Section 3-4: surrogate loss of LocalUpdate on scalar quadratic clients, and LocalUpdate itself.

Clients f_i(x) = 1/2 A_i (x - c_i)^2 with A_i = i, c_i = 1/i: (a) the two-point example (i in {1, 2},
equally likely), (b) the continuous example of Figure 1 (density 8i/15 on [0.5, 2]), represented exactly by
Gauss-Legendre nodes (E[Q_i A_i] is a polynomial expectation of degree K + 1 in i).
Surrogate minimizer x*(gamma, Theta) = E[Q_i A_i]^{-1} E[Q_i A_i c_i] (Lemma 6, Property 2).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from strategies import math as fm
from strategies import schedules
from theory import closed_forms as cf
from theory.output import new_figure, save_figure, write_outputs
from theory.problems import localupdate_client

EXAMPLES = ("two-point", "figure1")


@dataclass(frozen=True)
class ClientPopulation:
    """Scalar quadratic clients with probabilities ``probs`` (sum 1)."""

    A: np.ndarray
    c: np.ndarray
    probs: np.ndarray


def population(example: str, nodes: int = 24) -> ClientPopulation:
    if example == "two-point":
        z = np.array([1.0, 2.0])
        return ClientPopulation(z, 1.0 / z, np.array([0.5, 0.5]))
    if example == "figure1":
        x, w = np.polynomial.legendre.leggauss(nodes)
        i = 1.25 + 0.75 * x  # [-1, 1] -> [0.5, 2]
        probs = w * 0.75 * (8.0 * i / 15.0)
        return ClientPopulation(i, 1.0 / i, probs)
    raise ValueError(f"--example must be one of {EXAMPLES}, got {example!r}")


def true_minimizer(pop: ClientPopulation) -> float:
    """x* = E[A_i]^{-1} E[A_i c_i] (minimizer of f = E f_i)."""
    return float(np.sum(pop.probs * pop.A * pop.c) / np.sum(pop.probs * pop.A))


def surrogate_minimizer(pop: ClientPopulation, gamma: float, theta: np.ndarray) -> float:
    """x*(gamma, Theta) = E[Q_i A_i]^{-1} E[Q_i A_i c_i], Q_i from Eq. 8 by matrix powers."""
    Q = np.array([cf.distortion_matrix(a, gamma, theta)[0, 0] for a in pop.A])
    return float(np.sum(pop.probs * Q * pop.A * pop.c) / np.sum(pop.probs * Q * pop.A))


def run_localupdate(
    pop: ClientPopulation,
    gammas: np.ndarray,
    thetas: np.ndarray,
    rounds: int = 2000,
    decay: float = 0.5,
    eta0: np.ndarray | None = None,
) -> np.ndarray:
    """LocalUpdate (Algorithms 1-2) through the shared client/server functions, all clients every round.

    Lanes = configurations (gamma_m, Theta_m; Theta rows padded with trailing zeros). Server lr
    eta_t = eta0 / t^decay (shared ``scheduled_lr``), eta0 = 1 / (2 x the measured curvature of the mean update)
    unless given. Returns the
    trajectory, shape (rounds + 1, lanes), from x_0 = 0.
    """
    gammas = np.asarray(gammas, dtype=float)
    lanes_theta = thetas.T[:, :, None]  # (K, lanes, 1): one weight per lane and step

    def grad(y: np.ndarray) -> np.ndarray:
        return pop.A * (y - pop.c)

    def mean_update(x: np.ndarray) -> np.ndarray:
        q = localupdate_client(np.repeat(x[:, None], pop.A.size, axis=1), grad, gammas[:, None], lanes_theta)
        return fm.weighted_mean([[q[:, k]] for k in range(pop.A.size)], pop.probs)[0]

    # curvature of the mean update, measured through the client code itself (the update is affine in x)
    with np.errstate(over="ignore", invalid="ignore"):  # a gamma so large that it overflows is refused below
        curvature = mean_update(np.ones(gammas.size)) - mean_update(np.zeros(gammas.size))
    if not np.all((curvature > 0) & np.isfinite(curvature)):
        raise ValueError(
            "E[Q_i A_i] <= 0 for this (gamma, Theta): the surrogate loss has no minimizer "
            "and LocalUpdate diverges; use a smaller --gamma"
        )
    eta0 = 0.5 / curvature if eta0 is None else np.asarray(eta0, dtype=float)
    x = np.zeros(gammas.size)
    traj = [x.copy()]
    for t in range(1, rounds + 1):
        mean = [mean_update(x)]
        x = fm.localupdate_server_update([x], mean, schedules.scheduled_lr(eta0, "polynomial", decay, t))[0]
        traj.append(x.copy())
    return np.array(traj)


def theta_matrix(theta: str, Ks: list[int]) -> np.ndarray:
    """Theta vectors for each K (shared ``theta_weights``), padded with trailing zeros."""
    rows = [fm.theta_weights(theta, K) for K in Ks]
    out = np.zeros((len(rows), max(Ks)))
    for k, row in enumerate(rows):
        out[k, : row.size] = row
    return out


def point(example: str, gamma: float, K: int, theta: str = "fedavg", rounds: int = 2000) -> dict:
    """The three minimizers for one configuration (CLI single-point mode)."""
    if gamma < 0:
        raise ValueError(f"--gamma must be >= 0, got {gamma}")
    pop = population(example)
    th = theta_matrix(theta, [K])
    x_lu = run_localupdate(pop, np.array([gamma]), th, rounds)[-1, 0]
    return {
        "example": example,
        "gamma": gamma,
        "K": K,
        "theta": theta,
        "x_true": true_minimizer(pop),
        "x_surrogate": surrogate_minimizer(pop, gamma, th[0]),
        "x_localupdate": float(x_lu),
    }


def sweep(rounds: int = 2000) -> dict:
    """(a) two-point: vs gamma (Theta_{1:2}) and vs K (gamma = 1/2); (b) Figure 1 grid of (gamma, K)."""
    rows, curves = [], {}
    configs = [("two-point", g, 2, "gamma") for g in (0.0, 0.1, 0.2, 0.3, 0.4)]
    configs += [("two-point", 0.5, K, "K") for K in (1, 2, 3, 5, 10, 20)]
    configs += [("figure1", g, 10, "gamma") for g in (0.0, 0.1, 0.3, 0.5)]
    configs += [("figure1", 0.3, K, "K") for K in (1, 2, 5, 20)]
    for example in EXAMPLES:
        cfgs = [c for c in configs if c[0] == example]
        pop = population(example)
        thetas = theta_matrix("fedavg", [c[2] for c in cfgs])
        traj = run_localupdate(pop, np.array([c[1] for c in cfgs]), thetas, rounds)
        for k, (_, gamma, K, varied) in enumerate(cfgs):
            x_s = surrogate_minimizer(pop, gamma, thetas[k])
            if example == "two-point":
                closed = cf.two_point_surrogate_gamma(gamma) if varied == "gamma" else cf.two_point_surrogate_K(K)
            else:
                closed = None
            rows.append(
                {
                    "example": example,
                    "varied": varied,
                    "gamma": gamma,
                    "K": K,
                    "x_true": true_minimizer(pop),
                    "x_avg_client_opt": float(np.sum(pop.probs * pop.c)),
                    "x_surrogate": x_s,
                    "x_surrogate_closed_form": closed,
                    "x_localupdate": float(traj[-1, k]),
                    "lu_minus_surrogate": float(traj[-1, k] - x_s),
                }
            )
            curves[f"{example}|{varied}|gamma={gamma}|K={K}"] = traj[:, k]
    return {"rows": rows, "curves": curves, "setup": {"rounds": rounds, "theta": "fedavg (Theta_{1:K})"}}


def run_surrogate(outdir: str | os.PathLike, rounds: int = 2000) -> dict:
    payload = sweep(rounds)
    fig, axes = new_figure(2)
    for ax, varied in zip(axes, ("gamma", "K")):
        for name, curve in payload["curves"].items():
            example, v, g, K = name.split("|")
            if example == "figure1" and v == varied:
                (h,) = ax.plot(curve, lw=1, label=f"{g}, {K}")
                row = next(
                    r
                    for r in payload["rows"]
                    if f"gamma={r['gamma']}" == g
                    and f"K={r['K']}" == K
                    and r["example"] == example
                    and r["varied"] == v
                )
                ax.axhline(row["x_surrogate"], ls=":", color=h.get_color(), lw=1)
        r0 = next(r for r in payload["rows"] if r["example"] == "figure1")
        ax.axhline(r0["x_true"], color="k", lw=1.5, label="x* (true)")
        ax.axhline(r0["x_avg_client_opt"], color="gray", ls="--", lw=1, label="E[c_i]")
        ax.set(xscale="log", xlabel="round", ylabel="x_t", title=f"LocalUpdate, Figure 1 problem (vary {varied})")
        ax.legend(fontsize=7)
    rows = payload["rows"]
    payload["paths"] = write_outputs(outdir, "surrogate", rows, {"rows": rows, "setup": payload["setup"]})
    payload["paths"]["png"] = save_figure(fig, outdir, "surrogate")
    return payload
