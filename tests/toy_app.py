"""A numpy ClientApp on quadratic clients f_i(x) = (mu/2) ||x - c_i||^2, for strategy tests.

Local steps call the shared math (strategies.math), like the real torch client. Without
an "algorithm" key it behaves as a plain Flower FedAvg client (SGD with config "lr").
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from strategies import math as fm
from strategies import protocol

MU = 0.5
SHAPES = [(3,), (2, 2)]
app = ClientApp()


def center(partition_id: int) -> list[np.ndarray]:
    """c_i: a fixed, partition-dependent optimum."""
    rng = np.random.default_rng(1000 + partition_id)
    return [rng.normal(size=s) for s in SHAPES]


def num_examples(partition_id: int) -> int:
    return 10 + 5 * partition_id


def grad(x: list[np.ndarray], c: list[np.ndarray]) -> list[np.ndarray]:
    return [MU * (a - b) for a, b in zip(x, c)]


def loss(x: list[np.ndarray], c: list[np.ndarray]) -> float:
    return float(sum(0.5 * MU * np.sum((a - b) ** 2) for a, b in zip(x, c)))


def local_train(cfg: ConfigRecord, model: list[np.ndarray], c: list[np.ndarray], extra: ArrayRecord | None):
    """Run the round's local steps; returns (reply arrays, train loss, steps)."""
    algorithm = str(cfg.get(protocol.ALGORITHM, "plain"))
    steps = int(cfg.get(protocol.LOCAL_STEPS, 0)) or 2
    x = [a.copy() for a in model]
    losses = []
    if algorithm == "localupdate":
        weights = fm.theta_weights(cfg[protocol.THETA], steps)
        q = [np.zeros_like(a) for a in x]
        for w in weights:
            g = grad(x, c)
            losses.append(loss(x, c))
            q = [fm.localupdate_accumulate(qk, gk, w) for qk, gk in zip(q, g)]
            x = [fm.sgd_step(a, gk, float(cfg[protocol.CLIENT_LR])) for a, gk in zip(x, g)]
        return q, float(np.mean(losses)), len(weights)
    lr = float(cfg.get(protocol.CLIENT_LR, cfg.get("lr", 0.1)))
    correction = extra.to_numpy_ndarrays() if extra is not None else None
    for _ in range(steps):
        g = grad(x, c)
        losses.append(loss(x, c))
        if algorithm == "fedcm":
            beta = float(cfg[protocol.MOMENTUM])
            x = [fm.fedcm_local_step(a, gk, lr, beta, m, steps) for a, gk, m in zip(x, g, correction)]
        else:
            x = [fm.sgd_step(a, gk, lr) for a, gk in zip(x, g)]
    return x, float(np.mean(losses)), steps


@app.train()
def train(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    c = center(pid)
    record = msg.content[protocol.ARRAYS]
    model = record.to_numpy_ndarrays()
    cfg = msg.content[protocol.CONFIG]
    extra = msg.content.array_records.get(protocol.FEDCM_CORRECTION)
    out, train_loss, steps = local_train(cfg, model, c, extra)
    metrics = MetricRecord(
        {
            protocol.NUM_EXAMPLES: num_examples(pid),
            protocol.LOSS_BEFORE: loss(model, c),
            protocol.TRAIN_LOSS: train_loss,
            protocol.NUM_STEPS: steps,
        }
    )
    arrays = ArrayRecord({k: Array(np.asarray(a)) for k, a in zip(record.keys(), out)})
    return Message(RecordDict({protocol.ARRAYS: arrays, protocol.METRICS: metrics}), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    return Message(RecordDict({protocol.CONFIG: ConfigRecord({protocol.PARTITION_ID: pid})}), reply_to=msg)
