"""The processes of one local Ray simulation, ended when the simulation returns.

Flower ends a Ray simulation by asking each ClientAppActor to exit (``ray.actor.exit_actor``) and shutting Ray
down. The actors' core workers shut down at once, but each interpreter then finalises its heap (a garbage
collection of several hundred MB) at Ray's worker niceness (15); on busy cores this was seen to last minutes
(two actors of a 2-round CNN run, re-parented to init, collecting for ~7 min while the test suite ran): processes
of a run that had already returned, holding memory and taking CPU time from whatever runs next.

:func:`owned_processes` marks every process the run starts through its environment (a fresh token in
``FEDMOMENTUM_RAY_RUN``, inherited by the GCS, the raylet and every worker it spawns) and, when the run returns,
gives them ``grace`` seconds to exit and SIGKILLs the rest, waiting until they are gone. Only processes carrying
this run's token are touched: a Ray cluster's workers (``backend.address``) never inherit it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

RUN_VAR = "FEDMOMENTUM_RAY_RUN"
GRACE = 2.0  # seconds Ray's processes get to exit by themselves after the simulation returned
KILL_WAIT = 30.0  # bound on waiting for SIGKILLed processes to disappear (the kernel's work, not theirs)


@contextlib.contextmanager
def owned_processes(grace: float = GRACE, log: Callable[[str], None] | None = None) -> Iterator[str]:
    """Run the body with a fresh ``RUN_VAR`` token in the environment; end its processes afterwards.

    Yields the token. The environment is restored on exit, so a long-lived process that runs several simulations
    marks each with its own token.
    """
    token = secrets.token_hex(8)
    previous = os.environ.get(RUN_VAR)
    os.environ[RUN_VAR] = token
    try:
        yield token
    finally:
        if previous is None:
            os.environ.pop(RUN_VAR, None)
        else:
            os.environ[RUN_VAR] = previous
        killed = end_processes(token, grace)
        if killed and log is not None:
            log(
                f"Ray: {len(killed)} process(es) of this run still running {grace:g} s after it ended, killed "
                f"(pids {', '.join(map(str, killed))}; Ray actors finalising their interpreter)"
            )


def end_processes(token: str, grace: float) -> list[int]:
    """Wait up to ``grace`` s for the processes carrying ``token`` to exit, SIGKILL those left and wait until they
    are gone; returns the killed pids."""
    deadline = time.monotonic() + grace
    while (left := carrying(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT
    while carrying(token) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def carrying(token: str) -> list[int]:
    """Live processes (not this one) whose environment holds ``RUN_VAR=token``; empty where /proc is missing.

    A process that is exiting or a zombie has released its memory and shows an empty environment: not listed.
    """
    marker = f"\0{RUN_VAR}={token}\0".encode()
    found = []
    with contextlib.suppress(OSError):
        entries = os.listdir("/proc")
        for entry in entries:
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:  # gone, or another user's
                continue
            if marker in b"\0" + environ + b"\0":
                found.append(int(entry))
    return found
