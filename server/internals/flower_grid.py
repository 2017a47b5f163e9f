"""What an in-process Flower Grid needs beyond Flower's public API (flwr 1.39 internals).

The batched engine answers messages without a SuperLink, so it does three things a SuperLink does: it gives each
pushed message its id (``Metadata`` keeps it in the private ``_message_id``; the public property is read-only),
sets the process's task identity (``flwr.supercore.task_identity.TaskIdentity``, which Flower sets for a
ServerApp run and which a ``Message`` reads when it is built), and answers with Flower's error codes and node id
of the SuperLink (``flwr.common.constant``).
"""

from __future__ import annotations

from flwr.app import Message
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.supercore.task_identity import TaskIdentity

__all__ = ["SUPERLINK_NODE_ID", "ErrorCode", "set_message_id", "set_task_identity"]


def set_message_id(message: Message, message_id: str) -> None:
    """Give ``message`` the id a SuperLink would have given it when stored."""
    message.metadata.__dict__["_message_id"] = message_id


def set_task_identity(task_id: int, run_id: int, node_id: int) -> None:
    """The task identity of this process, as Flower sets it for a run's process."""
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = task_id, run_id, node_id
