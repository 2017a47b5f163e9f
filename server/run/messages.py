"""The train message's ConfigRecord as the server writes it from a validated config; its keys and the defaults a
client assumes for absent ones are those of :mod:`client.config` and :mod:`strategies.protocol`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from flwr.app import ConfigRecord

from client import config as C
from client.partition import parse_alpha
from strategies import protocol as P


def client_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The static part of every train message's ConfigRecord (see client/config.py)."""
    c, d = cfg["client"], cfg["data"]
    alpha = parse_alpha(d.get("alpha", "inf"))  # unused by the naturally partitioned tasks
    return {
        C.MODEL: cfg["model"]["name"],
        C.DATASET: d["name"],
        C.DATA_ROOT: d.get("root") or "",
        C.CACHE_DIR: d.get("cache_dir") or "",
        C.DOWNLOAD: bool(d.get("download", False)),
        P.NUM_PARTITIONS: int(cfg["num_clients"]),
        C.ALPHA: "inf" if math.isinf(alpha) else float(alpha),
        C.PARTITION_SEED: int(cfg["seed"]),
        C.SEED: int(cfg["seed"]),
        C.BATCH_SIZE: int(c["batch_size"]),
        C.WEIGHT_DECAY: float(c.get("weight_decay", 0.0)),
        C.AUGMENT: bool(c.get("augment", True)),
        C.LOSS_BEFORE_BATCHES: int(c.get("loss_before_batches", 0)),
        P.LOCAL_EPOCHS: int(c.get("local_epochs", 1)),
        P.LOCAL_STEPS: int(c.get("local_steps", 0)),
    }


def train_record(cfg: Mapping[str, Any]) -> ConfigRecord:
    """The static part of every train message with ``torch-threads`` when set (the strategy adds each round's keys)."""
    static = client_config(cfg)
    threads = int(cfg["client"].get("torch_threads", 0))
    if threads:
        static[C.TORCH_THREADS] = threads
    return ConfigRecord(static)
