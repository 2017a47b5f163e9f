"""examples/python_api.py runs as written and prints what it claims: the run's per-round metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "python_api.py"
COLUMNS = ["round", "accuracy", "loss", "train_loss", "num_replies", "update_norm"]


@pytest.mark.e2e  # a real 3-round run on the batched engine, ~7-25 s
def test_python_api_example_runs_and_prints_per_round_metrics(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=tmp_path,  # the example must not depend on the working directory
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()

    status = next(line for line in lines if line.startswith("status: "))
    assert json.loads(status.removeprefix("status: ")) == {"status": "finished", "round": 3, "reason": ""}

    header = lines.index(" | ".join(COLUMNS))
    rows = [dict(zip(COLUMNS, line.split(" | "), strict=True)) for line in lines[header + 1 : header + 5]]
    assert [r["round"] for r in rows] == ["0", "1", "2", "3"]
    # round 0 is the initial model: evaluated, no training yet
    assert rows[0]["train_loss"] == rows[0]["num_replies"] == rows[0]["update_norm"] == "-"
    for r in rows:
        assert 0.0 <= float(r["accuracy"]) <= 1.0 and float(r["loss"]) > 0.0
    for r in rows[1:]:
        assert r["num_replies"] == "2"  # C = 0.5 of 4 clients, every reply accepted
        assert float(r["train_loss"]) > 0.0 and float(r["update_norm"]) > 0.0
    # zero-initialised logistic regression: the initial model predicts uniformly over CIFAR-10's 10 classes
    assert float(rows[0]["loss"]) == pytest.approx(2.3026, abs=1e-4)

    final = lines[header + 5]
    assert final == f"final: accuracy {rows[-1]['accuracy']} after 3 rounds"


def test_readme_quotes_the_example_as_it_is() -> None:
    """The README's Python API section shows the example's own code (its configuration and main), not a copy that
    drifted."""
    example = EXAMPLE.read_text()
    readme = (ROOT / "README.md").read_text()
    core = example[example.index("def make_config") : example.index("def _fmt")].rstrip()
    assert core in readme
