"""flower-report counts a configuration's seed once: a copied job folder, or a failed job rerun into a second sweep
folder reported with the first, was a second sample of the same seed in n and in the confidence intervals."""

import csv
import shutil

from simcli import report
from test_report_amplitude import series, write_job


def _runs_per_method(out):
    with open(out / "report.csv") as f:
        return {row["method"]: int(row["runs"]) for row in csv.DictReader(f)}


def _sweep(root, methods=("a", "b")):
    for method in methods:
        for seed in range(3):
            params = {"+method": method, "strategy.client_lr": 0.1, "seed": seed}
            write_job(root, f"{method}_s{seed}", params, series(40, 1.0 + seed, 1e-3 * (seed + 1), tail=12))
    return root


def test_a_copied_job_counts_once_and_is_listed(tmp_path):
    sweep = _sweep(tmp_path / "sweep")
    shutil.copytree(sweep / "a_s0", sweep / "a_s0_copy")
    proc = report(sweep, "--metric", "pop_gap", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert _runs_per_method(tmp_path / "out") == {"a": 3, "b": 3}  # it was 4 for a: seed 0 twice
    md = (tmp_path / "out" / "report.md").read_text()
    assert f"- `{sweep / 'a_s0_copy'}`: the configuration and seed of `{sweep / 'a_s0'}`, counted once" in md


def test_a_failed_job_rerun_into_another_sweep_gives_way_to_the_rerun(tmp_path):
    first = _sweep(tmp_path / "first")
    failed = first / "b_s1"
    shutil.rmtree(failed)
    write_job(first, "b_s1", {"+method": "b", "strategy.client_lr": 0.1, "seed": 1}, series(20, 1.0, 1e-3, tail=0),
              status="running")  # fmt: skip
    rerun = tmp_path / "rerun"
    write_job(rerun, "b_s1", {"+method": "b", "strategy.client_lr": 0.1, "seed": 1}, series(40, 2.0, 2e-3, tail=12))
    proc = report(first, rerun, "--metric", "pop_gap", "--compare", "method=a", "method=b", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr  # --compare refused: "seed 1 appears twice"
    assert _runs_per_method(tmp_path / "out") == {"a": 3, "b": 3}
    md = (tmp_path / "out" / "report.md").read_text()
    assert f"- `{failed}`: the configuration and seed of `{rerun / 'b_s1'}`, counted once (incomplete at round" in md
    assert "| b | 3 |" in md and "incomplete" not in md.split("## Runs left out")[0]


def test_two_finished_runs_of_one_seed_with_other_metrics_are_one_line(tmp_path):
    sweep = _sweep(tmp_path / "sweep", methods=("a",))
    other = tmp_path / "other"
    write_job(other, "a_s2", {"+method": "a", "strategy.client_lr": 0.1, "seed": 2}, series(40, 9.0, 1e-3, tail=12))
    proc = report(sweep, other, "--metric", "pop_gap", "--out", tmp_path / "out")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"flower-report: {other / 'a_s2'} and {sweep / 'a_s2'} are runs of one configuration and seed (2) with "
        "different metrics: a seed counts once; move one of them away or report their folders apart"
    )
