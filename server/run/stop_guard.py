"""The signal guard of :func:`server.run.stop.exit_on_signals`: a small process that makes sure a signal ends the run.

Inside a process, every way of acting on a signal needs the GIL: the signal module's C handler only writes a byte
to the wakeup fd, and the thread that reads it (or a timer meant to end the process) runs only when it gets the
GIL. A main thread blocked in C code that holds the GIL (a native library waiting on a socket, say) therefore
freezes every in-process remedy (Ray's start-up wait for the GCS port did so for 30 s whenever the GCS died
first, e.g. of a Ctrl-C; :mod:`~server.internals.ray_port_wait` removes that cause). This guard runs in its own
process and reads the wakeup fd itself:

- on SIGINT/SIGTERM it notes the run's process tree and tells the watcher thread of the run (one byte on the
  notify pipe); the run then prints its line, sweeps its tree once and exits with ``128 + signal`` as usual, and
  the guard SIGKILLs whatever of the noted tree is left (the run itself must not read /proc after killing a
  child mid-exec: that was seen to freeze all its threads);
- if the run is still alive ``--grace`` seconds later, the guard prints the stop line itself (marked
  "forced"), and SIGKILLs the run's descendants and the run (so the exit status is that of a SIGKILL);
- when the run closes the wakeup pipe (the block ended) or dies, the guard exits.

    python -m server.run.stop_guard --parent PID --wakeup-fd R --notify-fd W --grace 8 --program P --message M
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import time

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def parent_alive(parent: int) -> bool:
    """Whether ``parent`` still runs (once it is gone this process is re-parented)."""
    return os.getppid() == parent


def force_end(parent: int) -> list[int]:
    """SIGKILL ``parent``'s descendants (not this process), then ``parent``."""
    from server.run.stop import end_descendants

    killed = end_descendants(parent)
    with contextlib.suppress(OSError):
        os.kill(parent, signal.SIGKILL)
    return [*killed, parent]


def _tree(parent: int) -> list[int]:
    from server.run.procs import process_table
    from server.run.stop import descendants

    return [pid for pid in descendants(parent, process_table()) if pid != os.getpid()]


def guard(parent: int, wakeup_fd: int, notify_fd: int, grace: float, program: str, message: str) -> None:
    """Forward the run's SIGINT/SIGTERM to its watcher; end the run by force after ``grace`` seconds."""
    while True:
        try:
            data = os.read(wakeup_fd, 64)
        except OSError:
            return
        if not data:
            return  # the run ended its block or died
        received = [b for b in data if b in SIGNALS]
        if not received:
            continue
        tree = _tree(parent)  # before the run exits: afterwards its children are re-parented out of sight
        with contextlib.suppress(OSError):
            os.write(notify_fd, bytes(received[:1]))
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not parent_alive(parent):  # the run swept its tree once; end what is left of it
                for pid in tree:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.05)
        name = signal.Signals(received[0]).name
        with contextlib.suppress(OSError):
            os.write(
                2,
                f"{program}: stopped by {name}; {message} (forced: the run did not exit within {grace:g} s "
                "of the signal)\n".encode(),
            )
        force_end(parent)
        return


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m server.run.stop_guard", description=__doc__.split("\n")[0])
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--wakeup-fd", type=int, required=True)
    parser.add_argument("--notify-fd", type=int, required=True)
    parser.add_argument("--grace", type=float, default=8.0)
    parser.add_argument("--program", default="python")
    parser.add_argument("--message", default="")
    args = parser.parse_args()
    for sig in SIGNALS:  # a terminal's Ctrl-C reaches the whole group: the run decides, the guard watches
        signal.signal(sig, signal.SIG_IGN)
    guard(args.parent, args.wakeup_fd, args.notify_fd, args.grace, args.program, args.message)


if __name__ == "__main__":
    main()
