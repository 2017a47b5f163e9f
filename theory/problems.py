"""Quadratic problems of both seeds, driven only through ``strategies.math``.

Paper 1 (Lemma III.4): two one-dimensional clients f_1 = mu/2 th^2 + G th (odd rounds) and
f_2 = mu/2 th^2 - G th (even rounds), cyclic participation with C = 0.5 (one client per round).
A round of FedAvgM (Eq. 91-92) or FedCM (Eq. 101-102) is built from the shared client and server
functions; nothing here re-implements an update rule.

Paper 2 (Section 3): clients f_i(x) = 1/2 (x - c_i)^T A_i (x - c_i); LocalUpdate clients (Algorithm 2)
and server (Algorithm 1) again call the shared functions.

All functions accept numpy arrays of any broadcastable shape ("lanes"), so one call advances many
configurations, or evaluates one round at many t at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from strategies import math as fm
from strategies import schedules

ALGORITHMS_000 = ("fedavgm", "fedcm")


# --------------------------------------------------------------------------- paper 1 clients
def client_sign(t: Any) -> Any:
    """+1 at odd t (client 1, f_1 = mu/2 th^2 + G th), -1 at even t (client 2): -(-1)^t (Eq. 119)."""
    return np.where(np.asarray(t) % 2 == 1, 1.0, -1.0)


def two_client_grad(theta: Any, mu: Any, g_sign: Any) -> Any:
    """grad f_i(theta) = mu theta + s G, with ``g_sign`` = s G already multiplied (Eq. 94)."""
    return mu * theta + g_sign


def client_curvature(t: Any, mu: float, mu_even: float | None) -> Any:
    """mu of the client of round t: ``mu`` for both (Lemma III.4), or ``mu`` at odd t (client 1) and ``mu_even`` at
    even t (client 2): clients of unequal curvature, f = (f_1 + f_2)/2 still minimised at x* = 0."""
    return mu if mu_even is None else np.where(np.asarray(t) % 2 == 1, mu, mu_even)


@dataclass(frozen=True)
class MomentumRound:
    """One round of FedAvgM or FedCM on the two-client problem of Lemma III.4.

    ``server_lr`` (eta_t) may be an array over rounds/lanes, ``client_lr`` (eta_l), ``momentum`` (beta)
    scalars or lane arrays; ``local_steps`` is J. With J = 1 and eta_l = 1 both algorithms are IGD with
    momentum of effective step eta_t (Corollary B.12).
    """

    algorithm: str = "fedavgm"
    mu: float = 2.0
    client_lr: Any = 1.0
    momentum: Any = 0.0
    local_steps: int = 1
    mu_even: float | None = None  # client 2's curvature (None: mu, Lemma III.4's problem)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS_000:
            raise ValueError(f"algorithm must be one of {ALGORITHMS_000}, got {self.algorithm!r}")
        if int(self.local_steps) < 1:
            raise ValueError(f"local_steps must be >= 1, got {self.local_steps}")
        fm.check_momentum(self.momentum)
        fm.check_lr(self.client_lr, "client_lr")

    def __call__(self, theta: Any, theta_prev: Any, G: Any, t: Any, server_lr: Any) -> Any:
        """theta^t from (theta^{t-1}, theta^{t-2}) at round t (Lemma B.10 / B.11 computed, not written out)."""
        g_sign = client_sign(t) * G
        mu = client_curvature(t, self.mu, self.mu_even)

        def grad(x: Any) -> Any:
            return two_client_grad(x, mu, g_sign)

        if self.algorithm == "fedavgm":
            local = fedavgm_client(theta, grad, self.client_lr, self.local_steps)
            delta = fm.model_delta([theta], fm.weighted_mean([[local]], [1.0]))
            return fm.fedavgm_server_update([theta], [theta_prev], delta, server_lr, self.momentum)[0]  # Eq. 92
        correction = fm.fedcm_correction([theta], [theta_prev], server_lr, self.momentum)[0]
        local = fedcm_client(theta, grad, self.client_lr, self.momentum, correction, self.local_steps)
        delta = fm.model_delta([theta], fm.weighted_mean([[local]], [1.0]))
        return fm.fedcm_server_update([theta], delta, server_lr)[0]  # Eq. 102


def fedavgm_client(theta: Any, grad: Callable[[Any], Any], client_lr: Any, local_steps: int) -> Any:
    """FedAvgM client: J plain gradient steps from theta^{t-1} (paper 1 Eq. 91)."""
    local = theta
    for _ in range(local_steps):
        local = fm.sgd_step(local, grad(local), client_lr)
    return local


def fedcm_client(
    theta: Any, grad: Callable[[Any], Any], client_lr: Any, momentum: Any, correction: Any, local_steps: int
) -> Any:
    """FedCM client: J corrected steps from theta^{t-1} (paper 1 Eq. 101)."""
    local = theta
    for _ in range(local_steps):
        local = fm.fedcm_local_step(local, grad(local), client_lr, momentum, correction, local_steps)
    return local


def ghbm_client(
    theta: Any, grad: Callable[[Any], Any], client_lr: Any, momentum: Any, term: Any, local_steps: int
) -> Any:
    """GHBM / LocalGHBM client: J steps theta - eta_l grad - (beta / J) m with the round's fixed m."""
    local = theta
    for _ in range(local_steps):
        local = fm.ghbm_local_step(local, grad(local), client_lr, momentum, term, local_steps)
    return local


def fedhbm_client(
    theta: Any,
    grad: Callable[[Any], Any],
    client_lr: Any,
    momentum: Any,
    anchor: Any,
    participation: Any,
    local_steps: int,
    has_state: Any = True,
) -> Any:
    """FedHBM client: J steps with m_k = C (a_i - theta_k); ``has_state`` False (or a 0/1 lane mask) = no momentum."""
    local = theta
    for _ in range(local_steps):
        term = fm.fedhbm_momentum(anchor, local, participation) * has_state
        local = fm.ghbm_local_step(local, grad(local), client_lr, momentum, term, local_steps)
    return local


def server_lrs(base_lr: Any, schedule: str, param: Any, t: Any) -> Any:
    """eta_t for an array of rounds via the shared :func:`strategies.schedules.scheduled_lr`."""
    schedules.check_schedule(schedule, param if param is not None else 1.0)
    return schedules.scheduled_lr(base_lr, schedule, param, t)


# --------------------------------------------------------------------------- paper 2 clients
@dataclass(frozen=True)
class QuadraticClient:
    """f_i(x) = 1/2 (x - c)^T A (x - c) (paper 2 Section 3); A is (d, d) or a scalar for d = 1."""

    A: Any
    c: Any

    def grad(self, x: Any) -> Any:
        """A (x - c): deterministic client gradient (mini-batch = whole client distribution)."""
        diff = x - self.c
        return self.A @ diff if np.ndim(self.A) == 2 else self.A * diff

    def loss(self, x: Any) -> Any:
        diff = x - self.c
        return 0.5 * (diff @ (self.A @ diff) if np.ndim(self.A) == 2 else self.A * diff * diff)


def localupdate_client(x: Any, grad: Callable[[Any], Any], client_lr: Any, theta: Sequence[Any]) -> Any:
    """InnerLoop(gamma, Theta) of paper 2 Algorithm 2: q = sum_k Theta_k g_k, x_{k+1} = x_k - gamma g_k.

    ``theta[k]`` may be a scalar or a lane array (several Theta vectors padded with trailing zeros).
    """
    q = 0.0 * x
    for weight in theta:
        g = grad(x)
        q = fm.localupdate_accumulate(q, g, weight)
        x = fm.sgd_step(x, g, client_lr)
    return q


def localupdate_round(
    x: Any,
    clients: Sequence[QuadraticClient],
    weights: Sequence[float],
    client_lr: Any,
    server_lr: Any,
    theta: Sequence[float],
) -> Any:
    """One LocalUpdate round (paper 2 Algorithm 1): x <- x - eta * mean_i q_i, weights = P(i)."""
    updates = [[localupdate_client(x, cl.grad, client_lr, theta)] for cl in clients]
    mean = fm.weighted_mean(updates, weights)
    return fm.localupdate_server_update([x], mean, server_lr)[0]
