"""A Grid wrapper for the round loop: short reply polling and progress lines while a round waits.

Flower 1.39's deployment grid (``HttpGrid.send_and_receive``) sleeps 3 s between pulls for replies, which adds
up to 3 s to every round. :class:`ProgressGrid` wraps whatever Grid the ServerApp receives (``HttpGrid`` in a
deployment, ``InMemoryGrid`` in simulation) and implements ``send_and_receive`` with the public
``push_messages`` / ``pull_messages`` calls, polling every ``poll_interval`` seconds (same timeout semantics
and the same replies; their order does not matter because the strategies sort them by partition). Every other
call goes to the wrapped grid.

While it waits it logs, every ``report_every`` seconds (not per poll)::

    [round 3/10] 3/10 clients done, 12.4 s elapsed, run ETA 41 min

to ``run.log``; the console shows the 1st, 2nd, 4th, 8th, … of these lines of a round (a long round keeps
showing progress, a few lines in all; :mod:`server.run.console`).

The run ETA combines the mean duration of the rounds finished in this process with the current round's
elapsed time (``begin_round`` tells the grid which round runs).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from logging import INFO

from flwr.app import Message, MessageType
from flwr.common.logger import log
from flwr.serverapp import Grid

from server.run import console
from server.run.console import format_duration

DEFAULT_POLL_INTERVAL = 0.1  # seconds between pulls for replies (Flower's HttpGrid: 3)
DEFAULT_REPORT_EVERY = 10.0  # seconds between in-round progress lines


class ProgressGrid(Grid):
    """Delegating Grid: fast ``send_and_receive`` with in-round progress lines."""

    def __init__(
        self, grid: Grid, poll_interval: float = DEFAULT_POLL_INTERVAL, report_every: float = DEFAULT_REPORT_EVERY
    ) -> None:
        if poll_interval <= 0 or report_every <= 0:
            raise ValueError("poll_interval and report_every must be > 0")
        self.grid = grid
        self.poll_interval = poll_interval
        self.report_every = report_every
        self.server_round, self.num_rounds = 0, 0
        self.round_seconds: list[float] = []  # durations of the rounds finished in this process
        self._round_start: float | None = None

    # ------------------------------------------------------------------ round bookkeeping
    def begin_round(self, server_round: int, num_rounds: int) -> None:
        """Mark the start of ``server_round`` (of ``num_rounds``); closes the previous round's timing."""
        now = time.monotonic()
        if self._round_start is not None:
            self.round_seconds.append(now - self._round_start)
        self.server_round, self.num_rounds, self._round_start = server_round, num_rounds, now

    def run_eta(self, done: int, total: int) -> float | None:
        """Seconds until the run ends, or None before anything can be estimated."""
        if self._round_start is None:
            return None
        elapsed = time.monotonic() - self._round_start
        if self.round_seconds:
            per_round = sum(self.round_seconds) / len(self.round_seconds)
        elif done:
            per_round = elapsed * total / done  # first round: extrapolate from the replies so far
        else:
            return None
        return max(per_round - elapsed, 0.0) + (self.num_rounds - self.server_round) * per_round

    def _report(self, done: int, total: int, started: float, training: bool, to_console: bool = True) -> None:
        elapsed = time.monotonic() - started
        extra = None if to_console else console.TO_FILE
        if not training:  # e.g. the client manager's partition queries
            log(
                INFO,
                "[round %d/%d] %d/%d nodes answered the partition query, %.1f s elapsed",
                self.server_round,
                self.num_rounds,
                done,
                total,
                elapsed,
                extra=extra,
            )
            return
        eta = self.run_eta(done, total)
        log(
            INFO,
            "[round %d/%d] %d/%d clients done, %.1f s elapsed, run ETA %s",
            self.server_round,
            self.num_rounds,
            done,
            total,
            elapsed,
            "?" if eta is None else format_duration(eta),
            extra=extra,
        )

    # ------------------------------------------------------------------ Grid API
    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Push ``messages``, then pull their replies every ``poll_interval`` s until all arrived or ``timeout``."""
        started = time.monotonic()
        messages = list(messages)
        training = any(m.metadata.message_type == MessageType.TRAIN for m in messages)
        pending = {mid for mid in self.grid.push_messages(messages) if mid}
        total = len(pending)
        end = None if timeout is None else time.time() + timeout
        replies: list[Message] = []
        next_report = started + self.report_every
        reports = 0
        while end is None or time.time() < end:
            pulled = list(self.grid.pull_messages(pending))
            replies.extend(pulled)
            pending.difference_update(m.metadata.reply_to_message_id for m in pulled)
            if not pending:
                break
            time.sleep(self.poll_interval)
            # after the sleep, not before it: a round still pending after one poll gets its line when it is due
            if time.monotonic() >= next_report:
                reports += 1
                to_console = reports & (reports - 1) == 0  # the 1st, 2nd, 4th, 8th, ... line
                self._report(total - len(pending), total, started, training, to_console)
                next_report += self.report_every
        return replies

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def get_nodes(self):  # noqa: ANN201 - Flower's NodeInfo protobufs
        return self.grid.get_nodes()

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # noqa: ANN001, ANN201
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def set_run(self, run) -> None:  # noqa: ANN001
        self.grid.set_run(run)

    @property
    def run(self):  # noqa: ANN201
        return self.grid.run
