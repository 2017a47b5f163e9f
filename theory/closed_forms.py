"""Closed forms of both papers, used only as the reference the simulations are compared with.

Nothing here advances an algorithm: the simulated side always goes through ``strategies.math``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


# --------------------------------------------------------------------------- paper 1
def stability_bound(beta: Any, mu: float) -> Any:
    """Upper end of Eq. 9: eta < 2 (1 + beta) / (mu (1 - beta))."""
    return 2.0 * (1.0 + beta) / (mu * (1.0 - beta))


def limit_cycle_amplitude(eta: Any, beta: Any, mu: float, G: Any) -> Any:
    """|theta^t| of the 2-periodic zero-state response, Eq. 10: eta (1-beta) G / (2(1+beta) - mu eta (1-beta))."""
    return eta * (1.0 - beta) * G / (2.0 * (1.0 + beta) - mu * eta * (1.0 - beta))


def pqr_fedavgm(eta_t: Any, eta_l: Any, beta: Any, mu: float, J: int) -> tuple[Any, Any, Any]:
    """(p, q, r) of FedAvgM with J local steps, Eq. 5 (Lemma B.10)."""
    eta_tt = eta_t * (1.0 - beta)
    geo = sum((1.0 - mu * eta_l) ** j for j in range(J))
    return 1.0 + beta + eta_tt * ((1.0 - mu * eta_l) ** J - 1.0), eta_tt * eta_l * geo, beta + 0.0 * eta_tt


def pqr_fedcm(eta_t: Any, eta_l: Any, beta: Any, mu: float, J: int) -> tuple[Any, Any, Any]:
    """(p, q, r) of FedCM with J local steps, Eq. 6 (Lemma B.11)."""
    eta_lt = eta_l * (1.0 - beta)
    geo = sum((1.0 - mu * eta_lt) ** j for j in range(J))
    p = 1.0 + beta / J * geo + eta_t * ((1.0 - mu * eta_lt) ** J - 1.0)
    return p, eta_t * eta_lt * geo, beta / J * geo


def periodic_amplitude(p: Any, q: Any, r: Any, G: Any) -> Any:
    """Amplitude c of the 2-periodic solution of theta^t = p theta^{t-1} - r theta^{t-2} + (-1)^t q G.

    Substituting theta^t = (-1)^t c gives c = q G / (1 + p + r); with J = 1 this is Eq. 10.
    """
    return q * G / (1.0 + p + r)


def spectral_radius(p: Any, r: Any) -> Any:
    """Largest |root| of lambda^2 - p lambda + r (eigenvalues of A[t] in Lemma III.4)."""
    disc = np.asarray(p, dtype=complex) ** 2 - 4.0 * np.asarray(r, dtype=complex)
    roots = np.stack([(p + np.sqrt(disc)) / 2.0, (p - np.sqrt(disc)) / 2.0])
    return np.max(np.abs(roots), axis=0)


def rate_exponent(alpha: float, mu: float, eta: float) -> float:
    """Theorem III.6: f(theta^t) - f* = Theta(t^{-e}) with e = 2 alpha, 2 min(mu eta, 1), or 0 (alpha > 1)."""
    if alpha < 1.0:
        return 2.0 * alpha
    if alpha == 1.0:
        return 2.0 * min(mu * eta, 1.0)
    return 0.0


# --------------------------------------------------------------------------- paper 2
def distortion_matrix(A: Any, gamma: float, theta: Sequence[float]) -> np.ndarray:
    """Q_i(gamma, Theta) = sum_k Theta_k (I - gamma A_i)^{k-1} (paper 2 Eq. 8), by matrix powers."""
    A = np.atleast_2d(np.asarray(A, dtype=float))
    step = np.eye(A.shape[0]) - gamma * A
    Q, power = np.zeros_like(A), np.eye(A.shape[0])
    for weight in theta:
        Q = Q + weight * power
        power = power @ step
    return Q


def phi(K: int, lam: Any, gamma: Any) -> Any:
    """phi_{K,lambda}(gamma) = (1 - (1 - gamma lambda)^K) / gamma, = K lambda at gamma = 0 (paper 2 Lemma 11)."""
    gamma = np.asarray(gamma, dtype=float)
    safe = np.where(gamma == 0.0, 1.0, gamma)
    return np.where(gamma == 0.0, K * np.asarray(lam, dtype=float), (1.0 - (1.0 - safe * lam) ** K) / safe)


def fomaml_eigenvalue(K: int, lam: Any, gamma: Any) -> Any:
    """Eigenvalue (1 - gamma lambda)^{K-1} lambda of Q_i(gamma, Theta_K) A_i (paper 2 Lemma 12)."""
    return (1.0 - gamma * lam) ** (K - 1) * lam


def two_point_surrogate_gamma(gamma: Any) -> Any:
    """Section 4, Theta_{1:2}: Q_1 = 2 - gamma, Q_2 = 2 - 2 gamma, x*(gamma) = (4 - 3 gamma) / (6 - 5 gamma)."""
    return (4.0 - 3.0 * gamma) / (6.0 - 5.0 * gamma)


def two_point_surrogate_K(K: Any) -> Any:
    """Section 4, gamma = 1/2: Q_1 = 2 (1 - 2^{-K}), Q_2 = 1, x*(K) = (Q_1 + 1) / (Q_1 + 2) -> 3/4."""
    q1 = 2.0 * (1.0 - 0.5 ** np.asarray(K, dtype=float))
    return (q1 + 1.0) / (q1 + 2.0)


def fedavg_cycle(eta: Any, eta_l: Any, mu_odd: Any, mu_even: Any, J: int, G: Any) -> tuple[Any, Any]:
    """(mean, half-spread) of FedAvg's period-2 steady state on two clients of curvature ``mu_odd``/``mu_even`` and
    linear terms ±G, one per round, J gradient steps of ``eta_l``, server lr ``eta``. With a_i = (1 − eta_l mu_i)^J a
    round maps theta to c_i theta ∓ eta G b_i, c_i = 1 − eta (1 − a_i), b_i = (1 − a_i) / mu_i; the 2-cycle is
    theta_1 = eta G (c_1 b_2 − b_1) / (1 − c_1 c_2), theta_2 = c_2 theta_1 + eta G b_2. Equal curvatures give mean 0
    (= x*); J = 1 gives mean k G (mu_even − mu_odd) / (2 (mu_odd + mu_even − k mu_odd mu_even)), k = eta eta_l."""
    a1, a2 = (1.0 - eta_l * mu_odd) ** J, (1.0 - eta_l * mu_even) ** J
    c1, c2 = 1.0 - eta * (1.0 - a1), 1.0 - eta * (1.0 - a2)
    b1, b2 = (1.0 - a1) / mu_odd, (1.0 - a2) / mu_even
    theta1 = eta * G * (c1 * b2 - b1) / (1.0 - c1 * c2)
    theta2 = c2 * theta1 + eta * G * b2
    return (theta1 + theta2) / 2.0, abs(theta1 - theta2) / 2.0
