"""A run directory's files read back (resume, flower-report, flower-plot) may be broken: a checkpoint that cannot be
read is one line and exit 2 before any round; a metrics row cut short by a kill is left out of a resumed run with a
warning; a report lists a run with a broken file as incomplete, naming the file, and goes on."""

import json
import logging
import resource
import shutil
import signal
import subprocess

import numpy as np
import pytest
from simcli import BIN, IN_PROCESS, report, run_cli, sim_args

from server.report.metrics import BrokenMetrics, MetricsWriter, read_metrics

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def finished(tiny_data, tmp_path_factory):
    """A finished 3-round run with a checkpoint every round."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    extra = [*IN_PROCESS, "model=logreg", "num_rounds=3", "checkpoint_every=1"]
    proc = run_cli("flower-simulation", sim_args(tiny_data, run_dir, *extra))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return run_dir, extra


def _state(path, **changes):
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, **changes}) if isinstance(state, dict) else "[]")


BREAKS = {
    "state.json not JSON": lambda c: (c / "state.json").write_text("{not json"),
    "state.json a list": lambda c: (c / "state.json").write_text("[1, 2]"),
    "round not a number": lambda c: _state(c / "state.json", round="x"),
    "arrays.npz truncated": lambda c: (c / "arrays.npz").write_bytes((c / "arrays.npz").read_bytes()[:100]),
    "an array missing": lambda c: np.savez(c / "arrays.npz", **dict(list(np.load(c / "arrays.npz").items())[1:])),
    "an array of another shape": lambda c: np.savez(  # was a stack trace in the first round after the resume
        c / "arrays.npz", **{k: v.T if v.ndim == 2 else v for k, v in np.load(c / "arrays.npz").items()}
    ),
    "another model's tensors": lambda c: np.savez(
        c / "arrays.npz", **{k.replace("linear", "fc"): v for k, v in np.load(c / "arrays.npz").items()}
    ),
}


@pytest.mark.parametrize("name", list(BREAKS))
def test_a_checkpoint_that_cannot_be_read_is_one_line_and_nothing_is_lost(finished, tiny_data, tmp_path, name):
    source, extra = finished
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    BREAKS[name](run_dir / "checkpoint")
    before = (run_dir / "metrics.jsonl").read_text()
    proc = run_cli("flower-simulation", sim_args(tiny_data, run_dir, *extra, "num_rounds=5", "resume=true"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("flower-simulation:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"flower-simulation: invalid configuration: cannot resume: the checkpoint in {run_dir}")
    assert (run_dir / "metrics.jsonl").read_text() == before  # refused before the metrics were touched


def _files(run_dir):
    """Every file of a run directory with its bytes (its Hydra record ``.hydra/`` too: a report reads the overrides
    there), but Hydra's job log and the lock."""
    return {
        p.relative_to(run_dir): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name not in ("cli.log", ".lock")
    }


REFUSED = {  # a resume=true whose run is not the checkpoint's: the one line it gets
    "strategy.client_lr=0.1": "'strategy.client_lr' differs from the checkpoint's run (0.05 there, 0.1 here)",
    "strategy=fedcm": "'strategy.name' differs from the checkpoint's run ('fedavgm' there, 'fedcm' here)",
    "client.local_steps=3": "'client.local_steps' differs from the checkpoint's run (2 there, 3 here)",
    "client.augment=false": "'client.augment' differs from the checkpoint's run (True there, False here)",
    "data.alpha=0": "'data.alpha' differs from the checkpoint's run (1.0 there, 0 here)",
    "participation=uniform": "'participation.mode' differs from the checkpoint's run ('cyclic' there, 'uniform' here)",
    "num_rounds=2": "the checkpoint is after round 3, past num_rounds=2 (give num_rounds >= 3 to continue it)",
}


@pytest.mark.parametrize("override", list(REFUSED))
def test_a_resume_of_another_run_s_checkpoint_is_one_line_and_changes_no_file(finished, tiny_data, tmp_path, override):
    """config.json was rewritten with the refused run's config (a report then grouped the results under it), and a
    run past its num_rounds "finished" again with status.json saying so: now refused before any work."""
    source, extra = finished
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    before = _files(run_dir)
    proc = run_cli("flower-simulation", sim_args(tiny_data, run_dir, *extra, "resume=true", override))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"flower-simulation: invalid configuration: cannot resume: {REFUSED[override]}"
    ]
    assert "Batched engine" not in proc.stdout + proc.stderr  # before any work
    assert _files(run_dir) == before


def test_a_resume_may_change_what_does_not_make_the_trajectory(finished, tiny_data, tmp_path):
    """More rounds, another evaluation schedule, the first round's wait and the engine's workers: it resumes."""
    source, extra = finished
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    changes = ["num_rounds=4", "eval_every=2", "participation.wait_timeout=5", "engine.workers=2", "resume=true"]
    proc = run_cli("flower-simulation", sim_args(tiny_data, run_dir, *extra, *changes))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Resuming" in (run_dir / "run.log").read_text()
    assert [r["round"] for r in read_metrics(run_dir)] == [0, 1, 2, 3, 4]
    assert json.loads((run_dir / "config.json").read_text())["participation"]["wait_timeout"] == 5


def _set_elapsed(run_dir, start):
    """Give the run's rows the elapsed times of a long run: ``start`` + round seconds."""
    rows = [{**r, "elapsed": start + r["round"]} for r in read_metrics(run_dir)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


@pytest.mark.parametrize("more", [False, True], ids=["finished", "one round more"])
def test_a_resumed_run_s_elapsed_time_goes_on_from_its_checkpoint_s(finished, tiny_data, tmp_path, more):
    """``elapsed`` and summary.json's ``seconds`` counted from the resume: a resume of a finished run (nothing to do)
    said the run took a fraction of a second."""
    source, extra = finished
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    kept = _set_elapsed(run_dir, 1000.0)
    rounds = ["num_rounds=4"] if more else []
    proc = run_cli("flower-simulation", sim_args(tiny_data, run_dir, *extra, *rounds, "resume=true"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = read_metrics(run_dir)
    assert rows[:4] == kept
    seconds = json.loads((run_dir / "summary.json").read_text())["seconds"]
    if more:
        assert rows[4]["elapsed"] >= 1003 + rows[4]["seconds"] and seconds >= rows[4]["elapsed"]
    else:
        assert len(rows) == 4 and seconds >= 1003
        assert ", finished at round 3\n" in (run_dir / "run.log").read_text()  # it said "rounds 4..3"


UNCHECKPOINTED = {  # no checkpoint (killed before its first), an earlier run's metrics: what a resume=true gets
    "client_lr differs": (
        lambda run: None,
        ["strategy.client_lr=0.1"],
        "'strategy.client_lr' differs from its config.json (0.05 there, 0.1 here)",
    ),
    "config.json broken": (
        lambda run: (run / "config.json").write_text("{cut"),
        [],
        "its config.json cannot be read (JSONDecodeError: ",
    ),
}


@pytest.mark.parametrize("case", list(UNCHECKPOINTED))
def test_a_resume_without_a_checkpoint_keeps_another_run_s_metrics(finished, tiny_data, tmp_path, case):
    """It started from round 1 and rewrote the metrics of whatever run the directory held; now only when its
    config.json is this run's (the rows are computed again, the same)."""
    source, extra = finished
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    shutil.rmtree(run_dir / "checkpoint")
    breaking, overrides, reason = UNCHECKPOINTED[case]
    breaking(run_dir)
    before = _files(run_dir)
    proc = run_cli("flower-simulation", sim_args(tiny_data, run_dir, *extra, "resume=true", *overrides))
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(
        f"flower-simulation: invalid configuration: cannot resume: {run_dir} has no checkpoint but an earlier run's "
        f"results (metrics up to round 3), and {reason}"
    ), line
    assert line.endswith("resume=false overwrite=true replaces them, or choose another run_dir")
    assert _files(run_dir) == before


def test_a_resume_without_a_checkpoint_of_the_same_run_computes_its_rows_again(finished, tiny_data, tmp_path):
    source, extra = finished
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    shutil.rmtree(run_dir / "checkpoint")
    proc = run_cli("flower-simulation", sim_args(tiny_data, run_dir, *extra, "resume=true"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "has no checkpoint: starting from round 1" in (run_dir / "run.log").read_text()
    untimed = [
        [{k: v for k, v in r.items() if k not in ("seconds", "elapsed")} for r in read_metrics(d)]
        for d in (run_dir, source)
    ]
    assert untimed[0] == untimed[1]


def test_a_multirun_job_refused_by_its_checkpoint_fails_alone_and_leaves_its_files(tiny_data, tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", *sim_args(tiny_data, tmp_path / "unused")[:-1], *IN_PROCESS, "model=logreg", "num_rounds=2"]
    first = run_cli("flower-simulation", [*args, "strategy.client_lr=0.05", f"hydra.sweep.dir={sweep}"])
    assert first.returncode == 0, first.stderr[-2000:]
    [earlier] = [p for p in sweep.iterdir() if p.is_dir()]
    before = _files(earlier)
    again = run_cli(
        "flower-simulation", [*args, "strategy.client_lr=0.1,0.2", "resume=true", f"hydra.sweep.dir={sweep}"]
    )
    assert again.returncode == 2, again.stderr[-2000:]
    assert f"{earlier}: invalid configuration: cannot resume: 'strategy.client_lr' differs" in again.stderr
    assert _files(earlier) == before  # its status.json still says finished
    assert sorted(json.loads((p / "status.json").read_text())["status"] for p in sweep.iterdir() if p.is_dir()) == [
        "finished",
        "finished",
    ]


def test_a_row_cut_short_by_a_kill_is_left_out_of_the_resumed_run(finished, tiny_data, tmp_path):
    source, extra = finished
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"round": 4, "train_lo')
    with pytest.raises(BrokenMetrics, match=r"metrics\.jsonl: line 5 is no metrics row"):
        read_metrics(run_dir)
    proc = run_cli("flower-simulation", sim_args(tiny_data, run_dir, *extra, "num_rounds=5", "resume=true"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["round"] for r in read_metrics(run_dir)] == [0, 1, 2, 3, 4, 5]
    assert "1 line(s) that are no metrics row left out (line 5 first)" in (run_dir / "run.log").read_text()


def test_the_writer_warns_of_each_broken_line_it_leaves_out(tmp_path, caplog):
    lines = ['{"round": 0, "accuracy": 0.1}', "[1]", '{"round": true}', '{"round": 1, "accuracy": 0.2}', "{cut"]
    lines += ['{"round": 1, "accuracy": 0.3}', '{"round": 2, "loss": "low"}', '{"round": 2, "loss": [1]}']
    lines += ['{"round": -3}', '{"round": 2, "loss": NaN, "accuracy": null, "num_replies": 2}']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING, logger="flwr"), MetricsWriter(tmp_path, keep_rounds_upto=2) as writer:
        assert [r["round"] for r in writer.rows] == [0, 1, 2]
    assert "7 line(s) that are no metrics row left out (line 2 first)" in caplog.text
    assert [r["round"] for r in read_metrics(tmp_path)] == [0, 1, 2]  # rewritten without them


def test_a_report_lists_a_run_with_a_broken_file_as_incomplete_and_goes_on(finished, tmp_path):
    source, _ = finished
    sweep = tmp_path / "sweep"
    broken_files = (("good", None), ("cut", "metrics.jsonl"), ("status", "status.json"), ("cfg", "config.json"))
    every = ("every", None)  # every file empty (a copy onto a full disk): its empty config.json was a stack trace
    jobs = (*broken_files, ("over", ".hydra/overrides.yaml"), ("word", None), ("twice", None), every)
    for seed, (name, broken) in enumerate(jobs, start=1):  # a seed each (not 0, the copied config.json's)
        shutil.copytree(source, sweep / name)
        (sweep / name / ".hydra").mkdir(exist_ok=True)
        (sweep / name / ".hydra" / "overrides.yaml").write_text(f"- seed={seed}\n")
        if broken:
            with open(sweep / name / broken, "a") as f:
                f.write("{cut")
    for file in [p for p in (sweep / "every").rglob("*") if p.is_file()]:
        file.write_text("")
    lines = (sweep / "word" / "metrics.jsonl").read_text().splitlines()
    lines[2] = json.dumps({**json.loads(lines[2]), "loss": "low"})  # was a stack trace of the report
    (sweep / "word" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with open(sweep / "twice" / "metrics.jsonl", "a") as f:  # a round's second row: its mean counted it twice
        f.write((sweep / "twice" / "metrics.jsonl").read_text().splitlines()[-1] + "\n")
    proc = report(sweep)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (sweep / "report.md").read_text()
    for name, broken in (
        ("cut", "metrics.jsonl: line 5 is no metrics row"),
        ("status", "status.json is no JSON"),
        ("word", "metrics.jsonl: line 3 is no metrics row"),
        ("twice", "metrics.jsonl: line 5 is no metrics row"),
        ("every", "status.json is no JSON"),
    ):
        assert f"`{sweep / name}`: incomplete" in text and broken in text, text
    assert "config.json is no JSON object" in text and "overrides.yaml is no YAML list of overrides" in text
    assert f"`{sweep / 'good'}`" not in text.split("Runs left out")[1]
    proc = report(sweep, "--out", "/proc/x")
    assert (
        proc.returncode == 2
        and proc.stderr == "flower-report: --out /proc/x: cannot create it (No such file or directory)\n"
    )


def test_flower_plot_names_a_broken_file(finished, tmp_path):
    source, _ = finished
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    (run_dir / "config.json").write_text("{cut")
    proc = run_cli("flower-plot", [run_dir, "--out", tmp_path / "x.png", "--group-by", "seed"])
    assert proc.returncode == 2 and f"{run_dir / 'config.json'} is no JSON object" in proc.stderr, proc.stderr
    proc = run_cli("flower-plot", [source, "--out", "/proc/x/a.png"])
    assert proc.returncode == 2 and "--out's folder /proc/x: cannot create it" in proc.stderr, proc.stderr


def _file_size_limit():
    """In the child: files past 100 kB cannot be written (EFBIG, as a full disk gives ENOSPC), for a real OS error
    without filling a disk; a logistic regression's checkpoint (~250 kB) is past it, its metrics rows are not."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))


@pytest.mark.parametrize("launcher", [[], ["-m", "hydra/launcher=stacked", "seed=0"]], ids=["lone", "stacked"])
def test_a_run_whose_files_cannot_be_written_stops_in_one_line_and_resumes(finished, tiny_data, tmp_path, launcher):
    """It was a stack trace with status.json left at running and the checkpoint's partial files left behind."""
    source, extra = finished  # its data cache is built: the limited run reads it
    run_dir = tmp_path / "run"
    where = [f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweep.subdir=job"] if launcher else []
    if launcher:
        run_dir = tmp_path / "sweep" / "job"
    args = [*launcher, *sim_args(tiny_data, run_dir, *extra), *where]
    command = [str(BIN / "flower-simulation"), *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, preexec_fn=_file_size_limit)
    assert proc.returncode == 1, proc.stderr[-2000:]
    reason = (
        f"cannot write the run's files in {run_dir} (File too large); the run's metrics up to round 1 and no "
        "checkpoint yet are kept: make room, then resume=true continues"
    )
    assert [line for line in proc.stderr.splitlines() if line.startswith("flower-simulation:")][0].endswith(reason)
    assert "Traceback" not in proc.stderr
    assert json.loads((run_dir / "status.json").read_text()) == {"status": "failed", "round": 1, "reason": reason}
    assert not (run_dir / ".checkpoint.tmp").exists()  # the partial checkpoint's room is freed
    resumed = run_cli("flower-simulation", [*args, "resume=true"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    with np.load(run_dir / "final_model.npz") as a, np.load(source / "final_model.npz") as b:
        assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)  # the uninterrupted run's


def test_a_run_log_that_cannot_be_written_stops_the_run_in_one_line(finished, tiny_data, tmp_path):
    """A run.log line that could not be written was logging's trace on stderr, once per line, while the run went on
    unlogged; now the run stops at the end of that round as for its other files. Here run.log is the file that
    fills: it already holds 99.7 kB (a directory's earlier start-ups) under the 100 kB limit."""
    source, extra = finished
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.log").write_text("x" * 99_700 + "\n")
    args = sim_args(tiny_data, run_dir, *extra)
    command = [str(BIN / "flower-simulation"), *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, preexec_fn=_file_size_limit)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Logging error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    reason = (
        f"cannot write {run_dir / 'run.log'} (File too large); the run's metrics up to round 1 and no checkpoint "
        "yet are kept: make room, then resume=true continues"
    )
    assert proc.stderr.strip().splitlines()[-1] == f"flower-simulation: {reason}"
    assert json.loads((run_dir / "status.json").read_text()) == {"status": "failed", "round": 1, "reason": reason}
    (run_dir / "run.log").write_text("")  # room made
    resumed = run_cli("flower-simulation", [*args, "resume=true"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    with np.load(run_dir / "final_model.npz") as a, np.load(source / "final_model.npz") as b:
        assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)


def test_a_data_cache_that_cannot_be_written_is_one_line_and_leaves_no_partial_file(tiny_data, tmp_path):
    """Numpy's short write of a decode-cache array (no errno) was a stack trace, its partial file left in the entry."""
    cache = tmp_path / "cache"
    args = sim_args({**tiny_data, "cache": cache}, tmp_path / "run", *IN_PROCESS, "model=logreg")
    command = [str(BIN / "flower-simulation"), *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, preexec_fn=_file_size_limit)
    assert proc.returncode == 1, proc.stderr[-2000:]
    [entry] = cache.iterdir()
    assert proc.stderr.strip().splitlines()[-1] == (
        f"flower-simulation: cannot write {entry} (a short write: the disk is full, or a quota or a file-size limit "
        "was reached); nothing was written yet: make room, then resume=true continues"
    )
    assert [p.name for p in entry.iterdir()] == [".lock"]  # the partial arrays' room is freed
    assert run_cli("flower-simulation", args).returncode == 0  # with room, the same command runs
