"""The run's strategy with its client manager, and the initial global model, from a validated config."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord

from client.models import build_model
from client.partition import client_sizes
from client.tasks import MODEL_OUTPUTS
from strategies import CyclicClientManager, UniformClientManager, registry
from strategies.base import ServerOptStrategy


def max_num_examples(cfg: Mapping[str, Any], num_train: int | None) -> float | None:
    """``trust.max_num_examples``: "auto" = the largest partition of the split (needs ``num_train``)."""
    value = cfg.get("trust", {}).get("max_num_examples", "auto")
    if value == "auto":
        return None if num_train is None else float(client_sizes(num_train, int(cfg["num_clients"])).max())
    return None if value is None else float(value)


def build_strategy(cfg: Mapping[str, Any], num_train: int | None = None) -> ServerOptStrategy:
    """The configured strategy with its cyclic or uniform client manager (server-side evaluation only).

    ``num_train``: size of the clients' training split, for the default ``trust.max_num_examples``.
    """
    s, p = cfg["strategy"], cfg["participation"]
    manager_cls = CyclicClientManager if p["mode"] == "cyclic" else UniformClientManager
    extra = {"groups": p.get("groups")} if p["mode"] == "cyclic" else {}
    manager = manager_cls(
        int(cfg["num_clients"]),
        float(p["fraction"]),
        int(cfg["seed"]),
        query_timeout=query_timeout(cfg),
        wait_timeout=float(p.get("wait_timeout", 300)),
        bind_partitions=bind_partitions(cfg),
        owners=partition_owners(cfg),
        **extra,
    )
    common = dict(
        server_lr=float(s["server_lr"]),
        client_lr=float(s["client_lr"]),
        server_lr_schedule=s.get("server_lr_schedule", "constant"),
        schedule_param=float(s.get("schedule_param", 1.0)),
        client_lr_schedule=s.get("client_lr_schedule", "constant"),
        client_schedule_param=float(s.get("client_schedule_param", 1.0)),
        client_manager=manager,
        max_update_norm=cfg.get("trust", {}).get("max_update_norm"),
        max_num_examples=max_num_examples(cfg, num_train),
        weighting=s.get("weighting", "examples"),
        fraction_evaluate=0.0,
        min_available_nodes=1,
        min_train_nodes=1,
    )
    spec = registry.STRATEGIES[s["name"]]
    if spec.stateful:
        common["client_state_dir"] = client_state_dir(cfg)
    return spec.cls(**registry.strategy_options(cfg), **common)


def client_state_dir(cfg: Mapping[str, Any]) -> str | None:
    """Where LocalGHBM/FedHBM clients keep their files: ``client.state_dir``, else <run_dir>/client_state
    (a node's ``node_config["client-state-dir"]`` overrides it; docs/ghbm.md)."""
    state_dir = cfg.get("client", {}).get("state_dir")
    if state_dir:
        return str(state_dir)
    return str(Path(cfg["run_dir"]) / "client_state") if cfg.get("run_dir") else None


def bind_partitions(cfg: Mapping[str, Any]) -> bool:
    """Whether a partition stays with the node that claimed it first: ``deploy.bind_partitions``, where null
    follows ``deploy.auth`` (only authenticated node ids are stable; see strategies/client_manager.py)."""
    d = cfg.get("deploy") or {}
    bind = d.get("bind_partitions")
    return bool(d.get("auth")) if bind is None else bool(bind)


def query_timeout(cfg: Mapping[str, Any]) -> float:
    """Seconds a round waits for a node's answer to the partition query (``participation.query_timeout``, at most
    ``round_timeout``); a node that misses it is silent and not waited for again (strategies/client_manager.py)."""
    return min(float(cfg["participation"].get("query_timeout", 30)), float(cfg["round_timeout"]))


def partition_owners(cfg: Mapping[str, Any]) -> dict[str, int] | None:
    """Key fingerprint -> partition of the SuperNodes allowed to serve each partition, or None (no key
    ownership): ``deploy.partition_owners``, which flower-deploy writes (server/deploy/ownership.py)."""
    owners = (cfg.get("deploy") or {}).get("partition_owners")
    return None if owners is None else {str(k): int(v) for k, v in owners.items()}


def initial_model(cfg: Mapping[str, Any]) -> ArrayRecord:
    """theta^0: the configured model initialised from ``seed``."""
    torch.manual_seed(int(cfg["seed"]))
    name = cfg["model"]["name"]
    model = build_model(name, MODEL_OUTPUTS.get(name, 10))
    return ArrayRecord(model.state_dict())
