"""The signal guard: SIGTERM ends a run whose main thread holds the GIL in native code (no in-process remedy can
run then), and leaves the ordinary exit path (exit 143, one line) untouched."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from server.run import stop

ROOT = Path(__file__).resolve().parents[2]
RUN = textwrap.dedent("""
    import re, sys, time
    sys.path.insert(0, {root!r})
    from server.run import stop
    from server.run.stop import exit_on_signals
    if sys.argv[1] == "no-guard":  # the guard process cannot start: the watcher reads the wakeup fd itself
        stop._start_guard = lambda *args: None
    with exit_on_signals("results so far are elsewhere"):
        print("ready", flush=True)
        if sys.argv[1] == "holds-gil":
            re.match(r"(a+)+$", "a" * 64 + "b")  # exponential backtracking in C, never releases the GIL
        else:
            time.sleep(120)
""")


@pytest.mark.parametrize("main_thread", ["sleeps", "holds-gil", "no-guard"])
def test_sigterm_ends_the_run(tmp_path, main_thread):
    script = tmp_path / "run.py"
    script.write_text(RUN.format(root=str(ROOT)))
    proc = subprocess.Popen(
        [sys.executable, str(script), main_thread], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        if main_thread == "holds-gil":
            _wait_until_busy(proc.pid)  # the main thread is inside re.match (holding the GIL), not before it
        guards = _guards(proc.pid)
        assert len(guards) == (0 if main_thread == "no-guard" else 1), "one guard process per run"
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    last = err.strip().splitlines()[-1]
    assert last.startswith("run.py: stopped by SIGTERM; results so far are elsewhere"), err[-2000:]
    if main_thread != "holds-gil":  # the watcher thread ends it: the usual status, within the guard's grace
        assert proc.returncode == 128 + signal.SIGTERM and took < stop.GUARD_GRACE and "forced" not in last
    else:  # nothing in the process can run: the guard ends it after its grace period
        assert proc.returncode == -signal.SIGKILL and "forced" in last
        assert took >= stop.GUARD_GRACE and f"within {stop.GUARD_GRACE:g} s" in last  # not before its grace
    assert _gone(guards), "the guard outlived the run"


def _cpu_ticks(pid: int) -> int:
    """utime + stime of the process's main thread, in clock ticks."""
    stat = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def _wait_until_busy(pid: int, ticks: int = 20, patience: float = 120.0) -> None:
    """Wait until the main thread has used ``ticks`` clock ticks of CPU (0.2 s at 100 Hz) after printing "ready":
    only the regex can take that long (a few bytecodes separate the print from it), so it is running then. An
    event (CPU the thread spent), not a guess at how long its start takes on a loaded machine."""
    start, deadline = _cpu_ticks(pid), time.monotonic() + patience
    while _cpu_ticks(pid) - start < ticks:
        assert time.monotonic() < deadline, "the main thread never started the regex"
        time.sleep(0.01)


def _gone(pids: list[int], patience: float = 30.0) -> bool:
    """Wait for ``pids`` to end: a guard notices its run's end within one 50 ms poll (bound: a loaded machine)."""
    deadline = time.monotonic() + patience
    while any(_running(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"  # a zombie has ended (its reaper here may be slow)


def _guards(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and b"server.run.stop_guard" in (entry / "cmdline").read_bytes()
                and f"--parent\x00{parent}\x00".encode() in (entry / "cmdline").read_bytes()
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found
