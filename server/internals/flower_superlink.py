"""Flower's SuperLink in this process with an in-memory object store and cached run checks (flwr 1.39 internals).

A SuperLink started with ``--database <file>`` (so that SuperNodes survive a SuperLink restart) also keeps every
object (each model array, both ways) in that SQLite file, one transaction per object
(``superlink/config_loader.py``, ``supercore/object_store/sql_object_store.py``): ~3 s per round. Here the object
store is always in memory (the LinkState, i.e. nodes, keys, runs and messages, still lives in the ``--database``
file), and the Fleet handlers look up a running run's status at most every ``RUN_STATUS_TTL`` seconds
(:class:`RunStatusCache`; with a database file Flower runs a status query and two clean-up UPDATEs for every
object pushed or pulled).
"""

from __future__ import annotations

import importlib
import sys
import time
from typing import Any

SUPERLINK_CONFIG = "flwr.superlink.config_loader"
FLEET_HANDLERS = "flwr.server.superlink.fleet.message_handler.message_handler"
RUN_STATUS_TTL = 0.5  # seconds a running run is not looked up again by the Fleet handlers (Flower: 0)


def patch_object_store_in_memory() -> None:
    """Make the SuperLink build an in-memory object store whatever ``--database`` says (LinkState unchanged)."""
    module = importlib.import_module(SUPERLINK_CONFIG)
    factory = module.ObjectStoreFactory
    if getattr(factory, "in_memory", False):
        return
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME

    def in_memory_factory(database: str = FLWR_IN_MEMORY_DB_NAME) -> Any:
        return factory(FLWR_IN_MEMORY_DB_NAME)

    in_memory_factory.in_memory = True  # type: ignore[attr-defined]
    module.ObjectStoreFactory = in_memory_factory


class RunStatusCache:
    """Stand-in for ``check_abort`` in Flower's Fleet message handlers: a run found running is not looked up
    again for ``ttl`` seconds (Flower: a SQL status query plus two task-token clean-up UPDATEs per object)."""

    def __init__(self, check_abort: Any, ttl: float) -> None:
        self.check_abort, self.ttl = check_abort, ttl
        self.running: dict[tuple[int, tuple[str, ...], int], float] = {}  # key -> monotonic time of the check

    def __call__(self, run_id: int, abort_status_list: list[str], state: Any) -> str | None:
        key = (run_id, tuple(abort_status_list), id(state))
        checked = self.running.get(key)
        if checked is not None and time.monotonic() - checked < self.ttl:
            return None
        message = self.check_abort(run_id, abort_status_list, state)
        if message is None:
            self.running[key] = time.monotonic()
        else:
            self.running.pop(key, None)
        return message


def patch_fleet_run_checks(ttl: float = RUN_STATUS_TTL) -> None:
    """Make Flower's Fleet handlers check a running run's status at most every ``ttl`` seconds."""
    module = importlib.import_module(FLEET_HANDLERS)
    if not isinstance(module.check_abort, RunStatusCache):
        module.check_abort = RunStatusCache(module.check_abort, ttl)


def run_flower_superlink(argv: list[str]) -> None:
    """Run Flower's own ``flower-superlink`` in this process with both patches (see the module doc)."""
    patch_object_store_in_memory()
    patch_fleet_run_checks()
    from flwr.superlink.cli.flower_superlink import flower_superlink

    sys.argv = ["flower-superlink", *argv]
    flower_superlink()
