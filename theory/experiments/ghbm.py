"""Does GHBM escape the momentum limits of paper 1? GHBM(tau), LocalGHBM and FedHBM on Lemma III.4's problem.

Three measurements, side by side with FedAvgM and FedCM, all through ``strategies.math`` (theory/ghbm.py):

- ``table1``: paper 1 Table I's 9 schedules x 5 (G, theta0) columns, theta^T after T = 10^6 rounds. The
  momentum half of Table I is IGD with momentum = FedAvgM with J = 1, client lr 1, server lr eta_t; the GHBM
  family runs with J = 1, server lr 1 and the *client* step eta_l,t = eta_t (1 - beta) on the same schedule, so
  that GHBM(tau = 1) is exactly the same heavy ball (the "sgd" column: no momentum, same step).
- ``limit_cycle``: constant step; the 2-periodic limit-cycle amplitude for G in {1, 10, 100} vs beta and tau,
  beside the closed form eta_l G / (2 - mu eta_l + [tau odd] 2 beta / tau) (J = 1; substitute
  theta^t = A (-1)^t into the GHBM round), and the per-round zero-input contraction rho.
- ``rates``: Thm III.6's fitted decay exponents of f(theta^t) for eta_l,t = eta (1 - beta) / t^alpha, theta0 = 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from strategies import math as fm
from theory import closed_forms as cf
from theory import paper_values as pv
from theory.driver import Schedule, log_checkpoints, run_fast, segment_map
from theory.experiments.seed000 import RATE_CASES
from theory.experiments.tables import KIND, final_maps, initial_step, theta_T
from theory.ghbm import GHBMRound
from theory.problems import MomentumRound
from theory.state_driver import apply_state_map, run_state_fast, state_segment_map

MU, BETA, EPS = 2.0, 0.9, 1e-2
TAUS = (1, 2, 4)
FEDHBM_BETA = 1.0  # the authors' value


def family(beta: float = BETA, taus: tuple[int, ...] = TAUS, **kw: Any) -> dict[str, GHBMRound]:
    """The GHBM variants of one comparison, keyed by their column name."""
    rounds = {f"ghbm_tau{t}": GHBMRound("ghbm", tau=t, momentum=beta, **kw) for t in taus}
    rounds["localghbm"] = GHBMRound("localghbm", momentum=beta, **kw)
    rounds["fedhbm"] = GHBMRound("fedhbm", momentum=FEDHBM_BETA, **kw)
    return rounds


# --------------------------------------------------------------------------- Table I
def table1(T: int = 10**6, mu: float = MU, beta: float = BETA, eps: float = EPS) -> dict:
    """theta^T of every algorithm for Table I's schedules and (G, theta0) columns."""
    rows = list(pv.ROWS)
    kinds = [KIND[r[0]] for r in rows]
    params = np.array([1.0 if p is None else p for _, p in rows])
    eta0 = initial_step(beta, mu, eps)
    step0 = eta0 * (1.0 - beta)  # the heavy ball's effective step eta_t (1 - beta)
    columns: dict[str, Any] = {}
    for algorithm in ("fedavgm", "fedcm"):
        m = final_maps(rows, [beta] * len(rows), [eta0] * len(rows), T, mu, algorithm)
        columns[algorithm] = lambda G, th0, lane, m=m: float(theta_T(m[:, :, lane], G, th0))
    m_sgd = final_maps(rows, [0.0] * len(rows), [step0] * len(rows), T, mu, "fedavgm")
    columns["sgd"] = lambda G, th0, lane: float(theta_T(m_sgd[:, :, lane], G, th0))
    base = np.array([step0 / T if k == "constant" else step0 for k in kinds])
    sched = Schedule(base, kinds, params)
    for name, rf in family(beta, mu=mu).items():
        m = state_segment_map(rf, rf.dim, sched, 1, T)
        columns[name] = lambda G, th0, lane, m=m, rf=rf: float(
            apply_state_map(m[lane : lane + 1], rf.initial_state(th0), G)[0][0]
        )
    entries = []
    for lane, (schedule, param) in enumerate(rows):
        for (G, th0), paper in zip(pv.COLUMNS, pv.TABLE1_MOMENTUM[lane]):
            entry = {"schedule": schedule, "param": param, "G": G, "theta0": th0}
            entry.update({name: fn(G, th0, lane) for name, fn in columns.items()})
            entry["paper_momentum"] = paper
            entries.append(entry)
    setup = {
        "T": T,
        "mu": mu,
        "beta": beta,
        "fedhbm_beta": FEDHBM_BETA,
        "eps": eps,
        "eta0_fedavgm": eta0,
        "client_step0_ghbm": step0,
        "J": 1,
        "server_lr_ghbm": 1.0,
    }
    return {"entries": entries, "columns": list(columns), "setup": setup}


# --------------------------------------------------------------------------- constant step: limit cycle
def ghbm_amplitude(client_lr: Any, beta: Any, tau: int, mu: float, G: Any) -> Any:
    """Closed form of GHBM's 2-periodic limit cycle (J = 1, server lr 1): theta^t = A (-1)^t with
    A = eta_l G / (2 - mu eta_l + [tau odd] 2 beta / tau); tau = 1 is Eq. 10 with eta (1 - beta) = eta_l."""
    odd = 2.0 * beta / tau if tau % 2 else 0.0
    return client_lr * G / (2.0 - mu * client_lr + odd)


def _constant_runs(rounds: dict[str, Any], lr: float, T: int, Gs: tuple[float, ...]) -> dict[str, dict]:
    """Zero-input stability, zero-state amplitudes for each G, and rho of every (name -> round) at step lr."""
    sched = Schedule(np.array([lr]), "constant", np.array([1.0]))
    out = {}
    for name, rf in rounds.items():
        with np.errstate(over="ignore", invalid="ignore"):
            if isinstance(rf, MomentumRound):
                zir = run_fast(rf, sched, 1.0, 0.0, T)[0][0, 0]
                amps = [float(np.max(np.abs(run_fast(rf, sched, 0.0, G, T, [T - 1, T])[0]))) for G in Gs]
                period = segment_map(rf, sched, T - 1, T)[:, :2, 0]
            else:
                zir = run_state_fast(rf, rf.dim, sched, rf.initial_state(1.0), 0.0, T)[0, 0]
                amps = [
                    float(np.max(np.abs(run_state_fast(rf, rf.dim, sched, rf.initial_state(0.0), G, T, [T - 1, T]))))
                    for G in Gs
                ]
                period = state_segment_map(rf, rf.dim, sched, T - 1, T)[0, : rf.dim, : rf.dim]
        stable = bool(np.isfinite(zir) and abs(zir) < 1e-8)
        rho = None if not np.all(np.isfinite(period)) else float(np.max(np.abs(np.linalg.eigvals(period))) ** 0.5)
        out[name] = {"stable_sim": stable, "amps": amps if stable else [None] * len(Gs), "rho": rho}
    return out


def limit_cycle(
    client_lr: float = 0.1,
    betas: tuple[float, ...] = (0.0, 0.5, 0.9, 0.99, 1.0),
    taus: tuple[int, ...] = (1, 2, 3, 4),
    Gs: tuple[float, ...] = (1.0, 10.0, 100.0),
    Js: tuple[int, ...] = (1, 2, 5, 10),
    T: int = 20_000,
    mu: float = MU,
) -> dict:
    """Constant client step eta_l (J = 1, server lr 1); then J > 1 at beta = 0.9 with J eta_l fixed."""
    rows = []
    for beta in betas:
        rounds: dict[str, Any] = family(beta, taus, mu=mu)
        rounds["fedhbm"] = GHBMRound("fedhbm", momentum=beta, mu=mu)  # here beta varies for FedHBM too
        if beta < 1.0:  # FedAvgM / FedCM with eta (1 - beta) = eta_l and J = 1 are the same heavy ball
            eta = client_lr / (1.0 - beta)
            rounds["fedavgm"] = MomentumRound("fedavgm", mu=mu, client_lr=1.0, momentum=beta)
            rounds["fedcm"] = MomentumRound("fedcm", mu=mu, client_lr=1.0, momentum=beta)
        runs = {
            name: _constant_runs({name: rf}, eta if name in ("fedavgm", "fedcm") else client_lr, T, Gs)[name]
            for name, rf in rounds.items()
        }
        for name, run in runs.items():
            tau = _tau_of(name, rounds[name])
            cf_amp = ghbm_amplitude(client_lr, beta, tau or 1, mu, 1.0) if name != "fedhbm" else None
            rows.append(_cycle_row(name, beta, tau, 1, client_lr, run, Gs, cf_amp, mu))
    for J in Js:  # local steps: same J eta_l, beta = 0.9
        lr = client_lr / J
        rounds = {name: rf for name, rf in family(BETA, (1, 2), mu=mu, local_steps=J).items()}
        # FedAvgM / FedCM: server lr 1 / (1 - beta), client lr eta_l: the same heavy-ball scale as GHBM's server lr 1
        rounds["fedavgm"] = MomentumRound("fedavgm", mu=mu, client_lr=lr, momentum=BETA, local_steps=J)
        rounds["fedcm"] = MomentumRound("fedcm", mu=mu, client_lr=lr, momentum=BETA, local_steps=J)
        for name, rf in rounds.items():
            scheduled = 1.0 / (1.0 - BETA) if name in ("fedavgm", "fedcm") else lr  # server lr, resp. client lr
            run = _constant_runs({name: rf}, scheduled, T, Gs)[name]
            tau = _tau_of(name, rf)
            rows.append(_cycle_row(name, BETA if name != "fedhbm" else FEDHBM_BETA, tau, J, lr, run, Gs, None, mu))
    return {
        "rows": rows,
        "setup": {"T": T, "mu": mu, "client_lr": client_lr, "G": list(Gs), "fedhbm_beta_in_J_rows": FEDHBM_BETA},
    }


def _tau_of(name: str, rf: Any) -> int | None:
    """GHBM's tau; LocalGHBM's tau_i (= the period 2 here); FedAvgM/FedCM behave as tau = 1; FedHBM has none."""
    if isinstance(rf, GHBMRound):
        return rf.tau if rf.variant == "ghbm" else (2 if rf.variant == "localghbm" else None)
    return 1


def _cycle_row(
    name: str,
    beta: float,
    tau: int | None,
    J: int,
    lr: float,
    run: dict,
    Gs: tuple[float, ...],
    cf_amp: float | None,
    mu: float,
) -> dict:
    amps = run["amps"]
    per_g = [a / g if a is not None else None for a, g in zip(amps, Gs)]
    sgd = lr * J / (2.0 - mu * lr * J) if J == 1 else None
    linear = None if per_g[0] is None else bool(max(per_g) - min(per_g) <= 1e-9 * max(abs(per_g[0]), 1e-300))
    return {
        "algorithm": name,
        "beta": beta,
        "tau": tau,
        "J": J,
        "client_lr": lr,
        "stable_sim": run["stable_sim"],
        **{f"amplitude_G{g:g}": a for g, a in zip(Gs, amps)},
        "amplitude_per_G": per_g[0],
        "linear_in_G": linear,
        "amplitude_cf_per_G": cf_amp,
        "vs_no_momentum": None if per_g[0] is None or sgd is None else per_g[0] / sgd,
        "rho": run["rho"],
    }


# --------------------------------------------------------------------------- Thm III.6 rates
def rates(T: int = 10**6, beta: float = BETA, G: float = 10.0, mu: float = MU, cases=RATE_CASES) -> dict:
    """Fitted exponent of f(theta^t) = mu/2 theta^2 (envelope over t-1, t) on [T/10, T], theta0 = 0."""
    alphas = np.array([c[0] for c in cases])
    etas = np.array([c[1] for c in cases])
    ts = log_checkpoints(T, 80)  # rounds >= 2; the envelope also needs theta^{t-1}
    checks = sorted(set(ts) | {t - 1 for t in ts})
    index = {c: k for k, c in enumerate(checks)}
    t = np.array(ts, dtype=float)
    curves: dict[str, np.ndarray] = {}
    th, prev = run_fast(
        MomentumRound("fedavgm", mu=mu, client_lr=1.0, momentum=beta),
        Schedule(etas, "polynomial", alphas),
        0.0,
        G,
        T,
        ts,
    )
    curves["fedavgm"] = 0.5 * mu * np.maximum(th**2, prev**2)
    sched = Schedule(etas * (1.0 - beta), "polynomial", alphas)
    for name, rf in family(beta, mu=mu).items():
        th = run_state_fast(rf, rf.dim, sched, rf.initial_state(0.0), G, T, checks)
        now, before = th[[index[c] for c in ts]], th[[index[c - 1] for c in ts]]
        curves[name] = 0.5 * mu * np.maximum(now**2, before**2)
    sel = t >= T / 10
    rows = []
    for name, f in curves.items():
        for k, (a, e) in enumerate(cases):
            slope = np.polyfit(np.log(t[sel]), np.log(f[sel, k]), 1)[0] if np.all(f[sel, k] > 0) else float("nan")
            rows.append(
                {
                    "algorithm": name,
                    "alpha": a,
                    "eta": e,
                    "mu_eta": mu * e,
                    "fitted_exponent": float(-slope),
                    "theorem_exponent": cf.rate_exponent(a, mu, e),
                    "f_T": float(f[-1, k]),
                    "f_T_over_fedavgm": float(f[-1, k] / curves["fedavgm"][-1, k]),
                }
            )
    return {
        "rows": rows,
        "t": t.tolist(),
        "curves": {k: v.tolist() for k, v in curves.items()},
        "setup": {
            "T": T,
            "beta": beta,
            "fedhbm_beta": FEDHBM_BETA,
            "G": G,
            "mu": mu,
            "client_lr": "eta (1 - beta) / t^alpha, server lr 1 (GHBM family)",
        },
    }


# --------------------------------------------------------------------------- one configuration
def point(
    tau: int,
    momentum: float,
    server_lr: float,
    client_lr: float,
    J: int,
    G: float,
    theta0: float,
    mu: float,
    rounds: int,
) -> dict:
    """theta^R of GHBM(tau) on Lemma III.4's problem with constant eta, eta_l (``flower-theory ghbm-point``)."""
    tau = fm.check_tau(tau)
    fm.check_ghbm_momentum(momentum)
    fm.check_lr(server_lr, "server-lr")
    fm.check_lr(client_lr, "client-lr")
    for name, value in (("G", G), ("theta0", theta0), ("mu", mu)):
        if not np.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
    rf = GHBMRound("ghbm", tau=tau, momentum=momentum, mu=mu, local_steps=J, scheduled="server", client_lr=client_lr)
    sched = Schedule(np.array([float(server_lr)]), "constant", np.array([1.0]))
    with np.errstate(over="ignore", invalid="ignore"):
        if tau <= 32:
            theta = run_state_fast(rf, rf.dim, sched, rf.initial_state(theta0), G, rounds)[0, 0]
        else:  # a (tau + 1)-dimensional map costs tau^3 per composition: the plain loop is cheaper
            from theory.state_driver import run_state_loop

            theta = run_state_loop(rf, sched, rf.initial_state(theta0), G, rounds)[0, 0]
    return {
        "tau": tau,
        "momentum": momentum,
        "server_lr": server_lr,
        "client_lr": client_lr,
        "J": J,
        "G": G,
        "theta0": theta0,
        "mu": mu,
        "rounds": rounds,
        "theta": float(theta),
    }
