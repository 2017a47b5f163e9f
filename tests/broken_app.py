"""A test-only ClientApp: honest quadratic clients (``toy_app``) plus clients whose train replies are broken.

Partitions ``0 .. NUM_HONEST-1`` are honest; partition ``NUM_HONEST + k`` sends a reply broken in the way
``BROKEN_KINDS[k]`` says (or raises). Everything else (query, the honest training) is ``toy_app``'s.
"""

from __future__ import annotations

import numpy as np
import toy_app
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from strategies import protocol

NUM_HONEST = 4
BROKEN_KINDS = (
    "wrong-shape",
    "wrong-keys",
    "no-num-examples",
    "zero-num-examples",
    "negative-num-examples",
    "nan",
    "inf",
    "int-dtype",
    "huge-num-examples",
    "two-array-records",
    "nan-loss-before",
    "raises",
)
app = ClientApp()


def kind_of(partition_id: int) -> str:
    """'honest' or the broken kind of this partition."""
    return "honest" if partition_id < NUM_HONEST else BROKEN_KINDS[partition_id - NUM_HONEST]


def corrupt(reply: Message, kind: str) -> RecordDict:
    """The content of ``reply`` broken in the way ``kind`` says."""
    arrays = reply.content[protocol.ARRAYS]
    named = {k: arrays[k].numpy() for k in arrays.keys()}
    metrics = dict(reply.content[protocol.METRICS])
    first = next(iter(named))
    if kind == "wrong-shape":
        named[first] = np.zeros(named[first].size + 1)
    elif kind == "wrong-keys":
        named["extra"] = named.pop(first)
    elif kind == "no-num-examples":
        metrics.pop(protocol.NUM_EXAMPLES)
    elif kind == "zero-num-examples":
        metrics[protocol.NUM_EXAMPLES] = 0
    elif kind == "negative-num-examples":
        metrics[protocol.NUM_EXAMPLES] = -5
    elif kind == "huge-num-examples":
        metrics[protocol.NUM_EXAMPLES] = 10**9
    elif kind == "nan":
        named[first] = np.full_like(named[first], np.nan)
    elif kind == "inf":
        named[first] = named[first] + np.inf
    elif kind == "int-dtype":
        named = {k: v.astype(np.int64) for k, v in named.items()}
    elif kind == "nan-loss-before":
        metrics[protocol.LOSS_BEFORE] = float("nan")
    content = RecordDict(
        {protocol.ARRAYS: ArrayRecord({k: Array(v) for k, v in named.items()}), protocol.METRICS: MetricRecord(metrics)}
    )
    if kind == "two-array-records":
        content["second"] = ArrayRecord({k: Array(v) for k, v in named.items()})
    return content


@app.train()
def train(msg: Message, context: Context) -> Message:
    kind = kind_of(int(context.node_config["partition-id"]))
    if kind == "raises":
        raise RuntimeError("a broken client")
    reply = toy_app.train(msg, context)
    return reply if kind == "honest" else Message(corrupt(reply, kind), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    return toy_app.query(msg, context)
