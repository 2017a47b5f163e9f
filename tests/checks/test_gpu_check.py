"""checks/gpu_check.py and gpu_equality.py: each skips cleanly without CUDA, and each pipeline runs end to end on
CPU (``--cpu-smoke``); checks/float32_flips.py and stacked_float32.py on CPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _run(*args, script="gpu_check", timeout=60):
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "RAY_ADDRESS": "local",
        "HOME": str(Path.home()),
    }
    return subprocess.run(
        [sys.executable, "-m", f"checks.{script}", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run")
@pytest.mark.parametrize("script", ["gpu_check", "gpu_equality"])
def test_without_cuda_it_says_it_skipped_and_exits_0(script, tmp_path):
    proc = _run("--out", tmp_path / "out", script=script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{script}: skipped: no CUDA device")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--convex-rounds", "-1"],
        ["--rounds", "1"],
        ["--budget", "0"],
        ["--shares", "-0.5"],
        ["--shares", "nan"],
        ["--generated-per-class", "0"],  # a stack trace after the start (no images to decode)
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args, tmp_path):
    proc = _run(*args, "--out", tmp_path / "out")
    assert proc.returncode == 2 and "error: --rounds must be >= 2" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_cpu_smoke_runs_the_whole_pipeline(tmp_path):
    """Generated data, the CNN preset, the plain loop, engine=batched stacked and one by one (vectorize=false), and
    a few rounds of the convex study's run. No Ray run (``--shares`` without values): the Ray engine's
    ``backend.num_gpus`` runs go through the same ``_simulation`` as the batched ones, and Ray's start-up would
    double the test's time."""
    proc = _run(
        "--cpu-smoke",
        "--presets",
        "fedavg_cnn",
        "--rounds",
        "3",
        "--generated-per-class",
        "30",
        "--data",
        tmp_path / "none",
        "--out",
        tmp_path / "out",
        "--budget",
        "400",
        "--convex-rounds",
        "20",
        "--shares",
        timeout=600,
    )
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


@pytest.mark.e2e
def test_equality_cpu_smoke_compares_stacked_and_one_by_one(tmp_path):
    """Part A in float64 (stacked vs the loop: rounding only), part B in float32 for GHBM: logreg within the
    tolerance, the CNN reported beside the one-ulp nudge's difference; every row names what it compared."""
    proc = _run("--cpu-smoke", "--strategies", "ghbm", "--out", tmp_path / "out", script="gpu_equality", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "gpu_equality.json").read_text())
    algorithm = report["algorithm"]
    ways = ("stacked on cpu", "one by one on cpu")
    assert {(r["model"], r["algorithm"], r["how"]) for r in algorithm} == {
        (m, a, h) for m in ("logreg", "cnn") for a in ("fedcm", "ghbm") for h in ways
    }
    assert all(r["ok"] and r["difference"] <= 1e-12 for r in algorithm)
    assert any(r["difference"] > 0 for r in algorithm if r["how"].startswith("stacked"))  # really another path
    rows = {(r["variant"], r["strategy"], r["model"]): r for r in report["rows"]}
    assert set(rows) == {(v, "ghbm", m) for v in ("cpu_stacked", "cpu_perturbed") for m in ("cnn", "logreg")}
    assert all(r["stacked_rounds"] == (3 if v == "cpu_stacked" else 0) for (v, _, _), r in rows.items())
    stacked, nudged = rows["cpu_stacked", "ghbm", "logreg"], rows["cpu_perturbed", "ghbm", "logreg"]
    assert stacked["ok"] is True and stacked["model_difference"] <= 1e-4 and nudged["ok"] is True
    stacked, nudged = rows["cpu_stacked", "ghbm", "cnn"], rows["cpu_perturbed", "ghbm", "cnn"]
    assert stacked["ok"] is None and 0 < stacked["model_difference"] < float("inf")
    assert 0 < nudged["model_difference"] == stacked["one_ulp_difference"]  # one ulp of θ⁰ changes the CNN
    markdown = (tmp_path / "out" / "gpu_equality.md").read_text()
    assert "## A. The algorithm in float64" in markdown and "| cpu_stacked | ghbm | cnn | 3 |" in markdown
    assert "| cpu_perturbed | ghbm | cnn | 0 |" in markdown


@pytest.mark.e2e
def test_float32_flips_measures_the_nudge_and_refuses_bad_arguments(tmp_path):
    """checks/float32_flips.py: in float64 a one-ulp nudge of θ⁰ stays at rounding level over 10 CNN steps (no
    activation is within 1e-16 of a flip); a bad argument is one line and exit 2."""
    proc = _run("--dtype", "float64", "--steps", "10", "--per-class", "2", "--work", tmp_path, script="float32_flips")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["model"] == "cnn" and summary["steps"] == 10 and summary["first_flip_step"] is None
    assert 0 < summary["after_nudge"] < 1e-14 and summary["last"] < 1e-12
    assert len([line for line in proc.stdout.splitlines() if line.startswith("step ")]) == 10
    for args, message in (
        (["--steps", "4", "--nudge-at", "4"], "--nudge-at must be in 0..3"),
        (["--weight-decay", "-1"], "--weight-decay must be >= 0"),
        (["--data", tmp_path / "missing"], "tree of class folders)"),
    ):
        proc = _run(*args, "--work", tmp_path, script="float32_flips")
        assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(message), proc.stderr


@pytest.mark.parametrize("args", [["--draws", "0"], ["--tol", "-1"], ["--model", "vgg"]])
def test_stacked_float32_refuses_bad_arguments(args):
    proc = _run(*args, script="stacked_float32")
    assert proc.returncode == 2 and "stacked_float32.py: error:" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.e2e
def test_stacked_float32_reports_every_case():
    """One draw of logistic regression (smooth: rounding only) for two algorithms: both cases within 1e-5."""
    proc = _run("--model", "logreg", "--draws", "1", "--algorithms", "fedavgm", "fedcm", script="stacked_float32")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["cases"] == 2 and summary["above_tol"] == 0 and 0 <= summary["max"] <= 1e-5
