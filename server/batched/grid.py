"""``BatchedGrid``: a Flower Grid in the driver process that answers a round's messages by computing its clients
together, with no actors, processes or serialisation in between.

The ServerApp round loop and the strategies talk to it as to any Grid (``push_messages`` / ``pull_messages``,
``send_and_receive``, ``get_node_ids``). Node ``NODE_BASE + p`` holds partition ``p`` and has its own
:class:`flwr.app.Context`, so its ClientApp state works as on a SuperNode; its ``node_config`` also carries this
process's pid (``client-state-memory``): LocalGHBM and FedHBM clients of this process keep their states in memory and
the server writes them to their files at its checkpoints (:mod:`strategies.client_state`). Every reply is built by the
ClientApp's own code (:mod:`client.app`): query and evaluate messages go to its handlers; train messages are
resolved by :func:`client.app.train_request` and answered by :func:`client.app.train_reply`, computed either

- **stacked** (:mod:`client.stacked`): the round's clients in chunks of at most ``chunk_size``, their
  parameters stacked and one vmapped gradient per step — where measured faster (``vectorize=auto``: CUDA, and
  the linear model on CPU; docs/benchmarks.md), or
- **one after another** through the ClientApp's own code, bitwise the Ray engine's client: in this process, or
  on a CPU in ``workers`` spawned processes of one torch thread each, as many clients at once (what Ray's
  actors do, without Ray: :mod:`server.batched.workers`).

A client that raises gets an error reply (the strategy counts it in ``num_failures``), as in Flower; a stacked
chunk that raises is retried one client at a time, so one bad client cannot fail its chunk. A chunk that runs out of
the device's memory is trained again in halves (:mod:`server.batched.memory`).
"""

from __future__ import annotations

import functools
import os
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, Error, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from client import app as client_app
from client import config as C
from client.chunk import shares_split
from client.examples import ImageExamples
from client.models import build_model
from client.stacked import ClientInput, can_stack, stacked_local_train
from client.train import TrainResult
from server.batched.memory import OutOfMemory, does_not_fit, is_out_of_memory, release, smaller_chunks
from server.batched.workers import WorkerPool
from server.internals.flower_grid import SUPERLINK_NODE_ID, ErrorCode, set_message_id, set_task_identity
from strategies import npy
from strategies import protocol as P

StackedEntry = tuple["BatchedGrid", Message, client_app.TrainJob]  # a train message resolved for stacked training
NODE_BASE = 1000  # node id of partition 0 (Flower's SuperLink is node 1)
RUN_ID = 1  # the one run of this process


class BatchedGrid(Grid):
    """In-process Grid of ``num_nodes`` simulated SuperNodes (see the module docstring).

    ``vectorize``: True/False, or None to decide per model and device (:meth:`stacks`). ``chunk_size``: the most
    clients trained together (None = all of a round's). ``workers`` > 1: processes for the clients trained one by
    one (:mod:`server.batched.workers`). ``report_every``: seconds between progress lines.
    """

    def __init__(
        self,
        num_nodes: int,
        vectorize: bool | None = None,
        chunk_size: int | None = None,
        device: torch.device | None = None,
        report_every: float = 10.0,
        reply_filter: Callable[[Message, Message], Message] | None = None,
        workers: int = 1,
    ) -> None:
        if num_nodes < 1 or (chunk_size is not None and chunk_size < 1):
            raise ValueError("num_nodes and chunk_size must be >= 1")
        self.vectorize, self.chunk_size, self.report_every = vectorize, chunk_size, report_every
        self.device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.contexts = {
            NODE_BASE + p: Context(
                run_id=RUN_ID,
                node_id=NODE_BASE + p,
                state=RecordDict(),
                run_config={},
                node_config={"partition-id": p, "num-partitions": num_nodes, P.STATE_MEMORY: os.getpid()},
            )
            for p in range(num_nodes)
        }
        self.workers = WorkerPool(workers) if workers > 1 else None  # CPU processes for one-by-one training
        self.reply_filter = reply_filter  # (reply, message) -> reply: tests tamper with replies on their way back
        self._replies: dict[str, Message] = {}
        self._run: Any = None
        set_task_identity(task_id=1, run_id=RUN_ID, node_id=SUPERLINK_NODE_ID)  # as Flower
        self._round_started: float | None = None
        self._next_report = 0.0
        self.stacked_rounds = 0  # rounds whose clients were trained stacked (for tests and benchmarks)
        self.unfit: Exception | None = None  # a client of this round that does not fit the device's memory alone

    # ------------------------------------------------------------------ Grid API
    def set_run(self, run: Any) -> None:
        self._run = run

    @property
    def run(self) -> Any:
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Compute every message's reply now (a round is one push); returns the message ids."""
        messages = list(messages)
        for msg in messages:
            set_message_id(msg, uuid.uuid4().hex)
        train = [m for m in messages if m.metadata.message_type == MessageType.TRAIN]
        for msg in messages:
            if msg.metadata.message_type != MessageType.TRAIN:
                self._store(msg, self._call(msg))
        if train:
            self._train(train)
        return [m.metadata.message_id for m in messages]

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(mid) for mid in list(message_ids) if mid in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))

    # ------------------------------------------------------------------ replies
    def _store(self, msg: Message, reply: Message) -> None:
        self._replies[msg.metadata.message_id] = reply

    def _handler(self, msg: Message) -> Callable[[Message, Context], Message]:
        kind = msg.metadata.message_type
        if kind == MessageType.QUERY:
            return client_app.query
        if kind == MessageType.EVALUATE:
            return client_app.evaluate_handler
        if kind == MessageType.TRAIN:
            return client_app.train
        raise ValueError(f"no handler for message type {kind!r}")

    def _call(self, msg: Message, handler: Callable[[Message, Context], Message] | None = None) -> Message:
        """The reply of ``handler`` (default: the ClientApp's handler of the message's type), or an error reply when
        the node or the message type is unknown or the handler raises."""
        context = self.contexts.get(msg.metadata.dst_node_id)
        if context is None:
            return Message(error=Error(ErrorCode.NODE_UNAVAILABLE, f"no node {msg.metadata.dst_node_id}"), reply_to=msg)
        try:
            reply = (handler or self._handler(msg))(msg, context)
            return self.reply_filter(reply, msg) if self.reply_filter else reply
        except Exception as err:  # the ClientApp raised: Flower's reply for that
            return Message(
                error=Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, f"{type(err).__name__}: {err}"), reply_to=msg
            )

    # ------------------------------------------------------------------ training
    def stacks(self, model: torch.nn.Module) -> bool:
        """Whether train messages for ``model`` are computed stacked: ``vectorize`` when set, else on CUDA for any
        stackable model and on CPU for the linear model only (measured: docs/benchmarks.md)."""
        if not can_stack(model):
            return False
        if self.vectorize is not None:
            return self.vectorize
        return self.device.type == "cuda" or not any(isinstance(m, torch.nn.Conv2d) for m in model.modules())

    def _train(self, messages: list[Message]) -> None:
        self.start_round_clock()
        entries = self.prepare_stacked(messages)
        if entries is None:
            return
        size = self.chunk_size or max(len(entries), 1)
        sizes: list[list[tuple[int, bool]]] = []
        for start in range(0, len(entries), size):
            sizes.append(store_fitted(fitting_results(entries[start : start + size], self.device)))
            self._progress(min(start + size, len(entries)), len(entries))
        self.chunk_size = smaller_chunks(self.chunk_size, sizes, self.device)
        self._round_started = None
        self.stacked_rounds += 1
        self.raise_unfit()

    def raise_unfit(self) -> None:
        """Raise :class:`~server.batched.memory.ClientDoesNotFit` when a client of this round did not fit alone."""
        if self.unfit is not None:
            err, self.unfit = self.unfit, None
            raise err

    def prepare_stacked(self, messages: list[Message]) -> list[StackedEntry] | None:
        """The round's train messages resolved for stacked training: (this grid, message, job) each. None when the
        model or the task does not stack: then every message has been answered one by one already. A message whose
        node is unknown or whose request the client refuses is answered by its handler (with the error)."""
        config = messages[0].content[P.CONFIG]
        if not self.stacks(_architecture(str(config.get(C.MODEL, C.DEFAULTS[C.MODEL])))):
            self._train_one_by_one(messages)
            self._round_started = None
            return None
        entries: list[StackedEntry] = []
        decoded: dict[int, tuple[ArrayRecord, dict[str, Any]]] = {}
        for msg in messages:
            context = self.contexts.get(msg.metadata.dst_node_id)
            try:
                if context is None:
                    raise KeyError(msg.metadata.dst_node_id)
                request = client_app.train_request(msg, context)
                for name in ARRAY_REQUESTS:
                    request[name] = _decoded_once(request[name], decoded)
                entries.append((self, msg, client_app.prepare_train(**request, load=False)))
            except Exception:  # unknown node or a request the client refuses: its handler answers with the error
                self._store(msg, self._call(msg, client_app.train))
        if not all(isinstance(job.examples, ImageExamples) for _, _, job in entries):  # stacked: image tasks only
            self._train_one_by_one([msg for _, msg, _ in entries])
            self._round_started = None
            return None
        return entries

    def _train_one_by_one(self, messages: list[Message]) -> None:
        """The ClientApp's own handler, one client after another; with a worker pool, ``workers`` at a time."""
        if self.workers is None:
            for done, msg in enumerate(messages, 1):
                self._store(msg, self._call(msg, client_app.train))
                self._progress(done, len(messages))
            return
        futures = {}
        for msg in messages:
            context = self.contexts.get(msg.metadata.dst_node_id)
            try:
                if context is None:
                    raise KeyError(msg.metadata.dst_node_id)
                futures[msg.metadata.message_id] = self.workers.submit(client_app.train_request(msg, context))
            except Exception:
                self._store(msg, self._call(msg, client_app.train))
        for done, msg in enumerate([m for m in messages if m.metadata.message_id in futures], 1):
            future = futures[msg.metadata.message_id]
            self._store(msg, self._call(msg, lambda m, c, f=future: client_app.train_reply(m, c, *f.result())))
            self._progress(done, len(futures))

    def close(self) -> None:
        """Stop the worker processes (if any)."""
        if self.workers is not None:
            self.workers.close()
            self.workers = None

    def start_round_clock(self) -> None:
        """A round's training starts: its progress lines count from now."""
        self._round_started = time.monotonic()
        self._next_report = self._round_started + self.report_every

    def _progress(self, done: int, total: int) -> None:
        """A progress line when ``report_every`` seconds of the round's training have passed since the last one (or
        its start); a late line is followed by one at each completion until the lines catch up with the clock."""
        now = time.monotonic()
        if self._round_started is None:  # no clock started for this round: it starts now
            self._round_started, self._next_report = now, now + self.report_every
        elif now >= self._next_report:
            log(INFO, "[batched] %d/%d clients done, %.1f s elapsed", done, total, now - self._round_started)
            self._next_report += self.report_every


Results = list[TrainResult] | str | OutOfMemory


def stacked_results(chunk: list[StackedEntry], device: torch.device, model: torch.nn.Module | None = None) -> Results:
    """Each client's result of training ``chunk`` stacked; the traceback's text when that raised, or
    :class:`~server.batched.memory.OutOfMemory` when it ran out of memory. The entries may come from several grids
    (the jobs of a stacked sweep) that share the round's settings. Touches no grid, so chunks may be computed side by
    side; ``model``: the architecture object to use (a thread's own copy when chunks run side by side: a functional
    call sets its module's parameters)."""
    first = chunk[0][2]
    inputs = [_client_input(job) for _, _, job in chunk]
    try:
        return stacked_local_train(model or first.model, inputs, first.examples.mean, first.examples.std, device)
    except Exception as err:
        if is_out_of_memory(err):
            return OutOfMemory(str(err).strip().splitlines()[0][:200])
        return traceback.format_exc(limit=3)


def fitting_results(
    chunk: list[StackedEntry], device: torch.device, model: torch.nn.Module | None = None
) -> list[tuple[list[StackedEntry], Results]]:
    """(part, :func:`stacked_results`) of ``chunk`` whole, or of its halves, recursively, while a part runs out of
    memory (each client's computation is its own: its results do not depend on its chunk). A client that does not fit
    alone stays an :class:`~server.batched.memory.OutOfMemory`."""
    results = stacked_results(chunk, device, model)
    if not isinstance(results, OutOfMemory) or len(chunk) == 1:
        return [(chunk, results)]
    release(device)
    half = (len(chunk) + 1) // 2
    log(WARNING, "[batched] a stacked chunk of %d clients ran out of %s memory (%s); training it in chunks of %d",
        len(chunk), device, results.error, half)  # fmt: skip
    return fitting_results(chunk[:half], device, model) + fitting_results(chunk[half:], device, model)


def store_fitted(parts: list[tuple[list[StackedEntry], Results]]) -> list[tuple[int, bool]]:
    """:func:`store_stacked` of every part; their (clients, fit)."""
    for part, results in parts:
        store_stacked(part, results)
    return [(len(part), not isinstance(results, OutOfMemory)) for part, results in parts]


def store_stacked(chunk: list[StackedEntry], results: Results) -> None:
    """Each client's reply from :func:`stacked_results` stored in its grid; after a failed chunk (the traceback's
    text), each client trained through its own handler instead; a client that does not fit alone is its grid's
    :attr:`BatchedGrid.unfit` (the run, or its job, fails)."""
    if isinstance(results, OutOfMemory):
        for grid, _, job in chunk:
            grid.unfit = does_not_fit(str(job.cfg[C.MODEL]), job.train_cfg.batch_size, grid.device, results.error)
        return
    if isinstance(results, str):
        log(WARNING, "[batched] a stacked chunk of %d clients raised; training them one by one:\n%s", len(chunk),
            results)  # fmt: skip
        for grid, msg, _ in chunk:
            grid._store(msg, grid._call(msg, client_app.train))
        return
    for (grid, msg, job), result in zip(chunk, results):
        grid._store(
            msg,
            grid._call(
                msg,
                lambda m, c, job=job, result=result: client_app.train_reply(
                    m, c, *client_app.finish_train(job, result)
                ),
            ),
        )


ARRAY_REQUESTS = ("arrays", "correction", "momentum_term")  # the arrays a train request carries


def _decoded_once(record: Any, decoded: dict[int, tuple[ArrayRecord, dict[str, Any]]]) -> Any:
    """``record``'s arrays decoded once for all the messages of a round that carry it (a strategy's messages share
    one record): the clients of a job share the decoded arrays, which nothing writes to (stacked training copies them
    into its own tensors). Anything but an ArrayRecord is returned as it is."""
    if not isinstance(record, ArrayRecord):
        return record
    if id(record) not in decoded:
        decoded[id(record)] = (record, npy.record_arrays(record))  # the record kept: its id stays its own
    return decoded[id(record)][1]


def _client_input(job: client_app.TrainJob) -> ClientInput:
    """A client of a stacked chunk. A client whose images are rows of the dataset's training split (a partition of
    CIFAR-10) uses one float copy of the whole split, shared by every partition, partitioning and job of the
    process (while it fits half the cache), instead of a float copy of its own."""
    examples, cfg = job.examples, job.cfg
    dataset = (cfg[C.DATASET], str(cfg[C.DATA_ROOT]), str(cfg[C.CACHE_DIR]))
    rows = getattr(examples, "rows", None)
    if rows is not None and shares_split(examples.source):
        x, key = (lambda: examples.source), (*dataset, "train")
    else:
        rows = None
        x = lambda: examples.x  # noqa: E731 - read only on a cache miss
        key = (*dataset, int(cfg[C.NUM_PARTITIONS]), str(cfg[C.ALPHA]), int(cfg[C.PARTITION_SEED]))
        key += (job.train_cfg.partition_id,)
    return ClientInput(x, examples.y, job.train_cfg, job.initial, **job.extra, key=key, rows=rows)


@functools.lru_cache(maxsize=8)
def _architecture(name: str) -> torch.nn.Module:
    """A model of that name, for deciding how to train it (its weights are never used)."""
    return build_model(name)
