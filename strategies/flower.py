"""Flower Message-API strategies: thin adapters over :mod:`strategies.math`.

Each strategy subclasses Flower's ``FedAvg`` and keeps its message conventions (model
in the ArrayRecord "arrays", weights under "num-examples"), so a ClientApp written for
Flower's FedAvg works with :class:`FedAvgM` unchanged. Node selection follows an
optional client manager (cyclic or uniform over partition ids); without one, Flower's
own sampling (``fraction_train``) is used. The server keeps the model and whatever
state it needs (previous model, decay state) and sends the client everything the round
needs (client lr, FedCM's momentum term, Theta), so clients stay stateless.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from strategies import math as fm
from strategies import protocol
from strategies.client_manager import PartitionClientManager


def _to_record(keys: Sequence[str], arrays: Sequence[np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(a)) for k, a in zip(keys, arrays, strict=True)})


class _ServerOptStrategy(FedAvg):
    """Shared machinery: state, node selection, message packing, reply unpacking."""

    algorithm = ""

    def __init__(
        self,
        *,
        server_lr: float = 1.0,
        client_lr: float | None = None,
        momentum: float = 0.0,
        server_lr_schedule: str = "constant",
        schedule_param: float = 1.0,
        client_manager: PartitionClientManager | None = None,
        **fedavg_kwargs: Any,
    ) -> None:
        super().__init__(**fedavg_kwargs)
        fm.check_lr(server_lr, "server_lr", allow_zero=self.algorithm != "fedcm")
        if client_lr is not None:
            fm.check_lr(client_lr, "client_lr")
        fm.check_momentum(momentum)
        fm.check_schedule(server_lr_schedule, schedule_param)
        self.server_lr = float(server_lr)
        self.client_lr = None if client_lr is None else float(client_lr)
        self.momentum = float(momentum)
        self.server_lr_schedule = server_lr_schedule
        self.schedule_param = float(schedule_param)
        self.client_manager = client_manager
        self.keys: list[str] | None = None
        self.model: list[np.ndarray] | None = None
        self.prev_model: list[np.ndarray] | None = None
        self.last_round = 0
        self.round_info: dict[str, float] = {}

    # ----------------------------------------------------------------------- state
    def current_server_lr(self, server_round: int) -> float:
        """eta_t of round t from the base server lr and the schedule."""
        return float(fm.scheduled_lr(self.base_server_lr(), self.server_lr_schedule, self.schedule_param, server_round))

    def base_server_lr(self) -> float:
        """Server lr before the schedule (LocalUpdateDecay overrides it)."""
        return self.server_lr

    def current_client_lr(self) -> float | None:
        """Client lr sent this round."""
        return self.client_lr

    def state_dict(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Full strategy state: JSON-serialisable metadata and named arrays (for checkpoints)."""
        if self.model is None:
            raise RuntimeError("strategy has no model yet: call configure_train first")
        meta = {"algorithm": self.algorithm, "keys": self.keys, "last_round": self.last_round}
        arrays = {f"model/{k}": a for k, a in zip(self.keys, self.model, strict=True)}
        arrays.update({f"prev_model/{k}": a for k, a in zip(self.keys, self.prev_model, strict=True)})
        return meta, arrays

    def load_state_dict(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if meta["algorithm"] != self.algorithm:
            raise ValueError(f"checkpoint is for {meta['algorithm']!r}, not {self.algorithm!r}")
        self.keys = list(meta["keys"])
        self.last_round = int(meta["last_round"])
        self.model = [np.asarray(arrays[f"model/{k}"]) for k in self.keys]
        self.prev_model = [np.asarray(arrays[f"prev_model/{k}"]) for k in self.keys]

    def model_record(self) -> ArrayRecord:
        """The current global model as an ArrayRecord."""
        return _to_record(self.keys, self.model)

    def _ensure_model(self, arrays: ArrayRecord) -> None:
        if self.model is None:
            self.keys = list(arrays.keys())
            self.model = arrays.to_numpy_ndarrays()
            self.prev_model = self.model  # theta^{-1} = theta^0

    # ----------------------------------------------------------------------- train
    def _select_nodes(self, server_round: int, grid: Grid) -> list[int]:
        if self.client_manager is not None:
            return self.client_manager.select(server_round, grid)
        num_nodes = int(len(list(grid.get_node_ids())) * self.fraction_train)
        node_ids, _ = sample_nodes(grid, self.min_available_nodes, max(num_nodes, self.min_train_nodes))
        return node_ids

    def _round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        cfg = ConfigRecord(dict(config))
        cfg[protocol.ALGORITHM] = self.algorithm
        cfg[protocol.SERVER_ROUND] = server_round
        cfg[protocol.SERVER_LR] = self.current_server_lr(server_round)
        cfg[protocol.MOMENTUM] = self.momentum
        client_lr = self.current_client_lr()
        if client_lr is not None:
            cfg[protocol.CLIENT_LR] = client_lr
        return cfg

    def _extra_records(self, server_round: int) -> dict[str, ArrayRecord]:
        return {}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Select nodes and send theta^{t-1} with this round's settings (one shared RecordDict)."""
        self._ensure_model(arrays)
        if self.fraction_train == 0.0:
            return []
        node_ids = self._select_nodes(server_round, grid)
        content = RecordDict(
            {
                self.arrayrecord_key: self.model_record(),
                self.configrecord_key: self._round_config(server_round, config),
                **self._extra_records(server_round),
            }
        )
        self.round_info = {"num-selected": len(node_ids)}
        log(INFO, "configure_train: round %d, %d nodes", server_round, len(node_ids))
        return [Message(content=content, message_type=MessageType.TRAIN, dst_node_id=n) for n in node_ids]

    def _server_update(self, server_round: int, per_client: list[list[np.ndarray]], weights: list[float]) -> None:
        raise NotImplementedError

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Apply the algorithm's server rule to the valid replies; failures are counted in the metrics."""
        replies = list(replies)
        valid, failed = self._check_and_log_replies(replies, is_train=True)
        server_lr = self.current_server_lr(server_round)
        client_lr = self.current_client_lr()
        metrics = MetricRecord()
        if valid:
            if self.client_manager is not None:  # a fixed summation order: same model in every engine
                partition = self.client_manager.node_to_partition
                valid.sort(key=lambda m: partition.get(m.metadata.src_node_id, -1))
            contents = [m.content for m in valid]
            per_client = [c[self.arrayrecord_key].to_numpy_ndarrays() for c in contents]
            weights = [float(next(iter(c.metric_records.values()))[self.weighted_by_key]) for c in contents]
            metrics = self.train_metrics_aggr_fn(contents, self.weighted_by_key)
            self._server_update(server_round, per_client, weights)
            self._after_update(server_round, metrics)
        self.last_round = server_round
        metrics["num-replies"] = len(valid)
        metrics["num-failures"] = len(failed) + int(self.round_info.get("num-selected", 0)) - len(replies)
        if self.client_manager is not None:
            metrics["num-skipped"] = len(self.client_manager.skipped.get(server_round, []))
            metrics["num-refused"] = len(self.client_manager.refused.get(server_round, []))
            metrics["num-reassigned"] = len(self.client_manager.reassigned.get(server_round, []))
        metrics["server-lr"] = server_lr
        if client_lr is not None:
            metrics["client-lr"] = client_lr
        return (self.model_record() if valid else None), metrics

    def _after_update(self, server_round: int, metrics: MetricRecord) -> None:
        """Hook run after each server update (LocalUpdateDecay feeds its plateau rule here)."""


class FedAvgM(_ServerOptStrategy):
    """FedAvg with server heavy-ball momentum (seed 000 Eq. 92).

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
        "constant", "polynomial" (eta / t^alpha) or "exponential" (eta gamma^t);
        ``schedule_param`` is alpha or gamma.
    client_manager : PartitionClientManager, optional
        Cyclic or uniform participation; Flower's ``fraction_train`` sampling when None.
    **fedavg_kwargs
        Passed to Flower's ``FedAvg`` (fractions, minimum nodes, record keys).
    """

    algorithm = "fedavgm"

    def _server_update(self, server_round: int, per_client: list[list[np.ndarray]], weights: list[float]) -> None:
        delta = fm.model_delta(self.model, fm.weighted_mean(per_client, weights))
        new = fm.fedavgm_server_update(self.model, self.prev_model, delta, self.current_server_lr(server_round),
                                       self.momentum)
        self.prev_model, self.model = self.model, new


class FedCM(_ServerOptStrategy):
    """FedCM: the server's momentum term corrects every local step (seed 000 Eq. 101-102).

    Clients step theta <- theta - eta_l (1 - beta) grad + (beta / (J eta_t)) (theta^{t-1} - theta^{t-2});
    the server sends beta (theta^{t-1} - theta^{t-2}) / eta_t in the ArrayRecord
    "fedcm-correction" (zero in round 1) and updates theta^t = theta^{t-1} - eta_t Delta^t.
    ``server_lr`` must be positive; other parameters as in :class:`FedAvgM`.
    """

    algorithm = "fedcm"

    def __init__(self, *, client_lr: float, **kwargs: Any) -> None:
        super().__init__(client_lr=client_lr, **kwargs)

    def _extra_records(self, server_round: int) -> dict[str, ArrayRecord]:
        term = fm.fedcm_correction(self.model, self.prev_model, self.current_server_lr(server_round), self.momentum)
        return {protocol.FEDCM_CORRECTION: _to_record(self.keys, term)}

    def _server_update(self, server_round: int, per_client: list[list[np.ndarray]], weights: list[float]) -> None:
        delta = fm.model_delta(self.model, fm.weighted_mean(per_client, weights))
        new = fm.fedcm_server_update(self.model, delta, self.current_server_lr(server_round))
        self.prev_model, self.model = self.model, new


class LocalUpdate(_ServerOptStrategy):
    """LocalUpdate with decoupled client lr gamma and server lr eta (seed 001 Algorithms 1-2).

    Each client runs K mini-batch SGD steps with lr gamma and replies, in the ArrayRecord
    "arrays", q = sum_k Theta_k g_k; the server steps x <- x - eta_t * mean_i q_i.
    Theta_{1:K} with gamma = eta is FedAvg model averaging (seed 001 Appendix A);
    gamma = 0 is mini-batch SGD with summed gradients.

    Parameters
    ----------
    client_lr : float
        gamma >= 0 (0 is allowed).
    theta : str or sequence of float
        "fedavg" (Theta_{1:K}), "fomaml" (Theta_K) or explicit weights (K = len(theta)).
    local_steps : int
        K for a preset theta; 0 lets the client take E epochs (K = its number of steps).
    Other parameters as in :class:`FedAvgM` (no momentum).
    """

    algorithm = "localupdate"

    def __init__(
        self, *, client_lr: float, theta: str | Sequence[float] = "fedavg", local_steps: int = 0, **kwargs: Any
    ) -> None:
        if "momentum" in kwargs:
            raise ValueError("LocalUpdate has no momentum parameter")
        super().__init__(client_lr=client_lr, **kwargs)
        if int(local_steps) < 0:
            raise ValueError(f"local_steps must be >= 0, got {local_steps}")
        fm.theta_weights(theta, max(int(local_steps), 1))  # validates presets and vectors
        self.theta: str | list[float] = theta if isinstance(theta, str) else [float(w) for w in theta]
        self.local_steps = len(self.theta) if isinstance(self.theta, list) else int(local_steps)

    def _round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        cfg = super()._round_config(server_round, config)
        cfg[protocol.THETA] = self.theta
        if self.local_steps:
            cfg[protocol.LOCAL_STEPS] = self.local_steps
        return cfg

    def _server_update(self, server_round: int, per_client: list[list[np.ndarray]], weights: list[float]) -> None:
        mean_update = fm.weighted_mean(per_client, weights)
        new = fm.localupdate_server_update(self.model, mean_update, self.current_server_lr(server_round))
        self.prev_model, self.model = self.model, new


class LocalUpdateDecay(LocalUpdate):
    """LocalUpdate with automatic plateau decay of gamma and eta (seed 001 Section 9).

    Monitors the example-weighted mean of the sampled clients' loss of the broadcast
    model before local training ("loss-before"), averaged over a window of W rounds;
    after P rounds without an improvement of ``min_delta`` (outside a cooldown of C
    rounds, which also covers the first C rounds) it sets gamma <- gamma * client_decay
    and eta <- eta * server_decay, floored at ``min_lr``. See
    :func:`strategies.math.plateau_decay_step`.
    """

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
        self.decay_config = fm.PlateauDecayConfig(window, patience, cooldown, min_delta, client_decay, server_decay,
                                                  min_lr)
        self.decay_state = fm.PlateauDecayState.start(self.client_lr, self.server_lr, self.decay_config)

    def base_server_lr(self) -> float:
        return self.decay_state.server_lr

    def current_client_lr(self) -> float:
        return self.decay_state.client_lr

    def _after_update(self, server_round: int, metrics: MetricRecord) -> None:
        if protocol.LOSS_BEFORE not in metrics:
            raise ValueError(f"LocalUpdateDecay needs '{protocol.LOSS_BEFORE}' in every client's train reply")
        before = self.decay_state.num_decays
        self.decay_state = fm.plateau_decay_step(self.decay_state, float(metrics[protocol.LOSS_BEFORE]),
                                                 self.decay_config)
        if self.decay_state.num_decays > before:
            log(INFO, "Round %d: plateau -> client lr %.3g, server lr %.3g", server_round,
                self.decay_state.client_lr, self.decay_state.server_lr)

    def state_dict(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta, arrays = super().state_dict()
        meta["decay"] = vars(self.decay_state).copy()
        return meta, arrays

    def load_state_dict(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        super().load_state_dict(meta, arrays)
        self.decay_state = fm.PlateauDecayState(**meta["decay"])
