"""Adaptive server optimizers (Reddi et al., "Adaptive Federated Optimization") for our strategies.

:class:`AdaptiveServerStrategy` is the base of FedAvgM, LocalUpdate and LocalUpdateDecay: with
``server_optimizer="sgd"`` (the default) they apply their own rule; with "adam", "adagrad" or "yogi" the
aggregated pseudo-gradient (Delta^t for model replies, mean q for LocalUpdate, paper 2 Section 8.4) goes through
:func:`strategies.math.fedopt_server_update` with the round's eta_t (schedules and LocalUpdateDecay's decayed
eta included). The moments m, v are part of :meth:`state_dict`, so a resumed run continues bitwise.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from strategies import math as fm
from strategies.base import ServerOptStrategy


class AdaptiveServerStrategy(ServerOptStrategy):
    """A :class:`ServerOptStrategy` whose server step may be Adam, Adagrad or Yogi on the pseudo-gradient.

    Parameters (besides those of :class:`ServerOptStrategy`)
    ----------
    server_optimizer : str
        "sgd" (the strategy's own rule), "adam", "adagrad" or "yogi" (Flower's FedAdam / FedAdagrad / FedYogi).
    beta_1, beta_2, tau : float, optional
        Flower's knobs; None takes Flower's default for the optimizer (adam, yogi: 0.9, 0.99, 1e-3;
        adagrad: tau 1e-3, no betas). ``momentum`` must be 0 with an adaptive optimizer.
    bias_correction : bool
        Adam only: True scales eta as Flower's FedAdam does; False is Reddi et al. Algorithm 2 as written.
    """

    def __init__(
        self,
        *,
        server_optimizer: str = "sgd",
        beta_1: float | None = None,
        beta_2: float | None = None,
        tau: float | None = None,
        bias_correction: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.server_optimizer = fm.server_optimizer_config(
            server_optimizer, beta_1, beta_2, tau, bias_correction, self.momentum
        )
        self.opt_m: list[np.ndarray] | None = None
        self.opt_v: list[np.ndarray] | None = None

    def adaptive_update(self, server_round: int, grad: list[np.ndarray]) -> list[np.ndarray]:
        """x_t = x_{t-1} - eta_t m_t / (sqrt(v_t) + tau); updates m and v (zero before the first step)."""
        if self.opt_m is None:
            self.opt_m = [np.zeros_like(a) for a in self.model]
            self.opt_v = [np.zeros_like(a) for a in self.model]
        new, self.opt_m, self.opt_v = fm.fedopt_server_update(
            self.model,
            self.opt_m,
            self.opt_v,
            grad,
            self.current_server_lr(server_round),
            self.server_optimizer,
            server_round,
        )
        return new

    def state_dict(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta, arrays = super().state_dict()
        opt = self.server_optimizer
        meta["server_optimizer"] = None if opt is None else asdict(opt)
        if self.opt_m is not None:
            arrays.update({f"server_opt_m/{k}": a for k, a in zip(self.keys, self.opt_m, strict=True)})
            arrays.update({f"server_opt_v/{k}": a for k, a in zip(self.keys, self.opt_v, strict=True)})
        return meta, arrays

    def load_state_dict(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        super().load_state_dict(meta, arrays)
        saved = meta.get("server_optimizer")
        mine = None if self.server_optimizer is None else asdict(self.server_optimizer)
        if saved != mine:
            raise ValueError(f"checkpoint has server_optimizer {saved}, this strategy {mine}")
        if f"server_opt_m/{self.keys[0]}" in arrays:
            self.opt_m = [np.asarray(arrays[f"server_opt_m/{k}"]) for k in self.keys]
            self.opt_v = [np.asarray(arrays[f"server_opt_v/{k}"]) for k in self.keys]
        else:
            self.opt_m = self.opt_v = None
