"""Flower's object pulls with a short retry backoff (flwr 1.39 internals).

A message becomes visible before its objects (the model) are uploaded, and whoever pulls it early retries the
object pulls with a backoff of 1 s, 2 s, 4 s, ... (``flwr/supercore/inflatable/inflatable_utils.py``): a fast
poller would hit that on most rounds. :func:`patch_object_pulls` binds a shorter backoff (0.05 s doubling to
0.5 s; the total budget stays Flower's ``PULL_MAX_TIME``) into the module globals through which the SuperNode,
the ClientApp runtime and the ServerApp's grid call their pull functions.
"""

from __future__ import annotations

import functools
import importlib

SUPERNODE_LOOP = "flwr.supernode.start_client_internal"
CLIENTAPP_RUNTIME = "flwr.supernode.runtime.run_clientapp"
SERVERAPP_GRID = "flwr.superlink.grid.http_grid"
PULL_BACKOFF = {"initial_backoff": 0.05, "backoff_cap": 0.5, "max_tries_per_object": None}  # Flower: 1, 10, 500
# (module, function) whose object pulls get PULL_BACKOFF: the SuperNode, the ClientApp, the ServerApp's grid
OBJECT_PULLS = (
    (SUPERNODE_LOOP, "pull_objects"),
    (CLIENTAPP_RUNTIME, "pull_and_inflate_object_from_tree"),
    (SERVERAPP_GRID, "pull_objects"),
)


def patch_object_pulls(*names: str) -> None:
    """Give the object pulls of the named modules (default: all of :data:`OBJECT_PULLS`) a short backoff."""
    for module_name, attr in OBJECT_PULLS:
        if names and module_name not in names:
            continue
        module = importlib.import_module(module_name)
        original = getattr(module, attr)
        if not isinstance(original, functools.partial):
            setattr(module, attr, functools.partial(original, **PULL_BACKOFF))


def patch_serverapp_object_pulls() -> None:
    """The short backoff for the object pulls of the ServerApp's grid (a deployed ServerApp process)."""
    patch_object_pulls(SERVERAPP_GRID)
