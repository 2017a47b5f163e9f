"""Flower ClientApp (Message API) of the CIFAR-10 experiments, importable as ``client.app:app``.

The handlers are thin wrappers around :func:`train_on_partition` / :func:`evaluate_on_partition`, which a
single-process benchmark can call directly to do the identical client work without Flower.

Per-process caches (dataset memory maps, partitions, model objects) are keyed by the config, so repeated
messages in one Ray actor reuse them; in a deployment every message runs in a fresh process, where loading
stays cheap (``np.load(mmap_mode="r")`` plus a partition computed from the labels in milliseconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from client import config as C
from client import threads
from client.data import Dataset, load_dataset
from client.datasets import NATURAL_DATASETS, NaturalData, load_task
from client.examples import Examples, ImageExamples
from client.models import build_model
from client.partition import dirichlet_partition
from client.train import (
    TrainConfig,
    TrainResult,
    as_named,
    evaluate_examples,
    get_device,
    load_arrays,
    state_shapes,
    train_examples,
)
from strategies import client_state, npy, records
from strategies import protocol as P
from strategies.client_step import algorithm as registered_algorithm
from strategies.client_step import extra_name

_DATASETS: dict[tuple, Dataset] = {}
_PARTITIONS: dict[tuple, list[np.ndarray]] = {}
_MODELS: dict[tuple, torch.nn.Module] = {}

STATE_KEY = "client-data-config"  # context.state ConfigRecord: data keys of the last train message
Arrays = ArrayRecord | Mapping[str, Any] | list[Any]


# --------------------------------------------------------------------------- cached resources
def get_dataset(cfg: Mapping[str, Any]) -> Dataset:
    key = (cfg[C.DATASET], str(cfg[C.DATA_ROOT]), str(cfg[C.CACHE_DIR]))
    if key not in _DATASETS:
        _DATASETS[key] = load_dataset(key[0], key[1], key[2] or None, download=bool(cfg[C.DOWNLOAD]))
    return _DATASETS[key]


def get_data(cfg: Mapping[str, Any]) -> Dataset | NaturalData:
    """The CIFAR-10 arrays, or a paper 2 task's naturally partitioned arrays (``client.datasets``)."""
    if cfg[C.DATASET] not in NATURAL_DATASETS:
        return get_dataset(cfg)
    key = (cfg[C.DATASET], str(cfg[C.DATA_ROOT]), str(cfg[C.CACHE_DIR]))
    if key not in _DATASETS:
        _DATASETS[key] = load_task(key[0], key[1], key[2] or None, download=bool(cfg[C.DOWNLOAD]))
    return _DATASETS[key]


def client_examples(
    cfg: Mapping[str, Any], ds: Dataset | NaturalData, partition_id: int, split: str, augment: bool = False
) -> Examples:
    """Client ``partition_id``'s examples of ``split``; a natural task has training clients only (paper 2
    §8), so its "test" is the client's training data too."""
    if isinstance(ds, NaturalData):
        return ds.client(int(partition_id), augment)
    idx = get_partition(cfg, split)[int(partition_id)]
    x, y = (ds.x_train, ds.y_train) if split == "train" else (ds.x_test, ds.y_test)
    return ImageExamples(x, y[idx], ds.mean, ds.std, augment, rows=idx)


def get_partition(cfg: Mapping[str, Any], split: str = "train") -> list[np.ndarray]:
    """Client indices of the train split (Dirichlet, alpha) or of the test split (IID shards)."""
    ds = get_dataset(cfg)
    alpha = cfg[C.ALPHA] if split == "train" else float("inf")
    key = (ds.cache_path, split, int(cfg[C.NUM_PARTITIONS]), alpha, int(cfg[C.PARTITION_SEED]))
    if key not in _PARTITIONS:
        labels = ds.y_train if split == "train" else ds.y_test
        _PARTITIONS[key] = dirichlet_partition(np.asarray(labels), key[2], alpha, key[4], ds.num_classes)
    return _PARTITIONS[key]


def get_model(name: str, num_classes: int) -> torch.nn.Module:
    """One model object per (name, classes) and process, on the chosen device; weights are always loaded."""
    key = (name, num_classes, get_device())
    if key not in _MODELS:
        _MODELS[key] = build_model(name, num_classes).to(key[2])
    return _MODELS[key]


def _to_named_arrays(arrays: Arrays) -> Mapping[str, Any] | list[Any]:
    if isinstance(arrays, ArrayRecord):
        return npy.record_arrays(arrays)
    return arrays


def _prepare(config: Mapping[str, Any], partition_id: int, node_config: Mapping[str, Any] | None):
    cfg = C.resolve(config, node_config)
    threads.apply(cfg, node_config)  # client.torch_threads, else the node's share (client/threads.py)
    if not 0 <= int(partition_id) < int(cfg[C.NUM_PARTITIONS]):
        raise ValueError(f"partition-id {partition_id} outside [0, {cfg[C.NUM_PARTITIONS]})")
    ds = get_data(cfg)
    return cfg, ds, get_model(str(cfg[C.MODEL]), ds.num_classes)


# --------------------------------------------------------------------------- plain functions
@dataclass
class TrainJob:
    """One client's round, prepared: its resolved config, examples, settings and the per-algorithm extras
    (``correction``, ``momentum_term`` or ``anchor``) that :func:`client.train.local_train` takes."""

    cfg: dict[str, Any]
    ds: Dataset | NaturalData
    model: torch.nn.Module  # the process's model object, holding the received weights (prepared with ``load``)
    examples: Examples  # the client's training examples (client.examples)
    train_cfg: TrainConfig
    extra: dict[str, Any]
    initial: Mapping[str, Any] | list[Any] = field(default_factory=dict)  # the received arrays
    store: client_state.ClientStateStore | None = None
    received: dict[str, np.ndarray] | None = None
    state_metrics: dict[str, int | float] = field(default_factory=dict)


def prepare_train(
    config: Mapping[str, Any],
    arrays: Arrays,
    partition_id: int,
    correction: Arrays | None = None,
    node_config: Mapping[str, Any] | None = None,
    momentum_term: Arrays | None = None,
    load: bool = True,
) -> TrainJob:
    """Resolve a train request into a :class:`TrainJob`; LocalGHBM and FedHBM read their node-local state here.
    ``load``: the received arrays are loaded into the model object (not needed by stacked training, which takes
    them from ``initial`` and the model for its architecture only; their names and shapes are checked either way)."""
    cfg, ds, model = _prepare(config, partition_id, node_config)
    received = _to_named_arrays(arrays)
    if load:
        load_arrays(model, received)
    else:
        as_named(state_shapes(model), received, "model arrays")
    train_cfg = C.train_config(cfg, partition_id)
    job = TrainJob(
        cfg,
        ds,
        model,
        client_examples(cfg, ds, partition_id, "train", train_cfg.augment),
        train_cfg,
        {
            "correction": _to_named_arrays(correction) if correction is not None else None,
            "momentum_term": _to_named_arrays(momentum_term) if momentum_term is not None else None,
        },
        initial=received,
    )
    algorithm = job.train_cfg.algorithm
    if registered_algorithm(algorithm).stateful:
        job.received = {k: np.asarray(v) for k, v in as_named(state_shapes(model), received, "model arrays").items()}
        job.store = client_state.ClientStateStore.from_config(cfg, partition_id, node_config)
        state, job.state_metrics = client_state.round_input(
            job.store, algorithm, job.train_cfg.server_round, job.received
        )
        job.extra[extra_name(job.train_cfg.family)] = state
    return job


def finish_train(job: TrainJob, result: TrainResult) -> tuple[dict[str, np.ndarray], dict[str, int | float]]:
    """(arrays as numpy, metrics) of a trained job; LocalGHBM and FedHBM write their node-local state here."""
    out = {k: v.numpy() for k, v in result.arrays.items()}
    if job.store is not None:
        client_state.remember(job.store, job.train_cfg.algorithm, job.train_cfg.server_round, job.received, out)
    return out, {**result.metrics, **job.state_metrics}


def train_on_partition(
    config: Mapping[str, Any],
    arrays: Arrays,
    partition_id: int,
    correction: Arrays | None = None,
    node_config: Mapping[str, Any] | None = None,
    momentum_term: Arrays | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, int | float]]:
    """One round of local training of client ``partition_id``: (state_dict or q as numpy, metrics).

    ``correction`` is FedCM's term, ``momentum_term`` GHBM's m. LocalGHBM and FedHBM read and write their
    node-local state (:mod:`strategies.client_state`).
    """
    job = prepare_train(config, arrays, partition_id, correction, node_config, momentum_term)
    return finish_train(job, train_examples(job.model, job.examples, job.train_cfg, **job.extra))


def evaluate_on_partition(
    config: Mapping[str, Any], arrays: Arrays, partition_id: int, node_config: Mapping[str, Any] | None = None
) -> dict[str, int | float]:
    """Loss/accuracy of the received model on this partition's test shard (or its train data)."""
    cfg, ds, model = _prepare(config, partition_id, node_config)
    split = str(cfg[C.EVAL_SPLIT])
    if split not in ("train", "test"):
        raise ValueError(f"{C.EVAL_SPLIT} must be 'train' or 'test', got {split!r}")
    load_arrays(model, _to_named_arrays(arrays))
    loss, acc, n = evaluate_examples(
        model, client_examples(cfg, ds, partition_id, split), int(cfg[C.EVAL_MAX_EXAMPLES])
    )
    return {P.NUM_EXAMPLES: int(n), "loss": float(loss), "accuracy": float(acc)}


# --------------------------------------------------------------------------- ClientApp
app = ClientApp()


def _partition_id(context: Context) -> int:
    if P.PARTITION_ID not in context.node_config:
        raise ValueError(f"node_config lacks {P.PARTITION_ID!r} (start the SuperNode with --node-config)")
    return int(context.node_config[P.PARTITION_ID])


def train_request(msg: Message, context: Context) -> dict[str, Any]:
    """The keyword arguments of :func:`train_on_partition` that a train message asks for on this node."""
    content = msg.content
    correction, momentum_term = content.get(P.FEDCM_CORRECTION), content.get(P.GHBM_MOMENTUM)
    return {
        "config": dict(content[P.CONFIG]),
        "arrays": content[P.ARRAYS],
        "partition_id": _partition_id(context),
        "correction": correction if isinstance(correction, ArrayRecord) else None,
        "momentum_term": momentum_term if isinstance(momentum_term, ArrayRecord) else None,
        "node_config": context.node_config,
    }


def train_reply(
    msg: Message, context: Context, arrays: Mapping[str, np.ndarray], metrics: Mapping[str, int | float]
) -> Message:
    """The reply to a train message: "arrays" (local model or q) and "metrics"; every engine builds it here.

    The node remembers the message's data keys (``context.state``), so evaluate messages without them still work.
    """
    config = msg.content[P.CONFIG]
    data = {k: config[k] for k in C.DATA_KEYS if k in config}
    current = context.state.get(STATE_KEY)
    if not isinstance(current, ConfigRecord) or dict(current) != data:  # building one validates every value
        context.state[STATE_KEY] = ConfigRecord(data)
    reply = records.record_dict(
        {
            P.ARRAYS: npy.to_record(list(arrays), list(arrays.values())),
            P.METRICS: records.metric_record(metrics),
        }
    )
    return Message(reply, reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training; the reply's "arrays" is the local model (FedAvgM, FedCM, GHBM family) or q (LocalUpdate)."""
    arrays, metrics = train_on_partition(**train_request(msg, context))
    return train_reply(msg, context, arrays, metrics)


@app.evaluate()
def evaluate_handler(msg: Message, context: Context) -> Message:
    """Evaluate the received model; reply "metrics" = {"num-examples", "loss", "accuracy"}.

    The data keys (dataset, data-root, model, partitioning, ...) come from the message's "config", falling
    back to those of the last train message this node handled (``context.state``).
    """
    config = dict(context.state[STATE_KEY]) if STATE_KEY in context.state.config_records else {}
    if P.CONFIG in msg.content.config_records:
        config.update(dict(msg.content[P.CONFIG]))
    metrics = evaluate_on_partition(config, msg.content[P.ARRAYS], _partition_id(context), context.node_config)
    return Message(records.record_dict({P.METRICS: records.metric_record(metrics)}), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which partition this node holds (and of how many, when its node_config says)."""
    claim = {P.PARTITION_ID: _partition_id(context)}
    if P.NUM_PARTITIONS in context.node_config:
        claim[P.NUM_PARTITIONS] = context.node_config[P.NUM_PARTITIONS]  # as given: the server checks it
    return Message(RecordDict({P.CONFIG: ConfigRecord(claim)}), reply_to=msg)
