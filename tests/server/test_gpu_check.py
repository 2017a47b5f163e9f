"""benchmarks/gpu_check.py: skips cleanly without CUDA, and its pipeline runs end to end (CPU smoke mode)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _run(*args, timeout=60):
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(ROOT), "RAY_ADDRESS": "local",
           "HOME": str(Path.home())}
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run")
def test_without_cuda_it_says_it_skipped_and_exits_0(tmp_path):
    proc = _run("--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("gpu_check: skipped: no CUDA device")
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_cpu_smoke_runs_the_whole_pipeline(tmp_path):
    """Generated data, the CNN preset, the plain loop, engine=batched stacked and one by one (vectorize=false), and
    a few rounds of the convex study's run. No Ray run (``--shares`` without values): the Ray engine's
    ``backend.num_gpus`` runs go through the same ``_simulation`` as the batched ones, and Ray's start-up would
    double the test's time."""
    proc = _run("--cpu-smoke", "--presets", "fedavg_cnn", "--rounds", "3", "--generated-per-class", "30",
                "--data", tmp_path / "none", "--out", tmp_path / "out", "--budget", "400", "--convex-rounds", "20",
                "--shares", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    convex, plain, batched, batched_seq = report["runs"]
    assert plain["engine"] == "plain loop" and plain["param_device"] == "cpu"
    assert plain["images_per_s_per_client"] > 0
    for run, engine in ((batched, "batched"), (batched_seq, "batched_seq")):
        assert run["engine"] == engine and run["returncode"] == 0 and len(run["seconds"]) == 3
        assert run["rounds_per_s"] > 0 and run["overhead_vs_plain"] > 0 and run["images_per_s"] > 0
        assert "peak_cuda_memory_mib" not in run  # CPU: no GPU memory to report
        assert run["loss_last"] == pytest.approx(plain["loss_last"], rel=1e-6)  # the same clients and rounds
    assert batched["loss_last"] == batched_seq["loss_last"]  # CNN on CPU: one by one either way, bitwise
    assert convex["engine"] == "batched cpu" and convex["returncode"] == 0 and convex["rounds"] == 4
    assert convex["s_per_round"] > 0 and convex["pop_loss_last"] > 0 and convex["projected_5000_s"] > 0
    assert all(c["ok"] for c in report["checks"]) and len(report["checks"]) == 8
    markdown = (tmp_path / "out" / "gpu_check.md").read_text()
    assert markdown in proc.stdout and "flower-simulation" not in markdown
    assert "| fedavg_cnn | batched | - |" in markdown and "| fedavg_cnn | batched_seq | - |" in markdown
    assert "| batched cpu | 4 |" in markdown
