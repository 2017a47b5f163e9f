"""A numpy ClientApp on quadratic clients f_i(x) = (mu/2) ||x - c_i||^2, for strategy tests.

Local steps use the theory package's client loops, which call the shared math (strategies.math); the GHBM family
(and the node-local state of LocalGHBM / FedHBM) runs through theory.flower_app.ghbm_family_local. Without
an "algorithm" key it behaves as a plain Flower FedAvg client (SGD with config "lr").
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from strategies import math as fm
from strategies import protocol
from theory.flower_app import ghbm_family_local
from theory.problems import fedavgm_client, fedcm_client, localupdate_client

MU = 0.5
SHAPES = [(3,), (2, 2)]
app = ClientApp()


def center(partition_id: int) -> list[np.ndarray]:
    """c_i: a fixed, partition-dependent optimum."""
    rng = np.random.default_rng(1000 + partition_id)
    return [rng.normal(size=s) for s in SHAPES]


def num_examples(partition_id: int) -> int:
    return 10 + 5 * partition_id


def loss(x: list[np.ndarray], c: list[np.ndarray]) -> float:
    return float(sum(0.5 * MU * np.sum((a - b) ** 2) for a, b in zip(x, c)))


def local_train(
    cfg: ConfigRecord,
    model: list[np.ndarray],
    c: list[np.ndarray],
    extra: ArrayRecord | None,
    partition_id: int = 0,
    state_metrics: dict | None = None,
):
    """Run the round's local steps layer by layer (the loss is separable); returns (reply arrays, steps).

    The GHBM family's client-state metrics are added to ``state_metrics``."""
    algorithm = str(cfg.get(protocol.ALGORITHM, "plain"))
    steps = int(cfg.get(protocol.LOCAL_STEPS, 0)) or 2
    lr = float(cfg.get(protocol.CLIENT_LR, cfg.get("lr", 0.1)))
    grads = [lambda x, ci=ci: MU * (x - ci) for ci in c]
    if algorithm == "localupdate":
        weights = fm.theta_weights(cfg[protocol.THETA], steps)
        return [localupdate_client(x, g, lr, weights) for x, g in zip(model, grads)], len(weights)
    if algorithm in ("ghbm", "localghbm", "fedhbm"):
        keys = list(extra.keys()) if extra is not None else [str(i) for i in range(len(model))]
        local, metrics = ghbm_family_local(
            cfg, dict(zip(keys, model)), dict(zip(keys, grads)), extra, partition_id, steps
        )
        if state_metrics is not None:
            state_metrics.update(metrics)
        return [local[k] for k in keys], steps
    if algorithm == "fedcm":
        beta = float(cfg[protocol.MOMENTUM])
        terms = extra.to_numpy_ndarrays()
        return [fedcm_client(x, g, lr, beta, m, steps) for x, g, m in zip(model, grads, terms)], steps
    return [fedavgm_client(x, g, lr, steps) for x, g in zip(model, grads)], steps


@app.train()
def train(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    c = center(pid)
    record = msg.content[protocol.ARRAYS]
    model = record.to_numpy_ndarrays()
    cfg = msg.content[protocol.CONFIG]
    records = msg.content.array_records
    extra = records.get(protocol.FEDCM_CORRECTION) or records.get(protocol.GHBM_MOMENTUM)
    state_metrics: dict = {}
    out, steps = local_train(cfg, model, c, extra, pid, state_metrics)
    metrics = MetricRecord(
        {
            protocol.NUM_EXAMPLES: num_examples(pid),
            protocol.LOSS_BEFORE: loss(model, c),
            protocol.TRAIN_LOSS: loss(out, c) if cfg.get(protocol.ALGORITHM) != "localupdate" else 0.0,
            protocol.NUM_STEPS: steps,
            **state_metrics,
        }
    )
    arrays = ArrayRecord({k: Array(np.asarray(a)) for k, a in zip(record.keys(), out)})
    return Message(RecordDict({protocol.ARRAYS: arrays, protocol.METRICS: metrics}), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    return Message(RecordDict({protocol.CONFIG: ConfigRecord({protocol.PARTITION_ID: pid})}), reply_to=msg)
