"""``flower-simulation -m hydra/launcher=stacked``: Hydra finds the launcher, every job gets a lone run's directory
(flower-report reads the sweep), ``hydra.launcher.processes`` runs its programs in worker processes, bad input exits
2 with one line, SIGTERM ends the group with every job resumable."""

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
from simcli import BIN, report, run_cli

from server.report.metrics import read_metrics

pytestmark = pytest.mark.e2e
RUN_FILES = ("metrics.csv", "metrics.jsonl", "run.log", "status.json", "config.json", "summary.json", "final_model.npz")


def sweep_args(data, sweep_dir, *extra):
    return [
        "-m",
        "hydra/launcher=stacked",
        "engine=batched",
        "model=logreg",
        "data=cifar10_folder",
        f"data.root={data['folder']}",
        f"data.cache_dir={data['cache']}",
        "num_clients=6",
        "participation.fraction=0.5",
        "client.batch_size=8",
        "plots=false",
        f"hydra.sweep.dir={sweep_dir}",
        *extra,
    ]


def status(run_dir):
    return json.loads((run_dir / "status.json").read_text())


def test_a_stacked_sweep_writes_lone_run_dirs_that_flower_report_reads(tmp_path, tiny_data):
    sweep = tmp_path / "sweep"
    proc = run_cli(
        "flower-simulation",
        sweep_args(tiny_data, sweep, "num_rounds=3", "strategy=fedavgm,fedcm", "seed=0,1", "engine.workers=2"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    how = "stacked clients, a chunk per job, 2 chunk threads"
    assert f"4 jobs as one program on cpu ({how})" in proc.stdout + proc.stderr
    assert "round 3/3: 12 clients of 4 jobs in 4 chunks" in proc.stdout + proc.stderr  # the CPU default
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 4
    for job in jobs:
        assert all((job / f).exists() for f in RUN_FILES), job
        assert (job / "checkpoint").is_dir() and (job / ".hydra" / "overrides.yaml").exists()
        assert status(job) == {"status": "finished", "round": 3, "reason": ""}
        assert "[round 3/3]" in (job / "run.log").read_text()
    assert "[round 1/3]" not in proc.stdout + proc.stderr  # the jobs' round lines are in their run.log only
    rep = report(str(sweep))
    assert rep.returncode == 0, rep.stderr[-2000:]
    table = (sweep / "report.md").read_text()
    assert "fedcm" in table and "fedavgm" in table


@pytest.mark.parametrize(
    "momenta, reason",
    [("0.5,1.5", "strategy.momentum"), ("0.5,${nope}", "strategy.momentum: Interpolation key 'nope' not found")],
)
def test_an_invalid_job_fails_alone_with_its_reason_and_the_sweep_exits_2(tmp_path, tiny_data, momenta, reason):
    """A value out of range, or one that does not resolve: that job's run dir says why, the other job runs."""
    sweep = tmp_path / "sweep"
    proc = run_cli("flower-simulation", sweep_args(tiny_data, sweep, "num_rounds=2", f"strategy.momentum={momenta}"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    bad = [line for line in proc.stderr.splitlines() if "invalid configuration" in line and "momentum" in line]
    assert len(bad) == 1
    by_status = {status(p)["status"]: p for p in sweep.iterdir() if p.is_dir()}
    assert set(by_status) == {"finished", "failed"}
    assert reason in status(by_status["failed"])["reason"]


def test_a_job_whose_checkpoint_cannot_be_read_fails_alone_and_keeps_its_rounds(tmp_path, tiny_data):
    """Resumed with a broken checkpoint, that job says why in its status.json with the round its metrics hold (not
    round 0) and nothing of it is touched; the other job resumes and finishes; exit 2, as a lone run's."""
    sweep = tmp_path / "sweep"
    common = ("checkpoint_every=1", "seed=0,1")
    first = run_cli("flower-simulation", sweep_args(tiny_data, sweep, "num_rounds=3", *common))
    assert first.returncode == 0, first.stderr[-3000:]
    broken, other = sorted(p for p in sweep.iterdir() if p.is_dir())
    (broken / "checkpoint" / "state.json").write_text("{not json")
    before = (broken / "metrics.jsonl").read_text()
    again = run_cli("flower-simulation", sweep_args(tiny_data, sweep, "num_rounds=5", *common, "resume=true"))
    assert again.returncode == 2, again.stderr[-3000:]
    assert status(broken)["status"] == "failed" and status(broken)["round"] == 3
    assert status(broken)["reason"].startswith(f"invalid configuration: cannot resume: the checkpoint in {broken}")
    assert (broken / "metrics.jsonl").read_text() == before
    assert status(other) == {"status": "finished", "round": 5, "reason": ""}


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["hydra.launcher.jobs=2"], "has no option 'hydra.launcher.jobs'"),
        (["hydra.launcher.require_stacked=true", "engine=ray,batched"], "cannot be stacked: engine=ray"),
        (["hydra.launcher.max_jobs=0"], "max_jobs must be an integer >= 1"),
        (["hydra.launcher.share_chunks=sometimes"], "share_chunks"),
        (["hydra.launcher.processes=0"], "processes must be an integer >= 1"),
        (["strategy=fedavg,nope"], "invalid configuration: Could not find 'strategy/nope' (options: "),
        (["data.bogus=1"], "invalid configuration: Could not override 'data.bogus'."),
    ],
)
def test_bad_launcher_input_exits_2_with_one_line_before_any_job_runs(tmp_path, tiny_data, extra, expected):
    sweep = tmp_path / "sweep"
    proc = run_cli("flower-simulation", sweep_args(tiny_data, sweep, "num_rounds=2", *extra))
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if expected in line]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert not list(sweep.glob("*/metrics.csv"))


def test_sigterm_ends_the_group_and_every_job_resumes_bitwise(tmp_path, tiny_data):
    """Both jobs stopped after round 3 of 200 (waiting on their metrics rows), resumed with resume=true: the same
    final models as an uninterrupted sweep."""
    rounds = ["num_rounds=200", "checkpoint_every=2", "strategy=fedavgm,ghbm"]
    whole = run_cli("flower-simulation", sweep_args(tiny_data, tmp_path / "whole", *rounds), timeout=600)
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [str(BIN / "flower-simulation"), *sweep_args(tiny_data, killed, *rounds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "FLWR_TELEMETRY_ENABLED": "0"},
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not (
            len(list(killed.glob("*/metrics.jsonl"))) == 2
            and all(
                max((r["round"] for r in read_metrics(d.parent)), default=0) >= 3
                for d in killed.glob("*/metrics.jsonl")
            )
        ):
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, out[-3000:]
    assert "stopped by SIGTERM" in out
    jobs = sorted(p.name for p in killed.iterdir() if p.is_dir())
    assert all(status(killed / j)["status"] == "running" for j in jobs)  # what a killed lone run leaves
    resumed = run_cli("flower-simulation", sweep_args(tiny_data, killed, *rounds, "resume=true"), timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for job in jobs:
        assert "Resuming" in (killed / job / "run.log").read_text()
        a, b = np.load(killed / job / "final_model.npz"), np.load(tmp_path / "whole" / job / "final_model.npz")
        assert all(np.array_equal(a[k], b[k]) for k in a.files), job


def test_processes_run_a_sweeps_programs_in_worker_processes(tmp_path, tiny_data):
    sweep = tmp_path / "sweep"
    extra = ["num_rounds=3", "strategy=fedavgm,fedcm", "seed=0,1", "hydra.launcher.processes=2"]
    proc = run_cli("flower-simulation", sweep_args(tiny_data, sweep, *extra))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "[stacked] 2 programs, 2 at a time in worker processes" in out and "jobs 0-1, jobs 2-3" in out
    assert "[stacked jobs 0-1] 2 jobs as one program" in out and "[stacked jobs 2-3] 2 jobs as one program" in out
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 4 and all(status(job) == {"status": "finished", "round": 3, "reason": ""} for job in jobs)
