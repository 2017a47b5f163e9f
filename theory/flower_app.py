"""A Flower ClientApp with the quadratic clients of both seeds (for the Flower equivalence check).

Partition 0 is client 1 of seed 000 Lemma III.4 (f_1 = mu/2 th^2 + G th) and partition 1 is client 2
(f_2 = mu/2 th^2 - G th); with ``"problem": "two-point"`` in the config, partition p is instead the seed 001
client A = p + 1, c = 1 / (p + 1). The local work calls the same client functions as the theory drivers
(:mod:`theory.problems`), which call ``strategies.math``. Defined in an importable module so that Ray actors
import it (see the Flower 1.39 notes).
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from strategies import math as fm
from strategies import protocol
from theory.problems import QuadraticClient, fedavgm_client, fedcm_client, localupdate_client, two_client_grad

app = ClientApp()


def client_for(partition_id: int, cfg: ConfigRecord) -> QuadraticClient | float:
    """The partition's problem: a seed 001 QuadraticClient, or the seed 000 signed heterogeneity s G."""
    if str(cfg.get("problem", "lemma-iii4")) == "two-point":
        a = float(partition_id + 1)
        return QuadraticClient(a, 1.0 / a)
    return float(cfg["G"]) * (1.0 if partition_id == 0 else -1.0)


def local_work(model: np.ndarray, cfg: ConfigRecord, extra: ArrayRecord | None, partition_id: int) -> np.ndarray:
    """Reply array of one client: the updated model (FedAvgM/FedCM) or q (LocalUpdate)."""
    problem = client_for(partition_id, cfg)
    if isinstance(problem, QuadraticClient):
        grad = problem.grad
    else:
        mu = float(cfg["mu"])

        def grad(x: np.ndarray) -> np.ndarray:
            return two_client_grad(x, mu, problem)

    algorithm = str(cfg[protocol.ALGORITHM])
    steps = int(cfg[protocol.LOCAL_STEPS])
    lr = float(cfg[protocol.CLIENT_LR])
    if algorithm == "fedavgm":
        return fedavgm_client(model, grad, lr, steps)
    if algorithm == "fedcm":
        correction = extra.to_numpy_ndarrays()[0]
        return fedcm_client(model, grad, lr, float(cfg[protocol.MOMENTUM]), correction, steps)
    return localupdate_client(model, grad, lr, fm.theta_weights(cfg[protocol.THETA], steps))


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = msg.content[protocol.CONFIG]
    model = msg.content[protocol.ARRAYS].to_numpy_ndarrays()[0]
    extra = msg.content.array_records.get(protocol.FEDCM_CORRECTION)
    out = local_work(model, cfg, extra, int(context.node_config["partition-id"]))
    metrics = MetricRecord({protocol.NUM_EXAMPLES: 1, protocol.LOSS_BEFORE: 0.0, protocol.TRAIN_LOSS: 0.0})
    return Message(RecordDict({protocol.ARRAYS: ArrayRecord([np.asarray(out)]), protocol.METRICS: metrics}),
                   reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    record = ConfigRecord({protocol.PARTITION_ID: int(context.node_config["partition-id"])})
    return Message(RecordDict({protocol.CONFIG: record}), reply_to=msg)
