"""Flower-side client managers: map connected nodes to partition ids, then follow a schedule.

Flower's Message-API strategies have no ClientManager, and the server cannot read a
node's ``node_config``. So the manager asks each new node for its partition id with
one QUERY message (answered by the ClientApp's ``@app.query()``), keeps the
node -> partition map, and each round returns the nodes of the partitions that the
schedule (:mod:`strategies.participation`) selects. Partitions without a connected
node are skipped and logged; nodes that rejoin under a new id are queried again.

A partition id is whatever a node claims (its ``--node-config``), so two nodes may claim one partition:

- ``bind_partitions=True`` (SuperNode authentication on: a node id is stable per key, a restarted node keeps
  it): the first node that claimed a partition in this run keeps it; any other claimant is **refused**,
  logged and counted (``refused``), and not queried again while it stays connected. This stops a hijack.
- ``bind_partitions=False`` (no authentication: a restarted node gets a new id): the newest claimant wins, and
  every change of a partition's node is logged and counted (``reassigned``), so a hijack is at least visible.
  The displaced node is not queried again while the partition has a connected node (no ping-pong).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from logging import INFO, WARNING

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from strategies import protocol
from strategies.participation import CyclicSchedule, UniformSchedule


class NoNodesError(RuntimeError):
    """No node answered the partition query before ``wait_timeout``: the run cannot train (in simulation the
    usual cause is a Ray backend whose actors failed to start; in a deployment, SuperNodes that never connected)."""


class PartitionClientManager:
    """Selects this round's nodes from a schedule over partition ids.

    Before its first round the manager waits until ``wait_for`` partitions (default: all) have answered the
    partition query, for at most ``wait_timeout`` seconds (a resumed run after a SuperLink restart needs this:
    reconnecting nodes may answer late); later rounds never block on missing nodes.
    """

    def __init__(
        self,
        schedule: CyclicSchedule | UniformSchedule,
        query_timeout: float = 120.0,
        wait_timeout: float = 300.0,
        wait_for: int | None = None,
        bind_partitions: bool = False,
    ) -> None:
        self.schedule = schedule
        self.query_timeout = query_timeout
        self.wait_timeout = wait_timeout
        self.wait_for = schedule.num_clients if wait_for is None else wait_for
        self.bind_partitions = bind_partitions
        self.node_to_partition: dict[int, int] = {}
        self.owner: dict[int, int] = {}  # partition -> node that claimed it first (bind) or last (newest wins)
        self.idle_claims: dict[int, int] = {}  # node -> partition it claimed but does not serve (refused/displaced)
        self.skipped: dict[int, list[int]] = {}
        self.refused: dict[int, list[int]] = {}  # round -> node ids refused in that round
        self.reassigned: dict[int, list[int]] = {}  # round -> partitions that changed node in that round
        self._round = 0
        self._waited = False

    @property
    def num_clients(self) -> int:
        """Number of partitions N the schedule covers."""
        return self.schedule.num_clients

    def wait_for_nodes(self, grid: Grid) -> int:
        """Block until ``wait_for`` partitions have a node that answered the partition query, or until
        ``wait_timeout`` passes; nodes that did not answer in time are queried again. Returns the count."""
        deadline = time.monotonic() + self.wait_timeout
        while True:
            self.refresh(grid, timeout=max(1.0, min(self.query_timeout, deadline - time.monotonic())))
            mapped = len(set(self.node_to_partition.values()))
            if mapped >= self.wait_for or time.monotonic() >= deadline:
                return mapped
            log(INFO, "Waiting for nodes: %d of %d partitions answered", mapped, self.wait_for)
            time.sleep(1.0)

    def refresh(self, grid: Grid, timeout: float | None = None) -> None:
        """Forget departed nodes and query new (or so far silent) ones for their partition id."""
        connected = set(grid.get_node_ids())
        self.node_to_partition = {n: p for n, p in self.node_to_partition.items() if n in connected}
        held = set(self.node_to_partition.values())  # a displaced node may claim again once its partition is free
        self.idle_claims = {n: p for n, p in self.idle_claims.items()
                            if n in connected and (self.bind_partitions or p in held)}
        unknown = sorted(connected - set(self.node_to_partition) - set(self.idle_claims))
        if not unknown:
            return
        messages = [
            Message(RecordDict({protocol.CONFIG: ConfigRecord({})}), dst_node_id=n, message_type=MessageType.QUERY)
            for n in unknown
        ]
        replies = list(grid.send_and_receive(messages, timeout=self.query_timeout if timeout is None else timeout))
        sent_to = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}  # ids are set when pushed
        for reply in replies:
            if reply.has_error():  # the SuperLink may be the error's source: name the node we asked
                node = sent_to.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
                log(WARNING, "Partition query failed for node %s: %s", node, reply.error.reason)
                continue
            for record in reply.content.config_records.values():
                if protocol.PARTITION_ID in record:
                    self._assign(reply.metadata.src_node_id, int(record[protocol.PARTITION_ID]))

    def _assign(self, node_id: int, partition_id: int) -> None:
        """Map ``node_id`` to its claimed partition, by the rule of ``bind_partitions`` (see the module doc)."""
        previous = self.owner.get(partition_id)
        if self.bind_partitions and previous is not None and previous != node_id:
            self.idle_claims[node_id] = partition_id
            self.refused.setdefault(self._round, []).append(node_id)
            log(WARNING, "Round %d: node %s claims partition %d, which node %s holds in this run: refused",
                self._round, node_id, partition_id, previous)
            return
        if previous is not None and previous != node_id:
            self.reassigned.setdefault(self._round, []).append(partition_id)
            if previous in self.node_to_partition:
                self.idle_claims[previous] = partition_id
            log(WARNING, "Round %d: partition %d reassigned from node %s to node %s (the newest claimant wins "
                "without SuperNode authentication)", self._round, partition_id, previous, node_id)
        self.owner[partition_id] = node_id
        self.node_to_partition = {n: p for n, p in self.node_to_partition.items() if p != partition_id}
        self.node_to_partition[node_id] = partition_id

    def select(self, server_round: int, grid: Grid) -> list[int]:
        """Node ids of the partitions scheduled for ``server_round`` that are connected."""
        self._round = server_round
        if not self._waited:
            if self.wait_for_nodes(grid) == 0:
                raise NoNodesError(f"no client node answered the partition query within "
                                   f"participation.wait_timeout={self.wait_timeout:g} s; nothing can be trained")
            self._waited = True
        self.refresh(grid)
        partition_to_node = {p: n for n, p in self.node_to_partition.items()}
        wanted = self.schedule.clients_for_round(server_round)
        missing = [p for p in wanted if p not in partition_to_node]
        if missing:
            self.skipped[server_round] = missing
            log(WARNING, "Round %d: partitions %s have no connected node and are skipped", server_round, missing)
        nodes = [partition_to_node[p] for p in wanted if p in partition_to_node]
        log(INFO, "Round %d: partitions %s on %d nodes", server_round, wanted, len(nodes))
        return nodes


class CyclicClientManager(PartitionClientManager):
    """Cyclic participation S^t = S^{t-p}, p = 1/C (seed 000 Assumption III.3)."""

    def __init__(
        self,
        num_clients: int,
        fraction: float,
        seed: int = 0,
        groups: Sequence[Sequence[int]] | None = None,
        **kwargs: float | bool,
    ) -> None:
        super().__init__(CyclicSchedule(num_clients, fraction, seed, groups), **kwargs)


class UniformClientManager(PartitionClientManager):
    """C*N partitions sampled uniformly without replacement each round."""

    def __init__(self, num_clients: int, fraction: float, seed: int = 0, **kwargs: float | bool) -> None:
        super().__init__(UniformSchedule(num_clients, fraction, seed), **kwargs)
