"""benchmarks/natural_tasks.py: bad options are one line, exit 2, before any work; an output folder inside the
repository is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--tasks", "mnist"], "--tasks: 'mnist' is not one of"),
        (["--rounds", "1"], "--rounds must be >= 2"),
        (["--scale", "0"], "--scale must be in (0, 1]"),
        (["--engines", "deploy"], "--engines: 'deploy'"),
        (["--load-modes", "first,cold"], "--load-modes: 'cold' is not one of"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_benchmark_bad_options_are_one_line(args, words, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.natural_tasks", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and words in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not out.exists()  # before any work


def test_benchmark_refuses_an_out_folder_in_the_repository():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.natural_tasks", "--out", str(ROOT / "x")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "inside the repository" in proc.stderr and not (ROOT / "x").exists()
