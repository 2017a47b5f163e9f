"""The shared base of our Flower strategies: state, node selection, message packing, reply validation.

:class:`ServerOptStrategy` subclasses Flower's Message-API ``FedAvg`` and keeps its message conventions (model
in the ArrayRecord "arrays", weights under "num-examples"). Node selection follows an optional client manager
(cyclic or uniform over partition ids); without one, Flower's own sampling (``fraction_train``) is used. Every
train reply passes :func:`strategies.validation.check_reply` before any aggregation. The algorithms
(:mod:`strategies.flower`) only add their server rule and what they send with the model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from server.internals.flower_strategy import sample_nodes
from strategies import math as fm
from strategies import npy, protocol, records, schedules, validation
from strategies.client_manager import PartitionClientManager


class ServerOptStrategy(FedAvg):
    """Shared machinery: state, node selection, message packing, reply validation and unpacking.

    Subclasses implement :meth:`_server_update` (the algorithm's server rule on the accepted replies) and may
    set ``reply_is_update`` (clients return an update q instead of a local model) and ``required_metrics``.
    """

    algorithm = ""
    server_lr_may_be_zero = True  # False: eta = 0 is refused (FedCM divides its correction by eta)
    reply_is_update = False  # True: the reply's arrays are the client's update itself (LocalUpdate's q)
    required_metrics: tuple[str, ...] = ()

    def __init__(
        self,
        *,
        server_lr: float = 1.0,
        client_lr: float | None = None,
        momentum: float = 0.0,
        server_lr_schedule: str = "constant",
        schedule_param: float = 1.0,
        client_lr_schedule: str = "constant",
        client_schedule_param: float = 1.0,
        client_manager: PartitionClientManager | None = None,
        max_update_norm: float | None = None,
        max_num_examples: float | None = None,
        weighting: str = "examples",
        **fedavg_kwargs: Any,
    ) -> None:
        super().__init__(**fedavg_kwargs)
        fm.check_lr(server_lr, "server_lr", allow_zero=self.server_lr_may_be_zero)
        if client_lr is not None:
            fm.check_lr(client_lr, "client_lr")
        self.check_momentum(momentum)
        schedules.check_schedule(server_lr_schedule, schedule_param)
        schedules.check_schedule(client_lr_schedule, client_schedule_param, "client_lr_schedule")
        self.server_lr = float(server_lr)
        self.client_lr = None if client_lr is None else float(client_lr)
        self.momentum = float(momentum)
        self.server_lr_schedule = server_lr_schedule
        self.schedule_param = float(schedule_param)
        self.client_lr_schedule = client_lr_schedule
        self.client_schedule_param = float(client_schedule_param)
        self.client_manager = client_manager
        self.max_update_norm = validation.check_cap(max_update_norm, "max_update_norm")
        self.max_num_examples = validation.check_cap(max_num_examples, "max_num_examples")
        fm.client_weights([], weighting)  # checks the name
        self.weighting = weighting
        self.keys: list[str] | None = None
        self.model: list[np.ndarray] | None = None
        self.prev_model: list[np.ndarray] | None = None
        self._model_record: tuple[list[np.ndarray], ArrayRecord] | None = None  # (model, its record)
        self.last_round = 0
        self.round_info: dict[str, float] = {}
        self.round_nodes: set[int] = set()

    # ----------------------------------------------------------------------- state
    def check_momentum(self, momentum: float) -> None:
        """Validate beta (in [0, 1) here; the GHBM family allows 1)."""
        fm.check_momentum(momentum)

    def checkpoint_due(self, server_round: int) -> None:
        """Hook: the run is about to save its checkpoint after ``server_round`` (what clients keep only in memory
        must reach their files first)."""

    def checkpoint_saved(self, server_round: int) -> None:
        """Hook: the run saved a checkpoint after ``server_round`` (stateful clients prune their files by it)."""

    def run_closed(self) -> None:
        """Hook: the run has ended (finished, diverged, failed or stopped)."""

    def current_server_lr(self, server_round: int) -> float:
        """eta_t of round t from the base server lr and the schedule."""
        return float(
            schedules.scheduled_lr(self.base_server_lr(), self.server_lr_schedule, self.schedule_param, server_round)
        )

    def base_server_lr(self) -> float:
        """Server lr before the schedule (LocalUpdateDecay overrides it)."""
        return self.server_lr

    def current_client_lr(self, server_round: int) -> float | None:
        """gamma_t sent in round t: the base client lr under ``client_lr_schedule`` (None: the strategy has none)."""
        base = self.base_client_lr()
        if base is None:
            return None
        return float(schedules.scheduled_lr(base, self.client_lr_schedule, self.client_schedule_param, server_round))

    def base_client_lr(self) -> float | None:
        """Client lr before the schedule (LocalUpdateDecay overrides it)."""
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
        """The current global model as an ArrayRecord, encoded once per model: a round's result and the next round's
        messages share it (a model is never changed in place: every update makes a new list)."""
        if self._model_record is None or self._model_record[0] is not self.model:
            self._model_record = (self.model, npy.to_record(self.keys, self.model))
        return self._model_record[1]

    def _ensure_model(self, arrays: ArrayRecord) -> None:
        if self.model is None:
            self.keys = list(arrays.keys())
            self.model = list(npy.record_arrays(arrays).values())
            self.prev_model = self.model  # theta^{-1} = theta^0

    # ----------------------------------------------------------------------- train
    def _select_nodes(self, server_round: int, grid: Grid) -> list[int]:
        if self.client_manager is not None:
            return self.client_manager.select(server_round, grid)
        num_nodes = int(len(list(grid.get_node_ids())) * self.fraction_train)
        node_ids, _ = sample_nodes(grid, self.min_available_nodes, max(num_nodes, self.min_train_nodes))
        return node_ids

    def _round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        cfg = config.copy() if isinstance(config, ConfigRecord) else ConfigRecord(dict(config))  # copy: checked once
        cfg[protocol.ALGORITHM] = self.algorithm
        cfg[protocol.SERVER_ROUND] = server_round
        cfg[protocol.SERVER_LR] = self.current_server_lr(server_round)
        cfg[protocol.MOMENTUM] = self.momentum
        client_lr = self.current_client_lr(server_round)
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
        content = records.record_dict(
            {
                self.arrayrecord_key: self.model_record(),
                self.configrecord_key: self._round_config(server_round, config),
                **self._extra_records(server_round),
            }
        )
        self.round_info = {protocol.NUM_SELECTED: len(node_ids)}
        self.round_nodes = set(node_ids)
        log(INFO, "configure_train: round %d, %d nodes", server_round, len(node_ids))
        return [Message(content=content, message_type=MessageType.TRAIN, dst_node_id=n) for n in node_ids]

    def _server_update(
        self, server_round: int, per_client: list[list[np.ndarray]], weights: list[float]
    ) -> list[np.ndarray]:
        """Apply the server rule to the accepted replies; return the aggregated pseudo-gradient it used."""
        raise NotImplementedError

    def client_update(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """One client's update: theta^{t-1} - theta_i for model replies, the reply itself for q replies."""
        return arrays if self.reply_is_update else fm.model_delta(self.model, arrays)

    def reply_spec(self) -> validation.ReplySpec:
        """What a valid train reply holds this round (keys, shapes, dtypes of the model; metrics; caps)."""
        return validation.ReplySpec.like(
            self.keys,
            self.model,
            weighted_by_key=self.weighted_by_key,
            required_metrics=self.required_metrics,
            max_num_examples=self.max_num_examples,
            max_update_norm=self.max_update_norm,
        )

    def _partition_of(self, node_id: int) -> int | None:
        return None if self.client_manager is None else self.client_manager.node_to_partition.get(node_id)

    def _validate_replies(self, server_round: int, replies: list[Message]) -> list[validation.CheckedReply]:
        """Accepted replies in partition order (a fixed summation order: the same model in every engine);
        every rejected one is logged once with its node, partition and reason."""
        spec = self.reply_spec()
        accepted: list[tuple[int, validation.CheckedReply]] = []
        for msg in replies:
            node = msg.metadata.src_node_id
            partition = self._partition_of(node)
            try:
                if node not in self.round_nodes:
                    raise validation.RejectedReply("reply from a node that was not asked this round")
                checked = validation.check_reply(msg.content, spec, self.client_update)
            except validation.RejectedReply as err:
                log(
                    WARNING,
                    "Round %d: rejected the reply of node %s (partition %s): %s",
                    server_round,
                    node,
                    partition,
                    err,
                )
                continue
            accepted.append((-1 if partition is None else partition, checked))
        accepted.sort(key=lambda item: item[0])  # stable: without a client manager, arrival order
        return [checked for _, checked in accepted]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate every reply, then apply the algorithm's server rule to the accepted ones.

        Error replies and missing replies count as failures, invalid ones as rejections; without an accepted
        reply the model and all strategy state stay unchanged (the returned ArrayRecord is None).
        """
        replies = list(replies)
        received, failed = self._check_and_log_replies(replies, is_train=True, validate=False)
        accepted = self._validate_replies(server_round, received)
        server_lr = self.current_server_lr(server_round)
        client_lr = self.current_client_lr(server_round)
        metrics: dict[str, Any] = {}  # the round's MetricRecord, built once at the end (records.metric_record)
        if accepted:
            weights = fm.client_weights([c.weight for c in accepted], self.weighting)
            metrics = validation.aggregate_metrics([c.metrics for c in accepted], weights)
            pseudo_gradient = self._server_update(server_round, [c.arrays for c in accepted], weights)
            metrics[protocol.UPDATE_NORM] = fm.l2_norm(pseudo_gradient)
            metrics[protocol.CLIENT_UPDATE_NORM] = sum(c.update_norm * w for c, w in zip(accepted, weights)) / sum(
                weights
            )
            self._after_update(server_round, metrics)
        else:
            log(WARNING, "Round %d: no valid reply; the model and the strategy state stay unchanged", server_round)
        self.last_round = server_round
        metrics[protocol.NUM_REPLIES] = len(accepted)
        metrics[protocol.NUM_REJECTED] = len(received) - len(accepted)
        metrics[protocol.NUM_FAILURES] = len(failed) + int(self.round_info.get(protocol.NUM_SELECTED, 0)) - len(replies)
        if self.client_manager is not None:
            metrics.update(self.client_manager.round_counts(server_round))
        metrics[protocol.SERVER_LR] = server_lr
        if client_lr is not None:
            metrics[protocol.CLIENT_LR] = client_lr
        return (self.model_record() if accepted else None), records.metric_record(metrics)

    def _after_update(self, server_round: int, metrics: Mapping[str, Any]) -> None:
        """Hook run after each server update (LocalUpdateDecay feeds its plateau rule here)."""
