"""Host work per client-round of a model: the clients' requests (``prepare_stacked``), their replies
(``store_stacked``) and the client's share of ``aggregate_train`` (reply checks, the server rule), each the function's
own wall time, in ms per client-round. The host setting of :mod:`benchmarks.host_round` (6 generated clients of 12
images, 3 a round, B = 8; FedAvg, FedCM, GHBM and FedHBM as 4 lone ``engine=batched`` jobs) with ``--model`` and
``engine.vectorize=true`` (stacked clients on a CPU too), at ``--rounds`` + 2 rounds minus 2 rounds.

    python -m benchmarks.client_host --model resnet20 --rounds 10
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import benchmarks.stacked_sweep as sweep
from benchmarks.host_round import SPLIT, split_timers, sweep_args
from server.run.cli import simulate
from strategies import base


def _run(out: Path, tag: str, model: str, rounds: int) -> dict[str, float]:
    seconds: dict[str, float] = collections.defaultdict(float, dict.fromkeys(SPLIT, 0.0))
    aggregate = base.ServerOptStrategy.aggregate_train

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return aggregate(*args, **kwargs)
        finally:
            seconds["aggregate"] += time.perf_counter() - start

    compose = sweep.composed
    sweep.composed = lambda overrides: compose(
        [o for o in overrides if not o.startswith("model=")] + [f"model={model}", "engine.vectorize=true"]
    )
    base.ServerOptStrategy.aggregate_train = timed
    try:
        args = sweep_args(4, rounds, "1")
        cfgs = sweep.jobs("host", out / tag, "batched", args, str(out / "tiny"), str(out / "cache"))
        with split_timers(seconds):
            for cfg in cfgs:
                simulate(cfg)
    finally:
        sweep.composed, base.ServerOptStrategy.aggregate_train = compose, aggregate
    return dict(seconds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet20", choices=("resnet20", "cnn", "logreg"))
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    from tools.datagen import make_image_folder

    out = Path(tempfile.mkdtemp(prefix="client-host-"))
    make_image_folder(out / "tiny", per_class=12, test_per_class=4, seed=1)
    _run(out, "warm", args.model, 2)
    short, long = _run(out, "short", args.model, 2), _run(out, "long", args.model, 2 + args.rounds)
    client_rounds = args.rounds * 4 * 3
    parts = ("requests", "replies", "aggregate")
    print(json.dumps({k: round(1e3 * (long[k] - short[k]) / client_rounds, 3) for k in parts}))


if __name__ == "__main__":
    main()
