"""studies/tail_average.py: the continued rounds are the run's own (their gaps are the pop_gap an uninterrupted run
logs), the averaged model's gap obeys Jensen, and bad input is one line with exit 2 before any work."""

import json
import shutil

import numpy as np
import pytest
from simcli import IN_PROCESS, run_cli, sim_args

from server.report.metrics import read_metrics
from studies import tail_average

CONVEX = (
    "model=logreg",
    "client.weight_decay=0.01",
    "client.augment=false",
    "eval_train=true",
    "eval_gap=true",
    "eval_every=1",
    *IN_PROCESS,
)


def _run(data, run_dir, rounds, *extra):
    proc = run_cli(
        "flower-simulation", sim_args(data, run_dir, *CONVEX, f"num_rounds={rounds}", "checkpoint_every=1", *extra)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir


@pytest.mark.e2e
def test_continued_rounds_are_the_runs_own_and_averaging_obeys_jensen(tiny_data, tmp_path, capsys):
    """A 3-round run continued by P = 2 (1/C) rounds gives, for rounds 4 and 5, the pop_gap that one uninterrupted
    5-round run logs; the gap of the two models' mean is at most their mean gap, equals f at the mean of the models
    of rounds 4 and 5 computed here by hand, and is the ``avg_pop_gap`` that the uninterrupted run logs with
    ``eval_average=2`` (server/run/window.py), also after a resume."""
    short = _run(tiny_data, tmp_path / "short", 3, f"run_dir={tmp_path / 'short'}")  # the continuation drops it
    full = _run(tiny_data, tmp_path / "full", 5, "eval_average=2")
    four = _run(tiny_data, tmp_path / "four", 4)
    assert tail_average.main([str(short), "--out", str(tmp_path / "out"), "--plot", str(tmp_path / "tail.png")]) == 0
    (line,) = [json.loads(text) for text in capsys.readouterr().out.splitlines() if text.startswith("{")]
    rows = {row["round"]: row for row in read_metrics(full)}
    assert line["rounds"] == [4, 5]
    assert line["gaps"] == pytest.approx([rows[4]["pop_gap"], rows[5]["pop_gap"]], rel=1e-9, abs=1e-12)
    assert line["mean_gap"] == pytest.approx(np.mean(line["gaps"]), rel=1e-12)
    assert 0 <= line["gap_of_mean_model"] <= line["mean_gap"] + 1e-12
    final, continued = np.load(full / "final_model.npz"), np.load(tmp_path / "out" / "short" / "final_model.npz")
    assert all(np.array_equal(final[key], continued[key]) for key in final.files)  # exact resume, bitwise
    assert (tmp_path / "tail.png").stat().st_size > 0
    assert read_metrics(short)[-1]["round"] == 3 and not (short / "final_model_avg.npz").exists()  # untouched

    # by hand: f at the float64 mean of the models of rounds 4 and 5, the run's own objective
    from server.convex.optimum import PopulationGap
    from server.run.data import server_dataset

    cfg = json.loads((full / "config.json").read_text())
    models = [np.load(run / "final_model.npz") for run in (four, full)]
    mean = {key: (models[0][key].astype(np.float64) + models[1][key].astype(np.float64)) / 2 for key in final.files}
    by_hand = PopulationGap(cfg, server_dataset(cfg))(mean)
    assert line["gap_of_mean_model"] == pytest.approx(by_hand, rel=1e-12, abs=1e-15)

    # eval_average=2: the mean of the server models of rounds r-1, r at every round r >= 2, computed in the run
    assert [r for r in rows if "avg_pop_gap" in rows[r]] == [2, 3, 4, 5]
    assert rows[5]["avg_pop_gap"] == pytest.approx(by_hand, rel=1e-12, abs=1e-15)
    for r in (2, 3, 4, 5):  # Jensen, round by round
        assert 0 <= rows[r]["avg_pop_gap"] <= (rows[r - 1]["pop_gap"] + rows[r]["pop_gap"]) / 2 + 1e-12
        assert set(rows[r]) >= {"avg_accuracy", "avg_loss", "avg_pop_loss", "avg_pop_accuracy"}
    averaged = np.load(full / "final_model_avg.npz")
    assert all(averaged[k].dtype == final[k].dtype for k in final.files)
    assert all(
        np.array_equal(averaged[k], np.load(tmp_path / "out" / "short" / "final_model_avg.npz")[k]) for k in final.files
    )  # the continuation refilled its window (short's checkpoint had none)
    log = (tmp_path / "out" / "short" / "run.log").read_text()
    assert "eval_average=2: the checkpoint holds no model window" in log
    assert "avg_pop_gap" in (full / "metrics.csv").read_text().splitlines()[0]
    assert "avg_pop_gap" in (full / "run.log").read_text()
    # a resumed run refills its window from the checkpoint: the same averaged columns as the uninterrupted run
    resumed = tmp_path / "resumed"
    _run(tiny_data, resumed, 3, "eval_average=2")
    _run(tiny_data, resumed, 5, "eval_average=2", "resume=true")
    again = {row["round"]: row for row in read_metrics(resumed)}
    for r in (4, 5):
        assert {k: v for k, v in again[r].items() if k.startswith("avg_")} == {
            k: v for k, v in rows[r].items() if k.startswith("avg_")
        }
    assert all(np.array_equal(averaged[k], np.load(resumed / "final_model_avg.npz")[k]) for k in final.files)


@pytest.mark.e2e
def test_bad_input_is_one_line_and_exit_2(tiny_data, tmp_path, capsys):
    run = _run(tiny_data, tmp_path / "run", 2)
    running = tmp_path / "running"
    shutil.copytree(run, running)
    (running / "status.json").write_text(json.dumps({"status": "running", "round": 1, "reason": ""}))
    cases = {
        (str(tmp_path / "nothing"),): "no config.json",
        (str(run), "--period", "0"): "--period must be >= 1",
        (str(run), str(running)): "not a finished run",
        (str(run), str(running / ".." / "run")): "share a directory name",
    }
    for args, message in cases.items():
        assert tail_average.main([*args, "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("tail_average: ") and message in err[0], err
    assert not (tmp_path / "out").exists()  # refused before any work
    folders = {  # the folders it writes: created before any run is continued (the plot's was written last of all)
        ("--out", "/proc/x"): "--out /proc/x: cannot create it (No such file or directory)",
        ("--out", str(tmp_path / "out"), "--plot", "/proc/y/tail.png"): "--plot's folder /proc/y: cannot create it",
    }
    for args, message in folders.items():
        assert tail_average.main([str(run), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("tail_average: ") and message in err[0], err
    assert not (tmp_path / "out" / "run").exists()
