"""benchmarks/gpu_equality.py: skips without CUDA, and its pipeline runs on CPU (--cpu-smoke) with real checks."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_equality.py"


def _run(*args, timeout=60):
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(Path.home())}
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run")
def test_without_cuda_it_says_it_skipped_and_exits_0(tmp_path):
    proc = _run("--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("gpu_equality: skipped: no CUDA device")
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_cpu_smoke_compares_stacked_and_one_by_one(tmp_path):
    """Part A in float64 (stacked vs the loop: rounding only), part B in float32 for two strategies: logreg within
    the tolerance, the CNN reported; every row names what it compared."""
    proc = _run("--cpu-smoke", "--strategies", "fedavg", "ghbm", "--out", tmp_path / "out", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "gpu_equality.json").read_text())
    algorithm = report["algorithm"]
    ways = ("stacked on cpu", "one by one on cpu")
    assert {(r["model"], r["algorithm"], r["how"]) for r in algorithm} == {
        (m, a, h) for m in ("logreg", "cnn") for a in ("fedcm", "ghbm") for h in ways}
    assert all(r["ok"] and r["difference"] <= 1e-12 for r in algorithm)
    assert any(r["difference"] > 0 for r in algorithm if r["how"].startswith("stacked"))  # really another path
    rows = {(r["strategy"], r["model"]): r for r in report["rows"]}
    assert set(rows) == {(s, m) for s in ("fedavg", "ghbm") for m in ("cnn", "logreg")}
    assert all(r["variant"] == "cpu_stacked" and r["stacked_rounds"] == 3 for r in rows.values())
    assert rows["fedavg", "logreg"]["ok"] is True and rows["fedavg", "logreg"]["model_difference"] <= 1e-4
    assert rows["fedavg", "cnn"]["ok"] is None and 0 < rows["fedavg", "cnn"]["model_difference"] < float("inf")
    markdown = (tmp_path / "out" / "gpu_equality.md").read_text()
    assert "## A. The algorithm in float64" in markdown and "| cpu_stacked | ghbm | cnn | 3 |" in markdown
