"""flower-plot on run directories written here: any metrics.csv column, mean +/- std per group, bad --metric."""

import json

import numpy as np
import pytest

from server.report.metrics import MetricsWriter
from server.report.run_plots import _legend_labels, plot_main


def write_run(path, name, seed, client_lr):
    """A run directory with config.json and per-round client_lr / pop_gap rows (no pop_gap at round 2)."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"strategy": {"name": name}, "seed": seed}))
    with MetricsWriter(path) as writer:
        for t, lr in enumerate(client_lr, start=1):
            writer.append({"round": t, "client_lr": lr, "pop_gap": None if t == 2 else lr / 10})


def test_plot_any_column_log_scale(tmp_path):
    lrs = {("a", 0): [1.0, 0.5, 0.25], ("a", 1): [1.0, 0.3, 0.1], ("b", 0): [0.01, 0.01, 0.01]}
    for (name, seed), values in lrs.items():
        write_run(tmp_path / f"{name}{seed}", name, seed, values)
    runs = [str(tmp_path / f"{n}{s}") for n, s in lrs]
    out = tmp_path / "lr.png"
    plot_main([*runs, "--metric", "client_lr", "--log", "--group-by", "strategy.name", "--out", str(out)])
    curves = json.loads(out.with_suffix(".json").read_text())
    a = np.array([lrs[("a", 0)], lrs[("a", 1)]])
    assert curves["strategy.name=a"]["runs"] == 2 and curves["strategy.name=a"]["round"] == [1, 2, 3]
    np.testing.assert_allclose(curves["strategy.name=a"]["mean"], a.mean(0))
    np.testing.assert_allclose(curves["strategy.name=a"]["std"], a.std(0))
    assert curves["strategy.name=b"]["mean"] == [0.01] * 3 and out.stat().st_size > 0
    plot_main([*runs, "--metric", "pop_gap", "--group-by", "strategy.name", "--out", str(out)])
    assert json.loads(out.with_suffix(".json").read_text())["strategy.name=a"]["round"] == [1, 3]  # rounds all have


@pytest.mark.parametrize(
    "metric, message",
    [
        ("gap", "--metric must be a metrics.csv column"),
        ("round", "--metric must be a metrics.csv column"),
        ("avg_pop_gap", "no run directory with avg_pop_gap rows"),
    ],
)
def test_bad_metric_is_one_line_exit_2(tmp_path, capsys, metric, message):
    write_run(tmp_path / "r", "a", 0, [1.0])
    with pytest.raises(SystemExit) as err:
        plot_main([str(tmp_path / "r"), "--metric", metric, "--out", str(tmp_path / "x.png")])
    assert err.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_legend_names_only_the_keys_that_differ():
    labels = ["strategy.name=a, strategy.min_lr=0.0, seed_set=x", "strategy.name=b, strategy.min_lr=0.0, seed_set=y"]
    assert _legend_labels(labels) == {labels[0]: "name=a, seed_set=x", labels[1]: "name=b, seed_set=y"}
    assert _legend_labels(["strategy.name=a"]) == {"strategy.name=a": "strategy.name=a"}  # nothing varies: as is
    assert _legend_labels(["run1", "run2"]) == {"run1": "run1", "run2": "run2"}  # no config.json: the dir names
    lists = ["strategy.theta=[1, 2], seed=0", "strategy.theta=[2, 1], seed=0"]  # a value holding ", ": as is
    assert _legend_labels(lists) == {k: k for k in lists}


def test_each_metrics_row_is_on_disk_when_appended_and_a_resume_keeps_the_rows_up_to_its_round(tmp_path):
    """The writer keeps its files open, so every row must reach the files at once, not at close."""
    from server.report.metrics import read_metrics

    writer = MetricsWriter(tmp_path)
    for t in (1, 2, 3):
        writer.append({"round": t, "train_loss": 1.0 / t})
        assert [r["round"] for r in read_metrics(tmp_path)] == list(range(1, t + 1))
        assert (tmp_path / "metrics.csv").read_text().count("\n") == t + 1  # header + rows
    writer.close()
    with MetricsWriter(tmp_path, keep_rounds_upto=2) as resumed:
        assert [r["round"] for r in resumed.rows] == [1, 2]
        resumed.append({"round": 3, "train_loss": 0.5})
    assert [(r["round"], r["train_loss"]) for r in read_metrics(tmp_path)] == [(1, 1.0), (2, 0.5), (3, 0.5)]
    assert (tmp_path / "metrics.csv").read_text().count("\n") == 4


def test_a_resume_replaces_the_metrics_files_whole(tmp_path):
    """A resumed run rewrites the rows up to its checkpoint: the files were truncated in place, so a kill (or a
    full disk) between the truncation and the write lost every row of the run; now each is replaced whole."""
    with MetricsWriter(tmp_path) as writer:
        for t in (1, 2, 3):
            writer.append({"round": t, "train_loss": 1.0 / t})
    before = {name: open(tmp_path / name) for name in ("metrics.jsonl", "metrics.csv")}  # what was there
    try:
        with MetricsWriter(tmp_path, keep_rounds_upto=1):
            pass
        assert before["metrics.jsonl"].read().count("\n") == 3 and before["metrics.csv"].read().count("\n") == 4
    finally:
        for handle in before.values():
            handle.close()
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv", "metrics.jsonl"]  # no temporary file left


def test_a_group_by_key_no_run_has_is_one_line_exit_2(tmp_path, capsys):
    """A mistyped --group-by key put every run into one curve (their configs have no such key); the default keys
    need not all exist (LocalUpdate's configs have no strategy.momentum)."""
    for seed in (0, 1):
        write_run(tmp_path / f"r{seed}", "a", seed, [1.0, 0.5])
    runs = [str(tmp_path / "r0"), str(tmp_path / "r1")]
    with pytest.raises(SystemExit) as err:
        plot_main([*runs, "--metric", "client_lr", "--group-by", "strategy.nmae", "--out", str(tmp_path / "x.png")])
    assert err.value.code == 2
    assert "--group-by: no run's config.json has the key 'strategy.nmae'" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()
    plot_main([*runs, "--metric", "client_lr", "--out", str(tmp_path / "y.png")])  # defaults: strategy.momentum absent
    assert list(json.loads((tmp_path / "y.json").read_text())) == [
        "strategy.name=a, strategy.momentum=None, model.name=None"
    ]


def test_a_run_named_twice_counts_once(tmp_path):
    for seed, lrs in ((0, [1.0, 0.5]), (1, [1.0, 0.1])):
        write_run(tmp_path / f"r{seed}", "a", seed, lrs)
    out = tmp_path / "x.png"
    plot_main([str(tmp_path), str(tmp_path / "r0"), "--metric", "client_lr", "--group-by", "strategy.name",
               "--out", str(out)])  # fmt: skip
    curve = json.loads(out.with_suffix(".json").read_text())["strategy.name=a"]
    assert curve["runs"] == 2 and curve["mean"] == [1.0, 0.3]


def test_the_count_says_how_many_runs_the_curves_hold(tmp_path, capsys):
    """A run without the metric's rows is in no curve; the count said "from N runs" with it counted."""
    write_run(tmp_path / "r0", "a", 0, [1.0, 0.5])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")  # e.g. a job that failed before round 0
    out = tmp_path / "x.png"
    plot_main([str(tmp_path), "--metric", "client_lr", "--group-by", "strategy.name", "--out", str(out)])
    assert capsys.readouterr().out.strip().endswith("from 1 run (1 without client_lr rows left out)")
    plot_main([str(tmp_path / "r0"), "--metric", "client_lr", "--group-by", "strategy.name", "--out", str(out)])
    assert capsys.readouterr().out.strip().endswith(" from 1 run")


def test_a_log_scale_of_no_positive_value_and_an_output_that_cannot_be_written_are_one_line_exit_2(tmp_path, capsys):
    """--log of a column that is never above 0 (the pop_gap of a wrong f*) drew an empty plot behind matplotlib's
    warning; an --out that is a folder was a trace after the runs were read."""
    write_run(tmp_path / "r", "a", 0, [-1.0, -2.0])
    (tmp_path / "d.png").mkdir()
    for args, message in (
        (["--metric", "client_lr", "--log", "--out", str(tmp_path / "x.png")], "--log: no mean value of client_lr"),
        (["--metric", "client_lr", "--out", str(tmp_path / "d.png")], "d.png: cannot write it (Is a directory)"),
    ):
        with pytest.raises(SystemExit) as err:
            plot_main([str(tmp_path / "r"), *args])
        lines = capsys.readouterr().err.strip().splitlines()
        assert err.value.code == 2 and message in lines[-1], lines
    assert not (tmp_path / "x.png").exists()


def test_a_copy_of_a_run_counts_once_and_a_killed_one_gives_way(tmp_path, capsys):
    """A copied run (or one killed early and run again elsewhere) counted twice in its curve's mean and n."""
    import shutil

    write_run(tmp_path / "a0", "a", 0, [1.0, 0.5, 0.25])
    write_run(tmp_path / "a1", "a", 1, [1.0, 0.3, 0.1])
    shutil.copytree(tmp_path / "a0", tmp_path / "a0_copy")
    write_run(tmp_path / "a1_killed", "a", 1, [1.0, 0.3])  # the same run, killed after round 2
    out = tmp_path / "lr.png"
    plot_main([str(tmp_path), "--metric", "client_lr", "--group-by", "strategy.name", "--out", str(out)])
    curve = json.loads(out.with_suffix(".json").read_text())["strategy.name=a"]
    assert curve["runs"] == 2 and curve["round"] == [1, 2, 3]  # the killed run's rounds do not cut the curve
    np.testing.assert_allclose(curve["mean"], [1.0, 0.4, 0.175])
    assert "from 2 runs (2 copies of a run of one configuration and seed left out)" in capsys.readouterr().out
    write_run(tmp_path / "a1_other", "a", 1, [1.0, 0.9, 0.8])  # seed 1 again, other results: which is seed 1?
    with pytest.raises(SystemExit) as stop:
        plot_main([str(tmp_path), "--metric", "client_lr", "--out", str(out)])
    assert stop.value.code == 2
    assert "are runs of one configuration and seed with different metrics" in capsys.readouterr().err


def write_configured_run(path, seed, client_lr, *, name="fedavgm", server_lr=1.0, engine="batched"):
    """A run whose config.json holds every key a run writes that matters here (storage and engine keys too)."""
    path.mkdir()
    config = {
        "strategy": {"name": name, "momentum": 0.9, "client_lr": client_lr, "server_lr": server_lr},
        "model": {"name": "logreg"},
        "engine": {"name": engine},
        "run_dir": str(path),
        "seed": seed,
    }
    (path / "config.json").write_text(json.dumps(config))
    with MetricsWriter(path) as writer:
        for t in (1, 2):
            writer.append({"round": t, "accuracy": client_lr * t + seed / 100})


def test_by_default_a_curve_averages_seeds_only(tmp_path, capsys, monkeypatch):
    """A learning-rate sweep's runs were averaged into one curve per strategy (the default keys): n = 4 over two
    client learning rates. By default every key that differs within a curve names curves too, except the seed,
    where a run is stored, how it ran (engine) and a key another key sets (server_lr by strategy.name)."""
    for name, server_lr in [("fedavgm", 1.0), ("fedcm", 0.1)]:
        for lr in (0.1, 0.2):
            for seed in (0, 1):
                engine = "ray" if seed else "batched"
                write_configured_run(
                    tmp_path / f"{name}{lr}_{seed}", seed, lr, name=name, server_lr=server_lr, engine=engine
                )
    monkeypatch.chdir(tmp_path)
    plot_main([str(tmp_path)])
    curves = json.loads((tmp_path / "accuracy_mean_std.json").read_text())
    base = "strategy.momentum=0.9, model.name=logreg"
    assert sorted(curves) == [
        f"strategy.name={n}, {base}, strategy.client_lr={lr}" for n in ("fedavgm", "fedcm") for lr in (0.1, 0.2)
    ]
    assert {c["runs"] for c in curves.values()} == {2}
    np.testing.assert_allclose(curves[f"strategy.name=fedcm, {base}, strategy.client_lr=0.2"]["mean"], [0.205, 0.405])
    assert "averages" not in capsys.readouterr().out
    plot_main([str(tmp_path), "--group-by", "strategy.name"])  # as asked, and said
    curves = json.loads((tmp_path / "accuracy_mean_std.json").read_text())
    assert sorted(curves) == ["strategy.name=fedavgm", "strategy.name=fedcm"]
    assert {c["runs"] for c in curves.values()} == {4}
    assert "each curve averages runs that differ in strategy.client_lr (not only in seed)" in capsys.readouterr().out
