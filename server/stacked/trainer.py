"""The round barrier of a stacked group: every job's round loop hands its train messages to one
:class:`GroupTrainer`, which trains the clients of all jobs together once each job of the group has handed in its
round (or left the group), then gives every job its replies. Evaluations are handed in the same way and done
together once every job waits (:func:`server.run.evaluator.metrics_of_many`: the ``pop_gap`` models of a round in one
pass over the shared data), before the round's training.

With ``share`` (the default on an accelerator), clients of different jobs are stacked together when they share the
round's settings (the fields of :data:`client.chunk.SHARED_FIELDS`: step form, batch size, local steps, ...): the
jobs of a sweep over seeds, client learning rates or beta (:data:`client.chunk.PER_CLIENT_FIELDS`, per-client
tensors of a chunk) train in the same chunks, and so do FedAvgM's, FedCM's and the GHBM family's (one step form,
theta - a g + c: :func:`strategies.math.affine_local_step`); LocalUpdate and FedHBM train in chunks of their own
within the same round. Without it (the default on a CPU, where a chunk per job measured faster) each job's clients
form the chunks of its lone run.
Each client's computation is the one a lone ``engine=batched`` run makes (its own batches, augmentation and steps),
so each job's results are that run's.

On a CPU, ``workers`` threads compute a round's chunks side by side (each with ``threads`` torch threads and its own
copy of the model), and the evaluations of a round use ``workers`` × ``threads`` torch threads; the replies are stored
and logged by the barrier's thread in chunk order, so what a job sees does not depend on which thread computed it.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import Message

from client.chunk import SHARED_FIELDS
from server.batched.grid import BatchedGrid, StackedEntry, fitting_results, store_fitted
from server.batched.memory import smaller_chunks
from server.run.errors import RunStopped
from server.run.evaluator import Evaluator, metrics_of_many


class GroupStopped(RunStopped):
    """The group was stopped while this job waited for its round (another job failed the group, or a signal)."""


@dataclass
class _Evaluation:
    """A job's evaluation handed in at the barrier: what to evaluate, then its metrics or error."""

    evaluator: Evaluator
    arrays: Any
    result: dict[str, float] | None = None
    error: BaseException | None = None
    done: bool = False


def stack_key(entry: StackedEntry) -> tuple:
    """What clients must share to be trained in one chunk: the model, the data's normalisation and the round's
    settings."""
    job = entry[2]
    cfg = job.train_cfg
    return (
        type(job.model).__name__,
        _architecture(job.model),
        tuple(job.examples.mean),
        tuple(job.examples.std),
        *(repr(getattr(cfg, f)) for f in SHARED_FIELDS),
    )


@functools.lru_cache(maxsize=64)
def _architecture(model: torch.nn.Module) -> str:
    """A model object's layers as text (the process keeps one model object per architecture: built once here)."""
    return str(model)


class GroupTrainer:
    """Lockstep training of the jobs of one group (see the module docstring).

    ``chunk_size``: the most clients trained together (over all jobs); ``on_round``: called after each group round
    with (round, clients trained, chunks trained), for progress lines; ``share``: clients of different jobs in one
    chunk; ``workers``: threads computing chunks side by side, ``threads`` torch threads each (0: as set), on a CPU.
    """

    def __init__(
        self,
        device: torch.device,
        chunk_size: int | None = None,
        on_round: Callable[[int, int, int], None] | None = None,
        share: bool = True,
        workers: int = 1,
        threads: int = 0,
    ) -> None:
        self.device, self.chunk_size, self.on_round, self.share = device, chunk_size, on_round, share
        self._pool: ThreadPoolExecutor | None = None
        self.use_threads(workers, threads)
        self._cond = threading.Condition()
        self._members: set[Any] = set()
        self._pending: dict[Any, tuple[BatchedGrid, list[Message]]] = {}
        self._evaluations: dict[Any, tuple[_Evaluation, threading.Lock]] = {}
        self._generation = 0
        self._error: BaseException | None = None
        self._stopped: str | None = None
        self.rounds = 0  # group rounds trained
        self.chunks = 0  # stacked chunks trained
        self.turn = threading.Lock()  # held by the one job thread that runs (see :meth:`run_turn`)
        self.evaluations = 0  # models evaluated at the barrier
        self.evaluation_passes = 0  # times the barrier evaluated the models handed in

    def use_threads(self, workers: int, threads: int) -> None:
        """``workers`` chunk threads of ``threads`` torch threads each (0: as set); one chunk at a time off a CPU.
        Set before the first round."""
        self.workers = max(1, int(workers)) if self.device.type == "cpu" else 1
        self.threads = int(threads)

    @contextlib.contextmanager
    def run_turn(self) -> Iterator[None]:
        """A job thread's whole run: it runs only while it holds the turn, which it leaves while waiting at the
        barrier, so the jobs' Python runs one job at a time instead of switching the interpreter lock between them."""
        self.turn.acquire()
        try:
            yield
        finally:
            self.turn.release()

    def join(self, member: Any) -> None:
        with self._cond:
            self._members.add(member)

    def leave(self, member: Any) -> None:
        """``member`` trains no more (finished, diverged or failed); the others go on without waiting for it."""
        with self._cond:
            self._members.discard(member)
            self._pending.pop(member, None)
            self._serve_if_all_wait()

    def stop(self, reason: str) -> None:
        """Wake every waiting job with :class:`GroupStopped` and end the chunk threads."""
        with self._cond:
            self._stopped = reason
            self._cond.notify_all()
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def train(self, member: Any, grid: BatchedGrid, messages: list[Message]) -> None:
        """Hand in ``member``'s train messages of this round; returns once their replies are stored in ``grid``."""
        with self._cond:
            if self._stopped:
                raise GroupStopped(self._stopped)
            self._pending[member] = (grid, messages)
            generation = self._generation
            self._serve_if_all_wait()
            self.turn.release()
            while self._generation == generation and not self._stopped:
                self._cond.wait()
        self.turn.acquire()
        if self._generation == generation:
            raise GroupStopped(self._stopped or "stopped")
        if self._error is not None:
            raise GroupStopped(f"the group's training raised: {self._error!r}")

    def evaluate(self, member: Any, evaluator: Evaluator, arrays: Any, lock: threading.Lock) -> dict[str, float]:
        """``evaluator.metrics(arrays)`` for ``member``, done together with the evaluations the other jobs hand in
        before all of them wait (:func:`server.run.evaluator.metrics_of_many`); ``lock`` guards ``evaluator``."""
        evaluation = _Evaluation(evaluator, arrays)
        with self._cond:
            if self._stopped:
                raise GroupStopped(self._stopped)
            self._evaluations[member] = (evaluation, lock)
            self._serve_if_all_wait()
            self.turn.release()
            while not evaluation.done and not self._stopped:
                self._cond.wait()
            if not evaluation.done:
                self._evaluations.pop(member, None)
        self.turn.acquire()
        if not evaluation.done:
            raise GroupStopped(self._stopped or "stopped")
        if evaluation.error is not None:
            raise evaluation.error
        assert evaluation.result is not None
        return evaluation.result

    def _serve_if_all_wait(self) -> None:
        """Once every member waits (called with the lock held): their evaluations if any were handed in (the jobs
        then go on to their training), else their training."""
        waiting = set(self._pending) | set(self._evaluations)
        if not waiting or not waiting >= self._members:
            return
        if self._evaluations:
            self._evaluate_pending()
        else:
            self._train_pending()

    def _evaluate_pending(self) -> None:
        pending, self._evaluations = list(self._evaluations.values()), {}
        evaluations = [e for e, _ in pending]
        locks = {id(lock): lock for _, lock in pending}
        with contextlib.ExitStack() as held:
            for lock in locks.values():
                held.enter_context(lock)
            with _torch_threads(self.workers * self.threads if self.workers > 1 and self.threads else 0):
                _evaluate(evaluations)
        for e in evaluations:
            e.done = True
        self.evaluations += len(evaluations)
        self.evaluation_passes += 1
        self._cond.notify_all()

    def _train_pending(self) -> None:
        """Train every pending job's messages together (called with the lock held, by the last job to arrive)."""
        pending, self._pending = self._pending, {}
        try:
            entries: list[StackedEntry] = []
            groups: dict[tuple, list[StackedEntry]] = {}
            for job, (grid, messages) in enumerate(pending.values()):
                for entry in grid.prepare_stacked(messages) or []:
                    entries.append(entry)
                    groups.setdefault((stack_key(entry), None if self.share else job), []).append(entry)
            chunks: list[list[StackedEntry]] = []
            for chunk_entries in groups.values():
                size = self.chunk_size or len(chunk_entries)
                chunks += [chunk_entries[start : start + size] for start in range(0, len(chunk_entries), size)]
            sizes: list[list[tuple[int, bool]]] = []
            for parts in self._compute(chunks):
                sizes.append(store_fitted(parts))
            self.chunk_size = smaller_chunks(self.chunk_size, sizes, self.device)
            self.rounds += 1
            self.chunks += len(chunks)
            if self.on_round is not None and entries:
                self.on_round(int(entries[0][2].train_cfg.server_round), len(entries), len(chunks))
        except BaseException as err:  # noqa: BLE001 - handed to every waiting job
            self._error = err
        self._generation += 1
        self._cond.notify_all()

    def _compute(self, chunks: list[list[StackedEntry]]) -> Iterator[Any]:
        """Each chunk's :func:`~server.batched.grid.fitting_results`, in order: on ``workers`` threads side by side
        when there are several chunks."""
        if self.workers == 1 or len(chunks) == 1:
            return (fitting_results(c, self.device) for c in chunks)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="stacked-chunks", initializer=self._init)
        return self._pool.map(lambda c: fitting_results(c, self.device, _own_model(c[0][2].model)), chunks)

    def _init(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)


_local = threading.local()


def _own_model(model: torch.nn.Module) -> torch.nn.Module:
    """This thread's copy of ``model`` (an architecture object shared by the jobs: a functional call sets its
    parameters, so two threads must not use one object)."""
    copies = getattr(_local, "models", None)
    if copies is None:
        copies = _local.models = {}
    if id(model) not in copies:
        copies[id(model)] = (model, copy.deepcopy(model))  # the original kept: its id stays its own
    return copies[id(model)][1]


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """This thread's torch threads set to ``n`` (0: left as they are) for the block."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if n:
            torch.set_num_threads(before)


def _evaluate(evaluations: Sequence[_Evaluation]) -> None:
    """Every evaluation's result in one pass where the data is shared; if that raises, each on its own (its own
    result or error)."""
    try:
        rows = metrics_of_many([(e.evaluator, e.arrays) for e in evaluations])
    except Exception:  # noqa: BLE001 - one model's failure must not become every job's
        for e in evaluations:
            try:
                e.result = e.evaluator.metrics(e.arrays)
            except Exception as err:  # noqa: BLE001 - handed to the job it belongs to
                e.error = err
        return
    for e, row in zip(evaluations, rows):
        e.result = row
