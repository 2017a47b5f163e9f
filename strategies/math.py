"""Pure update rules of every algorithm, written once.

Everything here works on lists of arrays (one entry per parameter tensor) and uses
only arithmetic operators, so the same functions run on numpy arrays (server
strategies, theory simulator) and on torch tensors (client trainer). Learning
rates and momentum may be Python scalars or arrays that broadcast against the
parameters; the theory package passes arrays to run many configurations at once.

The hot-path functions (called up to 10^6 times in a row by ``theory``) do no
validation and no defensive copies: callers validate once, at construction
(see :func:`check_momentum`, :func:`check_lr`).

Seeds cited in docstrings:
- paper 1: Zaccone et al., "On the Limits of Momentum in Decentralized and
  Federated Optimization" (FedAvgM Eq. 92, FedCM Eq. 101-102, Corollary B.12).
- GHBM: Zaccone et al., "Communication-Efficient Heterogeneous FL with Generalized Heavy-Ball Momentum"
  (paper 1 ref. [24]): GHBM, LocalGHBM, FedHBM (docs/ghbm.md).
- paper 2: Charles & Konecny, "On the Outsized Importance of Learning Rates in
  Local Update Methods" (LocalUpdate Algorithms 1-2, Appendix A, Section 9).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Params = list[Any]  # list of np.ndarray (or torch.Tensor on the client)


# --------------------------------------------------------------------------- validation
def check_momentum(momentum: Any, name: str = "momentum") -> None:
    """Raise ValueError unless every momentum value lies in [0, 1)."""
    value = np.asarray(momentum, dtype=float)
    if not np.all(np.isfinite(value)) or np.any(value < 0.0) or np.any(value >= 1.0):
        raise ValueError(f"{name} must lie in [0, 1), got {momentum!r}")


def as_number(value: Any, name: str, kind: type = float) -> Any:
    """``value`` as ``kind`` (float or int); ValueError naming ``name`` when it is no number (a bool is none)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None


def check_lr(lr: Any, name: str, allow_zero: bool = True) -> None:
    """Raise ValueError for a negative (or, if not allowed, zero) learning rate."""
    value = np.asarray(lr, dtype=float)
    if not np.all(np.isfinite(value)) or np.any(value < 0.0):
        raise ValueError(f"{name} must be a finite non-negative number, got {lr!r}")
    if not allow_zero and np.any(value == 0.0):
        raise ValueError(f"{name} must be positive, got {lr!r}")


# --------------------------------------------------------------------------- aggregation
WEIGHTINGS = ("examples", "uniform")


def client_weights(num_examples: Sequence[float], weighting: str = "examples") -> list[float]:
    """The weights of the accepted clients' contributions to the server average.

    "examples": n_i (FedAvg's n_k / n, McMahan et al.; paper 1's clients hold equal shares); "uniform": 1 each, the
    plain average of the sampled clients' updates of paper 2 Algorithm 1, an unbiased estimate under P uniform over
    clients (paper 2 Eq. 2, the population loss f the runs report as ``pop_loss``).
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    return [float(n) for n in num_examples] if weighting == "examples" else [1.0] * len(num_examples)


def weighted_mean(per_client: Sequence[Params], weights: Sequence[float]) -> Params:
    """Weighted mean of the clients' arrays, layer by layer.

    The server average of paper 1 Eq. 92/102 and of paper 2 Algorithm 1 (weights: :func:`client_weights`).
    """
    total = float(sum(weights))
    if total <= 0.0:
        raise ValueError("weights of the aggregated replies must sum to a positive number")
    scale = [float(w) / total for w in weights]
    out = [layer * scale[0] for layer in per_client[0]]
    for arrays, s in zip(per_client[1:], scale[1:]):
        for k, layer in enumerate(arrays):
            out[k] = out[k] + layer * s
    return out


def l2_norm(params: Params) -> float:
    """Euclidean norm of a list of numpy arrays taken as one vector (per-layer dot in the arrays' own dtype)."""
    return math.sqrt(sum(float(np.dot(v, v)) for v in (np.asarray(x).ravel() for x in params)))


def model_delta(global_model: Params, mean_client_model: Params) -> Params:
    """Pseudo-gradient Delta^t = theta^{t-1} - mean_i theta_i^{t,J} (paper 1 Eq. 92)."""
    return [g - c for g, c in zip(global_model, mean_client_model)]


# --------------------------------------------------------------------------- FedAvgM
def fedavgm_server_update(model: Params, prev_model: Params, delta: Params, server_lr: Any, momentum: Any) -> Params:
    """FedAvgM server step in heavy-ball form (paper 1 Eq. 92).

    theta^t = theta^{t-1} - eta_t (1 - beta) Delta^t + beta (theta^{t-1} - theta^{t-2}).
    In round 1 pass ``prev_model = model`` (theta^{-1} = theta^0: no momentum yet).
    ``momentum = 0`` is FedAvg with server learning rate eta_t.
    """
    step = server_lr * (1.0 - momentum)
    return [x - step * d + momentum * (x - xp) for x, xp, d in zip(model, prev_model, delta)]


# --------------------------------------------------------------------------- FedCM
def fedcm_correction(model: Params, prev_model: Params, server_lr: Any, momentum: Any) -> Params:
    """Server-side momentum term of FedCM sent to clients: beta (theta^{t-1} - theta^{t-2}) / eta_t.

    Paper 1 Eq. 101 adds (beta / (J eta_t)) (theta^{t-1} - theta^{t-2}) at each of the J local
    steps; the client divides this term by its own J (:func:`fedcm_local_step`). Round 1 uses
    ``prev_model = model``, i.e. a zero term. ``server_lr`` must be positive.
    """
    scale = momentum / server_lr
    return [scale * (x - xp) for x, xp in zip(model, prev_model)]


def affine_local_step(param: Any, grad: Any, client_lr: Any, shift: Any) -> Any:
    """theta - a grad + c: the form the SGD (Eq. 91), FedCM (Eq. 101) and GHBM local steps share, with a step size a
    and a term c fixed during the round (:func:`fedcm_shift`, :func:`ghbm_shift`; for SGD, c = -0.0 adds nothing to
    any value). Clients of the three may be stepped together with per-client a and c."""
    return param - client_lr * grad + shift


def fedcm_shift(correction: Any, local_steps: Any) -> Any:
    """FedCM's term of :func:`affine_local_step`: correction / J (paper 1 Eq. 101)."""
    return correction / local_steps


def fedcm_local_step(param: Any, grad: Any, client_lr: Any, momentum: Any, correction: Any, local_steps: int) -> Any:
    """One FedCM local step on one tensor (paper 1 Eq. 101).

    theta <- theta - eta_l (1 - beta) grad f_i(theta) + correction / J,
    with ``correction`` from :func:`fedcm_correction` and J = the client's local steps this round.
    """
    return affine_local_step(param, grad, client_lr * (1.0 - momentum), fedcm_shift(correction, local_steps))


def fedcm_server_update(model: Params, delta: Params, server_lr: Any) -> Params:
    """FedCM server step: theta^t = theta^{t-1} - eta_t Delta^t (paper 1 Eq. 102)."""
    return [x - server_lr * d for x, d in zip(model, delta)]


# --------------------------------------------------------------------------- GHBM family
# Zaccone, Karimireddy, Masone, Ciccone, "Communication-Efficient Heterogeneous Federated Learning with
# Generalized Heavy-Ball Momentum" (TMLR 2025; paper 1 ref. [24], Section III-F). Clients take
# theta <- theta - eta_l grad - (beta / J) m at each of their J local steps; the server steps
# theta^t = theta^{t-1} - eta_t Delta^t. The three variants differ only in where m comes from.
def check_ghbm_momentum(momentum: Any, name: str = "momentum") -> None:
    """Raise ValueError unless every momentum value lies in [0, 1] (FedHBM uses beta = 1)."""
    value = np.asarray(momentum, dtype=float)
    if not np.all(np.isfinite(value)) or np.any(value < 0.0) or np.any(value > 1.0):
        raise ValueError(f"{name} must lie in [0, 1], got {momentum!r}")


def check_tau(tau: Any, name: str = "tau") -> int:
    """GHBM's tau: an integer >= 1 (returned as int)."""
    try:
        ok = not isinstance(tau, bool) and float(tau).is_integer() and int(tau) >= 1
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError(f"{name} must be an integer >= 1, got {tau!r}")
    return int(tau)


def ghbm_has_momentum(server_round: Any, tau: Any) -> Any:
    """GHBM sends a zero momentum in rounds 1..tau (theta^{t-1-tau} does not exist yet): t > tau."""
    return np.asarray(server_round) > tau


def ghbm_momentum(anchor: Params, model: Params, tau: Any) -> Params:
    """Generalized heavy-ball momentum m = (anchor - theta^{t-1}) / tau.

    GHBM(tau): anchor = theta^{t-1-tau}, the global model tau rounds earlier (server side).
    LocalGHBM: anchor = the global model the client received at its previous participation and
    tau = tau_i, the rounds since then (client side); under cyclic participation with period p,
    tau_i = p and LocalGHBM is GHBM(tau = p). tau = 1 is classical heavy-ball momentum.
    """
    return [(a - x) / tau for a, x in zip(anchor, model)]


def ghbm_shift(momentum: Any, term: Any, local_steps: Any) -> Any:
    """The GHBM family's term of :func:`affine_local_step`: -(beta / J) m (adding it subtracts (beta / J) m exactly)."""
    return -((momentum / local_steps) * term)


def ghbm_local_step(param: Any, grad: Any, client_lr: Any, momentum: Any, term: Any, local_steps: int) -> Any:
    """One local step of the GHBM family on one tensor: theta - eta_l grad - (beta / J) m.

    ``term`` is m: :func:`ghbm_momentum` (GHBM, LocalGHBM; fixed during the round) or
    :func:`fedhbm_momentum` (FedHBM; recomputed at every step). J = the client's local steps.
    """
    return affine_local_step(param, grad, client_lr, ghbm_shift(momentum, term, local_steps))


def fedhbm_momentum(anchor: Any, param: Any, participation: Any) -> Any:
    """FedHBM's per-step momentum on one tensor: m_{i,k} = C (a_i - theta_{i,k}).

    a_i is the client's own final local model of its previous participation, C the participation
    fraction (1/C estimates the rounds between two participations).
    """
    return participation * (anchor - param)


def ghbm_server_update(model: Params, delta: Params, server_lr: Any) -> Params:
    """Server step of the GHBM family: theta^t = theta^{t-1} - eta_t Delta^t (as FedCM, Eq. 102)."""
    return fedcm_server_update(model, delta, server_lr)


# --------------------------------------------------------------------------- SGD / LocalUpdate
def sgd_step(param: Any, grad: Any, lr: Any) -> Any:
    """Plain (mini-batch) gradient step x - lr * g: the client step of FedAvgM (paper 1 Eq. 91)
    and of LocalUpdate (paper 2 Algorithm 2, x_{k+1} = x_k - gamma g_k)."""
    return param - lr * grad


THETA_PRESETS = ("fedavg", "fomaml")


def theta_weights(theta: str | Sequence[float], local_steps: int) -> np.ndarray:
    """Theta vector of LocalUpdate (paper 2 Section 2).

    ``"fedavg"`` = Theta_{1:K} = (1, ..., 1) (FedAvg/Reptile), ``"fomaml"`` = Theta_K = (0, ..., 0, 1)
    (first-order MAML), or an explicit vector whose length fixes K (trailing zeros allowed).
    """
    if isinstance(theta, str):
        if local_steps < 1:
            raise ValueError(f"local_steps must be >= 1, got {local_steps}")
        if theta == "fedavg":
            return np.ones(local_steps)
        if theta == "fomaml":
            weights = np.zeros(local_steps)
            weights[-1] = 1.0
            return weights
        raise ValueError(f"theta must be one of {THETA_PRESETS} or a list of weights, got {theta!r}")
    weights = np.asarray(list(theta), dtype=float)
    if weights.ndim != 1 or weights.size == 0 or not np.all(np.isfinite(weights)):
        raise ValueError(f"theta must be a non-empty list of finite weights, got {theta!r}")
    return weights


def check_theta_steps(theta: str | Sequence[float], local_steps: int) -> None:
    """A Theta list sets K = len(theta); an explicit ``local_steps`` (> 0) must then be the same K (ValueError)."""
    if not isinstance(theta, str) and local_steps and len(theta) != local_steps:
        raise ValueError(
            f"a list of {len(theta)} weights sets K = {len(theta)} local steps and local_steps={local_steps} "
            "another; give K once (a list of K weights, or local_steps with theta=fedavg or fomaml)"
        )


def localupdate_accumulate(q: Any, grad: Any, weight: float) -> Any:
    """q <- q + Theta_k g_k: the client's running Theta-weighted gradient sum (paper 2 Algorithm 2)."""
    return q + weight * grad


def localupdate_server_update(model: Params, mean_update: Params, server_lr: Any) -> Params:
    """LocalUpdate server step x <- x - eta * mean_i q_i (paper 2 Algorithm 1)."""
    return [x - server_lr * q for x, q in zip(model, mean_update)]


# --------------------------------------------------------------------------- server optimizers (FedOpt)
SERVER_OPTIMIZERS = ("sgd", "adam", "adagrad", "yogi")
# Flower's defaults (flwr.serverapp.strategy.FedAdam / FedAdagrad / FedYogi); Adagrad has no beta_1 / beta_2.
SERVER_OPTIMIZER_DEFAULTS: dict[str, dict[str, float]] = {
    "sgd": {},
    "adam": {"beta_1": 0.9, "beta_2": 0.99, "tau": 1e-3},
    "adagrad": {"tau": 1e-3},
    "yogi": {"beta_1": 0.9, "beta_2": 0.99, "tau": 1e-3},
}


@dataclass(frozen=True)
class ServerOptimizerConfig:
    """An adaptive server optimizer on the pseudo-gradient (Reddi et al., "Adaptive Federated Optimization").

    ``name`` is "adam", "adagrad" or "yogi"; ``beta_1`` (0 for Adagrad), ``beta_2`` (unused by Adagrad) and
    ``tau`` (the adaptivity, added to sqrt(v)) have Flower's meanings. ``bias_correction`` (Adam only) scales
    eta as Flower's FedAdam does (:func:`adam_bias_corrected_lr`); False is Reddi et al. Algorithm 2 as written.
    """

    name: str
    beta_1: float = 0.0
    beta_2: float = 0.0
    tau: float = 1e-3
    bias_correction: bool = True


def server_optimizer_config(
    name: str = "sgd",
    beta_1: float | None = None,
    beta_2: float | None = None,
    tau: float | None = None,
    bias_correction: bool = True,
    momentum: float = 0.0,
    prefix: str = "",
) -> ServerOptimizerConfig | None:
    """Validate the knobs and fill Flower's per-optimizer defaults; None for "sgd" (the strategy's own rule).

    Raises ValueError naming the parameter (``prefix`` + name): an unknown optimizer, beta_1 / beta_2 outside
    [0, 1), tau <= 0, a knob the optimizer does not have (any knob with sgd, beta_1 / beta_2 with adagrad,
    bias_correction=False without adam), or heavy-ball ``momentum`` > 0 with an adaptive optimizer (its momentum
    is beta_1).
    """
    if name not in SERVER_OPTIMIZERS:
        raise ValueError(f"{prefix}server_optimizer must be one of {SERVER_OPTIMIZERS}, got {name!r}")
    given = {"beta_1": beta_1, "beta_2": beta_2, "tau": tau}
    defaults = SERVER_OPTIMIZER_DEFAULTS[name]
    for key, value in given.items():
        if value is not None and key not in defaults:
            raise ValueError(f"{prefix}{key} is not a parameter of server_optimizer={name!r} (leave it null)")
    if not bias_correction and name != "adam":
        raise ValueError(f"{prefix}bias_correction applies to server_optimizer='adam' only (leave it true)")
    if name == "sgd":
        return None
    if momentum:
        raise ValueError(f"{prefix}momentum must be 0 with server_optimizer={name!r} (use beta_1), got {momentum!r}")
    knobs = {key: as_number(defaults[key] if given[key] is None else given[key], prefix + key) for key in defaults}
    for key in ("beta_1", "beta_2"):
        if key in knobs and not 0.0 <= knobs[key] < 1.0:
            raise ValueError(f"{prefix}{key} must lie in [0, 1), got {knobs[key]!r}")
    if not (math.isfinite(knobs["tau"]) and knobs["tau"] > 0.0):
        raise ValueError(f"{prefix}tau must be a positive number, got {knobs['tau']!r}")
    return ServerOptimizerConfig(name, bias_correction=bool(bias_correction), **knobs)


def fedopt_first_moment(m: Params, grad: Params, beta_1: Any) -> Params:
    """m_t = beta_1 m_{t-1} + (1 - beta_1) Delta_t (Reddi et al. Algorithm 2; Adagrad: beta_1 = 0)."""
    return [beta_1 * mi + (1.0 - beta_1) * g for mi, g in zip(m, grad)]


def fedopt_second_moment(v: Params, grad: Params, name: str, beta_2: Any) -> Params:
    """v_t of Reddi et al. Algorithm 2.

    adagrad: v + Delta^2; adam: beta_2 v + (1 - beta_2) Delta^2;
    yogi: v - (1 - beta_2) Delta^2 sign(v - Delta^2).
    """
    if name == "adagrad":
        return [vi + g * g for vi, g in zip(v, grad)]
    if name == "adam":
        return [beta_2 * vi + (1.0 - beta_2) * (g * g) for vi, g in zip(v, grad)]
    return [vi - (1.0 - beta_2) * (g * g) * np.sign(vi - g * g) for vi, g in zip(v, grad)]


def adam_bias_corrected_lr(server_lr: Any, beta_1: Any, beta_2: Any, server_round: int) -> Any:
    """eta sqrt(1 - beta_2^(t+1)) / (1 - beta_1^(t+1)): the step size of Flower's FedAdam in round t.

    Kingma & Ba's alpha_t with Flower's exponent t + 1 (round t = 1 uses the powers 2), kept to match it.
    """
    correction = np.sqrt(1.0 - np.power(beta_2, server_round + 1.0)) / (1.0 - np.power(beta_1, server_round + 1.0))
    return server_lr * correction


def fedopt_server_update(
    model: Params,
    m: Params,
    v: Params,
    grad: Params,
    server_lr: Any,
    config: ServerOptimizerConfig,
    server_round: int,
) -> tuple[Params, Params, Params]:
    """One adaptive server step on the pseudo-gradient Delta_t; returns (x_t, m_t, v_t).

    x_t = x_{t-1} - eta_t m_t / (sqrt(v_t) + tau) (Reddi et al. Algorithm 2, with Delta_t taken as a gradient:
    theta^{t-1} - mean theta_i for model replies, mean q_i for LocalUpdate, paper 2 Section 8.4). Start from
    m = v = 0 (as Flower does). Equals Flower's FedAdagrad / FedAdam / FedYogi, whose delta is -Delta_t. x_t keeps
    x_{t-1}'s dtype (Adam's bias-corrected eta is a float64 scalar, which would make a float32 model float64).
    """
    m = fedopt_first_moment(m, grad, config.beta_1)
    v = fedopt_second_moment(v, grad, config.name, config.beta_2)
    lr = server_lr
    if config.name == "adam" and config.bias_correction:
        lr = adam_bias_corrected_lr(server_lr, config.beta_1, config.beta_2, server_round)
    new = [
        np.asarray(x - lr * mi / (np.sqrt(vi) + config.tau), dtype=np.asarray(x).dtype)
        for x, mi, vi in zip(model, m, v)
    ]
    return new, m, v
