"""Ctrl-C (SIGINT) and SIGTERM end ``flower-simulation`` at once, in any phase.

A Python signal handler runs only when the main thread executes Python code. During a run the main thread
sits in Ray's C++ code (``ray.init`` retrying a cluster, waiting on actors) while the ServerApp thread, which
the interpreter would wait for at exit, may be in a 600 s round timeout: an ordinary KeyboardInterrupt or
``sys.exit`` is then delayed for minutes, or lost. So :func:`exit_on_signals` routes both signals through
``signal.set_wakeup_fd`` (written by the C-level handler, whatever the main thread is doing) to a watcher
thread, which prints one line and ends the process with ``os._exit(128 + signal)``.

Nothing is lost that a resume needs: metrics rows are flushed as they are written and checkpoints are
replaced atomically. Ray's processes go with the driver: a local Ray's are fate-shared with it (Linux
``PR_SET_PDEATHSIG``), and a cluster ends the actors of a driver that disconnects.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def exit_on_signals(message: str) -> Iterator[None]:
    """Within the block, SIGINT/SIGTERM print ``<program>: stopped by <SIG>; <message>`` and exit 130/143.

    Only possible from the main thread; elsewhere (e.g. a test calling ``simulate`` from a thread) the
    block runs with the process's own handlers.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig in SIGNALS:
        signal.signal(sig, _ignore_in_main_thread)  # Python-level no-op: the watcher acts
    watcher = threading.Thread(target=_watch, args=(read_fd, message), name="exit-on-signals", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(write_fd)  # the watcher reads EOF and returns
        watcher.join(timeout=5)
        os.close(read_fd)


def _ignore_in_main_thread(signum: int, frame: object) -> None:
    """Installed so that the C-level handler runs (and writes the wakeup fd); the watcher does the rest."""


def _watch(read_fd: int, message: str) -> None:
    while True:
        try:
            data = os.read(read_fd, 1)
        except OSError:
            return
        if not data:
            return
        signum = data[0]
        if signum in SIGNALS:
            _exit(signum, message)


def _exit(signum: int, message: str) -> None:
    name = signal.Signals(signum).name
    program = os.path.basename(sys.argv[0]) or "python"
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(Exception):
        print(f"{program}: stopped by {name}; {message}", file=sys.stderr, flush=True)
    os._exit(128 + signum)
