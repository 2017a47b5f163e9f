"""``JobGrid``: the batched engine's Grid of one job of a stacked group, whose train messages go to the group's
:class:`~server.stacked.trainer.GroupTrainer` instead of being trained alone."""

from __future__ import annotations

import threading
from typing import Any

from flwr.app import Message

from server.batched.grid import BatchedGrid
from server.stacked.trainer import GroupTrainer


class JobGrid(BatchedGrid):
    """A :class:`BatchedGrid` (queries and evaluation messages answered as there) that trains through ``trainer``.

    ``startup``: a lock the job holds from its start to its round-0 evaluation (or, resumed, its first training
    round), so that jobs set up one after another (their initial models come from the global torch RNG seeded with
    each job's seed).
    """

    def __init__(self, num_nodes: int, trainer: GroupTrainer, startup: threading.Lock, **kwargs: Any) -> None:
        super().__init__(num_nodes, **kwargs)
        self.trainer, self._startup = trainer, startup
        self._holds_startup = False

    def hold_startup(self) -> None:
        self._startup.acquire()
        self._holds_startup = True

    def release_startup(self) -> None:
        if self._holds_startup:
            self._holds_startup = False
            self._startup.release()

    def _train(self, messages: list[Message]) -> None:
        self.start_round_clock()
        self.release_startup()
        self.trainer.train(self, self, messages)
        self.stacked_rounds += 1
        self.raise_unfit()  # this job's client did not fit alone: this job fails, the group goes on
