"""Ray's start-up wait for the GCS port, with the GIL released while it waits (Ray internals).

``ray.init`` starting a local Ray (and a node joining a head) calls ``ray._raylet.wait_for_persisted_port``, a
Cython function that runs the C++ ``ray::WaitForPersistedPort`` (look for the GCS's port file in the session dir
every 100 ms, for up to 30 s) *without releasing the GIL*. Should the GCS die before it writes that file (the
sweep of :mod:`server.run.stop`'s watcher kills it when the signal came while the GCS was starting; a terminal's
Ctrl-C reaches it too), the driver's main thread holds the GIL for the full 30 s and no other Python thread runs:
not the watcher thread, which then cannot exit, so the signal guard ended the run by force ("forced", exit -9)
in about 1 of 10 start-up signals. A ``py-spy dump`` of such a run shows the main thread in ``ray::WaitForFile`` under
``Node.start_gcs_server`` and every other thread waiting for the GIL.

:func:`install` replaces the function in ``ray._private.node`` (its only caller) by a Python loop that waits for
the file with ``time.sleep`` (GIL released) and then lets Ray's own function read it, so the result and errors
are Ray's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable


def install() -> None:
    """Make ``ray._private.node`` wait for persisted ports with the GIL released (idempotent)."""
    import ray._private.node as node
    from ray._raylet import get_port_filename

    if getattr(node.wait_for_persisted_port, "releases_gil", False):
        return
    node.wait_for_persisted_port = releasing_gil(node.wait_for_persisted_port, get_port_filename)


def releasing_gil(wait: Callable[..., int], port_filename: Callable[[str, str], str]) -> Callable[..., int]:
    """``wait`` (Ray's ``wait_for_persisted_port``) preceded by a GIL-free wait for the port file.

    Ray's function only runs once the file exists (it then returns at once) or the timeout has passed (it is then
    called with one poll interval left, to raise Ray's own "Timed out waiting for file" error).
    """

    def wait_for_persisted_port(
        dir: str, node_id: str, port_name: str, timeout_ms: int = 30000, poll_interval_ms: int = 100
    ) -> int:
        path = os.path.join(dir, port_filename(node_id, port_name))
        deadline = time.monotonic() + timeout_ms / 1000
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(min(poll_interval_ms, 20) / 1000)
        left_ms = max(int((deadline - time.monotonic()) * 1000), poll_interval_ms)
        return wait(dir, node_id, port_name, left_ms, poll_interval_ms)

    wait_for_persisted_port.releases_gil = True  # type: ignore[attr-defined]
    return wait_for_persisted_port
