"""Which Ray flower-simulation starts, and how a run ends on SIGINT/SIGTERM (issue 11 §2, issue 8 §6).

Real flower-simulation processes, each with a private Ray temp dir (RAY_TMPDIR) that also marks every
process it starts, so the tests find their own leftovers and nobody else's.
"""

import os
import signal
import subprocess
import time

import pytest
from simcli import sim_args

from server.report.metrics import read_metrics
from server.run.procs import cmdline
from tools.datagen import make_image_folder
from tools.raytools import BIN, free_port, private_ray_tmp, processes_with, ray_env, wait_gone

pytestmark = pytest.mark.e2e
NOISE = (
    "DEPRECATED FEATURE",
    "run_simulation",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO",
    "FutureWarning",
    "DeprecationWarning",
    "fraction_evaluate",
    "Failed to connect to GCS",
    "Traceback",
)


@pytest.fixture
def ray_tmp():
    path = private_ray_tmp()
    yield path
    for pid in processes_with(str(path)):  # a failed test must not leave its Ray behind
        os.kill(pid, signal.SIGKILL)
    wait_gone(str(path))
    subprocess.run(["rm", "-rf", str(path)], check=False)


def _stale_cluster_file(ray_tmp):
    """What `ray start` leaves behind after its cluster went away: an address where nothing answers."""
    address = f"127.0.0.1:{free_port()}"
    (ray_tmp / "ray").mkdir(parents=True, exist_ok=True)
    (ray_tmp / "ray" / "ray_current_cluster").write_text(address)
    return address


def _run(args, ray_tmp, timeout=300, **env):
    return subprocess.run(
        [str(BIN / "flower-simulation"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ray_env(ray_tmp, **env),
    )


@pytest.mark.smoke  # the end-to-end simulation of `make test-fast`
def test_default_starts_a_fresh_local_ray_whatever_the_environment_says(tiny_data, tmp_path, ray_tmp):
    stale = _stale_cluster_file(ray_tmp)
    proc = _run(sim_args(tiny_data, tmp_path / "run"), ray_tmp, RAY_ADDRESS=stale)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert [r["round"] for r in read_metrics(tmp_path / "run")] == [0, 1, 2]
    assert list((ray_tmp / "ray").glob("session_*")), "the fresh Ray should live in the private temp dir"
    assert (ray_tmp / "ray" / "ray_current_cluster").read_text() == stale  # and leave the file alone
    # issue 8 §6: only the run's own lines (no deprecation, accelerator, decode or evaluate warnings)
    assert [word for word in NOISE if word in output] == []
    # no process of its Ray outlives the run: they are gone when it returns, not some time later
    # (server/ray/leftovers.py; the signal guard is waited for by the run and has tests of its own)
    assert [pid for pid in processes_with(str(ray_tmp)) if "stop_guard" not in cmdline(pid)] == []


# Processes of the run that outlive Ray's shutdown (as two actors finalising their heap for ~7 min on a loaded
# machine did): each Ray worker starts a child in a session of its own that ignores SIGTERM and sleeps, and Ray is
# told not to end its workers' children. A child, not the worker itself: how a worker ends (a clean exit that runs
# exit handlers, os._exit, or Ray's SIGKILL) depends on timing, so a worker that lingers from an exit handler did
# not linger in every run. The child carries the run's environment, as the workers do, and outlives the run every
# time unless the run's sweep (server/ray/leftovers.py) ends it.
LINGER = """import sys
if sys.argv and sys.argv[0].endswith("default_worker.py"):
    import subprocess

    subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "time.sleep(3600)"], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
"""


def test_ray_workers_that_do_not_exit_end_with_the_run(tiny_data, tmp_path, ray_tmp):
    """server/ray/leftovers.py: the run returns with none of its Ray processes left, and says whom it killed."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(LINGER)
    pythonpath = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    proc = _run(
        sim_args(tiny_data, tmp_path / "run"),
        ray_tmp,
        PYTHONPATH=pythonpath,
        RAY_kill_child_processes_on_worker_exit="0",
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert [r["round"] for r in read_metrics(tmp_path / "run")] == [0, 1, 2]
    assert [pid for pid in processes_with(str(ray_tmp)) if "stop_guard" not in cmdline(pid)] == []
    assert "process(es) of this run still running" in output, output[-3000:]


def test_auto_with_a_stale_cluster_file_exits_2_at_once(tiny_data, tmp_path, ray_tmp):
    stale = _stale_cluster_file(ray_tmp)
    proc = _run(sim_args(tiny_data, tmp_path / "run", "backend.address=auto"), ray_tmp, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = proc.stderr.strip().splitlines()
    assert "'backend.address'" in line and stale in line and "ray_current_cluster" in line
    assert not list((ray_tmp / "ray").glob("session_*")), "no Ray may start: the error comes before any work"


@pytest.fixture(scope="module")
def eval_data(tmp_path_factory):
    """Tiny train split, larger test split: the round-0 evaluation of a ResNet-20 lasts a few seconds."""
    root = make_image_folder(tmp_path_factory.mktemp("evaldata") / "folder", per_class=8, test_per_class=150, seed=2)
    return {"folder": root, "tarball": root, "cache": root.parent / "cache"}


def _started(ray_tmp, run_dir):
    return bool(list((ray_tmp / "ray").glob("session_*")))


def _evaluating(ray_tmp, run_dir):  # "Run dir ..." is logged just before the round-0 evaluation
    log = run_dir / "run.log"
    return log.exists() and "Run dir" in log.read_text() and not read_metrics(run_dir)


def _mid_round(ray_tmp, run_dir):  # round 0 written: round 1 (actor start-up, training) is under way
    return [r["round"] for r in read_metrics(run_dir)] == [0]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("phase", [_started, _evaluating, _mid_round], ids=["start-up", "evaluation", "mid-round"])
def test_signal_ends_the_run_in_any_phase(eval_data, tmp_path, ray_tmp, phase, sig):
    run_dir = tmp_path / "run"
    # a long round-0 evaluation (ResNet-20 on 1,500 images): the ServerApp starts it while Ray is still starting
    # (the data is decoded before), so a start-up signal must not race a round 0 of a few milliseconds
    slow_phase = ["model=resnet20", "eval_max_examples=0"] if phase in (_started, _evaluating) else []
    args = sim_args(eval_data, run_dir, *slow_phase, "client.local_steps=20", "num_rounds=3")
    proc = subprocess.Popen(
        [str(BIN / "flower-simulation"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ray_env(ray_tmp),
        start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        while not phase(ray_tmp, run_dir) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert phase(ray_tmp, run_dir), f"never reached {phase.__name__}"
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # a terminal's Ctrl-C reaches the whole foreground group
        else:
            os.kill(proc.pid, sig)  # `kill` reaches the driver only
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # the run's own exit, before the guard's grace (GUARD_GRACE s by the guard's clock: no bound of ours to miss
    # on a loaded machine); a forced end (-9, "forced") would mean the run froze
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "forced" not in err
    assert f"stopped by {signal.Signals(sig).name}" in err.strip().splitlines()[-1]
    assert "Traceback" not in err
    rounds = [r["round"] for r in read_metrics(run_dir)]
    assert rounds == ([0] if phase is _mid_round else []), "the signal should have come in that phase"
    assert not wait_gone(str(ray_tmp)), "processes of the run outlived it"
