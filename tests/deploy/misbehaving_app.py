"""Test-only ClientApp: the product's ClientApp (``client.app``), whose train replies a node may break on purpose.

A SuperNode started with ``--node-config "... misbehave=<kinds>"`` runs the real training of its partition,
then corrupts the reply; ``<kinds>`` is a comma-separated list used cyclically by server round (round 1 takes
the first kind). Nodes without the key reply exactly like the product ClientApp. The deployment tests run it as
the app's ClientApp through :func:`make_app_dir` (a copy of the project's FAB files whose pyproject names this
module), so the product's ClientApp holds no test switch.

Kinds: those of ``tests/broken_app.py`` (``wrong-shape``, ``nan``, ``zero-num-examples``, ... : its
``corrupt`` is reused) plus ``scale`` (weights x 1.1: finite, right shape, a plausible-looking poisoned update).
``train-gate=<path>`` / ``query-gate=<path>`` hold its training / its query answer until that
file exists (a test's event); ``train-started=<path>`` creates that file when a train message starts (the event a
fault test kills on).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
from broken_app import corrupt
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client import app as product
from strategies import protocol as P

MODULE = "misbehaving_app"
app = ClientApp()


def scaled(reply: Message, factor: float = 1.1) -> RecordDict:
    """The reply with every floating array multiplied by ``factor``."""
    arrays = {k: v.numpy() for k, v in reply.content[P.ARRAYS].items()}
    arrays = {k: v * factor if np.issubdtype(v.dtype, np.floating) else v for k, v in arrays.items()}
    return RecordDict(
        {
            P.ARRAYS: ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()}),
            P.METRICS: MetricRecord(dict(reply.content[P.METRICS])),
        }
    )


def _wait_gate(context: Context, key: str) -> None:
    """Hold the handler until the file named by ``node_config[key]`` exists (a test's event), at most 300 s."""
    gate = str(context.node_config.get(key, ""))
    deadline = time.monotonic() + 300
    while gate and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)


@app.train()
def train(msg: Message, context: Context) -> Message:
    started = str(context.node_config.get("train-started", ""))
    if started:
        Path(started).touch()
    _wait_gate(context, "train-gate")
    reply = product.train(msg, context)
    kinds = str(context.node_config.get("misbehave", "")).split(",")
    if not kinds[0]:
        return reply
    kind = kinds[(int(msg.content[P.CONFIG][P.SERVER_ROUND]) - 1) % len(kinds)]
    return Message(scaled(reply) if kind == "scale" else corrupt(reply, kind), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return product.evaluate_handler(msg, context)


@app.query()
def query(msg: Message, context: Context) -> Message:
    _wait_gate(context, "query-gate")
    return product.query(msg, context)


def make_app_dir(root: Path, out: Path) -> Path:
    """A Flower app dir = the project's FAB files + this module, with this module as the ClientApp."""
    from server.deploy.app_stage import stage_app

    stage_app(root, out)  # the project's FAB files (without walking .venv)
    shutil.copy(Path(__file__), out / f"{MODULE}.py")
    for helper in ("broken_app.py", "toy_app.py"):  # imported from the app's top level, like this module
        shutil.copy(root / "tests" / helper, out / helper)
    pyproject = out / "pyproject.toml"
    text = pyproject.read_text()
    assert 'clientapp = "client.app:app"' in text
    pyproject.write_text(text.replace('clientapp = "client.app:app"', f'clientapp = "{MODULE}:app"'))
    return out
