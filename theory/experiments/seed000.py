"""Paper 1 dynamics experiments: limit cycle (Thm III.5), decay rates (Thm III.6), local steps (Eq. 5-7)."""

from __future__ import annotations

import os

import numpy as np

from theory import closed_forms as cf
from theory.driver import Schedule, log_checkpoints, round_maps, run_fast
from theory.output import new_figure, save_figure, write_outputs
from theory.problems import MomentumRound

MU = 2.0


# --------------------------------------------------------------------------- Thm III.5
def limit_cycle(
    betas: tuple[float, ...] = (0.0, 0.5, 0.9),
    fractions: tuple[float, ...] = tuple(np.round(np.linspace(0.05, 0.95, 10), 3)) + (1.05, 1.25),
    T: int = 20_000,
    G: float = 1.0,
    mu: float = MU,
) -> dict:
    """Constant eta = f * eta_max(beta) (Eq. 9): simulated stability and limit-cycle amplitude vs Eq. 10."""
    grid = [(b, f * cf.stability_bound(b, mu), f) for b in betas for f in fractions]
    beta = np.array([g[0] for g in grid])
    eta = np.array([g[1] for g in grid])
    sched = Schedule(eta, "constant", np.ones_like(eta))
    rf = MomentumRound("fedavgm", mu=mu, client_lr=1.0, momentum=beta)
    with np.errstate(over="ignore", invalid="ignore"):
        zir, _ = run_fast(rf, sched, 1.0, 0.0, T)  # zero-input response: theta0 = 1, G = 0
        zsr = run_fast(rf, sched, 0.0, G, T)  # zero-state response: theta0 = 0
    rows = []
    for k, (b, e, f) in enumerate(grid):
        stable_sim = bool(np.isfinite(zir[0, k]) and abs(zir[0, k]) < 1e-8)
        amp_sim = float(max(abs(zsr[0][0, k]), abs(zsr[1][0, k]))) if stable_sim else None
        amp_cf = float(cf.limit_cycle_amplitude(e, b, mu, G)) if f < 1 else None
        rows.append(
            {
                "beta": b,
                "eta": float(e),
                "eta_over_bound": f,
                "stable_sim": stable_sim,
                "stable_eq9": bool(f < 1.0),
                "amplitude_sim": amp_sim,
                "amplitude_eq10": amp_cf,
                "cycle_mean_sim": _cycle_mean(zsr, k, stable_sim),
                "rel_err": None if amp_sim is None or amp_cf is None else abs(amp_sim - amp_cf) / amp_cf,
            }
        )
    return {"rows": rows, "setup": {"T": T, "G": G, "mu": mu}}


def _cycle_mean(response: tuple[np.ndarray, np.ndarray], lane: int, stable: bool = True) -> float | None:
    """(θ^T + θ^{T−1}) / 2: the mean of the last period-2 cycle, the point the oscillation is around. The round map is
    linear with the zero-mean input ±G, so in the periodic steady state it is (I − A)⁻¹ B · mean(input) = 0 = x*,
    with or without momentum (docs/findings.md, where the real data disagrees)."""
    return float((response[0][0, lane] + response[1][0, lane]) / 2) if stable else None


def run_limit_cycle(outdir: str | os.PathLike, T: int = 20_000) -> dict:
    payload = limit_cycle(T=T)
    fig, (ax,) = new_figure()
    for b in sorted({r["beta"] for r in payload["rows"]}):
        rs = [r for r in payload["rows"] if r["beta"] == b and r["amplitude_sim"] is not None]
        line = np.linspace(0, max(r["eta"] for r in rs) * 1.02, 200)
        (h,) = ax.plot(line, cf.limit_cycle_amplitude(line, b, MU, 1.0), lw=1)
        ax.plot([r["eta"] for r in rs], [r["amplitude_sim"] for r in rs], "o", color=h.get_color(), label=f"beta={b}")
    ax.set(
        xlabel="eta", ylabel="limit-cycle amplitude |theta^t| (G=1)", yscale="log", title="Thm III.5: Eq. 10 (lines)"
    )
    ax.legend()
    payload["paths"] = write_outputs(outdir, "limit_cycle", payload["rows"], payload)
    payload["paths"]["png"] = save_figure(fig, outdir, "limit_cycle")
    return payload


# --------------------------------------------------------------------------- Thm III.6
RATE_CASES = ((0.25, 1.0), (0.5, 1.0), (0.75, 1.0), (1.0, 0.3), (1.0, 0.95), (2.0, 1.0))  # (alpha, eta)


def rates(T: int = 10**6, beta: float = 0.9, G: float = 10.0, mu: float = MU, cases=RATE_CASES) -> dict:
    """Fitted log-log exponent of f(theta^t) = mu/2 theta^2 (envelope over t-1, t) on [T/10, T], theta0 = 0."""
    alphas = np.array([c[0] for c in cases])
    etas = np.array([c[1] for c in cases])
    rf = MomentumRound("fedavgm", mu=mu, client_lr=1.0, momentum=beta)
    checks = log_checkpoints(T, 80)
    th, prev = run_fast(rf, Schedule(etas, "polynomial", alphas), 0.0, G, T, checks)
    f = 0.5 * mu * np.maximum(th**2, prev**2)
    t = np.array(checks, dtype=float)
    sel = t >= T / 10
    rows, curves = [], {}
    for k, (a, e) in enumerate(cases):
        slope = np.polyfit(np.log(t[sel]), np.log(f[sel, k]), 1)[0]
        expected = cf.rate_exponent(a, mu, e)
        rows.append(
            {
                "alpha": a,
                "eta": e,
                "mu_eta": mu * e,
                "fitted_exponent": float(-slope),
                "theorem_exponent": expected,
                "abs_err": abs(-slope - expected),
                "f_T": float(f[-1, k]),
            }
        )
        curves[f"alpha={a},eta={e}"] = f[:, k].tolist()
    return {"rows": rows, "t": t.tolist(), "curves": curves, "setup": {"T": T, "beta": beta, "G": G, "mu": mu}}


def run_rates(outdir: str | os.PathLike, T: int = 10**6) -> dict:
    payload = rates(T=T)
    fig, (ax,) = new_figure()
    for name, curve in payload["curves"].items():
        ax.loglog(payload["t"], curve, label=name)
    ax.set(xlabel="t", ylabel="f(theta^t) - f*", title="Thm III.6 (FedAvgM, beta=0.9, theta0=0)")
    ax.legend(fontsize=7)
    payload["paths"] = write_outputs(outdir, "rates", payload["rows"], {k: payload[k] for k in ("rows", "setup")})
    payload["paths"]["png"] = save_figure(fig, outdir, "rates")
    return payload


# --------------------------------------------------------------------------- Eq. 5-7
def local_steps(
    Js: tuple[int, ...] = (1, 2, 5, 10),
    eta_t: float = 1.0,
    eta_l: float = 0.05,
    beta: float = 0.9,
    G: float = 10.0,
    T: int = 20_000,
    mu: float = MU,
) -> dict:
    """p, q, r measured from one round of the client/server functions, and the limit cycle, vs Eq. 5-7."""
    rows = []
    for algorithm in ("fedavgm", "fedcm"):
        for J in Js:
            rf = MomentumRound(algorithm, mu=mu, client_lr=eta_l, momentum=beta, local_steps=J)
            sched = Schedule(np.array([eta_t]), "constant", np.array([1.0]))
            m = round_maps(rf, sched, np.array([2.0]))[:, :, 0, 0]  # even round: client 2, input +q G
            p, r, q = m[0, 0], -m[0, 1], m[0, 2]
            closed = (cf.pqr_fedavgm if algorithm == "fedavgm" else cf.pqr_fedcm)(eta_t, eta_l, beta, mu, J)
            th, prev = run_fast(rf, sched, 0.0, G, T)
            amp_sim = float(max(abs(th[0, 0]), abs(prev[0, 0])))
            rows.append(
                {
                    "algorithm": algorithm,
                    "J": J,
                    "p": p,
                    "p_eq": closed[0],
                    "q": q,
                    "q_eq": closed[1],
                    "r": r,
                    "r_eq": closed[2],
                    "rho": float(cf.spectral_radius(p, r)),
                    "amplitude_sim": amp_sim,
                    "cycle_mean_sim": _cycle_mean((th, prev), 0),
                    "amplitude_cf": float(cf.periodic_amplitude(*closed, G)),
                    "q_lower_eq7": eta_t * eta_l * (1 - beta),
                }
            )
    for row in rows:
        if row["algorithm"] == "fedcm":
            avgm = next(r for r in rows if r["algorithm"] == "fedavgm" and r["J"] == row["J"])
            row["q_cm_ge_q_avgm"] = bool(row["q"] >= avgm["q"] * (1 - 1e-12))
    return {"rows": rows, "setup": {"eta_t": eta_t, "eta_l": eta_l, "beta": beta, "G": G, "T": T, "mu": mu}}


def run_local_steps(outdir: str | os.PathLike, T: int = 20_000) -> dict:
    payload = local_steps(T=T)
    fig, axes = new_figure(2)
    for algorithm, marker in (("fedavgm", "o"), ("fedcm", "s")):
        rs = [r for r in payload["rows"] if r["algorithm"] == algorithm]
        Js = [r["J"] for r in rs]
        axes[0].plot(Js, [r["q"] for r in rs], marker, label=f"{algorithm} measured")
        axes[0].plot(Js, [r["q_eq"] for r in rs], "-", lw=1, label=f"{algorithm} Eq. 5/6")
        axes[1].plot(Js, [r["amplitude_sim"] for r in rs], marker, label=f"{algorithm} simulated")
        axes[1].plot(Js, [r["amplitude_cf"] for r in rs], "-", lw=1, label=f"{algorithm} qG/(1+p+r)")
    axes[0].set(xlabel="local steps J", ylabel="q (input gain)", title="Eq. 7: q_CM >= q_AvgM")
    axes[1].set(xlabel="local steps J", ylabel="limit-cycle amplitude")
    for ax in axes:
        ax.legend(fontsize=7)
    payload["paths"] = write_outputs(outdir, "local_steps", payload["rows"], payload)
    payload["paths"]["png"] = save_figure(fig, outdir, "local_steps")
    return payload
