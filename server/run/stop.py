"""Ctrl-C (SIGINT) and SIGTERM end ``flower-simulation`` at once, in any phase.

A Python signal handler runs only when the main thread executes Python code. During a run the main thread
sits in Ray's C++ code (``ray.init`` retrying a cluster, waiting on actors) while the ServerApp thread, which
the interpreter would wait for at exit, may be in a 600 s round timeout: an ordinary KeyboardInterrupt or
``sys.exit`` is then delayed for minutes, or lost. So :func:`exit_on_signals` routes both signals through
``signal.set_wakeup_fd`` (written by the C-level handler, whatever the main thread is doing) to a watcher
thread, which prints one line, ends this process's descendants and exits with ``os._exit(128 + signal)``. The
Python-level handler tells the watcher too, in case a library took the wakeup fd over (an event loop may).
The wakeup fd is read by a guard *process* (:mod:`server.run.stop_guard`) that forwards the signal to the watcher,
because every in-process remedy needs the GIL: should a native call hold it, the guard prints the line and ends
the run by force ``GUARD_GRACE`` seconds after the signal.

Nothing is lost that a resume needs: metrics rows are flushed as they are written and checkpoints are
replaced atomically. The descendants are a local Ray: GCS and raylet die with the driver (Ray fate-shares
them), but the raylet's own children (dashboard and runtime-env agents, idle workers) were seen to outlive it
by minutes, so :func:`end_descendants` kills the whole tree, by PID. A joined cluster's processes are not
descendants and are left alone: the cluster ends the actors of a driver that disconnects.

Two things of Ray's compete for SIGTERM in the driver: ``ray.init`` installs a Python handler that raises
SystemExit in the main thread (the block then waits for the watcher instead of printing a traceback, and a
SystemExit raised where Python can only report it, e.g. in a fork hook, is not reported), and
Ray's C++ core worker installs absl's failure-signal handler, which kills the process with the default action
right after our handler ran; ``RAY_DISABLE_FAILURE_SIGNAL_HANDLER=1`` (set by :func:`exit_on_signals` unless
already set) keeps it out of this process and of the local Ray it starts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from server.run.procs import process_table

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_STOPPING = threading.Event()  # set by the watcher as soon as a signal arrived
SWEEP_TIMEOUT = 3.0  # seconds the watcher waits for end_descendants before exiting anyway
_SPARED: set[int] = set()  # the guard process of the active block


@contextlib.contextmanager
def exit_on_signals(message: str) -> Iterator[None]:
    """Within the block, SIGINT/SIGTERM print ``<program>: stopped by <SIG>; <message>`` and exit 130/143.

    Only possible from the main thread; elsewhere (e.g. a test calling ``simulate`` from a thread) the
    block runs with the process's own handlers.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    read_fd, write_fd = os.pipe()  # wakeup fd: the C-level handler -> the guard process (or the watcher)
    notify_r, notify_w = os.pipe()  # -> the watcher thread: from the guard and from the Python-level handler
    os.set_blocking(write_fd, False)
    os.set_blocking(notify_w, False)
    guard = _start_guard(read_fd, notify_w, message)
    _SPARED.clear()
    if guard is not None:
        _SPARED.add(guard.pid)  # it ends this run's tree after it (and ends a frozen run): never swept here
        os.close(read_fd)  # the guard holds it: it sees EOF when this process closes write_fd or dies
        watch_fd = notify_r
    else:  # no guard process: the watcher reads the wakeup fd itself (as it did before the guard existed)
        os.close(notify_r)
        os.close(notify_w)
        watch_fd = read_fd
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}

    def on_signal(signum: int, frame: object) -> None:  # also tells the watcher, should the wakeup fd be taken
        with contextlib.suppress(OSError):
            os.write(notify_w if guard is not None else write_fd, bytes([signum]))

    for sig in SIGNALS:
        signal.signal(sig, on_signal)
    previous_hook = sys.unraisablehook

    def unraisable(info: Any) -> None:  # a signal's SystemExit inside a fork hook or finalizer: not news
        if not isinstance(info.exc_value, (SystemExit, KeyboardInterrupt)):
            previous_hook(info)

    sys.unraisablehook = unraisable
    watcher = threading.Thread(target=_watch, args=(watch_fd, message), name="exit-on-signals", daemon=True)
    watcher.start()
    try:
        yield
    except BaseException as err:
        # after a signal, an error here is its consequence (Ray's SIGTERM handler raises SystemExit, the
        # stopped Ray fails calls): the watcher is ending the process, so wait instead of printing a traceback
        if _STOPPING.is_set() or (isinstance(err, (SystemExit, KeyboardInterrupt)) and _STOPPING.wait(2.0)):
            while True:
                time.sleep(1.0)
        if isinstance(err, KeyboardInterrupt) or (isinstance(err, SystemExit) and err.code in SIGNALS):
            _STOPPING.set()  # a signal the watcher never heard of (e.g. Ray's SIGTERM handler): end it here
            _exit(signal.SIGINT if isinstance(err, KeyboardInterrupt) else int(err.code), message)
        raise
    finally:
        sys.unraisablehook = previous_hook
        signal.set_wakeup_fd(previous_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(write_fd)  # the guard (or the watcher) reads EOF and returns
        if guard is not None:
            with contextlib.suppress(Exception):
                guard.wait(timeout=5)
            os.close(notify_w)  # the guard's copy is closed too: the watcher reads EOF
        watcher.join(timeout=5)
        os.close(watch_fd)


GUARD_GRACE = 8.0  # seconds after a signal before the guard ends a run that did not exit (watcher path: <= 5 s)


def _start_guard(wakeup_read: int, notify_write: int, message: str) -> Any:
    """Start :mod:`server.run.stop_guard` for this process; None when it cannot start (the watcher then reads the
    wakeup fd itself)."""
    import subprocess

    cmd = [
        sys.executable,
        "-m",
        "server.run.stop_guard",
        "--parent",
        str(os.getpid()),
        "--wakeup-fd",
        str(wakeup_read),
        "--notify-fd",
        str(notify_write),
        "--grace",
        str(GUARD_GRACE),
        "--program",
        os.path.basename(sys.argv[0]) or "python",
        "--message",
        message,
    ]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    try:
        # own session: a Ctrl-C to the run's process group must not kill the guard while it is starting
        return subprocess.Popen(
            cmd,
            pass_fds=(wakeup_read, notify_write),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    except OSError:
        return None


def _watch(read_fd: int, message: str) -> None:
    while True:
        try:
            data = os.read(read_fd, 1)
        except OSError:
            return
        if not data:
            return
        if data[0] in SIGNALS:
            _STOPPING.set()
            _exit(data[0], message)


def _exit(signum: int, message: str) -> None:
    # Lock-free and bounded: the main thread may hold sys.stderr's buffer lock while a Python-level signal
    # handler (Ray's, which waits for its processes) runs inside an interrupted write; a print here would wait.
    deadman = threading.Timer(SWEEP_TIMEOUT + 2.0, os._exit, args=(128 + signum,))
    deadman.daemon = True
    deadman.start()
    flusher = threading.Thread(target=_flush_stdout, name="flush-stdout", daemon=True)
    flusher.start()
    flusher.join(timeout=0.5)
    name = signal.Signals(signum).name
    program = os.path.basename(sys.argv[0]) or "python"
    with contextlib.suppress(OSError):
        os.write(2, f"{program}: stopped by {name}; {message}\n".encode())
    with contextlib.suppress(OSError):  # what the dying run would still print is not news (no locks taken)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    # in a thread of its own, bounded, one sweep: reading /proc after killing a child mid-exec was seen to freeze
    # every thread of this process (even timers); the guard process sweeps what is left once this one is gone
    sweeper = threading.Thread(
        target=end_descendants, kwargs={"sweeps": 1 if _SPARED else 5}, name="end-descendants", daemon=True
    )
    sweeper.start()
    sweeper.join(timeout=SWEEP_TIMEOUT)
    os._exit(128 + signum)


def _flush_stdout() -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()


def end_descendants(root: int | None = None, sweeps: int = 5) -> list[int]:
    """SIGKILL every descendant of ``root`` (default: this process), by PID, parents before children; repeat
    while any is left. This process is never among them (the guard ends its parent's tree from below).

    The tree is read before each sweep, since a killed parent's children are re-parented out of sight (and
    not frozen with SIGSTOP first: stopping a child in the middle of its fork/exec made reading /proc hang).
    Returns the PIDs.
    """
    root = os.getpid() if root is None else root
    killed: list[int] = []
    for _ in range(sweeps):
        tree = [
            pid
            for pid in descendants(root, process_table())
            if pid not in killed and pid != os.getpid() and pid not in _SPARED
        ]
        if not tree:
            break
        _send(tree, signal.SIGKILL)
        killed += tree
    return killed


def descendants(root: int, table: Mapping[int, tuple[int, int]]) -> list[int]:
    """The PIDs below ``root`` in a process table {pid: (ppid, ...)}."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, frontier = [], [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            found.append(child)
            frontier.append(child)
    return found


def _send(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
