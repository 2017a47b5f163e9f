"""Partition claims and silent nodes in the client manager (issue 19), on a scripted grid with a fake clock.

Each node of :class:`ScriptedGrid` answers the partition query with a scripted claim, with an error, or never
(silent) until the test makes it answer. Time is a fake clock that only ``time.sleep`` advances, so the
"not waited for" assertions are exact and the tests never sleep.
"""

from __future__ import annotations

import uuid

import pytest
from flwr.app import ConfigRecord, Error, Message, RecordDict
from flwr.proto.node_pb2 import NodeInfo
from flwr.supercore.task_identity import TaskIdentity

from server.deploy import tls
from strategies import claims, client_manager
from strategies.claims import ClaimRules, RefusedClaim, key_fingerprint
from strategies.client_manager import CyclicClientManager

SILENT = object()


class Clock:
    """time.monotonic / time.sleep of the client manager: sleeping advances the clock, nothing else does."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def clock(monkeypatch):
    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = 1
    fake = Clock()
    monkeypatch.setattr(client_manager.time, "monotonic", fake.monotonic)
    monkeypatch.setattr(client_manager.time, "sleep", fake.sleep)
    return fake


class ScriptedGrid:
    """Nodes answer queries with ``answers[node]``: a claim dict, "error", or SILENT (kept until :meth:`wake`)."""

    def __init__(self, answers: dict, keys: dict | None = None) -> None:
        self.answers, self.keys = dict(answers), keys or {}
        self.replies: dict[str, Message] = {}
        self.held: dict[str, Message] = {}  # queries a silent node has not answered
        self.queries: list[int] = []

    def get_node_ids(self):
        return list(self.answers)

    def get_nodes(self):
        return [NodeInfo(node_id=n, public_key=self.keys.get(n, b"")) for n in self.answers]

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            mid = uuid.uuid4().hex
            msg.metadata.__dict__["_message_id"] = mid
            self.queries.append(msg.metadata.dst_node_id)
            self.held[mid] = msg
            ids.append(mid)
            self._answer(mid)
        return ids

    def _answer(self, mid: str) -> None:
        msg = self.held[mid]
        answer = self.answers[msg.metadata.dst_node_id]
        if answer is SILENT:
            return
        del self.held[mid]
        if answer == "error":
            self.replies[mid] = Message(error=Error(5, "node unavailable"), reply_to=msg)
        else:
            self.replies[mid] = Message(RecordDict({"config": ConfigRecord(answer)}), reply_to=msg)

    def wake(self, node: int, answer: dict) -> None:
        """The silent ``node`` answers its pending queries now."""
        self.answers[node] = answer
        for mid in list(self.held):
            self._answer(mid)

    def pull_messages(self, message_ids):
        return [self.replies.pop(mid) for mid in list(message_ids) if mid in self.replies]


def claim(partition, num_partitions=2):
    return {"partition-id": partition, "num-partitions": num_partitions}


def manager(**kwargs) -> CyclicClientManager:
    return CyclicClientManager(2, 1.0, query_timeout=3.0, wait_timeout=60.0, **kwargs)


def test_fingerprint_is_openssh_sha256_of_pem_and_openssh_forms(tmp_path):
    """The SuperLink stores keys as PEM; operators hold OpenSSH .pub files: both give `ssh-keygen -lf`'s text."""
    from cryptography.hazmat.primitives import serialization
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    key = tls.make_node_key(tmp_path, "n0")
    line = key.public.read_text()
    pem = public_key_to_bytes(serialization.load_ssh_public_key(line.encode()))
    assert key_fingerprint(line) == key_fingerprint(pem)
    assert key_fingerprint(line).startswith("SHA256:") and len(key_fingerprint(line)) == 7 + 43
    with pytest.raises(ValueError):
        key_fingerprint("not a key")


@pytest.mark.parametrize(
    "record, reason",
    [
        (None, "holds no"),
        ({"partition-id": "0"}, "not an integer"),
        ({"partition-id": True}, "not an integer"),
        ({"partition-id": 7, "num-partitions": 2}, "outside [0, 2)"),
        ({"partition-id": -1}, "outside [0, 2)"),
        ({"partition-id": 1, "num-partitions": 5}, "num-partitions=5, the run has 2"),
    ],
)
def test_claim_rules_refuse_with_a_reason(record, reason):
    with pytest.raises(RefusedClaim, match=reason.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        ClaimRules(2).check(record)
    assert ClaimRules(2).check({"partition-id": 1}) == 1  # num-partitions may be absent
    owners = ClaimRules(2, {"SHA256:a": 0})
    assert owners.check({"partition-id": 0}, "SHA256:a") == 0
    with pytest.raises(RefusedClaim, match="owns no partition"):
        owners.check({"partition-id": 0}, "SHA256:b")
    with pytest.raises(RefusedClaim, match="gives no public key"):
        owners.check({"partition-id": 0}, None)
    assert claims.claim_record(RecordDict({"config": ConfigRecord({"x": 1})})) is None


def test_keys_own_partitions_whoever_answers_first(monkeypatch):
    """Auth + owners map: the intruder (node 5, answers before the honest nodes, registered key owning nothing)
    and a node with the key of partition 1 claiming partition 0 are refused and counted; the honest nodes keep
    their partitions, also after a restart under a new node id (same key)."""
    monkeypatch.setattr(client_manager, "key_fingerprint", lambda raw: "fp-" + raw.decode())  # opaque test keys
    keys = {5: b"intruder", 11: b"key0", 12: b"key1"}
    grid = ScriptedGrid({5: claim(0), 11: claim(0), 12: claim(1)}, keys)
    m = manager(owners={"fp-key0": 0, "fp-key1": 1})
    assert m.select(1, grid) == [11, 12]
    assert m.refused == {1: [5]} and m.node_to_partition == {11: 0, 12: 1}
    grid.answers[13], grid.keys[13] = claim(0), b"key1"  # the key of partition 1 (another node) claims partition 0
    assert m.select(2, grid) == [11, 12] and 2 not in m.refused  # asked, not waited for: every partition has a node
    assert m.select(3, grid) == [11, 12] and m.refused[3] == [13]  # its answer, collected a round later
    del grid.answers[11]  # node 0 restarts under a new id with its key: waited for, its partition needs it
    grid.answers[21], grid.keys[21] = claim(0), b"key0"
    assert m.select(4, grid) == [21, 12] and 4 not in m.refused
    assert m.reassigned == {4: [0]}  # the partition's node id changed, by its key: counted
    assert grid.queries.count(5) == 1  # a refused node is not asked again while connected


@pytest.mark.parametrize(
    "bad, reason",
    [
        (claim(7), "partition 7 is outside"),
        (claim(1, 5), "num-partitions=5"),
        ({"partition-id": "x"}, "not an integer"),
    ],
)
def test_every_bad_claim_is_refused_logged_and_counted(bad, reason, caplog):
    grid = ScriptedGrid({11: claim(0), 12: claim(1), 13: bad})
    m = manager()
    with caplog.at_level("WARNING", logger="flwr"):
        assert m.select(1, grid) == [11, 12]
    assert m.refused == {1: [13]} and m.node_to_partition == {11: 0, 12: 1}
    assert any("node 13" in r.getMessage() and reason in r.getMessage() for r in caplog.records)


def test_duplicate_claim_refused_while_the_holder_answers_reassigned_when_it_left():
    """No auth: a second claimant of a held partition is refused; once the holder left, the next claimant gets it
    (a restarted node has a new id without auth), counted in reassigned. bind_partitions: the first claimant's."""
    grid = ScriptedGrid({11: claim(0), 12: claim(1), 13: claim(0)})
    m = manager()
    assert m.select(1, grid) == [11, 12] and m.refused == {1: [13]}
    del grid.answers[11]  # the holder leaves: the refused claimant is asked again and takes it, a newcomer is refused
    grid.answers[14] = claim(0)
    assert m.select(2, grid) == [13, 12] and m.reassigned == {2: [0]} and m.refused[2] == [14]
    bound = manager(bind_partitions=True)
    grid = ScriptedGrid({11: claim(0), 12: claim(1)})
    bound.select(1, grid)
    del grid.answers[11]
    grid.answers[14] = claim(0)
    assert bound.select(2, grid) == [12] and bound.refused == {2: [14]} and bound.skipped == {2: [0]}


def test_silent_node_is_not_waited_for_and_counted_every_round(clock):
    """A registered node that never answers costs at most query_timeout, once, and only while its partition
    could need it; it is counted in every round until it answers, then it is back."""
    grid = ScriptedGrid({11: claim(0), 12: claim(1), 13: SILENT})
    m = manager()
    t0 = clock.now
    assert m.select(1, grid) == [11, 12]
    assert clock.now - t0 < 0.5  # every partition had its node: the silent query was not waited for
    clock.sleep(3.0)
    assert m.select(2, grid) == [11, 12] and m.silent_rounds[2] == {13}
    assert m.select(3, grid) == [11, 12] and m.silent_rounds[3] == {13}
    assert grid.queries.count(13) == 1  # one pending query, not one per round
    grid.wake(13, claim(1))  # it answers late, claiming the held partition 1: alive, but refused
    m.select(4, grid)
    assert 4 not in m.silent_rounds and m.refused == {4: [13]}


class SlowStartGrid(ScriptedGrid):
    """Node 12 answers its query only ``delay`` seconds (of the fake clock) after the first pull: a slow start."""

    def __init__(self, answers: dict, clock: Clock, delay: float) -> None:
        super().__init__({**answers, 12: SILENT})
        self.clock, self.delay, self.start = clock, delay, None

    def pull_messages(self, message_ids):
        self.start = self.clock.now if self.start is None else self.start
        if self.answers[12] is SILENT and self.clock.now - self.start >= self.delay:
            self.wake(12, claim(1))
        return super().pull_messages(message_ids)


def test_a_node_slower_to_start_than_query_timeout_is_not_silent(clock):
    """In the start-up wait (wait_timeout = 60 s) a node that answers after 10 s, longer than query_timeout
    (3 s), is waited for and never counted silent: round 1 runs both partitions with num-silent 0."""
    grid = SlowStartGrid({11: claim(0)}, clock, delay=10.0)
    m = manager()
    assert m.select(1, grid) == [11, 12]
    assert clock.now - grid.start >= 10.0 and m.round_counts(1)["num-silent"] == 0 and not m.silent


def test_node_silent_on_train_is_skipped_until_it_answers_a_query(clock):
    grid = ScriptedGrid({11: claim(0), 12: claim(1)})
    m = manager()
    assert m.select(1, grid) == [11, 12]
    sent = [Message(RecordDict({}), dst_node_id=n, message_type="train") for n in (11, 12)]
    for msg in sent:  # ids as a grid sets them when it pushes
        msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
    m.note_replies(1, sent, [Message(RecordDict({}), reply_to=sent[0])])  # 12: no reply within the round timeout
    assert m.silent_rounds[1] == {12} and 12 not in m.node_to_partition
    grid.answers[12] = SILENT
    t0 = clock.now
    assert m.select(2, grid) == [11] and m.skipped == {2: [1]} and m.silent_rounds[2] == {12}
    assert clock.now - t0 < 0.5  # a silent node is never waited for, even for its own partition
    grid.wake(12, claim(1))
    assert m.select(3, grid) == [11, 12] and 3 not in m.silent_rounds
    assert not m.refused and not m.reassigned  # the same node got its own partition back


def test_error_answers_are_asked_again_and_no_node_fails_after_wait_timeout(clock):
    grid = ScriptedGrid({11: "error", 12: "error"})
    m = CyclicClientManager(2, 1.0, query_timeout=3.0, wait_timeout=5.0)
    with pytest.raises(client_manager.NoNodesError):
        m.select(1, grid)
    assert grid.queries.count(11) >= 3  # asked again about once a second until wait_timeout


def test_answers_that_came_in_during_a_round_are_counted_in_that_round():
    """A node that joins is asked at the next round's start, not waited for (every partition has its node); its
    answer, in by the end of the round, is collected then and counted in that round's metrics."""
    grid = ScriptedGrid({11: claim(0), 12: claim(1)})
    m = manager()
    m.select(1, grid)
    grid.answers[13] = claim(0)
    assert m.select(2, grid) == [11, 12] and m.round_counts(2)["num-refused"] == 0
    m.note_replies(2, [], [], grid)
    assert m.round_counts(2) == {"num-skipped": 0, "num-refused": 1, "num-reassigned": 0, "num-silent": 0}


@pytest.mark.parametrize("mode", ["first claimant", "bind_partitions", "owners"])
def test_a_partition_never_has_two_nodes_whatever_the_order_of_claims_and_departures(mode, monkeypatch):
    """5,000 seeded random events (claims, valid or not, nodes leaving, nodes silent on train): after each one every
    partition has at most one node, and that node is the partition's owner — the invariant that lets a claim drop
    the previous holder in O(1) (a federation of 342k Stack Overflow users was quadratic: docs/benchmarks.md)."""
    import random

    monkeypatch.setattr(client_manager, "key_fingerprint", lambda raw: "fp-" + raw.decode())
    rng = random.Random(0)
    owners = {f"fp-key{p}": p for p in range(10)} if mode == "owners" else None
    m = CyclicClientManager(
        10, 1.0, query_timeout=3.0, wait_timeout=60.0, bind_partitions=mode == "bind_partitions", owners=owners
    )
    most = 0
    for event in range(5000):
        node, partition = rng.randrange(40), rng.randrange(10)
        kind = rng.random()
        if kind < 0.7:
            m.keys[node] = f"fp-key{node % 10}"
            m._claim(node, claim(partition if rng.random() < 0.8 else node % 10, 10))
        elif kind < 0.85:
            m._forget({n for n in range(40) if rng.random() < 0.9})
        else:
            m.node_to_partition.pop(node, None)  # silent on a train message (note_replies)
        held = list(m.node_to_partition.values())
        assert len(held) == len(set(held)), event
        assert all(m.owner[p] == n for n, p in m.node_to_partition.items()), event
        most = max(most, len(held))
    changes = sum(map(len, (m.refused if mode == "bind_partitions" else m.reassigned).values()))
    assert most >= 6 and changes > 10  # the sequence did exercise conflicts


class CountingGrid(ScriptedGrid):
    """A ScriptedGrid that records the number of ids of every pull."""

    def __init__(self, answers: dict) -> None:
        super().__init__(answers)
        self.pulls: list[int] = []

    def pull_messages(self, message_ids):
        self.pulls.append(len(list(message_ids)))
        return super().pull_messages(message_ids)


def test_queries_are_pulled_a_window_at_a_time_and_answered_windows_go_on_at_once(monkeypatch):
    """A pull costs O(ids) (Flower's in-memory LinkState holds its lock for it): at most PULL_WINDOW ids a pull; when
    every answer is in (the batched grid) one collection still takes them all, window after window."""
    monkeypatch.setattr(client_manager, "PULL_WINDOW", 3)
    grid = CountingGrid({n: claim(n - 10, 10) for n in range(10, 20)})
    cm = CyclicClientManager(10, 1.0, query_timeout=3.0, wait_timeout=60.0)
    assert cm.wait_for_nodes(grid) == 10
    assert cm.node_to_partition == {n: n - 10 for n in range(10, 20)} and not cm.pending
    assert grid.pulls == [3, 3, 3, 1]  # one pass in one collection, no window over 3


def test_answers_already_in_are_collected_without_a_poll_interval(clock):
    """A grid that answers as it is asked (the batched engine): the start-up wait maps every partition without
    sleeping, and a node that joins later and is needed is mapped in the same round, also without sleeping."""
    grid = ScriptedGrid({11: claim(0), 12: claim(1)})
    m = manager()
    assert m.wait_for_nodes(grid) == 2 and clock.now == 1000.0
    del grid.answers[11]
    grid.answers[13] = claim(0)  # partition 0's node restarts under a new id: needed in round 1
    assert m.select(1, grid) == [13, 12] and clock.now == 1000.0


def test_a_mostly_silent_window_ends_the_pass_and_the_next_poll_takes_the_next_queries(monkeypatch, clock):
    """Unanswered queries go to the back: every query is pulled within ceil(pending / window) polls, so an answer
    behind silent nodes is not starved, and a window of silence does not make a poll pull everything."""
    monkeypatch.setattr(client_manager, "PULL_WINDOW", 2)
    answers = {n: SILENT for n in range(10, 16)}
    answers[15] = claim(5, 6)  # the last node asked answers at once; the others are silent
    grid = CountingGrid(answers)
    cm = CyclicClientManager(6, 1.0, query_timeout=30.0, wait_timeout=60.0)
    cm.refresh(grid, need=[5], timeout=0.0)  # pushes every query (nothing was out to collect)
    cm._collect(grid)  # the first window: nodes 10 and 11, silent: the pass ends there
    assert grid.pulls == [2] and cm.node_to_partition == {}
    cm._collect(grid)  # (12, 13): silent
    cm._collect(grid)  # (14, 15): node 15 answers, half a window: the pass goes on to (10, 11), silent, and ends
    assert cm.node_to_partition == {15: 5} and grid.pulls == [2, 2, 2, 2]
    grid.wake(12, claim(2, 6))
    cm._collect(grid)  # (12, 13): node 12's answer; then (14, 10), silent
    assert cm.node_to_partition == {15: 5, 12: 2} and grid.pulls[4:] == [2, 2]
    assert [n for n, _ in cm.pending.values()] == [11, 13, 14, 10]  # the next poll starts at node 11
