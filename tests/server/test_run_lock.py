"""A run directory is one run's (server/run/run_lock.py): a second run of a directory that a run holds is refused with
one line before it writes anything, in a lone run (the command's check and the round loop's own lock), a multirun
job and a stacked group's job; the lock goes with the process that held it. A fresh run of a directory that holds an
earlier run's results is refused the same way unless overwrite=true, which then leaves nothing of the earlier run."""

import copy
import json
import os
import signal
import socket
import subprocess
import sys

import pytest
from simcli import IN_PROCESS, run_cli, sim_args
from test_stacked_program import composed

from server.report.metrics import read_metrics
from server.run import config as config_lib
from server.run.app import DivergenceError
from server.run.cli import simulate
from server.run.errors import ConfigError
from server.run.run_lock import (
    LOCK_FILE,
    RUN_FILES,
    RUN_FOLDERS,
    RunDirHoldsResults,
    RunDirInUse,
    check_free,
    check_fresh,
    check_layout,
    run_dir_lock,
)
from server.stacked.launch import run_jobs

HOLDER = f"pid {os.getpid()} on {socket.gethostname()}"


def test_a_held_run_dir_is_refused_naming_its_holder_and_free_again_after(tmp_path):
    with run_dir_lock(tmp_path):
        assert (tmp_path / LOCK_FILE).read_text() == HOLDER + "\n"
        with pytest.raises(RunDirInUse, match=rf"^'run_dir': {tmp_path} is in use by another run \({HOLDER}\);"):
            check_free(tmp_path)
        with pytest.raises(RunDirInUse), run_dir_lock(tmp_path):
            pass
    check_free(tmp_path)
    with run_dir_lock(tmp_path):  # free again
        pass
    assert isinstance(RunDirInUse("x"), config_lib.ConfigError)  # exit 2, as any invalid configuration


def test_the_lock_goes_with_a_killed_holder(tmp_path):
    """A run killed with SIGKILL leaves no stale lock: the kernel releases it with the process."""
    code = (
        "import sys; from server.run.run_lock import run_dir_lock\n"
        f"with run_dir_lock({str(tmp_path)!r}):\n"
        "    print('held', flush=True); sys.stdin.read()\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(RunDirInUse, match=rf"in use by another run \(pid {holder.pid} on "):
            check_free(tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    check_free(tmp_path)


@pytest.mark.e2e
def test_a_second_run_of_a_held_run_dir_is_one_line_and_writes_nothing(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    args = sim_args(tiny_data, tmp_path / "hydra", *IN_PROCESS, f"run_dir={run_dir}")  # Hydra's own files elsewhere
    with run_dir_lock(run_dir):
        proc = run_cli("flower-simulation", args)
        assert proc.returncode == 2, proc.stderr[-2000:]
        lines = [line for line in proc.stderr.splitlines() if line.startswith("flower-simulation:")]
        assert lines == [
            f"flower-simulation: invalid configuration: 'run_dir': {run_dir} is in use by another run ({HOLDER}); "
            "wait for it to end or choose another run_dir"
        ]
        multirun = run_cli("flower-simulation", ["-m", *args, f"hydra.sweep.dir={tmp_path / 'sweep'}"])
        assert multirun.returncode == 2 and "is in use by another run" in multirun.stderr, multirun.stderr[-2000:]
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]  # no status.json, no metrics: nothing written


@pytest.mark.e2e
def test_the_round_loop_holds_the_lock_itself(tiny_data, tmp_path):
    """Past the command's check (two runs started at once), the round loop's own lock refuses the second run before
    it writes anything; in a stacked group that job fails alone and the other runs."""
    cfgs = [composed(tmp_path / f"job{s}", tiny_data, "model=logreg", "num_rounds=2", f"seed={s}") for s in (0, 1)]
    held = tmp_path / "job1"
    held.mkdir()
    with run_dir_lock(held):
        with pytest.raises(RunDirInUse):
            simulate(copy.deepcopy(cfgs[1]))
        outcomes = run_jobs(copy.deepcopy(cfgs))
    assert [o.status for o in outcomes] == ["finished", "invalid"], [o.message for o in outcomes]
    assert "is in use by another run" in outcomes[1].message
    assert sorted(p.name for p in held.iterdir()) == [LOCK_FILE]
    assert json.loads((tmp_path / "job0" / "status.json").read_text())["status"] == "finished"


def test_a_run_dir_with_an_earlier_run_s_metrics_is_not_fresh(tmp_path):
    check_fresh(tmp_path / "absent")
    (tmp_path / "metrics.jsonl").write_text("")
    check_fresh(tmp_path)  # a run that wrote no row: nothing to lose
    (tmp_path / "metrics.jsonl").write_text('{"round": 0}\n{"round": 7}\n')
    with pytest.raises(RunDirHoldsResults, match=rf"^'run_dir': {tmp_path} holds an earlier run's results "):
        check_fresh(tmp_path)
    with pytest.raises(
        RunDirHoldsResults, match=r"\(metrics up to round 7\); resume=true continues it, overwrite=true"
    ):
        check_fresh(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"round": 0}\n{"rou')  # a row cut short by a kill
    with pytest.raises(RunDirHoldsResults, match=r"\(2 metrics rows\)"):
        check_fresh(tmp_path)


@pytest.mark.e2e
def test_a_fresh_run_over_earlier_results_needs_overwrite_and_then_keeps_nothing_of_them(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    simulate(composed(run_dir, tiny_data, "model=logreg", "num_rounds=3", "checkpoint_every=1"))
    with pytest.raises(RunDirHoldsResults, match="metrics up to round 3"):
        composed(run_dir, tiny_data, "model=logreg", "num_rounds=3")
    resumed = simulate(composed(run_dir, tiny_data, "model=logreg", "num_rounds=4", "resume=true"))
    assert resumed["rounds"] == 4
    diverging = composed(run_dir, tiny_data, "model=logreg", "overwrite=true", "strategy.server_lr=1e300")
    with pytest.raises(DivergenceError):
        simulate(diverging)  # diverges in round 1, before its first checkpoint
    assert [row["round"] for row in read_metrics(run_dir)] == [0, 1]
    assert not (run_dir / "checkpoint").exists() and not (run_dir / "summary.json").exists()
    assert not (run_dir / "final_model.npz").exists()  # a later resume=true cannot continue the earlier run


MISPLACED = {  # an entry of the wrong kind where the run writes one: each was a stack trace, some after hours
    "metrics.jsonl a folder": lambda run: (run / "metrics.jsonl").mkdir(),
    "status.json a folder": lambda run: (run / "status.json").mkdir(),
    ".lock a folder": lambda run: (run / LOCK_FILE).mkdir(),
    "final_model.npz a folder": lambda run: (run / "final_model.npz").mkdir(),
    "checkpoint a file": lambda run: (run / "checkpoint").write_text(""),
    "client_state a file": lambda run: (run / "client_state").write_text(""),
    "run.log a dangling link": lambda run: (run / "run.log").symlink_to(run / "absent"),
}


@pytest.mark.parametrize("case", list(MISPLACED))
def test_an_entry_of_the_wrong_kind_in_the_run_dir_is_one_line_before_any_work(tiny_data, tmp_path, case):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    MISPLACED[case](run_dir)
    before = sorted(p.name for p in run_dir.iterdir())
    name = case.split()[0]
    proc = run_cli("flower-simulation", sim_args(tiny_data, run_dir, *IN_PROCESS, "model=logreg", "resume=true"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"flower-simulation: invalid configuration: 'run_dir': {run_dir}/{name} is not a "), line
    assert line.endswith(f"the run writes its {name} there: move it away or choose another run_dir"), line
    assert sorted(p.name for p in run_dir.iterdir()) == sorted([*before, "cli.log"])  # nothing but Hydra's log


@pytest.mark.e2e
def test_a_multirun_job_whose_dir_has_an_entry_of_the_wrong_kind_fails_alone_in_one_line(tiny_data, tmp_path):
    """The job's refusal wrote the reason into its status.json, here a folder: a stack trace ended the sweep."""
    sweep = tmp_path / "sweep"
    (sweep / "0" / "status.json").mkdir(parents=True)
    args = ["-m", "hydra/launcher=stacked", *sim_args(tiny_data, tmp_path / "unused")[:-1], *IN_PROCESS]
    args += ["model=logreg", f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=${seed}", "seed=0,1"]
    proc = run_cli("flower-simulation", args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    bad = f"flower-simulation: {sweep / '0'}: invalid configuration: 'run_dir': {sweep}/0/status.json is not a file"
    assert bad in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert json.loads((sweep / "1" / "status.json").read_text())["status"] == "finished"  # the other job ran


@pytest.mark.e2e
@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=stacked"]], ids=["basic", "stacked"])
def test_multirun_jobs_that_share_a_run_dir_leave_it_to_the_first(tiny_data, tmp_path, launcher):
    """A hydra.sweep.subdir that gives every job the same folder: with overwrite=true the second job replaced the
    first's results (without it, it was refused as holding "an earlier run's results", or in a stacked group as
    "in use by another run": the first job's)."""
    sweep = tmp_path / "sweep"
    args = ["-m", *launcher, *sim_args(tiny_data, tmp_path / "unused")[:-1], *IN_PROCESS, "model=logreg"]
    args += ["seed=0,1", "overwrite=true", f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=same"]
    proc = run_cli("flower-simulation", args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    same = sweep / "same"
    assert (
        f"flower-simulation: {same}: invalid configuration: 'run_dir': {same} is job 0's run_dir too: every job of "
        "a multirun needs its own"
    ) in proc.stderr
    assert json.loads((same / "status.json").read_text())["status"] == "finished"
    assert json.loads((same / "config.json").read_text())["seed"] == 0  # the first job's results, kept
    assert "- seed=0" in (same / ".hydra" / "overrides.yaml").read_text()


@pytest.mark.e2e
def test_the_layout_names_every_entry_a_run_writes(tiny_data, tmp_path):
    """The entries :func:`check_layout` checks are those a run writes (plots, the window's mean model, client states
    and checkpoints included); gap.png needs eval_gap (f*), named without a run here."""
    run_dir = tmp_path / "run"
    overrides = (
        "model=logreg",
        "strategy=fedhbm",
        "num_rounds=3",
        "eval_average=2",
        "checkpoint_every=1",
        "plots=true",
    )
    simulate(composed(run_dir, tiny_data, *overrides))
    written = {p.name for p in run_dir.iterdir()}
    assert written <= set(RUN_FILES) | set(RUN_FOLDERS), written - set(RUN_FILES) - set(RUN_FOLDERS)
    assert {"final_model_avg.npz", "client_state", "checkpoint", "accuracy.png", "norm.png"} <= written
    check_layout(run_dir)  # a finished run's own directory passes
    (run_dir / "lr.png").unlink()
    (run_dir / "lr.png").mkdir()
    with pytest.raises(ConfigError, match=r"lr.png is not a file"):
        check_layout(run_dir)


RECORD = ("status.json", "metrics.jsonl", ".hydra/overrides.yaml", ".hydra/config.yaml", ".hydra/hydra.yaml")


@pytest.mark.e2e
@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=stacked"]], ids=["basic", "stacked"])
def test_a_multirun_job_over_earlier_results_fails_alone_and_leaves_them(tiny_data, tmp_path, launcher):
    sweep = tmp_path / "sweep"
    args = ["-m", *launcher, *sim_args(tiny_data, tmp_path / "unused")[:-1], *IN_PROCESS, "model=logreg"]
    first = run_cli("flower-simulation", [*args, "seed=0", f"hydra.sweep.dir={sweep}"])
    assert first.returncode == 0, first.stderr[-2000:]
    [earlier] = [p for p in sweep.iterdir() if p.is_dir()]
    kept = {name: (earlier / name).read_text() for name in RECORD}
    lrs = "strategy.client_lr=0.2,abc"  # jobs 0_seed0 (refused), 1_seed0 (invalid), 2_seed1, 3_seed1 (invalid)
    again = run_cli("flower-simulation", [*args, "seed=0,1", lrs, f"hydra.sweep.dir={sweep}"])
    assert again.returncode == 2, again.stderr[-2000:]
    assert f"{earlier}: invalid configuration: 'run_dir': {earlier} holds an earlier run's results" in again.stderr
    # its Hydra record too: a report labelled the earlier results with the refused job's client_lr
    assert {name: (earlier / name).read_text() for name in RECORD} == kept
    status = {p.name: json.loads((p / "status.json").read_text())["status"] for p in sweep.iterdir() if p.is_dir()}
    assert status == {"0_seed0": "finished", "1_seed0": "failed", "2_seed1": "finished", "3_seed1": "failed"}
    for job in ("1_seed0", "2_seed1", "3_seed1"):  # an invalid job's record is written: a report lists it
        assert "- strategy.client_lr=" in (sweep / job / ".hydra" / "overrides.yaml").read_text()
