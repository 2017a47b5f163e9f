"""Flower-side client managers: map connected nodes to partition ids, then follow a schedule.

Flower's Message-API strategies have no ClientManager, and the server cannot read a node's ``node_config``. So
the manager asks each new node for its partition id with one QUERY message (answered by the ClientApp's
``@app.query()``), keeps the node -> partition map, and each round returns the nodes of the partitions that the
schedule (:mod:`strategies.participation`) selects. Partitions without a node are skipped and logged.

Every claim is checked (:mod:`strategies.claims`): a partition id in [0, N), the run's num-partitions, and
- ``owners`` given (SuperNode authentication: key fingerprint -> partition, the operator's map): the node's
  public key, as the SuperLink stores it for the node id, must own the partition; whoever answers first does
  not matter, and a restarted node (same key) gets its partition back;
- else ``bind_partitions=True``: the first node that claimed a partition in this run keeps it;
- else (no authentication: a restarted node gets a new id) a partition whose node left or went silent goes to
  the next claimant, counted in ``reassigned``.
A claim that breaks a rule, or that names a partition another answering node holds, is **refused**: logged with
the node id and the reason, counted in ``refused``, and the node is not asked again while it stays connected.

Nobody can hold a round hostage: queries are pushed without blocking and collected later. A round waits for
query answers only while one of its partitions has no node, only for at most ``query_timeout`` seconds and
only for nodes that could serve such a partition. A node that has not answered its query within
``query_timeout``, or a train message within the round timeout (:meth:`note_replies`), is **silent**: named in
the log, counted in ``silent`` every round, never waited for, and its partition is not scheduled, until it
answers its pending query (which shows it is alive).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from logging import INFO, WARNING

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from strategies import protocol
from strategies.claims import ClaimRules, RefusedClaim, claim_record, key_fingerprint
from strategies.participation import CyclicSchedule, UniformSchedule

# Query ids pulled per poll. A pull costs O(ids) in every grid, and Flower's in-memory LinkState (the Ray engine) holds
# its lock for all of it: 0.35 s for 34,248 ids, while the simulation's dispatch thread waits (docs/benchmarks.md).
PULL_WINDOW = 2048


class NoNodesError(RuntimeError):
    """No node answered the partition query before ``wait_timeout``: the run cannot train (in simulation the
    usual cause is a Ray backend whose actors failed to start; in a deployment, SuperNodes that never connected)."""


class PartitionClientManager:
    """Selects this round's nodes from a schedule over partition ids.

    Before its first round the manager waits until ``wait_for`` partitions (default: all) have a node, for at
    most ``wait_timeout`` seconds (a resumed run after a SuperLink restart needs this: reconnecting nodes may
    answer late); later rounds never block on missing nodes longer than ``query_timeout``.
    """

    def __init__(
        self,
        schedule: CyclicSchedule | UniformSchedule,
        query_timeout: float = 30.0,
        wait_timeout: float = 300.0,
        wait_for: int | None = None,
        bind_partitions: bool = False,
        owners: Mapping[str, int] | None = None,
        poll_interval: float = 0.1,
    ) -> None:
        self.schedule = schedule
        self.query_timeout = query_timeout
        self.wait_timeout = wait_timeout
        self.wait_for = schedule.num_clients if wait_for is None else wait_for
        self.bind_partitions = bind_partitions
        self.rules = ClaimRules(schedule.num_clients, owners)
        self.poll_interval = poll_interval
        self.node_to_partition: dict[int, int] = {}
        # partition -> node that served it last (first, with bind_partitions); a node in node_to_partition is its
        # partition's owner (every mapping goes through _assign), so a partition has at most one node
        self.owner: dict[int, int] = {}
        self.idle_claims: dict[int, int | None] = {}  # node -> partition (None: invalid) it claimed, refused/displaced
        self.pending: dict[str, tuple[int, float]] = {}  # query message id -> (node, monotonic time sent)
        self.silent: dict[int, str] = {}  # node -> why it is not waited for
        self.keys: dict[int, str] = {}  # node -> fingerprint of its public key (with owners)
        self.skipped: dict[int, list[int]] = {}
        self.refused: dict[int, list[int]] = {}  # round -> node ids refused in that round
        self.reassigned: dict[int, list[int]] = {}  # round -> partitions that changed node in that round
        self.silent_rounds: dict[int, set[int]] = {}  # round -> nodes silent in that round
        self._round = 0
        self._waited = False

    @property
    def num_clients(self) -> int:
        """Number of partitions N the schedule covers."""
        return self.schedule.num_clients

    def wait_for_nodes(self, grid: Grid) -> int:
        """Block until ``wait_for`` partitions have a node, or until ``wait_timeout`` passes; nodes that did not
        answer are asked again. Returns the number of partitions with a node. Nodes still starting are not
        silent during this start-up wait (``wait_timeout`` is its budget, not ``query_timeout``): a slow start
        (Ray actors importing torch on a loaded machine) is not counted in ``num_silent``."""
        deadline = time.monotonic() + self.wait_timeout
        everything = range(self.num_clients)
        while True:
            self.refresh(
                grid, everything, timeout=max(0.0, min(self.query_timeout, deadline - time.monotonic())), silence=False
            )
            mapped = len(set(self.node_to_partition.values()))
            if mapped >= self.wait_for or time.monotonic() >= deadline:
                return mapped
            log(INFO, "Waiting for nodes: %d of %d partitions answered", mapped, self.wait_for)
            time.sleep(1.0)

    def refresh(
        self, grid: Grid, need: Collection[int] = (), timeout: float | None = None, silence: bool = True
    ) -> None:
        """Forget departed nodes, collect query answers, ask new nodes; while a partition of ``need`` has no node,
        wait up to ``timeout`` (default ``query_timeout``) for the answers of nodes that could serve it; then (with
        ``silence``) mark the nodes whose query is older than ``query_timeout`` silent."""
        connected = set(grid.get_node_ids())
        self._forget(connected)
        self._collect(grid)
        self._probe(grid, connected)
        limit = self.query_timeout if timeout is None else timeout
        if self._worth_waiting(need, limit):  # answers already in (an in-process grid answers as it is asked): no sleep
            self._collect(grid)
        while self._worth_waiting(need, limit):
            time.sleep(self.poll_interval)
            self._collect(grid)
        if silence:
            self._mark_silent()

    def _forget(self, connected: set[int]) -> None:
        """Drop what is known about nodes that left (a node that comes back is asked again)."""
        self.node_to_partition = {n: p for n, p in self.node_to_partition.items() if n in connected}
        held = set(self.node_to_partition.values())  # a displaced node may claim again once its partition is free
        keep = self.bind_partitions or self.rules.owners is not None
        self.idle_claims = {
            n: p for n, p in self.idle_claims.items() if n in connected and (keep or p is None or p in held)
        }
        self.pending = {mid: v for mid, v in self.pending.items() if v[0] in connected}
        self.silent = {n: why for n, why in self.silent.items() if n in connected}
        self.keys = {n: key for n, key in self.keys.items() if n in connected}

    def _probe(self, grid: Grid, connected: set[int]) -> None:
        """Push one partition query to every connected node that has no partition, no refused claim and no
        query pending (silent nodes have one pending: its answer brings them back)."""
        asked = {node for node, _ in self.pending.values()}
        targets = sorted(connected - set(self.node_to_partition) - set(self.idle_claims) - asked)
        if not targets:
            return
        if self.rules.owners is not None:  # the key the SuperLink holds for each node id (never the node's word)
            for info in grid.get_nodes():
                if info.node_id in targets and info.public_key:
                    try:
                        self.keys[int(info.node_id)] = key_fingerprint(info.public_key)
                    except ValueError:
                        log(WARNING, "Node %s: the SuperLink's public key for it does not parse", info.node_id)
        messages = [
            Message(RecordDict({protocol.CONFIG: ConfigRecord({})}), dst_node_id=n, message_type=MessageType.QUERY)
            for n in targets
        ]
        now = time.monotonic()
        for node, mid in zip(targets, grid.push_messages(messages), strict=False):
            if mid:
                self.pending[mid] = (node, now)

    def _collect(self, grid: Grid) -> None:
        """Pull the answers that arrived (without waiting) and check their claims, ``PULL_WINDOW`` queries at a time,
        the longest unpulled first (those still unanswered go to the back of ``pending``); a window that comes back
        mostly unanswered ends the pass (the next poll goes on from there)."""
        for _ in range(-(-len(self.pending) // PULL_WINDOW)):  # at most one pass over the queries out
            window = list(itertools.islice(self.pending, PULL_WINDOW))
            answered = self._pull(grid, window)
            if len(self.pending) > len(window) - answered:  # rotate: the next pull takes the next queries
                for mid in window:
                    if mid in self.pending:
                        self.pending[mid] = self.pending.pop(mid)
            if 2 * answered < len(window):
                return

    def _pull(self, grid: Grid, window: list[str]) -> int:
        """Pull the answers to the queries of ``window`` and check their claims; returns how many came."""
        answered = 0
        for reply in grid.pull_messages(window):
            entry = self.pending.pop(reply.metadata.reply_to_message_id, None)
            if entry is None:
                continue
            answered += 1
            node = entry[0]  # the SuperLink may be an error's source: name the node we asked
            if reply.has_error():  # no sign of life (e.g. the SuperLink declared the node offline): asked again
                log(WARNING, "Partition query failed for node %s: %s", node, reply.error.reason)
                continue
            if self.silent.pop(node, None) is not None:
                log(INFO, "Round %d: node %s answered again: no longer silent", self._round, node)
            self._claim(node, claim_record(reply.content))
        return answered

    def _worth_waiting(self, need: Collection[int], limit: float) -> bool:
        """Whether a partition of ``need`` lacks a node and a fresh query of a node that could serve it is out."""
        missing = set(need) - set(self.node_to_partition.values())
        if not missing or limit <= 0:
            return False
        now = time.monotonic()
        for node, sent in self.pending.values():
            if node in self.silent or now - sent >= limit:
                continue
            owned = self.rules.owned(self.keys.get(node))
            if self.rules.owners is None or owned in missing:
                return True
        return False

    def _mark_silent(self) -> None:
        now = time.monotonic()
        for node, sent in self.pending.values():
            if node not in self.silent and now - sent >= self.query_timeout:
                self._silence(node, f"no answer to the partition query within {self.query_timeout:g} s")

    def _silence(self, node: int, reason: str) -> None:
        self.silent[node] = reason
        self.silent_rounds.setdefault(self._round, set()).add(node)
        log(WARNING, "Round %d: node %s is silent (%s): not waited for until it answers", self._round, node, reason)

    def _refuse(self, node_id: int, partition_id: int | None, reason: str) -> None:
        self.idle_claims[node_id] = partition_id
        self.refused.setdefault(self._round, []).append(node_id)
        log(WARNING, "Round %d: refused the partition claim of node %s: %s", self._round, node_id, reason)

    def _claim(self, node_id: int, record: Mapping | None) -> None:
        """Check a node's claim (see the module doc) and map the node to its partition, or refuse it."""
        try:
            partition_id = self.rules.check(record, self.keys.get(node_id))
        except RefusedClaim as err:
            self._refuse(node_id, None, str(err))
            return
        self._assign(node_id, partition_id)

    def _assign(self, node_id: int, partition_id: int) -> None:
        """Map ``node_id`` to a valid claim, unless another node holds the partition (see the module doc)."""
        previous = self.owner.get(partition_id)
        if previous is not None and previous != node_id:
            answering = self.node_to_partition.get(previous) == partition_id
            if self.rules.owners is None and (self.bind_partitions or answering):
                holds = "holds" if answering else "held first"
                self._refuse(
                    node_id,
                    partition_id,
                    f"it claims partition {partition_id}, which node {previous} {holds} in this run",
                )
                return
            self.reassigned.setdefault(self._round, []).append(partition_id)
            if answering:
                self.idle_claims[previous] = partition_id
            reason = (
                "its key owns it"
                if self.rules.owners is not None
                else f"node {previous} left or went silent; without SuperNode authentication the next claimant takes it"
            )
            log(
                WARNING,
                "Round %d: partition %d reassigned from node %s to node %s (%s)",
                self._round,
                partition_id,
                previous,
                node_id,
                reason,
            )
        self.owner[partition_id] = node_id
        if previous is not None and previous != node_id and self.node_to_partition.get(previous) == partition_id:
            del self.node_to_partition[previous]  # only a partition's owner can hold it: O(1), not O(nodes)
        self.node_to_partition[node_id] = partition_id
        log(INFO, "Round %d: node %s serves partition %d", self._round, node_id, partition_id)

    def note_replies(
        self, server_round: int, messages: Iterable[Message], replies: Iterable[Message], grid: Grid | None = None
    ) -> None:
        """After a round's train exchange: a node whose message got no reply at all (not even an error) within
        the round timeout is silent: its partition is not scheduled until it answers a partition query. With
        ``grid``, the query answers that arrived meanwhile are collected now (without waiting)."""
        answered = {r.metadata.reply_to_message_id for r in replies}
        self._round = server_round
        for msg in messages:
            node = msg.metadata.dst_node_id
            if msg.metadata.message_id not in answered and node not in self.silent:
                self.node_to_partition.pop(node, None)
                self._silence(node, "no reply to its train message within the round timeout")
        if grid is not None:
            self._collect(grid)
            self._mark_silent()

    def round_counts(self, server_round: int) -> dict[str, int]:
        """The round's metrics of the manager: skipped partitions, refused claims, reassigned partitions, silent
        nodes."""
        return {
            protocol.NUM_SKIPPED: len(self.skipped.get(server_round, [])),
            protocol.NUM_REFUSED: len(self.refused.get(server_round, [])),
            protocol.NUM_REASSIGNED: len(self.reassigned.get(server_round, [])),
            protocol.NUM_SILENT: len(self.silent_rounds.get(server_round, ())),
        }

    def select(self, server_round: int, grid: Grid) -> list[int]:
        """Node ids of the partitions scheduled for ``server_round`` that have an answering node."""
        self._round = server_round
        if not self._waited:
            if self.wait_for_nodes(grid) == 0:
                raise NoNodesError(
                    f"no client node answered the partition query within "
                    f"participation.wait_timeout={self.wait_timeout:g} s; nothing can be trained"
                )
            self._waited = True
        wanted = self.schedule.clients_for_round(server_round)
        self.refresh(grid, wanted)
        if self.silent:
            self.silent_rounds.setdefault(server_round, set()).update(self.silent)
            log(WARNING, "Round %d: silent nodes %s are not waited for", server_round, sorted(self.silent))
        partition_to_node = {p: n for n, p in self.node_to_partition.items()}
        missing = [p for p in wanted if p not in partition_to_node]
        if missing:
            self.skipped[server_round] = missing
            log(WARNING, "Round %d: partitions %s have no connected node and are skipped", server_round, missing)
        nodes = [partition_to_node[p] for p in wanted if p in partition_to_node]
        log(INFO, "Round %d: partitions %s on %d nodes", server_round, wanted, len(nodes))
        return nodes


class CyclicClientManager(PartitionClientManager):
    """Cyclic participation S^t = S^{t-p}, p = 1/C (paper 1 Assumption III.3)."""

    def __init__(
        self,
        num_clients: int,
        fraction: float,
        seed: int = 0,
        groups: Sequence[Sequence[int]] | None = None,
        **kwargs: float | bool | Mapping[str, int] | None,
    ) -> None:
        super().__init__(CyclicSchedule(num_clients, fraction, seed, groups), **kwargs)


class UniformClientManager(PartitionClientManager):
    """C*N partitions sampled uniformly without replacement each round."""

    def __init__(
        self, num_clients: int, fraction: float, seed: int = 0, **kwargs: float | bool | Mapping[str, int] | None
    ) -> None:
        super().__init__(UniformSchedule(num_clients, fraction, seed), **kwargs)
