"""server.internals.flower_link_state: the simulation's LinkState indexed by node gives Flower's own answers,
checking only the node's messages (the Ray engine installs it; docs/benchmarks.md "The Ray engine at Stack Overflow's
size")."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.proto.task_pb2 import Task  # pylint: disable=E0611
from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
from flwr.server.superlink.linkstate import InMemoryLinkState, LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid.inmemory_grid import InMemoryGrid

from server.internals import flower_link_state as linkstate

RUN_ID, TASK_ID = 7, 11


@pytest.fixture(autouse=True)
def _installed():
    """The index installed (as the Ray engine does) and Flower's task identity of a simulation, restored after."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)  # None when unset
    store, get = InMemoryLinkState.store_message_ins, InMemoryLinkState.get_message_ins
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, RUN_ID, SUPERLINK_NODE_ID
    linkstate.install()
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved
    InMemoryLinkState.store_message_ins, InMemoryLinkState.get_message_ins = store, get


def _federation(num_nodes: int) -> tuple[InMemoryLinkState, InMemoryGrid, list[int]]:
    """A simulation's state, grid and nodes, set up as flwr.simulation.run_simulation does."""
    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    state = factory.state()
    run = Run.create_empty(run_id=RUN_ID)
    run.primary_task_id, run.federation_id = TASK_ID, NOOP_FEDERATION_ID
    state.run_ids[RUN_ID] = RunRecord(run=run)
    state.task_store[TASK_ID] = Task(task_id=TASK_ID, run_id=RUN_ID)
    nodes = list(_register_nodes(num_nodes, factory))
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(run)
    return state, grid, nodes


def _push(grid: InMemoryGrid, nodes: list[int], targets: list[int]) -> list[str]:
    """One QUERY message to ``nodes[t]`` for each t of ``targets``, in that order; their ids."""
    messages = [
        Message(RecordDict({"config": ConfigRecord({"k": k})}), dst_node_id=nodes[t], message_type=MessageType.QUERY)
        for k, t in enumerate(targets)
    ]
    return list(grid.push_messages(messages))


def _scenario(get) -> list[tuple]:
    """Polls like the simulation's dispatch thread (every node, limit 1), with an expired message, a deleted one,
    a node with several, limit None and a run filter; the answers as (node index, message index) pairs."""
    state, grid, nodes = _federation(6)
    targets = [0, 2, 0, 5, 3, 0, 5, 4]
    ids = _push(grid, nodes, targets)
    where = {mid: k for k, mid in enumerate(ids)}
    state.message_ins_store[ids[4]].metadata.__dict__["_created_at"] -= 10**7  # node 3's message expired
    log: list[tuple] = []

    def poll(node: int, limit: int | None, **kw) -> None:
        log.append((node, limit, [where[m.metadata.message_id] for m in get(state, nodes[node], limit, **kw)]))

    for node in range(6):
        poll(node, 1)
    state.delete_messages({ids[6]})  # node 5's second message deleted before it is asked for
    for node in range(6):
        poll(node, 1)
    ids += _push(grid, nodes, [0, 1])
    where.update({mid: k for k, mid in enumerate(ids)})
    poll(0, None)
    poll(1, None, run_id=RUN_ID + 1)  # another run: nothing
    poll(1, None, run_id=RUN_ID)
    delivered = sorted(where[mid] for mid, m in state.message_ins_store.items() if m.metadata.delivered_at)
    return log + [("delivered", delivered), ("stored", sorted(where[mid] for mid in state.message_ins_store))]


def test_indexed_state_answers_as_flower():
    expected = _scenario(linkstate.ORIGINAL_GET)
    assert expected[:6] == [(0, 1, [0]), (1, 1, []), (2, 1, [1]), (3, 1, []), (4, 1, [7]), (5, 1, [3])]
    assert _scenario(InMemoryLinkState.get_message_ins) == expected


def test_a_poll_checks_only_its_nodes_messages(monkeypatch):
    state, grid, nodes = _federation(50)
    _push(grid, nodes, [n % 50 for n in range(200)])  # 4 messages for every node
    checked = []
    original = InMemoryLinkState._check_stored_messages
    monkeypatch.setattr(
        InMemoryLinkState,
        "_check_stored_messages",
        lambda self, ids, run_id=None: (checked.extend(ids), original(self, ids, run_id))[1],
    )
    assert len(InMemoryLinkState.get_message_ins(state, nodes[7], limit=None)) == 4
    assert len(checked) == 4  # the node's own messages only
    checked.clear()
    assert InMemoryLinkState.get_message_ins(state, nodes[7], limit=None) == [] and checked == []  # delivered: gone
    assert InMemoryLinkState.get_message_ins(state, nodes[7] + 1, limit=1) == [] and checked == []  # unknown node
    checked.clear()
    assert len(linkstate.ORIGINAL_GET(state, nodes[8], limit=None)) == 4
    assert len(checked) == 200  # Flower 1.39 checks every stored message for every node's poll


def test_install_is_idempotent_and_indexes_a_state_that_predates_it():
    state, grid, nodes = _federation(3)
    InMemoryLinkState.store_message_ins = linkstate.ORIGINAL_STORE  # messages stored before the index existed
    InMemoryLinkState.get_message_ins = linkstate.ORIGINAL_GET
    ids = _push(grid, nodes, [2, 1, 2])
    linkstate.install()
    linkstate.install()
    assert linkstate.installed()
    assert [m.metadata.message_id for m in state.get_message_ins(nodes[2], limit=None)] == [ids[0], ids[2]]
    with pytest.raises(AssertionError, match="limit"):
        state.get_message_ins(nodes[1], limit=0)
