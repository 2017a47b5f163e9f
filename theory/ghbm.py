"""The GHBM family on paper 1's two-client problem (Lemma III.4), through ``strategies.math`` only.

f_1 = mu/2 th^2 + G th at odd rounds, f_2 = mu/2 th^2 - G th at even rounds: cyclic participation with p = 2,
one client per round. A round of GHBM(tau), LocalGHBM or FedHBM is built from the shared client and server
functions (:func:`theory.problems.ghbm_client` / :func:`theory.problems.fedhbm_client`,
``strategies.math.ghbm_momentum``, ``model_delta``, ``weighted_mean``, ``ghbm_server_update``); nothing here
re-implements an update rule. Every round is linear in (state, G), so :mod:`theory.state_driver` runs
10^6 rounds at Table-I speed.

States (row 0 is always theta^{t-1}):

- ``ghbm``: (theta^{t-1}, theta^{t-2}, ..., theta^{t-1-tau}), d = tau + 1; m^t = (theta^{t-1-tau} - theta^{t-1})
  / tau from round tau + 1 on.
- ``localghbm``: (theta^{t-1}, anchor_1, anchor_2): client c's anchor is the global model it received at its
  previous participation, tau_c = t - (that round) = 2 from its second participation (t > 2) on.
- ``fedhbm``: (theta^{t-1}, a_1, a_2): client c's final local model of its previous participation; the step
  uses m_k = C (a_c - theta_k) with C = 1/2 from t > 2 on.

``scheduled`` says which step the driver's schedule drives: ``"client"`` (eta_l,t; the server lr is
``server_lr``, 1 for Table I, so that GHBM(tau = 1) is exactly paper 1's IGD with momentum) or ``"server"``
(eta_t; the client lr is ``client_lr``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from strategies import math as fm
from theory.problems import client_curvature, client_sign, fedhbm_client, ghbm_client, two_client_grad

VARIANTS = ("ghbm", "localghbm", "fedhbm")
PERIOD = 2  # cyclic participation of Lemma III.4: one client per round, each every other round


@dataclass(frozen=True)
class GHBMRound:
    """One round of a GHBM variant on the problem of Lemma III.4 (see the module docstring)."""

    variant: str = "ghbm"
    tau: int = 1
    momentum: Any = 0.9
    mu: float = 2.0
    local_steps: int = 1
    scheduled: str = "client"
    client_lr: Any = 1.0
    server_lr: Any = 1.0
    participation: float = 1.0 / PERIOD
    mu_even: float | None = None  # client 2's curvature (None: mu, Lemma III.4's problem)

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.scheduled not in ("client", "server"):
            raise ValueError(f"scheduled must be 'client' or 'server', got {self.scheduled!r}")
        fm.check_tau(self.tau)
        fm.check_ghbm_momentum(self.momentum)
        if int(self.local_steps) < 1:
            raise ValueError(f"J (local steps) must be >= 1, got {self.local_steps}")
        fm.check_lr(self.client_lr, "client_lr")
        fm.check_lr(self.server_lr, "server_lr")

    @property
    def dim(self) -> int:
        return self.tau + 1 if self.variant == "ghbm" else 3

    def initial_state(self, theta0: Any) -> tuple:
        """theta^0 in every slot (slots are unused until they hold a real model)."""
        return (theta0,) * self.dim

    def __call__(self, state: tuple, G: Any, t: Any, lr: Any) -> tuple:
        client_lr, server_lr = (lr, self.server_lr) if self.scheduled == "client" else (self.client_lr, lr)
        theta = state[0]
        g_sign = client_sign(t) * G
        mu = client_curvature(t, self.mu, self.mu_even)

        def grad(x: Any) -> Any:
            return two_client_grad(x, mu, g_sign)

        if self.variant == "ghbm":
            has = fm.ghbm_has_momentum(t, self.tau)
            term = fm.ghbm_momentum([state[self.tau]], [theta], self.tau)[0] * has
            local = ghbm_client(theta, grad, client_lr, self.momentum, term, self.local_steps)
            return (self._server(theta, local, server_lr),) + tuple(state[: self.tau])
        odd = np.asarray(t) % 2 == 1
        has = np.asarray(t) > PERIOD  # second participation onwards
        anchor = np.where(odd, state[1], state[2])
        if self.variant == "localghbm":
            term = fm.ghbm_momentum([anchor], [theta], PERIOD)[0] * has
            local = ghbm_client(theta, grad, client_lr, self.momentum, term, self.local_steps)
            kept = theta  # the received global model becomes the anchor
        else:
            local = fedhbm_client(
                theta, grad, client_lr, self.momentum, anchor, self.participation, self.local_steps, has
            )
            kept = local  # the final local model becomes a_c
        new = self._server(theta, local, server_lr)
        return new, np.where(odd, kept, state[1]), np.where(odd, state[2], kept)

    @staticmethod
    def _server(theta: Any, local: Any, server_lr: Any) -> Any:
        delta = fm.model_delta([theta], fm.weighted_mean([[local]], [1.0]))
        return fm.ghbm_server_update([theta], delta, server_lr)[0]
