"""Helpers of the end-to-end tests: the console-script runner, a tiny experiment's overrides, kill-and-resume.

A module of its own, not conftest.py: test files import these names, and ``from conftest import`` takes whichever
conftest.py pytest loaded last (tests/client's when ``pytest tests/server/x.py tests/client`` is run)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from warm_cli import shared, wants_warm

from tools.tiny_run import sim_args  # noqa: F401 - test files import it from here

BIN = Path(sys.executable).parent


# The batched engine (server/batched/), clients one after another in the flower-simulation process: the same
# ServerApp round loop, strategies and ClientApp code as the Ray engine, bitwise the same final CNN model
# (tests/server/test_batched_engine.py), without Ray's ~10-20 s start-up per process. For end-to-end tests whose
# subject is not the Ray engine (sweeps, reports, divergence, resume logic, presets); the tests about Ray keep it.
IN_PROCESS = ("engine=batched", "engine.workers=1")


def run_cli(name, args, timeout=300, **kwargs):
    """Run a console script of this environment; returns the CompletedProcess (stdout and stderr captured).
    ``engine=batched`` simulations and the report/optimum/plot CLIs run in a fork of a warm process that has
    imported torch, Flower and Hydra once (tests/warm_cli.py); the rest as a fresh process."""
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "RAY_DEDUP_LOGS": "0", "PYTHONUNBUFFERED": "1"}
    args = [str(a) for a in args]
    if wants_warm(name, args):
        cwd = kwargs.pop("cwd", None)
        assert not kwargs, f"warm calls take cwd and timeout only: {sorted(kwargs)}"
        return shared(env).run(name, args, env, cwd=cwd, timeout=timeout)
    return subprocess.run([str(BIN / name), *args], capture_output=True, text=True, timeout=timeout, env=env, **kwargs)


def report(*args):
    """flower-report (its console script's entry point)."""
    return run_cli("flower-report", args, timeout=120)


def full_and_resumed(data, tmp_path, extra, kill_round=2, full_extra=()):
    """Run ``extra`` uninterrupted (``tmp_path/full``, plus ``full_extra``) and again killed after ``kill_round``
    and resumed (``tmp_path/killed``); asserts both finish and end with the bitwise-same model. Returns the two run
    dirs."""
    import numpy as np

    from server.report.metrics import read_metrics

    full_dir, killed_dir = tmp_path / "full", tmp_path / "killed"
    full = run_cli("flower-simulation", sim_args(data, full_dir, *extra, *full_extra))
    assert full.returncode == 0, full.stderr[-2000:]
    kill_after_round(sim_args(data, killed_dir, *extra), killed_dir, kill_round)
    last = max(r["round"] for r in read_metrics(full_dir))
    assert max(r["round"] for r in read_metrics(killed_dir)) < last, "the run finished before it was killed"
    resumed = run_cli("flower-simulation", sim_args(data, killed_dir, *extra, "resume=true"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "Resuming" in (killed_dir / "run.log").read_text()
    a, b = np.load(full_dir / "final_model.npz"), np.load(killed_dir / "final_model.npz")
    assert a.files == b.files
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])
    return full_dir, killed_dir


def kill_after_round(args, run_dir, rnd):
    """Start `flower-simulation args`, SIGKILL its whole process group once round ``rnd`` is in the metrics."""
    from server.report.metrics import read_metrics

    proc = subprocess.Popen(
        [str(BIN / "flower-simulation"), *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not any(r["round"] == rnd for r in read_metrics(run_dir)):
            time.sleep(0.2)
        assert any(r["round"] == rnd for r in read_metrics(run_dir)), f"run never reached round {rnd}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
