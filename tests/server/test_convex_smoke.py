"""issue 17 part 5 smoke test (no Ray): a real 2-strategy x 2-seed multirun of logistic regression with pop_gap on
the batched engine, f* a true minimiser, flower-report's CI and paired-comparison sections against scipy, and the
statistics on synthetic values with known answers."""

import csv
import json
import math
import shutil

import numpy as np
import pytest
from scipy import stats as scipy_stats
from simcli import report, run_cli

from server.convex.optimum import objective, optimum
from server.convex.solver import TOL
from server.report.metrics import read_metrics
from server.report.runs import load_run
from server.report.stats import ci_half_width, paired, summarise
from server.run.data import server_dataset

MU = 0.01
SEEDS = (0, 1)
STRATEGIES = ("fedavg", "fedcm")


@pytest.fixture(scope="module")
def sweep(tiny_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("convex_sweep")
    args = [
        "-m",
        f"data.root={tiny_data['tarball']}",
        f"data.cache_dir={tiny_data['cache']}",
        "engine=batched",
        "model=logreg",
        f"client.weight_decay={MU}",
        "client.augment=false",
        "num_clients=4",
        "participation.fraction=0.5",
        "num_rounds=3",
        "client.local_steps=2",
        "client.batch_size=8",
        "eval_max_examples=20",
        "eval_train=true",
        "eval_gap=true",
        f"strategy={','.join(STRATEGIES)}",
        f"seed={','.join(map(str, SEEDS))}",
        f"hydra.sweep.dir={root}",
        "hydra.sweep.subdir=${hydra.job.num}_${strategy.name}_m${strategy.momentum}_s${seed}",
    ]
    proc = run_cli("flower-simulation", args, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = sorted(p.parent for p in root.glob("*/metrics.jsonl"))
    assert len(runs) == 4
    return root, runs


@pytest.mark.e2e
def test_pop_gap_is_written_and_never_below_f_star(sweep):
    for run in sweep[1]:
        rows = read_metrics(run)
        header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
        assert "pop_gap" in header and header.index("pop_gap") < header.index("avg_pop_gap")  # avg_*: eval_average
        gaps = [r["pop_gap"] for r in rows]
        assert len(gaps) == 4 and all(g >= -1e-9 for g in gaps), gaps
        f0 = rows[0]["pop_gap"] + (math.log(10) - rows[0]["pop_gap"])  # round 0: the zero model, f = log 10
        assert rows[0]["pop_loss"] == pytest.approx(f0, rel=1e-6)
        assert f"pop_gap {rows[-1]['pop_gap']:.4e}" in (run / "run.log").read_text()
        assert (run / "gap.png").stat().st_size > 0


@pytest.mark.e2e
def test_the_runs_f_star_is_a_true_minimiser(sweep):
    """f* = log 10 − pop_gap(round 0) is the cached optimum, ‖∇f(w*)‖ ≤ 1e-8, and f grows in every direction."""
    cfg = json.loads((sweep[1][0] / "config.json").read_text())
    ds = server_dataset(cfg)
    obj = objective(cfg, ds)
    found = optimum(cfg, ds, obj)
    assert found.cached
    f_star = math.log(10) - read_metrics(sweep[1][0])[0]["pop_gap"]
    assert found.f_star == pytest.approx(f_star, rel=1e-12)
    grad_norm = float(np.linalg.norm(obj.grad(found.w)))
    assert grad_norm <= TOL
    rng = np.random.default_rng(0)
    for _ in range(4):
        d = rng.normal(size=obj.dim)
        d *= 1e-2 / np.linalg.norm(d)
        assert obj.value(found.w + d) - found.f_star >= 0.5 * MU * 1e-4 - grad_norm * 1e-2 > 0  # strong convexity


def per_seed(runs, strategy, metric):
    """{seed: final value of ``metric``} of the runs whose Hydra override is strategy=``strategy``."""
    loaded = [load_run(run) for run in runs]
    return {r.seed: r.rows[-1][metric] for r in loaded if r.params["strategy"] == strategy}


@pytest.mark.e2e
def test_report_has_ci_and_paired_comparison_equal_to_scipy(sweep, tmp_path):
    root, runs = sweep
    proc = report(root, "--metric", "pop_gap", "--compare", "strategy=fedavg", "strategy=fedcm", "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "report.md").read_text()
    assert "95 % confidence half-width" in md and "(n=2)" in md
    assert "## Paired comparison: strategy=fedcm − strategy=fedavg" in md
    a, b = per_seed(runs, "fedavg", "pop_gap"), per_seed(runs, "fedcm", "pop_gap")
    assert sorted(a) == sorted(b) == list(SEEDS)
    with open(tmp_path / "report.csv") as f:
        rows = {r["strategy"]: r for r in csv.DictReader(f)}
    for name, values in (("fedavg", a), ("fedcm", b)):
        x = np.array([values[s] for s in SEEDS])
        low, high = scipy_stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=scipy_stats.sem(x))
        assert float(rows[name]["pop_gap_final_ci95"]) == pytest.approx((high - low) / 2, rel=1e-9)
        assert int(rows[name]["pop_gap_final_n"]) == 2
    with open(tmp_path / "compare.csv") as f:
        final = next(r for r in csv.DictReader(f) if r["value"] == "final")
    xa, xb = np.array([a[s] for s in SEEDS]), np.array([b[s] for s in SEEDS])
    test = scipy_stats.ttest_rel(xb, xa)
    assert float(final["mean_diff"]) == pytest.approx(float(np.mean(xb - xa)), rel=1e-12)
    assert float(final["t"]) == pytest.approx(test.statistic, rel=1e-9)
    assert float(final["p"]) == pytest.approx(test.pvalue, rel=1e-9)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "compare, drop, message",
    [
        (["model.name=logreg", "model.name=cnn"], None, "'model.name' was not swept"),
        (["strategy=fedavg", "seed=1"], None, "both sides must set the same key"),
        (["strategy=fedavg", "strategy=ghbm"], None, "no run has strategy=ghbm"),
        (  # the seeds were floats: "[0.0, 1.0]"
            ["strategy=fedavg", "strategy=fedcm"],
            "*_fedcm_*_s1",
            "strategy=fedavg has seeds [0, 1], strategy=fedcm has [0] (only one side: [1])",
        ),
        (["strategy=fedavg", "strategy=fedcm"], "*_s1", "1 seed(s); a paired CI needs at least 2"),
    ],
)
def test_bad_compare_input_exits_2_with_one_line(sweep, tmp_path, compare, drop, message):
    root = sweep[0]
    if drop:
        root = tmp_path / "copy"
        shutil.copytree(sweep[0], root)
        for job in root.glob(drop):
            shutil.rmtree(job)
    proc = report(root, "--compare", *compare, "--out", tmp_path / "out")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "report.md").exists()


def test_statistics_on_known_answers():
    """Closed forms, independent of scipy: t_{0.975,1} = 12.7062047361747 (tables); paired d = (1, 2, 3): d̄ = 2,
    s = 1, t = 2√3, and with 2 degrees of freedom the two-sided p = 1 − t/√(2 + t²) = 1 − √(12/14)."""
    one = summarise([0.0, 2.0])
    assert (one.mean, one.std, one.n) == (1.0, 1.0, 2)
    assert one.ci == pytest.approx(12.7062047361747, rel=1e-12)  # t · s/√n with s = √2, n = 2
    assert summarise([3.0]).ci is None and summarise([]) is None
    result = paired([0.0, 0.0, 0.0], [1.0, 2.0, 3.0])
    assert (result.mean, result.n) == (2.0, 3)
    assert result.t == pytest.approx(2 * math.sqrt(3), rel=1e-14)
    assert result.p == pytest.approx(1 - math.sqrt(12 / 14), rel=1e-10)
    assert result.ci == pytest.approx(4.30265272974946 / math.sqrt(3), rel=1e-12)  # t_{0.975,2} · 1/√3
    rng = np.random.default_rng(7)
    a = rng.normal(size=6)
    b = a + rng.normal(0.3, 0.2, size=6)
    test, r = scipy_stats.ttest_rel(b, a), paired(a, b)
    assert (r.t, r.p) == (pytest.approx(test.statistic, rel=1e-12), pytest.approx(test.pvalue, rel=1e-10))
    assert ci_half_width(b - a) == pytest.approx(
        np.diff(scipy_stats.t.interval(0.95, 5, loc=0, scale=scipy_stats.sem(b - a)))[0] / 2, rel=1e-12
    )
    constant = paired([1.0, 2.0], [1.5, 2.5])  # every difference 0.5: no spread, certain
    assert (constant.mean, constant.ci, constant.p) == (0.5, 0.0, 0.0)
