"""The simulation's in-memory LinkState, indexed by destination node (Flower 1.39 internals).

Flower 1.39's ``InMemoryLinkState.get_message_ins(node_id)`` finds a node's messages by scanning *every* stored
instruction message, checking each one (expiry, federation) on the way, and the simulation's dispatch thread
(``flwr/server/superlink/fleet/vce/vce_api.py``, ``add_messages_to_queue``) calls it for every node, every 0.1 s. A
sweep over the nodes therefore costs nodes × messages checks, and a round that messages every node (the partition
query of round 1: :mod:`strategies.client_manager`) costs nodes² of them: measured at 34,248 nodes (Stack Overflow,
10 % copy), ~3.6 answers a second; ~225 with this index and the client manager's windowed pulls (docs/benchmarks.md
"The Ray engine at Stack Overflow's size").

:func:`install` keeps, per state object, the ids of each node's stored messages in store order and makes
``get_message_ins`` walk that node's ids only, with Flower's own checks (``_check_stored_messages``) and filters
for each of them: the same messages, in the same order, marked delivered the same way. Ids of messages that Flower
deleted meanwhile (expired, invalid, a finished run) or that were delivered (never returned again) are dropped when
met, so a sweep over nodes with nothing to deliver costs a dict lookup each. What no longer happens as a side effect
of a poll is the expiry check (and deletion) of other nodes' messages and of delivered ones: ``get_message_res``
checks the messages it is asked about, so the replies the ServerApp pulls are the same.
``tests/server/test_linkstate_index.py`` runs one scripted sequence through both versions and compares every answer
(so it also exercises each Flower internal used here); ``tests/server/test_internals_pins.py`` fails when the source
of Flower's ``get_message_ins`` (the method rewritten here) changes.
"""

from __future__ import annotations

import functools

from flwr.app import Message
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
from flwr.supercore.date import now

ORIGINAL_GET = InMemoryLinkState.get_message_ins  # Flower's own, kept for the tests' comparison
ORIGINAL_STORE = InMemoryLinkState.store_message_ins
_INDEX = "_fedmomentum_ins_by_node"


def _index(state: InMemoryLinkState) -> dict[int, dict[str, None]]:
    """{node id: ordered set of its stored instruction message ids}; built from the store on first use."""
    index = state.__dict__.get(_INDEX)
    if index is None:
        index = {}
        for message_id, message in state.message_ins_store.items():
            index.setdefault(message.metadata.dst_node_id, {})[message_id] = None
        state.__dict__[_INDEX] = index
    return index


@functools.wraps(ORIGINAL_STORE)
def store_message_ins(self: InMemoryLinkState, message: Message) -> str | None:
    """Flower's ``store_message_ins``, then the stored message's id goes into its node's index."""
    with self.lock:
        message_id = ORIGINAL_STORE(self, message)
        if message_id is not None and message_id in self.message_ins_store:
            stored = self.message_ins_store[message_id]
            _index(self).setdefault(stored.metadata.dst_node_id, {})[message_id] = None
    return message_id


def get_message_ins(
    self: InMemoryLinkState, node_id: int, limit: int | None, *, run_id: int | None = None
) -> list[Message]:
    """Flower's ``get_message_ins`` over ``node_id``'s stored messages only (see the module docstring)."""
    if limit is not None and limit < 1:
        raise AssertionError("`limit` must be >= 1")
    found: list[Message] = []
    with self.lock:
        index = _index(self)
        mine = index.get(node_id)
        if not mine:  # the common case of a sweep: nothing for this node
            return found
        for message_id in list(mine):
            stored = self.message_ins_store.get(message_id)
            if stored is not None and stored.metadata.delivered_at != "":  # never returned again: forget it
                del mine[message_id]
                continue
            self._check_stored_messages({message_id})
            message = self.message_ins_store.get(message_id)
            if message is None:  # deleted by Flower (now or earlier): forget it
                del mine[message_id]
            elif (
                message.metadata.dst_node_id == node_id
                and (run_id is None or message.metadata.run_id == run_id)
                and message.metadata.delivered_at == ""
            ):
                found.append(message)
            if limit and len(found) == limit:
                break
        if not mine:
            index.pop(node_id, None)
    delivered_at = now().isoformat()
    for message in found:
        message.metadata.delivered_at = delivered_at
    return found


def install() -> None:
    """Index every InMemoryLinkState of this process from now on (idempotent)."""
    InMemoryLinkState.store_message_ins = store_message_ins  # type: ignore[method-assign]
    InMemoryLinkState.get_message_ins = get_message_ins  # type: ignore[method-assign]


def installed() -> bool:
    """Whether :func:`install` has run in this process."""
    return InMemoryLinkState.get_message_ins is get_message_ins
