"""Per-round cost of reply validation on the CNN, against the round's own client work, measured in one run.

    python -m benchmarks.validation_cost --clients 10 --examples 500 --threads 2

One round of the seed-000 setting (C = 0.1 of 100 clients: 10 clients x 500 images x 1 epoch, B = 64): the
client work is ``local_train`` of each client one after the other (generated 32x32 images, so no data is
needed); the server work is ``FedAvgM.aggregate_train`` on those 10 real CNN replies, once with validation
(as every run does) and once with ``check_reply`` alone, repeated to get stable figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import time

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from client.models import build_model
from client.train import TrainConfig, local_train
from server.internals.flower_grid import set_task_identity
from strategies import FedAvgM
from strategies.validation import check_reply


class _Nodes:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def get_node_ids(self) -> list[int]:
        return list(self.ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--examples", type=int, default=500, help="images per client")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20, help="aggregations timed")
    args = parser.parse_args()
    if min(args.clients, args.examples, args.threads, args.repeats) < 1:
        parser.error("--clients, --examples, --threads and --repeats must be >= 1")
    torch.set_num_threads(args.threads)
    set_task_identity(task_id=1, run_id=1, node_id=1)  # Messages outside a Flower run
    logging.getLogger("flwr").setLevel(logging.WARNING)
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    model = build_model("cnn")
    initial = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    cfg = TrainConfig("fedavgm", 0.05, local_epochs=1, batch_size=64)
    x = rng.integers(0, 256, size=(args.examples, 32, 32, 3), dtype=np.uint8)
    replies, t0 = [], time.perf_counter()
    for _ in range(args.clients):
        model.load_state_dict({k: torch.from_numpy(v) for k, v in initial.items()})
        y = rng.integers(0, 10, size=args.examples)
        result = local_train(model, x, y, (0.5,) * 3, (0.25,) * 3, cfg)
        replies.append((result.arrays, result.metrics))
    client_seconds = time.perf_counter() - t0

    grid = _Nodes(list(range(1, args.clients + 1)))
    strategy = FedAvgM(server_lr=1.0, fraction_train=1.0, min_available_nodes=1, min_train_nodes=args.clients)
    arrays = ArrayRecord({k: Array(v) for k, v in initial.items()})
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    answers = [
        Message(
            RecordDict(
                {"arrays": ArrayRecord({k: Array(v.numpy()) for k, v in out.items()}), "metrics": MetricRecord(metrics)}
            ),
            reply_to=m,
        )
        for m, (out, metrics) in zip(messages, replies)
    ]
    spec, update = strategy.reply_spec(), strategy.client_update
    t0 = time.perf_counter()
    for _ in range(args.repeats):
        for answer in answers:
            check_reply(answer.content, spec, update)
    validate_seconds = (time.perf_counter() - t0) / args.repeats
    t0 = time.perf_counter()
    for _ in range(args.repeats):  # what aggregation paid before validation existed: decoding the arrays
        for answer in answers:
            answer.content["arrays"].to_numpy_ndarrays()
    decode_seconds = (time.perf_counter() - t0) / args.repeats
    t0 = time.perf_counter()
    for _ in range(args.repeats):
        strategy.aggregate_train(1, answers)
    aggregate_seconds = (time.perf_counter() - t0) / args.repeats
    out = {
        "clients": args.clients,
        "parameters": int(sum(v.size for v in initial.values())),
        "client_work_s": client_seconds,
        "check_reply_all_s": validate_seconds,
        "decode_only_s": decode_seconds,
        "validation_extra_s": validate_seconds - decode_seconds,
        "aggregate_train_s": aggregate_seconds,
        "validation_extra_share_of_round_pct": 100
        * (validate_seconds - decode_seconds)
        / (client_seconds + aggregate_seconds),
    }
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}, indent=1))


if __name__ == "__main__":
    main()
