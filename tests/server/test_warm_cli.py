"""tests/warm_cli.py, the warm fork runner of the tests' CLI calls, behaves as a fresh process would: the same exit
code and output as the console script, the interpreter's exit for exceptions, and a timeout that kills the call and
leaves the runner usable."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from warm_cli import WarmCLI

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.e2e  # the runner serves the end-to-end tests


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    runner = WarmCLI(dict(os.environ), tmp_path_factory.mktemp("warm"))
    yield runner
    runner.close()


def test_same_exit_code_and_output_as_the_console_script(warm, tmp_path):
    args = ["engine=batched", "num_clients=-1", f"hydra.run.dir={tmp_path / 'r'}"]
    fresh = subprocess.run(
        [str(BIN / "flower-simulation"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
        cwd=tmp_path,
    )
    forked = warm.run("flower-simulation", args, dict(os.environ), cwd=tmp_path, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == 2 and "num_clients" in forked.stderr


def test_environment_cwd_argv_and_output_are_the_calls(warm, tmp_path):
    env = {**os.environ, "WARM_CLI_PROBE": "probe-value"}
    proc = warm.run("warm_cli:probe", ["7", "x y"], env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 7 and proc.stderr == "probe on stderr\n"
    assert json.loads(proc.stdout) == {
        "cwd": str(tmp_path),
        "argv": ["warm_cli:probe", "7", "x y"],
        "probe": "probe-value",
    }
    merged = warm.run("warm_cli:probe", ["0"], dict(os.environ), cwd=tmp_path, timeout=60, merge_output=True)
    assert merged.returncode == 0 and merged.stderr is None and merged.stdout.endswith("probe on stderr\n")
    assert json.loads(merged.stdout.splitlines()[0])["probe"] is None  # not the previous call's environment


def test_an_exception_exits_1_with_its_traceback(warm, tmp_path):
    proc = warm.run("builtins:input", [], dict(os.environ), cwd=tmp_path, timeout=60)  # stdin is /dev/null
    assert proc.returncode == 1 and "EOFError" in proc.stderr


def test_a_timeout_kills_the_call_and_the_runner_goes_on(warm, tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run("signal:pause", [], dict(os.environ), cwd=tmp_path, timeout=2)
    after = warm.run("builtins:input", [], dict(os.environ), cwd=tmp_path, timeout=60)
    assert after.returncode == 1
