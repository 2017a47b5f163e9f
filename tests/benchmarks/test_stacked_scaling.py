"""benchmarks/stacked_scaling.py end to end on tiny generated data (``--smoke``): a row per (model, jobs) whose rate
is its jobs over its training round, evaluated rounds measured, the report and a projection written."""

import json

import pytest

from benchmarks.stacked_scaling import main

pytestmark = pytest.mark.e2e


def test_the_scaling_benchmark_measures_each_group_and_writes_its_report(tmp_path):
    main(["--smoke", "--out", str(tmp_path), "--models", "logreg", "--jobs", "1", "3", "--rounds", "4"])
    report = json.loads((tmp_path / "scaling.json").read_text())
    assert [(r["model"], r["jobs"]) for r in report["rows"]] == [("logreg", 1), ("logreg", 3)]
    for row in report["rows"]:
        assert row["train_round_s"] > 0 and row["eval_round_s"] > 0
        assert row["job_rounds_per_s"] == pytest.approx(row["jobs"] / row["train_round_s"])
        assert all((tmp_path / "logreg" / f"jobs{row['jobs']}" / f"job{i}" / "summary.json").exists()
                   for i in range(row["jobs"]))  # fmt: skip
    assert report["projections"]["convex_study_hours"]["hours"] > 0
    assert "| logreg | 3 |" in (tmp_path / "scaling.md").read_text()
