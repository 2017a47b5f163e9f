"""Noise-free replay of a convex run's own algorithm on the quadratic model at w* (``convex_curvature.py --replay``).

On f(w) ≈ f* + ½ eᵀ H e with e = w − w* and every client's gradient replaced by the population gradient H e, each
algorithm of the study is linear in e, so along an eigenvector of H = ∇²f(w*) with eigenvalue λ it gives
e_T = r_T(λ) e_0. :func:`replay_factors` computes r_T at many λ at once (numpy lanes) by running the run's own update
rules — the client loops of ``theory/problems.py`` and the server steps of ``strategies.math`` — with the η_t and
η_l,t (γ_t for LocalUpdate) its metrics.csv logged, round by round. With the Lanczos quadrature of e_0 = −w*
(``convex_curvature.lanczos_measure``: nodes θ_j, weights τ_j²), ‖e_T‖² ≈ ‖w*‖² Σ_j τ_j² r_T(θ_j)² and
½ e_Tᵀ H e_T ≈ ½ ‖w*‖² Σ_j τ_j² θ_j r_T(θ_j)²: where the run would stand without sampling noise, heterogeneity or
γ's surrogate, its momentum included — the run's own bias, where ``--flow``'s matched mass assumes plain descent.

Supported: FedAvg / FedAvgM (server optimizer ``sgd``), FedCM, GHBM, LocalUpdate and LocalUpdateDecay; under cyclic
participation also LocalGHBM (GHBM with τ = the period) and FedHBM (every client's anchor a_i is the final local model
of the round one period earlier, no momentum in the first period; C = ``strategy.participation`` or 1/p, as the
strategy sends it). Under uniform sampling the anchors' ages are random, which this replay does not model.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator

import numpy as np

from strategies import math as fm
from theory.problems import fedavgm_client, fedcm_client, fedhbm_client, ghbm_client, localupdate_client

SUPPORTED = ("fedavg", "fedavgm", "fedcm", "ghbm", "localghbm", "fedhbm", "localupdate", "localupdate_decay")
CYCLIC_ONLY = ("localghbm", "fedhbm")


def replay_check(cfg: dict) -> str | None:
    """Why this run's algorithm cannot be replayed (None when it can)."""
    strategy = cfg["strategy"]
    name = str(strategy["name"])
    if name not in SUPPORTED:
        return f"strategy {name!r} is not replayed (supported: {', '.join(SUPPORTED)})"
    if strategy.get("server_optimizer", "sgd") != "sgd":
        return f"server_optimizer {strategy['server_optimizer']!r} is not replayed (only sgd)"
    if name in CYCLIC_ONLY and cfg["participation"]["mode"] != "cyclic":
        return f"{name} is replayed only under cyclic participation (there every anchor is one period old)"
    return None


def _period(cfg: dict) -> int:
    return round(1.0 / float(cfg["participation"]["fraction"]))


def _tau(cfg: dict) -> int:
    return _period(cfg) if cfg["strategy"]["name"] == "localghbm" else int(cfg["strategy"]["tau"])


def replay_factors(
    cfg: dict, server_lr: np.ndarray, client_lr: np.ndarray, local_steps: int, curvature: np.ndarray
) -> np.ndarray:
    """r_T(λ) for every λ of ``curvature``: the run's algorithm from e_0 = 1 on ½ λ e², every client the mean.

    ``server_lr`` and ``client_lr`` are the logged rates of rounds 1..T; ``local_steps`` is K.
    """
    last = deque(replay_path(cfg, server_lr, client_lr, local_steps, curvature), maxlen=1)
    return last[0] if last else np.ones_like(np.asarray(curvature, dtype=float))


def replay_path(
    cfg: dict, server_lr: np.ndarray, client_lr: np.ndarray, local_steps: int, curvature: np.ndarray
) -> Iterator[np.ndarray]:
    """r_t(λ) after each round t = 1..T (see :func:`replay_factors`)."""
    reason = replay_check(cfg)
    if reason is not None:
        raise ValueError(reason)
    strategy = cfg["strategy"]
    name = str(strategy["name"])
    lam = np.clip(np.asarray(curvature, dtype=float), 0.0, None)

    def grad(x: np.ndarray) -> np.ndarray:
        return lam * x

    momentum = float(strategy.get("momentum") or 0.0)
    theta = fm.theta_weights(strategy.get("theta", "fedavg"), local_steps) if name.startswith("localupdate") else None
    tau = _tau(cfg) if name in ("ghbm", "localghbm") else 0
    period = _period(cfg) if name == "fedhbm" else 0
    fraction = strategy.get("participation") or (1.0 / period if period else 0.0)  # FedHBM's C
    finals: deque[np.ndarray] = deque(maxlen=period)  # FedHBM: the local finals of rounds t−p, …, t−1
    x = np.ones_like(lam)
    previous = x  # θ^{t−2}; round 1 has no momentum (θ^{−1} = θ^0)
    history: deque[np.ndarray] = deque([x], maxlen=tau + 1)  # θ^{t−1−τ}, …, θ^{t−1}
    for t, (eta, eta_l) in enumerate(zip(server_lr, client_lr), start=1):
        if name in ("fedavg", "fedavgm"):
            local = fedavgm_client(x, grad, eta_l, local_steps)
            new = fm.fedavgm_server_update([x], [previous], [x - local], eta, momentum)[0]
        elif name == "fedcm":
            correction = fm.fedcm_correction([x], [previous], eta, momentum)[0]
            local = fedcm_client(x, grad, eta_l, momentum, correction, local_steps)
            new = fm.fedcm_server_update([x], [x - local], eta)[0]
        elif name in ("ghbm", "localghbm"):
            term = fm.ghbm_momentum([history[0]], [x], tau)[0] if fm.ghbm_has_momentum(t, tau) else 0.0 * x
            local = ghbm_client(x, grad, eta_l, momentum, term, local_steps)
            new = fm.ghbm_server_update([x], [x - local], eta)[0]
        elif name == "fedhbm":
            anchor = finals[0] if t > period else x
            local = fedhbm_client(x, grad, eta_l, momentum, anchor, fraction, local_steps, t > period)
            finals.append(local)
            new = fm.ghbm_server_update([x], [x - local], eta)[0]
        else:
            q = localupdate_client(x, grad, eta_l, theta)
            new = fm.localupdate_server_update([x], [q], eta)[0]
        previous, x = x, new
        history.append(x)
        yield x


def replay_error(nodes: np.ndarray, weights: np.ndarray, norm2: float, factors: np.ndarray) -> tuple[float, float]:
    """‖e_T‖ and ½ e_Tᵀ H e_T from e_0's quadrature (nodes, weights, ‖e_0‖²) and the factors r_T at the nodes."""
    r2 = factors * factors
    return math.sqrt(norm2 * float(weights @ r2)), 0.5 * norm2 * float(weights @ (np.clip(nodes, 0.0, None) * r2))


def replay_label(cfg: dict) -> str:
    """A run's configuration in a legend: strategy, β where it has one, (η, η_l) and non-constant schedules."""
    strategy = cfg["strategy"]
    beta = float(strategy.get("momentum") or 0.0)
    name = "fedavg" if strategy["name"] == "fedavgm" and not beta else strategy["name"]  # FedAvg = FedAvgM, β = 0
    label = f"{name}{f' β={beta:g}' if beta else ''} (η, η_l)=({strategy['server_lr']:g}, {strategy['client_lr']:g})"
    for key in ("server_lr_schedule", "client_lr_schedule"):
        if strategy.get(key, "constant") != "constant":
            label += f" {key}={strategy[key]}"
    return label


def plot_replays(curves: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]], path: str) -> None:
    """Measured pop_gap (solid, mean over a label's runs) and the replay's bias (dashed) against the round, log y."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from server.report.run_plots import place_legend

    fig, ax = plt.subplots(figsize=(8, 5))
    for index, (label, curve) in enumerate(curves.items()):
        color = f"C{index % 10}"
        ax.semilogy(*curve["measured"], color=color, lw=1.0, label=f"{label}: f(x^t) − f*")
        ax.semilogy(*curve["replay"], color=color, lw=1.5, ls="--", label=f"{label}: noise-free replay")
    ax.set_xlabel("round")
    ax.set_ylabel("f − f*  (replay: ½ eᵀ∇²f(w*) e)")
    ax.set_title("Each run and its own algorithm replayed without noise on the quadratic at w*", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    place_legend(ax, fontsize=7)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
