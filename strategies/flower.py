"""Flower Message-API strategies: thin adapters over :mod:`strategies.math`.

Each strategy subclasses :class:`strategies.base.ServerOptStrategy` (itself Flower's ``FedAvg``) and keeps its
message conventions (model in the ArrayRecord "arrays", weights under "num-examples"), so a ClientApp written
for Flower's FedAvg works with :class:`FedAvgM` unchanged. The server keeps the model and whatever state it
needs (previous model, decay state) and sends the client everything the round needs (client lr, FedCM's
momentum term, Theta), so clients stay stateless. Every reply is validated before aggregation
(:mod:`strategies.validation`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from flwr.common.logger import log

from strategies import math as fm
from strategies import protocol, schedules
from strategies.base import ServerOptStrategy
from strategies.fedopt import AdaptiveServerStrategy
from strategies.npy import to_record


class FedAvgM(AdaptiveServerStrategy):
    """FedAvg with server heavy-ball momentum (paper 1 Eq. 92).

    theta^t = theta^{t-1} - eta_t (1 - beta) Delta^t + beta (theta^{t-1} - theta^{t-2}),
    Delta^t = example-weighted mean of (theta^{t-1} - theta_i^{t,J}).
    Equals Flower's ``FedAvgM(server_learning_rate=eta (1 - beta), server_momentum=beta)``
    for a constant eta. ``momentum=0`` is FedAvg with server lr ``server_lr``.

    Parameters
    ----------
    server_lr : float
        Base server step eta (>= 0); eta_t follows ``server_lr_schedule``.
    momentum : float
        beta in [0, 1).
    client_lr : float, optional
        Local step eta_l sent to clients as "client-lr" (clients use their own when None).
    server_lr_schedule : str
        "constant", "polynomial" (eta / t^alpha), "exponential" (eta gamma^t) or "inverse_time"
        (eta t0 / (t0 + t - 1)); ``schedule_param`` is alpha, gamma or t0.
    client_lr_schedule : str
        The same schedules for the client lr sent in round t, with ``client_schedule_param`` (paper 2 §7
        decays gamma_t and eta_t as 1/t: "polynomial" with 1.0, or "inverse_time", for both). Every strategy
        takes it.
    client_manager : PartitionClientManager, optional
        Cyclic or uniform participation; Flower's ``fraction_train`` sampling when None.
    max_update_norm : float, optional
        Reject replies whose update (theta^{t-1} - theta_i, or q) has a larger L2 norm (None = no cap).
    max_num_examples : float, optional
        Reject replies that claim a larger weight ``num-examples`` (None = no cap).
    weighting : str
        "examples" (each reply weighted by its ``num-examples``, FedAvg's rule) or "uniform" (the plain average of
        the accepted replies, paper 2 Algorithm 1): :func:`strategies.math.client_weights`. The round's client
        means (train loss, loss-before) use the same weights.
    server_optimizer, beta_1, beta_2, tau, bias_correction
        Adam / Adagrad / Yogi on Delta^t instead of the heavy-ball step (needs ``momentum=0``); with the same
        knobs it equals Flower's FedAdam / FedAdagrad / FedYogi(eta=server_lr). See
        :class:`strategies.fedopt.AdaptiveServerStrategy`.
    **fedavg_kwargs
        Passed to Flower's ``FedAvg`` (fractions, minimum nodes, record keys).
    """

    algorithm = "fedavgm"

    def _server_update(
        self, server_round: int, per_client: list[list[np.ndarray]], weights: list[float]
    ) -> list[np.ndarray]:
        delta = fm.model_delta(self.model, fm.weighted_mean(per_client, weights))
        if self.server_optimizer is not None:
            new = self.adaptive_update(server_round, delta)
        else:
            new = fm.fedavgm_server_update(
                self.model, self.prev_model, delta, self.current_server_lr(server_round), self.momentum
            )
        self.prev_model, self.model = self.model, new
        return delta


class FedCM(ServerOptStrategy):
    """FedCM: the server's momentum term corrects every local step (paper 1 Eq. 101-102).

    Clients step theta <- theta - eta_l (1 - beta) grad + (beta / (J eta_t)) (theta^{t-1} - theta^{t-2});
    the server sends beta (theta^{t-1} - theta^{t-2}) / eta_t in the ArrayRecord
    "fedcm-correction" (zero in round 1) and updates theta^t = theta^{t-1} - eta_t Delta^t.
    ``server_lr`` must be positive; other parameters as in :class:`FedAvgM`.
    """

    algorithm = "fedcm"
    server_lr_may_be_zero = False

    def __init__(self, *, client_lr: float, **kwargs: Any) -> None:
        super().__init__(client_lr=client_lr, **kwargs)

    def _extra_records(self, server_round: int) -> dict[str, ArrayRecord]:
        term = fm.fedcm_correction(self.model, self.prev_model, self.current_server_lr(server_round), self.momentum)
        return {protocol.FEDCM_CORRECTION: to_record(self.keys, term)}

    def _server_update(
        self, server_round: int, per_client: list[list[np.ndarray]], weights: list[float]
    ) -> list[np.ndarray]:
        delta = fm.model_delta(self.model, fm.weighted_mean(per_client, weights))
        new = fm.fedcm_server_update(self.model, delta, self.current_server_lr(server_round))
        self.prev_model, self.model = self.model, new
        return delta


class LocalUpdate(AdaptiveServerStrategy):
    """LocalUpdate with decoupled client lr gamma and server lr eta (paper 2 Algorithms 1-2).

    Each client runs K mini-batch SGD steps with lr gamma and replies, in the ArrayRecord
    "arrays", q = sum_k Theta_k g_k; the server steps x <- x - eta_t * mean_i q_i (``weighting="uniform"``: the
    plain mean of paper 2; the default weights each q_i by its client's examples).
    Theta_{1:K} with gamma = eta is FedAvg model averaging (paper 2 Appendix A);
    gamma = 0 is mini-batch SGD with summed gradients.

    Parameters
    ----------
    client_lr : float
        gamma >= 0 (0 is allowed).
    theta : str or sequence of float
        "fedavg" (Theta_{1:K}), "fomaml" (Theta_K) or explicit weights (K = len(theta)).
    local_steps : int
        K for a preset theta; 0 lets the client take E epochs (K = its number of steps).
    server_optimizer : str
        "sgd" or Adam / Adagrad / Yogi on mean q (paper 2 Section 8.4 uses Yogi), as in :class:`FedAvgM`.
    Other parameters as in :class:`FedAvgM` (no momentum).
    """

    algorithm = "localupdate"
    reply_is_update = True

    def __init__(
        self, *, client_lr: float, theta: str | Sequence[float] = "fedavg", local_steps: int = 0, **kwargs: Any
    ) -> None:
        if "momentum" in kwargs:
            raise ValueError("LocalUpdate has no momentum parameter")
        super().__init__(client_lr=client_lr, **kwargs)
        if int(local_steps) < 0:
            raise ValueError(f"local_steps must be >= 0, got {local_steps}")
        fm.theta_weights(theta, max(int(local_steps), 1))  # validates presets and vectors
        fm.check_theta_steps(theta, int(local_steps))
        self.theta: str | list[float] = theta if isinstance(theta, str) else [float(w) for w in theta]
        self.local_steps = len(self.theta) if isinstance(self.theta, list) else int(local_steps)

    def _round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        cfg = super()._round_config(server_round, config)
        cfg[protocol.THETA] = self.theta
        if self.local_steps:
            cfg[protocol.LOCAL_STEPS] = self.local_steps
        return cfg

    def _server_update(
        self, server_round: int, per_client: list[list[np.ndarray]], weights: list[float]
    ) -> list[np.ndarray]:
        mean_update = fm.weighted_mean(per_client, weights)
        if self.server_optimizer is not None:
            new = self.adaptive_update(server_round, mean_update)
        else:
            new = fm.localupdate_server_update(self.model, mean_update, self.current_server_lr(server_round))
        self.prev_model, self.model = self.model, new
        return mean_update


class LocalUpdateDecay(LocalUpdate):
    """LocalUpdate with automatic plateau decay of gamma and eta (paper 2 Section 9).

    Monitors the example-weighted mean of the sampled clients' loss of the broadcast
    model before local training ("loss-before"), averaged over a window of W rounds;
    after P rounds without an improvement of ``min_delta`` (outside a cooldown of C
    rounds, which also covers the first C rounds) it sets gamma <- gamma * client_decay
    and eta <- eta * server_decay, floored at ``min_lr``. See
    :func:`strategies.schedules.plateau_decay_step`. With an adaptive ``server_optimizer`` the decayed eta is the
    optimizer's step size.
    """

    required_metrics = (protocol.LOSS_BEFORE,)

    def __init__(
        self,
        *,
        client_lr: float,
        window: int = 100,
        patience: int = 100,
        cooldown: int = 100,
        min_delta: float = 1e-4,
        client_decay: float = 0.1,
        server_decay: float = 0.9,
        min_lr: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(client_lr=client_lr, **kwargs)
        self.decay_config = schedules.PlateauDecayConfig(
            window, patience, cooldown, min_delta, client_decay, server_decay, min_lr
        )
        self.decay_state = schedules.PlateauDecayState.start(self.client_lr, self.server_lr, self.decay_config)

    def base_server_lr(self) -> float:
        return self.decay_state.server_lr

    def base_client_lr(self) -> float:
        return self.decay_state.client_lr

    def _after_update(self, server_round: int, metrics: Mapping[str, Any]) -> None:
        before = self.decay_state.num_decays
        self.decay_state = schedules.plateau_decay_step(
            self.decay_state, float(metrics[protocol.LOSS_BEFORE]), self.decay_config
        )
        if self.decay_state.num_decays > before:
            log(
                INFO,
                "Round %d: plateau -> client lr %.3g, server lr %.3g",
                server_round,
                self.decay_state.client_lr,
                self.decay_state.server_lr,
            )

    def state_dict(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta, arrays = super().state_dict()
        meta["decay"] = vars(self.decay_state).copy()
        return meta, arrays

    def load_state_dict(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        super().load_state_dict(meta, arrays)
        self.decay_state = schedules.PlateauDecayState(**meta["decay"])
