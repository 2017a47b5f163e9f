"""``hydra.launcher.processes``: a multirun's programs in worker processes. Each job equals its lone batched run; a
process that is killed fails its own jobs with one line naming each, and the next program still runs."""

import contextlib
import copy
import multiprocessing
import os
import signal
import threading
import time

import pytest
from test_stacked_program import assert_same_run, composed, flwr_lines

from server.report.metrics import read_metrics
from server.run.cli import simulate
from server.stacked.launch import run_jobs, split
from server.stacked.processes import PROCESS_NAME, core_sets

pytestmark = pytest.mark.e2e


def test_split_and_core_sets():
    assert split(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert split([7], 3) == [[7]]
    assert split(list(range(6)), 3) == [[0, 1], [2, 3], [4, 5]]
    cores = sorted(os.sched_getaffinity(0))
    sets = core_sets(2)
    assert len(sets) == 2 and all(sets) and set().union(*map(set, sets)) <= set(cores)
    if len(cores) >= 2:
        assert not set(sets[0]) & set(sets[1])  # a share of the cores each


def test_programs_in_worker_processes_equal_their_jobs_run_alone(tmp_path, tiny_data):
    names = {"fedavgm": ["strategy=fedavgm"], "fedcm": ["+method=fedcm"], "ghbm": ["+method=ghbm"]}
    names["localupdate"] = ["+method=localupdate_decay"]
    common = ["model=logreg", "num_rounds=6", "eval_every=2"]
    cfgs = [composed(tmp_path / "stacked" / n, tiny_data, *o, *common, f"seed={i % 2}") for i, (n, o) in
            enumerate(names.items())]  # fmt: skip
    with flwr_lines() as lines:
        outcomes = run_jobs(copy.deepcopy(cfgs), processes=2)
    assert [o.status for o in outcomes] == ["finished"] * 4, [o.message for o in outcomes]
    assert any(line.startswith("[stacked] 2 programs, 2 at a time in worker processes") and "jobs 0-1, jobs 2-3" in line
               for line in lines), lines  # fmt: skip
    for i, (name, overrides) in enumerate(names.items()):
        simulate(composed(tmp_path / "lone" / name, tiny_data, *overrides, *common, f"seed={i % 2}"))
        assert_same_run(tmp_path / "stacked" / name, tmp_path / "lone" / name)


def _rounds(run_dir):
    return max((r["round"] for r in read_metrics(run_dir)), default=0) if (run_dir / "metrics.jsonl").exists() else 0


def _program(number):
    """The running worker process of program ``number`` (None before it starts)."""
    return next((p for p in multiprocessing.active_children() if p.name == f"{PROCESS_NAME}{number}"), None)


def _wait(condition, what):
    deadline = time.monotonic() + 300  # a bound against a hang only: each wait ends on the event it waits for
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_killed_process_fails_its_jobs_in_one_line_each_and_the_next_program_runs(tmp_path, tiny_data):
    """Programs: jobs 0-1 and 2-3 (one long group, split in two), then job 4 (short, alone). Program 0's process is
    killed once its jobs trained: its jobs fail naming the signal, job 4 starts in its place and finishes; then
    program 1's process is killed too."""
    long = ["model=logreg", "num_rounds=100000", "eval_every=100000", "checkpoint_every=1", "eval_tail=0"]
    cfgs = [composed(tmp_path / f"long{i}", tiny_data, f"seed={i}", *long) for i in range(4)]
    cfgs.append(composed(tmp_path / "short", tiny_data, "model=logreg", "num_rounds=3"))
    result = {}
    runner = threading.Thread(target=lambda: result.update(outcomes=run_jobs(cfgs, processes=2)))
    with flwr_lines() as lines:
        runner.start()
        try:
            _wait(lambda: _program(0) and _rounds(tmp_path / "long0") >= 2, "program 0 trains")
            os.kill(_program(0).pid, signal.SIGKILL)
            _wait(lambda: _rounds(tmp_path / "short") == 3 and _rounds(tmp_path / "long2") >= 2, "job 4 finishes")
            _wait(lambda: _program(2) is None, "program 2 ends")
        finally:
            for proc in filter(None, map(_program, (0, 1, 2))):
                with contextlib.suppress(ProcessLookupError):  # it may have ended meanwhile
                    os.kill(proc.pid, signal.SIGKILL)
            runner.join(timeout=120)
    outcomes = result["outcomes"]
    assert [o.status for o in outcomes] == ["error"] * 4 + ["finished"], [o.message for o in outcomes]
    for i, o in enumerate(outcomes[:4]):
        assert o.message == (f"job {i} ({tmp_path / f'long{i}'}): its process was killed by SIGKILL (the kernel's "
                             "out-of-memory killer sends it) before it finished; resume=true continues it")  # fmt: skip
        assert sum(o.message in line for line in lines) == 1
        assert (tmp_path / f"long{i}" / "checkpoint").is_dir()


@pytest.mark.parametrize("processes", [1, 2])
def test_a_lone_job_that_raises_fails_alone_and_the_next_job_runs(tmp_path, tiny_data, processes):
    """A job of its own shape whose run raises (its run dir lies under a file: it cannot be created) ends as an
    ``error`` outcome, in the launcher's process as in a worker process; the next job still runs and finishes."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    cfgs = [composed(blocker / "run", tiny_data, "model=logreg", "num_rounds=2"),
            composed(tmp_path / "next", tiny_data, "model=logreg", "num_rounds=3")]  # fmt: skip
    outcomes = run_jobs(cfgs, processes=processes)
    assert [o.status for o in outcomes] == ["error", "finished"], [o.message for o in outcomes]
    assert "NotADirectoryError" in outcomes[0].message or "FileExistsError" in outcomes[0].message
    assert _rounds(tmp_path / "next") == 3
