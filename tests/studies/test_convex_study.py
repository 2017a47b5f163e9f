"""issue 17 part 5: the smoke version of the convex study (studies/convex_study.py --scale smoke) on generated
data: every stage through the real ``flower-simulation -m``, 2 seeds, few rounds; checks the tuning choice, the
eval_tail rounds, every report column and section (CI, amplitude, paired comparisons), the figures, the statistics
against scipy and that a rerun skips every finished job. The tests that read the study are e2e (the full suite);
the bad-input test stays in the fast tier."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from server.report.metrics import read_metrics
from server.report.oscillation import cycle_amplitude

ROOT = Path(__file__).resolve().parents[2]
ARGS = [
    "--scale",
    "smoke",
    "--jobs",
    "2",
    "--methods",
    "fedavg,fedcm",
    "--variants",
    "tuned,halved,uniform",
    "--seed001",
    "localupdate_g0,localupdate_decay",
    "--upto",
    "15",
    "--average",
]
ROUNDS, TUNE_ROUNDS, PERIOD, TAIL, EVERY = 20, 10, 5, 10, 5  # SCALES["smoke"]: eval_tail = 2 cycles of 5
UPTO = 15  # the earlier horizon: its last 2 cycles (rounds 6..15) are evaluated too (eval_tail_at)


def driver(out, data, *extra):
    data_args = [f"data.root={data['tarball']}", f"data.cache_dir={data['cache']}", "plots=false"]  # report PNGs only
    return subprocess.run(
        [sys.executable, "-m", "studies.convex_study", *ARGS, "--out", str(out), *extra, *data_args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def study(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("convex_study")
    proc = driver(out / "study", tiny_data, "--figures", out / "img")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out / "study", out / "img", tiny_data


def runs(folder):
    return sorted(p.parent for p in folder.glob("*/metrics.jsonl"))


@pytest.mark.e2e
def test_tuning_picks_the_smallest_last_10_percent_gap(study):
    out = study[0]
    tuned = json.loads((out / "tuned.json").read_text())
    assert set(tuned) == {"seed000", "seed001"}
    for method in ("fedavg", "fedcm"):
        scores = {}
        for run in runs(out / "seed000" / "tune"):
            cfg = json.loads((run / "config.json").read_text())
            if run.name.startswith(method + "_"):
                rows = [r for r in read_metrics(run) if r["round"] > TUNE_ROUNDS - TUNE_ROUNDS // 10]
                scores[repr(cfg["strategy"]["client_lr"])] = np.mean([r["pop_gap"] for r in rows])
        assert len(scores) == 2
        assert tuned["seed000"][method]["strategy.client_lr"] == min(scores, key=scores.get)


@pytest.mark.e2e
def test_final_runs_evaluate_every_round_of_the_tail_only(study):
    out = study[0]
    finals = (
        runs(out / "seed000" / "tuned")
        + runs(out / "seed000" / "halved")
        + runs(out / "seed000" / "uniform")
        + runs(out / "seed001" / "tuned")
    )
    assert len(finals) == 2 * 2 + 2 * 2 + 2 * 2 + 2 * 2
    expected = sorted(
        {t for t in range(ROUNDS + 1) if t % EVERY == 0}
        | set(range(ROUNDS - TAIL + 1, ROUNDS + 1))
        | set(range(UPTO - TAIL + 1, UPTO + 1))
    )
    for run in finals:
        rows = read_metrics(run)
        assert [r["round"] for r in rows if r.get("pop_gap") is not None] == expected
        assert all(r.get("accuracy") is not None for r in rows if r.get("pop_gap") is not None)
        assert json.loads((run / "status.json").read_text())["status"] == "finished"
        averaged = [r for r in rows if r.get("avg_pop_gap") is not None]  # --average: eval_average = the period
        assert [r["round"] for r in averaged] == [t for t in expected if t >= PERIOD]
        gaps = {r["round"]: r["pop_gap"] for r in rows if r.get("pop_gap") is not None}
        assert (
            averaged[-1]["avg_pop_gap"] <= np.mean([gaps[t] for t in range(ROUNDS - PERIOD + 1, ROUNDS + 1)]) + 1e-12
        )  # Jensen over the last cycle


@pytest.mark.e2e
def test_reports_have_every_column_section_and_figure(study):
    out, img, _ = study
    reports = out / "reports"
    for name in ("seed000_tuned", "seed000_uniform", "seed000_cyclic_vs_uniform", "seed001"):
        md = (reports / name / "report.md").read_text()
        assert "95 % confidence half-width" in md and "(n=2)" in md, name
        assert "## Oscillation amplitude of pop_gap" in md and f"period p = {PERIOD} rounds; cycles used: 2" in md
        assert "## Paired comparison:" in md
        for png in ("curves.png", "gap_curves.png"):
            assert (reports / name / png).stat().st_size > 0 and (img / f"convex_{name}_{png}").exists()
        header = (reports / name / "report.csv").read_text().splitlines()[0].split(",")
        for column in (
            "pop_gap_final_mean",
            "pop_gap_final_ci95",
            "pop_gap_last2_ci95",
            "pop_gap_amplitude_mean",
            "pop_gap_amplitude_ci95",
            "pop_gap_amplitude_n",
        ):
            assert column in header, (name, column)
    md = (reports / "seed000_tuned" / "report.md").read_text()
    assert "## Paired comparison: method=fedcm − method=fedavg" in md
    md = (reports / "seed001" / "report.md").read_text()
    assert "## Paired comparison: method=localupdate_decay − method=localupdate_g0" in md
    with open(reports / "seed000_cyclic_vs_uniform" / "compare.csv") as f:
        groups = {r["group"] for r in csv.DictReader(f)}
    assert len(groups) == 2 and all("method=" in g for g in groups)  # cyclic − uniform within each method
    md = (reports / "seed000_tuned_averaged" / "report.md").read_text()  # --average
    assert "## Paired comparison: method=fedcm − method=fedavg" in md and "avg_pop_gap" in md
    assert not (reports / "seed001_averaged").exists()


@pytest.mark.e2e
def test_amplitude_and_comparison_statistics_match_the_metrics(study):
    out = study[0]
    per_method = {}
    for run in runs(out / "seed000" / "tuned"):
        rounds = np.array([r["round"] for r in read_metrics(run) if r.get("pop_gap") is not None])
        gaps = np.array([r["pop_gap"] for r in read_metrics(run) if r.get("pop_gap") is not None])
        tail = gaps[rounds > ROUNDS - TAIL].reshape(2, PERIOD)
        amp = float(np.mean(tail.max(1) - tail.min(1)))  # by hand: 2 cycles of 5 rounds
        assert cycle_amplitude(rounds, gaps, PERIOD, cycles=2) == (pytest.approx(amp, rel=1e-12), 2)
        method = run.name.split("_eta")[0]
        per_method.setdefault(method, {})[json.loads((run / "config.json").read_text())["seed"]] = (amp, gaps[-1])
    with open(out / "reports" / "seed000_tuned" / "report.csv") as f:
        rows = {r["method"]: r for r in csv.DictReader(f)}
    for method, seeds in per_method.items():
        x = np.array([seeds[s][0] for s in sorted(seeds)])
        assert float(rows[method]["pop_gap_amplitude_mean"]) == pytest.approx(x.mean(), rel=1e-12)
        low, high = scipy_stats.t.interval(0.95, 1, loc=x.mean(), scale=scipy_stats.sem(x))
        assert float(rows[method]["pop_gap_amplitude_ci95"]) == pytest.approx((high - low) / 2, rel=1e-9)
    with open(out / "reports" / "seed000_tuned" / "compare.csv") as f:
        final = next(r for r in csv.DictReader(f) if r["value"] == "final" and r["b"] == "fedcm")
    a = np.array([per_method["fedavg"][s][1] for s in (0, 1)])
    b = np.array([per_method["fedcm"][s][1] for s in (0, 1)])
    test = scipy_stats.ttest_rel(b, a)
    assert float(final["mean_diff"]) == pytest.approx(float(np.mean(b - a)), rel=1e-12)
    assert float(final["p"]) == pytest.approx(test.pvalue, rel=1e-9)


@pytest.mark.e2e
def test_halved_vs_tuned_ratio_per_method(study):
    """Lemma III.4's check: per method, halved / tuned of the amplitude (and floor) over matched seeds, by hand."""
    out = study[0]
    tuned = json.loads((out / "tuned.json").read_text())["seed000"]
    for method in ("fedavg", "fedcm"):
        lr = float(tuned[method]["strategy.client_lr"])
        amps = {}
        for variant in ("tuned", "halved"):
            for run in runs(out / "seed000" / variant):
                cfg = json.loads((run / "config.json").read_text())
                if run.name.startswith(method + "_"):
                    assert cfg["strategy"]["client_lr"] == (lr if variant == "tuned" else lr / 2)
                    rows = [r for r in read_metrics(run) if r.get("pop_gap") is not None]
                    amp, _ = cycle_amplitude(
                        np.array([r["round"] for r in rows]), np.array([r["pop_gap"] for r in rows]), PERIOD, cycles=2
                    )
                    amps.setdefault(variant, {})[cfg["seed"]] = amp
        a = np.array([amps["tuned"][s] for s in (0, 1)])
        b = np.array([amps["halved"][s] for s in (0, 1)])
        report = out / "reports" / f"seed000_{method}_halved_vs_tuned"
        with open(report / "compare.csv") as f:
            row = next(r for r in csv.DictReader(f) if r["value"] == "amplitude")
        assert float(row["mean_diff"]) == pytest.approx(float(np.mean(b - a)), rel=1e-9)
        assert float(row["ratio"]) == pytest.approx(float(np.exp(np.mean(np.log(b / a)))), rel=1e-9)
        assert "ratio b/a [95 % CI]" in (report / "report.md").read_text()


@pytest.mark.e2e
def test_reports_at_the_earlier_horizon_read_the_runs_up_to_it(study):
    """--upto 15: each report again as the runs stood after round 15, its amplitude and floor from rows <= 15."""
    out = study[0]
    per_method = {}
    for run in runs(out / "seed000" / "tuned"):
        rows = [r for r in read_metrics(run) if r.get("pop_gap") is not None and r["round"] <= UPTO]
        rounds, gaps = np.array([r["round"] for r in rows]), np.array([r["pop_gap"] for r in rows])
        tail = gaps[rounds > UPTO - TAIL].reshape(2, PERIOD)  # rounds 6..15, by hand
        method = run.name.split("_eta")[0]
        per_method.setdefault(method, []).append((float(np.mean(tail.max(1) - tail.min(1))), gaps[-1]))
    report = out / "reports" / f"seed000_tuned_upto{UPTO}"
    assert f"as it stood after round {UPTO} (--upto)" in (report / "report.md").read_text()
    with open(report / "report.csv") as f:
        rows = {r["method"]: r for r in csv.DictReader(f)}
    for method, values in per_method.items():
        amps, at_upto = np.array(values).T
        assert float(rows[method]["pop_gap_amplitude_mean"]) == pytest.approx(amps.mean(), rel=1e-12)
        assert float(rows[method]["pop_gap_final_mean"]) == pytest.approx(at_upto.mean(), rel=1e-12)
        assert int(rows[method]["runs"]) == 2 and rows[method]["note"] == ""
    assert (out / "reports" / f"seed001_upto{UPTO}" / "report.md").exists()


@pytest.mark.e2e
def test_a_rerun_skips_every_finished_job(study):
    out, _, data = study
    proc = driver(out, data, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "flower-simulation" not in proc.stdout  # 7 reports + 3 averaged variants, also at --upto
    assert proc.stdout.count("flower-report") == 2 * (7 + 3)


@pytest.mark.e2e
def test_curvature_replays_each_finished_run_and_plots_them(study, tmp_path):
    """studies/convex_curvature.py --replay on the study's own runs (FedAvg, FedCM, LocalUpdate, the decay)."""
    out = study[0]
    dirs = sorted(p.parent for p in out.rglob("final_model.npz"))
    names = {json.loads((d / "config.json").read_text())["strategy"]["name"] for d in dirs}
    assert {"fedavgm", "fedcm", "localupdate", "localupdate_decay"} <= names
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "studies.convex_curvature",
            *map(str, dirs),
            "--flow",
            "1",
            "--replay",
            "--lanczos",
            "8",
            "--plot",
            str(tmp_path / "replay.png"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    runs_, replays = ({r["run"]: r for r in lines if key in r} for key in ("step_mass", "replay_bias"))
    assert set(replays) == set(runs_) == {str(d) for d in dirs}
    start = next(r for r in lines if r.get("flow_mass") == 0.0)["quadratic"]
    for run, replay in replays.items():
        assert 0.0 <= replay["replay_bias"] < start  # every run descends from its start, noise-free too
        assert replay["replay_excess"] == pytest.approx(runs_[run]["gap"] - replay["replay_bias"], rel=1e-12)
    assert (tmp_path / "replay.png").stat().st_size > 0 and lines[-1] == {"plot": str(tmp_path / "replay.png")}


def test_bad_driver_input_exits_2_before_any_work(tmp_path, tiny_data):
    for extra, message in (
        (["--methods", "fedavg,nope"], "no method 'nope'"),
        (["--seeds", "0"], "--seeds must be"),
        (["--bogus"], "unknown argument"),
        (["--upto", "20"], "--upto must be a round in 1..19"),
        (["--stacked", "-1"], "--stacked must be >= 0"),
    ):
        proc = driver(tmp_path / "s", tiny_data, *extra)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["nope=1"], "invalid configuration: Could not override 'nope'."),
        (["strategy.client_lr=abc"], "invalid configuration: 'strategy.client_lr' must be a number, got 'abc'"),
        (["data.root=/nonexistent/d.tar.gz"], "invalid configuration: 'data.root': no ImageFolder tree or .tar.gz"),
        (["--out", "/proc/x"], "--out /proc/x: cannot create it (No such file or directory)"),
        (["--figures", "/proc/y"], "--figures /proc/y: cannot create it (No such file or directory)"),
    ],
)
def test_bad_overrides_and_output_folders_exit_2_before_any_work(tmp_path, tiny_data, capsys, extra, message):
    """Trailing Hydra overrides are composed and validated with every preset of the study, and the folders it writes
    (the report stage's figures last of all) created, before the first call: not a failed call in every sweep folder
    or a stack trace after hours of runs."""
    from studies import convex_study

    data = [f"data.root={tiny_data['tarball']}", f"data.cache_dir={tiny_data['cache']}"]
    with pytest.raises(SystemExit) as stop:
        convex_study.parse([*ARGS, "--out", str(tmp_path / "s"), *data, *extra])
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("convex_study.py: error: ") and message in lines[-1], lines
    assert not (tmp_path / "s").exists() or extra[0] == "--figures"


def test_stacked_calls_run_their_jobs_as_stacked_programs(tmp_path, tiny_data):
    proc = driver(tmp_path / "s", tiny_data, "--stage", "tune", "--dry-run", "--stacked", "2")
    assert proc.returncode == 0, proc.stderr
    calls = proc.stdout.splitlines()
    assert calls and all(" -m hydra/launcher=stacked hydra.launcher.processes=2 +sweep=" in c for c in calls), calls
