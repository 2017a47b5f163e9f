"""The GHBM family as Flower Message-API strategies: GHBM(tau), LocalGHBM and FedHBM (docs/ghbm.md).

Zaccone, Karimireddy, Masone, Ciccone, "Communication-Efficient Heterogeneous Federated Learning with Generalized
Heavy-Ball Momentum" (TMLR 2025), the escape from the momentum limits of paper 1 (Section III-F). All three
share the server rule theta^t = theta^{t-1} - eta_t Delta^t and the client step
theta <- theta - eta_l grad - (beta / J) m (:mod:`strategies.math`, GHBM section); they differ in m:

- :class:`GHBM`: stateless clients; the server keeps theta^{t-1-tau} .. theta^{t-1} and sends
  m^t = (theta^{t-1-tau} - theta^{t-1}) / tau with the model (zero in rounds 1..tau).
- :class:`LocalGHBM`: the server sends only the model (FedAvg's communication); each client keeps the global
  model of its previous participation and forms m_i = (anchor_i - theta^{t-1}) / tau_i itself.
- :class:`FedHBM`: the server sends only the model; each client keeps its own final local model a_i and uses
  m = C (a_i - theta_{i,k}) at every step.

The stateful clients keep node-local files (:mod:`strategies.client_state`); the strategy owns the identity of
those files (run id, one segment per server start) and keeps it in its checkpoint state.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log

from strategies import client_state, protocol, validation
from strategies import math as fm
from strategies.base import ServerOptStrategy
from strategies.client_state import new_id
from strategies.npy import to_record
from strategies.participation import CyclicSchedule


class _GHBMServer(ServerOptStrategy):
    """Server rule shared by the family: theta^t = theta^{t-1} - eta_t Delta^t; beta in [0, 1]."""

    def __init__(self, *, client_lr: float, momentum: float = 0.9, **kwargs: Any) -> None:
        super().__init__(client_lr=client_lr, momentum=momentum, **kwargs)

    def check_momentum(self, momentum: float) -> None:
        fm.check_ghbm_momentum(momentum)

    def _server_update(
        self, server_round: int, per_client: list[list[np.ndarray]], weights: list[float]
    ) -> list[np.ndarray]:
        delta = fm.model_delta(self.model, fm.weighted_mean(per_client, weights))
        new = fm.ghbm_server_update(self.model, delta, self.current_server_lr(server_round))
        self.prev_model, self.model = self.model, new
        return delta


class GHBM(_GHBMServer):
    """Generalized heavy-ball momentum with stateless clients.

    Parameters
    ----------
    server_lr, client_lr : float
        eta (>= 0; eta_t follows ``server_lr_schedule``) and eta_l (>= 0).
    momentum : float
        beta in [0, 1] (0.9 in the authors' configs).
    tau : int
        >= 1: the server sends m^t = (theta^{t-1-tau} - theta^{t-1}) / tau ("ghbm-momentum"), zero in rounds
        1..tau. tau = 1 is heavy-ball momentum inside the local steps; the authors use tau = 1/C (one cycle).
    Other parameters as in :class:`strategies.flower.FedAvgM`.
    """

    algorithm = "ghbm"

    def __init__(self, *, client_lr: float, tau: int = 1, **kwargs: Any) -> None:
        super().__init__(client_lr=client_lr, **kwargs)
        self.tau = fm.check_tau(tau)
        self.history: dict[int, list[np.ndarray]] = {}  # round s -> theta^s, rounds last - tau .. last

    def _ensure_model(self, arrays: ArrayRecord) -> None:
        super()._ensure_model(arrays)
        if not self.history:
            self.history = {self.last_round: self.model}

    def model_at(self, server_round: int) -> list[np.ndarray]:
        """theta^s: the newest kept model of a round <= s (a round without accepted reply keeps the model)."""
        rounds = [r for r in self.history if r <= server_round]
        if not rounds:
            raise RuntimeError(f"GHBM history has no model of round <= {server_round}")
        return self.history[max(rounds)]

    def momentum_term(self, server_round: int) -> list[np.ndarray]:
        """m^t sent in round t (zero in rounds 1..tau)."""
        if not fm.ghbm_has_momentum(server_round, self.tau):
            return [np.zeros_like(a) for a in self.model]
        return fm.ghbm_momentum(self.model_at(server_round - 1 - self.tau), self.model, self.tau)

    def _extra_records(self, server_round: int) -> dict[str, ArrayRecord]:
        return {protocol.GHBM_MOMENTUM: to_record(self.keys, self.momentum_term(server_round))}

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The base round, then record theta^t (also when no reply was accepted: theta^t = theta^{t-1})."""
        out = super().aggregate_train(server_round, replies)
        self.history[server_round] = self.model
        self.history = {r: m for r, m in self.history.items() if r >= server_round - self.tau}
        return out

    def state_dict(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta, arrays = super().state_dict()
        meta["tau"] = self.tau
        meta["history_rounds"] = sorted(self.history)
        for r in meta["history_rounds"]:
            arrays.update({f"history/{r}/{k}": a for k, a in zip(self.keys, self.history[r], strict=True)})
        return meta, arrays

    def load_state_dict(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        super().load_state_dict(meta, arrays)
        if int(meta["tau"]) != self.tau:
            raise ValueError(f"checkpoint has tau={meta['tau']}, this strategy tau={self.tau}")
        self.history = {
            int(r): [np.asarray(arrays[f"history/{r}/{k}"]) for k in self.keys] for r in meta["history_rounds"]
        }


class _StatefulClients(_GHBMServer):
    """Server side of the stateful variants: only the model on the wire, plus the identity of the clients' state.

    ``client_state_dir`` is where clients keep their files (``node_config["client-state-dir"]`` overrides it on
    a node). The run id and the first segment are created here, at a fresh start; :meth:`load_state_dict` (a
    resume) restores them and opens a new segment from the next round.
    """

    def __init__(self, *, client_lr: float, client_state_dir: str | None = None, **kwargs: Any) -> None:
        super().__init__(client_lr=client_lr, **kwargs)
        self.client_state_dir = None if client_state_dir is None else str(client_state_dir)
        self.state_run = new_id()
        self.state_starts: list[int] = [1]
        self.state_ids: list[str] = [new_id()]
        self.checkpoint_round: int | None = None

    def _validate_replies(self, server_round: int, replies: list[Message]) -> list[validation.CheckedReply]:
        """The accepted replies; a warning when some clients found their stored state corrupt and ran the round as a
        first participation (``state-invalid``; each client's own log says why), which changes the run's
        trajectory."""
        accepted = super()._validate_replies(server_round, replies)
        ignored = sum(1 for c in accepted if c.metrics.get(protocol.STATE_INVALID, 0.0) > 0)
        if ignored:
            log(WARNING, "Round %d: %d client(s) ignored a corrupt stored state (a first participation instead)",
                server_round, ignored)  # fmt: skip
        return accepted

    def checkpoint_due(self, server_round: int) -> None:
        """States kept in memory by nodes of this process reach their files (:func:`client_state.flush`), pruned by
        the last saved checkpoint: a resume from it may still need older ones."""
        keep = self.checkpoint_round if self.checkpoint_round is not None else server_round
        client_state.flush(self.state_run, keep)

    def checkpoint_saved(self, server_round: int) -> None:
        self.checkpoint_round = int(server_round)

    def run_closed(self) -> None:
        client_state.forget(self.state_run)

    def _round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        cfg = super()._round_config(server_round, config)
        if self.client_state_dir is not None:
            cfg[protocol.STATE_DIR] = self.client_state_dir
        cfg[protocol.STATE_RUN] = self.state_run
        cfg[protocol.STATE_STARTS] = list(self.state_starts)
        cfg[protocol.STATE_IDS] = list(self.state_ids)
        # without checkpoints nothing older than the newest state can be needed again
        keep = self.checkpoint_round if self.checkpoint_round is not None else server_round - 1
        cfg[protocol.STATE_KEEP] = int(keep)
        return cfg

    def state_dict(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta, arrays = super().state_dict()
        meta["client_state"] = {"run": self.state_run, "starts": self.state_starts, "ids": self.state_ids}
        return meta, arrays

    def load_state_dict(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        super().load_state_dict(meta, arrays)
        state = meta["client_state"]
        self.state_run = str(state["run"])
        self.state_starts = [int(s) for s in state["starts"]] + [self.last_round + 1]
        self.state_ids = [str(s) for s in state["ids"]] + [new_id()]
        self.checkpoint_round = self.last_round


class LocalGHBM(_StatefulClients):
    """LocalGHBM: FedAvg's communication; each client keeps the global model of its previous participation.

    Client i uses m_i = (anchor_i - theta^{t-1}) / tau_i, tau_i = rounds since that participation, zero at its
    first one (:func:`strategies.client_state.round_input`); under cyclic participation with period p this is
    GHBM(tau = p) exactly. (The authors' code uses C (anchor_i - theta^{t-1}); identical under cyclic
    participation with C = 1/p, see docs/ghbm.md.) Parameters as in :class:`GHBM` without ``tau``, plus
    ``client_state_dir``.
    """

    algorithm = "localghbm"


class FedHBM(_StatefulClients):
    """FedHBM: each client keeps its own final local model a_i and steps with m = C (a_i - theta_{i,k}).

    theta <- theta - eta_l grad - (beta C / J)(a_i - theta_{i,k}) at every local step, zero momentum at a first
    participation; the authors use beta = 1 (the default here). C is sent as "participation": ``participation``
    when given, else 1/p of a cyclic client manager, C*N/N of a uniform one, or ``fraction_train``.
    """

    algorithm = "fedhbm"

    def __init__(
        self, *, client_lr: float, momentum: float = 1.0, participation: float | None = None, **kwargs: Any
    ) -> None:
        super().__init__(client_lr=client_lr, momentum=momentum, **kwargs)
        if participation is not None and not 0.0 < float(participation) <= 1.0:
            raise ValueError(f"participation must lie in (0, 1], got {participation!r}")
        self.participation = None if participation is None else float(participation)

    def participation_fraction(self) -> float:
        """C: explicit, else from the client manager's schedule, else Flower's ``fraction_train``."""
        if self.participation is not None:
            return self.participation
        if self.client_manager is not None:
            schedule = self.client_manager.schedule
            if isinstance(schedule, CyclicSchedule):
                return 1.0 / schedule.period
            return schedule.size / schedule.num_clients
        return float(self.fraction_train)

    def _round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        cfg = super()._round_config(server_round, config)
        cfg[protocol.PARTICIPATION] = self.participation_fraction()
        return cfg
