"""server/ray/leftovers.py: the processes a local Ray run started end when the run returns (no Ray needed here)."""

import os
import signal
import subprocess
import sys

from server.ray import leftovers

# a child that ignores SIGTERM and would run for an hour: only SIGKILL ends it; it says when it is up
STUBBORN = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(3600)"
)
QUICK = "print('up', flush=True)"


def _start(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"  # it has exec'd with the environment of this moment
    return proc


def test_a_process_of_the_run_that_outlives_it_is_killed_and_named():
    messages = []
    outsider = _start(STUBBORN)  # started before the run: no token, left alone
    try:
        with leftovers.owned_processes(grace=0.2, log=messages.append) as token:
            assert os.environ[leftovers.RUN_VAR] == token
            inside = _start(STUBBORN)
            assert leftovers.carrying(token) == [inside.pid]
        assert inside.wait(timeout=30) == -signal.SIGKILL
        assert leftovers.carrying(token) == []
        assert outsider.poll() is None
        [line] = messages
        assert f"pids {inside.pid};" in line and "1 process(es)" in line
    finally:
        outsider.kill()
        outsider.wait()


def test_processes_that_exit_in_time_are_not_killed_and_nothing_is_logged():
    messages = []
    with leftovers.owned_processes(grace=0.0, log=messages.append):
        quick = _start(QUICK)
        assert quick.wait() == 0  # gone (a reaped child) before the run returns: nothing to end, whatever the grace
    assert messages == []


def test_the_environment_is_restored_and_each_run_has_its_own_token(monkeypatch):
    monkeypatch.delenv(leftovers.RUN_VAR, raising=False)
    with leftovers.owned_processes(grace=0) as first:
        with leftovers.owned_processes(grace=0) as second:
            assert os.environ[leftovers.RUN_VAR] == second != first
        assert os.environ[leftovers.RUN_VAR] == first
    assert leftovers.RUN_VAR not in os.environ


def test_a_token_is_matched_as_a_whole_variable(monkeypatch):
    """A longer token, or the same text inside another variable, is another run's."""
    monkeypatch.setenv("OTHER", f"{leftovers.RUN_VAR}=abc")
    monkeypatch.setenv(leftovers.RUN_VAR, "abcd")
    proc = _start(STUBBORN)
    try:
        assert proc.pid not in leftovers.carrying("abc")
        assert proc.pid in leftovers.carrying("abcd")
    finally:
        proc.kill()
        proc.wait()
