"""flower-report's oscillation amplitude, gap_curves.png and multi-value --compare on synthetic runs with known
answers (no simulation: job directories written by hand, as Hydra and the ServerApp would)."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats as scipy_stats
from simcli import report

from server.report.oscillation import cycle_amplitude
from server.report.stats import paired_ratio

P = 4  # cyclic participation with fraction 0.25


def series(rounds: int, amp: float, floor: float, tail: int, every: int = 10):
    """pop_gap = floor + amp * (phase / (P - 1)) within each cycle, evaluated every ``every`` rounds and every
    round of the last ``tail``: the max − min of every cycle is exactly ``amp``."""
    out = []
    for t in range(rounds + 1):
        if t == 0 or t % every == 0 or t > rounds - tail:
            out.append({"round": t, "pop_gap": floor + amp * (((t - 1) % P) / (P - 1)), "loss": 1.0, "num_replies": 1})
    return out


def write_job(root, name, params: dict, rows, mode="cyclic", status="finished"):
    job = root / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"{k}={v}" for k, v in params.items()]))
    cfg = {"seed": params["seed"], "num_rounds": rows[-1]["round"], "participation": {"mode": mode, "fraction": 0.25}}
    (job / "config.json").write_text(json.dumps(cfg))
    (job / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (job / "status.json").write_text(json.dumps({"status": status, "round": rows[-1]["round"]}))
    return job


AMPS = {"a": [1.0, 2.0, 3.0], "b": [0.5, 0.5, 0.8], "c": [4.0, 4.0, 4.0]}  # per method, per seed 0, 1, 2


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "sweep"
    for method, amps in AMPS.items():
        lr = {"a": 0.1, "b": 0.2, "c": 0.3}[method]  # each method's own "tuned" lr: goes with the method
        for seed, amp in enumerate(amps):
            write_job(
                root,
                f"{method}_s{seed}",
                {"+method": method, "strategy.client_lr": lr, "seed": seed},
                series(40, amp, 1e-3 * (seed + 1), tail=12),
            )
    return root


def test_cycle_amplitude_known_answers():
    rounds = np.arange(1, 21)
    values = np.array([(t % 5) * (1 + (t > 10)) for t in rounds], dtype=float)  # period 5: spans 4,4 then 8,8
    assert cycle_amplitude(rounds, values, 5) == (6.0, 4)
    assert cycle_amplitude(rounds, values, 5, cycles=2) == (8.0, 2)
    assert cycle_amplitude(rounds, values, 5, cycles=3) == (pytest.approx(20 / 3), 3)
    # the tail evaluated from round 14 on only: cycles 15..20 -> one full cycle (16..20)
    tail = rounds >= 14
    assert cycle_amplitude(rounds[tail], values[tail], 5) == (8.0, 1)
    with pytest.raises(ValueError, match="only 1 full cycle"):
        cycle_amplitude(rounds[tail], values[tail], 5, cycles=2)
    with pytest.raises(ValueError, match="no full cycle"):
        cycle_amplitude(np.arange(10, 101, 10), np.ones(10), 5)
    with pytest.raises(ValueError, match=">= 2"):
        cycle_amplitude(rounds, values, 1)


def test_report_amplitude_ci_figures_and_multi_compare(sweep, tmp_path):
    out = tmp_path / "out"
    proc = report(
        sweep,
        "--metric",
        "pop_gap",
        "--last",
        "4",
        "--amplitude",
        "--compare",
        "method=a",
        "method=b",
        "method=c",
        "--out",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    md = (out / "report.md").read_text()
    assert "## Oscillation amplitude of pop_gap" in md and "period p = 4 rounds; cycles used: 3" in md
    assert "## Paired comparison: method=b − method=a" in md and "## Paired comparison: method=c − method=a" in md
    with open(out / "report.csv") as f:
        rows = {r["method"]: r for r in csv.DictReader(f)}
    for method, amps in AMPS.items():
        x = np.array(amps)
        assert float(rows[method]["pop_gap_amplitude_mean"]) == pytest.approx(x.mean(), rel=1e-12)
        assert int(rows[method]["pop_gap_amplitude_n"]) == 3
        if x.std() > 0:
            low, high = scipy_stats.t.interval(0.95, 2, loc=x.mean(), scale=scipy_stats.sem(x))
            assert float(rows[method]["pop_gap_amplitude_ci95"]) == pytest.approx((high - low) / 2, rel=1e-9)
    with open(out / "compare.csv") as f:
        found = list(csv.DictReader(f))
    assert {r["b"] for r in found} == {"b", "c"} and all(r["group"] == "" for r in found)  # lr goes with method
    for png in ("curves.png", "gap_curves.png"):
        assert (out / png).stat().st_size > 0


def test_compare_ratio_and_amplitude_match_scipy(sweep, tmp_path):
    """--ratio with --amplitude: per kind (final, last 4, amplitude) the paired difference and the geometric mean
    ratio with its log-scale t interval and p, against numpy/scipy on the known per-seed values."""
    out = tmp_path / "out"
    proc = report(
        sweep,
        "--metric",
        "pop_gap",
        "--last",
        "4",
        "--amplitude",
        "--ratio",
        "--compare",
        "method=a",
        "method=b",
        "method=c",
        "--out",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    with open(out / "compare.csv") as f:
        found = {(r["b"], r["value"]): r for r in csv.DictReader(f)}
    assert set(found) == {(b, kind) for b in "bc" for kind in ("final", "last4", "amplitude")}
    floors = np.array([1e-3 * (seed + 1) for seed in range(3)])
    for b in "bc":
        xa, xb = np.array(AMPS["a"]), np.array(AMPS[b])
        # round 40 is the last of a cycle (phase 3 of 0..3): floor + amp; the last 4 rounds are one whole cycle
        per_kind = {
            "final": (floors + xa, floors + xb),
            "last4": (floors + xa / 2, floors + xb / 2),
            "amplitude": (xa, xb),
        }
        for kind, (va, vb) in per_kind.items():
            row = found[(b, kind)]
            assert int(row["n"]) == 3 and row["note"] == ""
            assert float(row["mean_diff"]) == pytest.approx(float(np.mean(vb - va)), rel=1e-9, abs=1e-15)
            logs = np.log(vb / va)
            assert float(row["ratio"]) == pytest.approx(float(np.exp(logs.mean())), rel=1e-9)
            low, high = scipy_stats.t.interval(0.95, 2, loc=logs.mean(), scale=scipy_stats.sem(logs))
            assert float(row["ratio_low"]) == pytest.approx(float(np.exp(low)), rel=1e-9)
            assert float(row["ratio_high"]) == pytest.approx(float(np.exp(high)), rel=1e-9)
            assert float(row["ratio_p"]) == pytest.approx(
                scipy_stats.ttest_rel(np.log(vb), np.log(va)).pvalue, rel=1e-9
            )
    md = (out / "report.md").read_text()
    assert "| ratio b/a [95 % CI] | p (ratio = 1) |" in md and "| pop_gap amplitude |" in md


def test_ratio_needs_positive_values_and_compare_without_it_is_unchanged(sweep, tmp_path):
    for job in sweep.glob("b_s*"):  # method b's final pop_gap <= 0: no ratio of the final value, the rest as usual
        rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
        rows[-1]["pop_gap"] = 0.0
        (job / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = report(
        sweep,
        "--metric",
        "pop_gap",
        "--last",
        "4",
        "--ratio",
        "--compare",
        "method=a",
        "method=b",
        "--out",
        tmp_path / "ratio",
    )
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "ratio" / "compare.csv") as f:
        found = {r["value"]: r for r in csv.DictReader(f)}
    assert set(found) == {"final", "last4"}  # no --amplitude: no amplitude row
    assert found["final"]["ratio"] == "" and found["final"]["note"] == "no ratio: a value ≤ 0"
    assert found["final"]["mean_diff"] != "" and found["last4"]["ratio"] != ""
    proc = report(
        sweep, "--metric", "pop_gap", "--last", "4", "--compare", "method=a", "method=b", "--out", tmp_path / "plain"
    )
    with open(tmp_path / "plain" / "compare.csv") as f:
        assert all(r["ratio"] == "" and r["note"] == "" for r in csv.DictReader(f))
    assert "ratio b/a" not in (tmp_path / "plain" / "report.md").read_text()


def test_only_keeps_one_methods_runs(sweep, tmp_path):
    proc = report(
        sweep, "--metric", "pop_gap", "--last", "4", "--amplitude", "--only", "method=b", "--out", tmp_path / "out"
    )
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "out" / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and int(rows[0]["runs"]) == 3  # method b only: one configuration of 3 seeds
    assert float(rows[0]["pop_gap_amplitude_mean"]) == pytest.approx(np.mean(AMPS["b"]), rel=1e-12)


def test_runs_started_one_by_one_group_by_configuration(tmp_path):
    """Runs launched one at a time each carry their own run_dir (and resume, checkpoint_every...): storage keys, not
    configuration keys, so the seeds of one method still form one configuration and pair with another's."""
    root = tmp_path / "runs"
    for method, amps in (("a", AMPS["a"]), ("b", AMPS["b"])):
        for seed, amp in enumerate(amps):
            write_job(
                root,
                f"{method}{seed}",
                {
                    "+method": method,
                    "seed": seed,
                    "run_dir": f"/x/{method}{seed}",
                    "resume": "true",
                    "checkpoint_every": 10 * (seed + 1),
                },
                series(40, amp, 0.01, tail=12),
            )
    proc = report(
        root,
        "--metric",
        "pop_gap",
        "--last",
        "4",
        "--amplitude",
        "--compare",
        "method=a",
        "method=b",
        "--out",
        tmp_path / "out",
    )
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "out" / "report.csv") as f:
        rows = {r["method"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"a", "b"} and all(int(r["runs"]) == 3 for r in rows.values())
    assert "run_dir" not in rows["a"] and "checkpoint_every" not in rows["a"]
    with open(tmp_path / "out" / "compare.csv") as f:
        amplitude = next(r for r in csv.DictReader(f) if r["value"] == "amplitude")
    assert int(amplitude["n"]) == 3 and amplitude["group"] == ""
    assert float(amplitude["mean_diff"]) == pytest.approx(np.mean(np.array(AMPS["b"]) - AMPS["a"]), rel=1e-9)


def test_a_key_left_at_its_default_reads_the_default_the_run_had(tmp_path):
    """Cyclic runs started with the preset's participation group (no override) against runs started with
    participation=uniform strategy.client_lr=0.1 (the default): the cyclic runs read their Hydra group choice and
    their resolved client lr, so participation compares cyclic vs uniform and the lr is no swept key."""
    root = tmp_path / "runs"
    for mode, amps in (("cyclic", AMPS["a"]), ("uniform", AMPS["b"])):
        for seed, amp in enumerate(amps):
            params = (
                {"seed": seed} if mode == "cyclic" else {"participation": mode, "strategy.client_lr": 0.1, "seed": seed}
            )
            job = write_job(root, f"{mode}{seed}", params, series(40, amp, 0.01, tail=12), mode=mode)
            hydra = {"hydra": {"runtime": {"choices": {"participation": mode, "strategy": "fedavgm"}}}}
            (job / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
            cfg = json.loads((job / "config.json").read_text())
            (job / "config.json").write_text(json.dumps({**cfg, "strategy": {"client_lr": 0.1}}))
    proc = report(
        root,
        "--metric",
        "pop_gap",
        "--last",
        "4",
        "--amplitude",
        "--period",
        str(P),
        "--compare",
        "participation=cyclic",
        "participation=uniform",
        "--out",
        tmp_path / "out",
    )
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "out" / "report.csv") as f:
        rows = {r["participation"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"cyclic", "uniform"} and "strategy.client_lr" not in rows["cyclic"]
    with open(tmp_path / "out" / "compare.csv") as f:
        amplitude = next(r for r in csv.DictReader(f) if r["value"] == "amplitude")
    assert int(amplitude["n"]) == 3
    assert float(amplitude["mean_diff"]) == pytest.approx(np.mean(np.array(AMPS["b"]) - AMPS["a"]), rel=1e-9)


def test_an_unreadable_hydra_record_leaves_the_key_missing(tmp_path):
    """A broken .hydra/hydra.yaml (or none) and a config without the key: nothing is filled in, nothing raises."""
    from server.report.runs import load_runs

    root = tmp_path / "runs"
    write_job(root, "set", {"participation": "uniform", "seed": 0}, series(40, 1.0, 0.01, tail=12))
    broken = write_job(root, "broken", {"seed": 1}, series(40, 1.0, 0.01, tail=12))
    (broken / ".hydra" / "hydra.yaml").write_text("hydra: {runtime: [unclosed")
    write_job(root, "none", {"seed": 2}, series(40, 1.0, 0.01, tail=12))
    runs = {r.path.name: r for r in load_runs([root])}
    assert runs["set"].params["participation"] == "uniform"
    assert "participation" not in runs["broken"].params and "participation" not in runs["none"].params


def test_a_curve_label_names_only_the_keys_its_runs_set():
    """gap_curves.png / curves.png legends: a configuration without a swept key (γ = 0 has no decay factor) is not
    labelled "server_decay=" with nothing after it."""
    from server.report.runs import Config, Run
    from server.report.sweep_plots import _label

    keys = ["method", "strategy.server_decay"]
    done = Run(Path("seed0"), {}, "finished", 40, "", [], 40)
    assert _label(Config({"method": "g0", "strategy.server_decay": ""}, [done]), keys) == "method=g0 (n=1)"
    assert (
        _label(Config({"method": "decay", "strategy.server_decay": "0.3"}, [done, done]), keys)
        == "method=decay, server_decay=0.3 (n=2)"
    )
    assert _label(Config({}, []), []) == "all runs (n=0)"


def test_upto_reads_every_run_as_it_stood_at_an_earlier_horizon(tmp_path):
    """Runs of 40 rounds with both tails evaluated (eval_tail_at=[20]): --upto 20 gives the first tail's amplitude
    and floor; a run still going past 20 counts, one that ended before 20 is listed; num_rounds and eval_tail_at
    are no keys there."""
    root = tmp_path / "runs"
    tail = 8  # 2 cycles of P = 4 before round 20 and before round 40
    amp_at = {20: [1.0, 2.0, 3.0], 40: [0.5, 0.25, 0.125]}
    for seed in range(3):
        rows = [
            {
                "round": t,
                "loss": 1.0,
                "num_replies": 1,
                "pop_gap": 0.1 * (seed + 1) + amp_at[20 if t <= 20 else 40][seed] * (((t - 1) % P) / (P - 1)),
            }
            for t in range(41)
            if t % 10 == 0 or 20 - tail < t <= 20 or t > 40 - tail
        ]
        status = "running" if seed == 2 else "finished"  # still going: reached round 20 all the same
        horizon = {"eval_tail_at": "[20]"} if seed else {}  # run 0 was started without it: still the same config
        write_job(root, f"s{seed}", {"seed": seed, "num_rounds": 40 + seed, **horizon}, rows, status=status)
    write_job(root, "short", {"seed": 3, "num_rounds": 15}, series(15, 1.0, 0.1, tail=8))
    proc = report(root, "--metric", "pop_gap", "--last", "8", "--amplitude", "--upto", "20", "--out", tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "o" / "report.csv") as f:
        (row,) = list(csv.DictReader(f))  # num_rounds and eval_tail_at differ between the runs: one configuration
    assert int(row["runs"]) == 4 and int(row["finished"]) == 3 and int(row["incomplete"]) == 1
    assert float(row["pop_gap_amplitude_mean"]) == pytest.approx(np.mean(amp_at[20]), rel=1e-12)
    assert float(row["pop_gap_final_mean"]) == pytest.approx(np.mean([0.1 * (s + 1) + amp_at[20][s] for s in range(3)]))
    md = (tmp_path / "o" / "report.md").read_text()
    assert "ended at round 15, before --upto 20" in md and "after round 20 (--upto)" in md
    proc = report(root, "--metric", "pop_gap", "--amplitude", "--upto", "0", "--out", tmp_path / "bad")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--upto must be a round >= 1" in proc.stderr


def test_paired_ratio_known_answers():
    r = paired_ratio([1.0, 1.0], [2.0, 8.0])  # log ratios log 2, log 8: geometric mean 4
    assert r.mean == pytest.approx(4.0, rel=1e-12) and r.n == 2 and r.low < 4.0 < r.high
    same = paired_ratio([1.0, 2.0, 4.0], [0.5, 1.0, 2.0])  # every ratio 0.5: no spread
    assert (same.mean, same.low, same.high, same.p) == (pytest.approx(0.5, rel=1e-12),) * 3 + (0.0,)
    for a, b in (([1.0, 0.0], [1.0, 1.0]), ([1.0, 1.0], [1.0, -2.0]), ([1.0, float("nan")], [1.0, 1.0])):
        with pytest.raises(ValueError, match="values > 0"):
            paired_ratio(a, b)
    with pytest.raises(ValueError, match="at least 2"):
        paired_ratio([1.0], [2.0])


def test_gap_curves_with_values_at_or_below_zero(tmp_path):
    root = tmp_path / "sweep"
    for seed in (0, 1):
        rows = series(40, 1.0, 0.0, tail=12)  # the first round of every cycle is at 0: clipped and marked
        rows[-3]["pop_gap"] = -1e-10
        write_job(root, f"s{seed}", {"seed": seed}, rows)
    proc = report(root, "--metric", "pop_gap", "--cycles", "2", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert "cycles used: 2" in (tmp_path / "out" / "report.md").read_text()
    assert (tmp_path / "out" / "gap_curves.png").stat().st_size > 0


@pytest.mark.parametrize(
    "args, mode, tail, message",
    [
        (["--amplitude"], "cyclic", 0, "no full cycle of 4 consecutive evaluated rounds"),
        (["--period", "1"], "cyclic", 12, "--period must be >= 2 rounds, got 1"),
        (["--cycles", "0"], "cyclic", 12, "--cycles must be >= 1, got 0"),
        (["--cycles", "5"], "cyclic", 12, "only 3 full cycle(s)"),
        (["--amplitude"], "uniform", 12, "is not a cyclic run (participation.mode): give --period P"),
        (["--amplitude", "accuracy"], "cyclic", 12, "--amplitude: metric 'accuracy' is in no run's metrics"),
        (["--pair-by", "seed"], "cyclic", 12, "--pair-by needs --compare"),
        (["--ratio"], "cyclic", 12, "--ratio needs --compare"),
        (["--only", "seed"], "cyclic", 12, "--only takes KEY=VALUE, got 'seed'"),
        (["--only", "method=a"], "cyclic", 12, "--only: no run sets 'method' (keys: seed)"),
        (["--only", "seed=7"], "cyclic", 12, "--only seed=7: no run matches"),
    ],
)
def test_bad_amplitude_input_exits_2_with_one_line(tmp_path, args, mode, tail, message):
    root = tmp_path / "sweep"
    for seed in (0, 1):
        write_job(root, f"s{seed}", {"seed": seed}, series(40, 1.0, 0.1, tail=tail), mode=mode)
    proc = report(root, *args, "--out", tmp_path / "out")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "report.md").exists()


def test_a_run_named_twice_counts_once(sweep):
    """A sweep given twice, or with one of its own job directories, is each run once: twice, a seed would count twice
    in n and in the CIs."""
    from server.report.runs import load_runs

    once = sorted(r.path.resolve() for r in load_runs([sweep]))
    again = load_runs([sweep, sweep, sweep / "a_s0", sweep / ".." / "sweep"])
    assert sorted(r.path.resolve() for r in again) == once and len(once) == 9
