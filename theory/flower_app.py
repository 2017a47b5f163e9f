"""A Flower ClientApp with the quadratic clients of both seeds (for the Flower equivalence check).

Partition 0 is client 1 of paper 1 Lemma III.4 (f_1 = mu/2 th^2 + G th) and partition 1 is client 2
(f_2 = mu/2 th^2 - G th); with ``"problem": "two-point"`` in the config, partition p is instead the paper 2
client A = p + 1, c = 1 / (p + 1). GHBM, LocalGHBM and FedHBM run through :func:`ghbm_family_local` (the
stateful two keep node-local state with :mod:`strategies.client_state`, like the CIFAR-10 client). The local
work calls the same client functions as the theory drivers (:mod:`theory.problems`), which call
``strategies.math``. Defined in an importable module so that Ray actors import it (see the Flower 1.39 notes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from strategies import client_state, protocol
from strategies import math as fm
from strategies.client_step import algorithm as registered_algorithm
from theory.problems import (
    QuadraticClient,
    fedavgm_client,
    fedcm_client,
    fedhbm_client,
    ghbm_client,
    localupdate_client,
    two_client_grad,
)

app = ClientApp()


def client_for(partition_id: int, cfg: ConfigRecord) -> QuadraticClient | float:
    """The partition's problem: a paper 2 QuadraticClient, or the paper 1 signed heterogeneity s G."""
    if str(cfg.get("problem", "lemma-iii4")) == "two-point":
        a = float(partition_id + 1)
        return QuadraticClient(a, 1.0 / a)
    return float(cfg["G"]) * (1.0 if partition_id == 0 else -1.0)


def ghbm_family_local(
    cfg: Mapping[str, Any],
    arrays: dict[str, np.ndarray],
    grads: dict[str, Callable[[Any], Any]],
    momentum_record: ArrayRecord | None,
    partition_id: int,
    local_steps: int,
    node_config: Mapping[str, Any] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """One GHBM / LocalGHBM / FedHBM client round on numpy arrays (one gradient function per array).

    GHBM uses the server's m ("ghbm-momentum"); LocalGHBM and FedHBM read their state (m_i, resp. a_i) from
    the node-local store and write this round's state back. Returns the local model and the state metrics.
    """
    algorithm, t = str(cfg[protocol.ALGORITHM]), int(cfg[protocol.SERVER_ROUND])
    lr, beta = float(cfg[protocol.CLIENT_LR]), float(cfg[protocol.MOMENTUM])
    if algorithm == "ghbm":
        m = {k: v.numpy() for k, v in momentum_record.items()}
        return {k: ghbm_client(x, grads[k], lr, beta, m[k], local_steps) for k, x in arrays.items()}, {}
    store = client_state.ClientStateStore.from_config(cfg, partition_id, node_config)
    state, metrics = client_state.round_input(store, algorithm, t, arrays)
    if algorithm == "localghbm":
        local = {
            k: ghbm_client(x, grads[k], lr, beta, state[k] if state else 0.0, local_steps) for k, x in arrays.items()
        }
    else:
        C = float(cfg[protocol.PARTICIPATION])
        local = {
            k: fedhbm_client(x, grads[k], lr, beta, state[k] if state else x, C, local_steps, state is not None)
            for k, x in arrays.items()
        }
    client_state.remember(store, algorithm, t, arrays, local)
    return local, metrics


def local_work(model: np.ndarray, cfg: ConfigRecord, extra: ArrayRecord | None, partition_id: int) -> np.ndarray:
    """Reply array of one client: the updated model (FedAvgM/FedCM) or q (LocalUpdate)."""
    problem = client_for(partition_id, cfg)
    if isinstance(problem, QuadraticClient):
        grad = problem.grad
    else:
        mu = float(cfg["mu"])

        def grad(x: np.ndarray) -> np.ndarray:
            return two_client_grad(x, mu, problem)

    family = registered_algorithm(str(cfg[protocol.ALGORITHM])).family
    steps = int(cfg[protocol.LOCAL_STEPS])
    lr = float(cfg[protocol.CLIENT_LR])
    if family == "sgd":
        return fedavgm_client(model, grad, lr, steps)
    if family == "fedcm":
        correction = extra.to_numpy_ndarrays()[0]
        return fedcm_client(model, grad, lr, float(cfg[protocol.MOMENTUM]), correction, steps)
    if family in ("ghbm", "fedhbm"):
        return ghbm_family_local(cfg, {"0": model}, {"0": grad}, extra, partition_id, steps)[0]["0"]
    return localupdate_client(model, grad, lr, fm.theta_weights(cfg[protocol.THETA], steps))


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = msg.content[protocol.CONFIG]
    model = msg.content[protocol.ARRAYS].to_numpy_ndarrays()[0]
    records = msg.content.array_records
    extra = records.get(protocol.FEDCM_CORRECTION) or records.get(protocol.GHBM_MOMENTUM)
    out = local_work(model, cfg, extra, int(context.node_config["partition-id"]))
    metrics = MetricRecord({protocol.NUM_EXAMPLES: 1, protocol.LOSS_BEFORE: 0.0, protocol.TRAIN_LOSS: 0.0})
    return Message(
        RecordDict({protocol.ARRAYS: ArrayRecord([np.asarray(out)]), protocol.METRICS: metrics}), reply_to=msg
    )


@app.query()
def query(msg: Message, context: Context) -> Message:
    record = ConfigRecord({protocol.PARTITION_ID: int(context.node_config["partition-id"])})
    return Message(RecordDict({protocol.CONFIG: record}), reply_to=msg)
