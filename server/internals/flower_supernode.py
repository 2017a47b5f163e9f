"""Flower's SuperNode in this process with a short pull loop (flwr 1.39 internals).

``flwr/supernode/start_client_internal.py``: the SuperNode's pull loop sleeps a fixed ``time.sleep(3)`` when the
SuperLink has no message for it, and waits for its ClientApp's reply in ``time.sleep(0.5)`` steps. Here the
module's ``time`` is replaced by :class:`ShortSleepTime` (both sleeps capped), and the loop's
``_pull_and_store_message`` is wrapped by :class:`LoopWatch` (it notes that the node joined and signals every
stored message through a pipe).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from types import ModuleType
from typing import Any

from server.internals.flower_object_pulls import SUPERNODE_LOOP
from server.internals.pins import VERSIONS

LOCAL_WAIT = 0.02  # seconds between the SuperNode's checks of its own state for a reply (Flower: 0.5)


class ShortSleepTime:
    """Stand-in for the ``time`` module inside Flower's SuperNode loop: the idle wait between pulls from the
    SuperLink (``sleep(3)``) lasts at most ``cap``; the waits on the node's own in-memory state for the
    ClientApp's reply (``sleep(0.5)``, no network traffic) at most ``LOCAL_WAIT``."""

    def __init__(self, cap: float) -> None:
        self.cap = cap

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self.cap if seconds >= 1 else LOCAL_WAIT))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def patch_supernode_loop(poll_interval: float) -> ModuleType:
    """Cap the sleeps of Flower's SuperNode loop at ``poll_interval`` seconds; returns the patched module."""
    module = importlib.import_module(SUPERNODE_LOOP)
    if module.time is not time and not isinstance(module.time, ShortSleepTime):
        raise RuntimeError(f"{SUPERNODE_LOOP}.time is not the time module (flwr != {VERSIONS['flwr']}?)")
    module.time = ShortSleepTime(poll_interval)
    return module


class LoopWatch:
    """Wraps the SuperNode loop's ``_pull_and_store_message``: notes that the node joined (the loop runs only
    after the SuperLink accepted it) and writes one byte to ``notify_fd`` per stored message."""

    def __init__(self, notify_fd: int | None) -> None:
        self.notify_fd = notify_fd
        self.joined = False
        module = importlib.import_module(SUPERNODE_LOOP)
        self.original = module._pull_and_store_message
        module._pull_and_store_message = self.pull

    def pull(self, *args: Any, **kwargs: Any) -> Any:
        self.joined = True
        run_id = self.original(*args, **kwargs)
        if run_id is not None and self.notify_fd is not None:
            try:
                os.write(self.notify_fd, b"m")
            except (BlockingIOError, BrokenPipeError):  # full (the worker will acquire anyway) or worker gone
                pass
        return run_id


def timestamped_logs() -> None:
    """Timestamps in Flower's console log lines of this process."""
    from flwr.common.logger import update_console_handler

    update_console_handler(timestamps=True)


def run_flower_supernode(flower_args: list[str]) -> None:
    """Run Flower's own ``flower-supernode`` with ``flower_args`` in this process."""
    from flwr.supernode.cli.flower_supernode import flower_supernode

    sys.argv = ["flower-supernode", *flower_args]
    flower_supernode()
