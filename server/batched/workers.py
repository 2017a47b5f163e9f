"""Worker processes of the batched engine for clients trained one after another on a CPU.

A convolutional client's batch keeps one core busy, so on a CPU the engine trains ``workers`` clients at once,
one per process with one torch thread each (what Ray's actors do, without Ray): each worker runs the ClientApp's
own :func:`client.app.train_on_partition` on a request the driver resolved with :func:`client.app.train_request`;
the driver builds the reply with :func:`client.app.train_reply`. Workers are spawned (not forked: the driver's
OpenMP threads do not survive a fork) once per run, and keep their dataset caches between rounds.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

import numpy as np
from flwr.app import ArrayRecord


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def _train(request: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, int | float]]:
    from client.app import train_on_partition

    return train_on_partition(**request)


def _plain(value: Any) -> Any:
    """ArrayRecords as {name: numpy} (cheap to send); everything else as it is."""
    if isinstance(value, ArrayRecord):
        return {k: v.numpy() for k, v in value.items()}
    return dict(value) if isinstance(value, Mapping) else value


def available_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class WorkerPool:
    """``size`` spawned processes training one client each at a time."""

    def __init__(self, size: int) -> None:
        if size < 2:
            raise ValueError("a worker pool needs at least 2 workers (1 = train in the driver)")
        self.size = size
        self._pool = ProcessPoolExecutor(
            size, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker
        )

    def submit(self, request: Mapping[str, Any]) -> Future:
        """Train one client of :func:`client.app.train_request`'s ``request``; the future holds (arrays, metrics)."""
        return self._pool.submit(_train, {k: _plain(v) for k, v in request.items()})

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
