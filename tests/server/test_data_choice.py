"""`make run` on a fresh machine: which CIFAR-10 it uses (server/run/data_choice.py), without network."""

import os
import subprocess
import sys
from pathlib import Path

from server.run.data_choice import DOWNLOAD, choose

ROOT = Path(__file__).resolve().parents[2]


def test_the_shared_copy_when_it_exists(tmp_path):
    shared = tmp_path / "cifar10-jpeg.tar.gz"
    shared.write_bytes(b"")
    overrides, why = choose("", shared, env={})
    assert overrides == [f"data.root={shared}"] and "(SHARED_DATA, the local copy)" in why


def test_torchvision_download_without_a_copy(tmp_path):
    overrides, why = choose("", tmp_path / "missing.tar.gz", env={})
    assert overrides == DOWNLOAD == ["data=cifar10", "data.download=true"]
    assert "torchvision" in why and "missing.tar.gz" in why


def test_explicit_choices_win(tmp_path):
    shared = tmp_path / "shared.tar.gz"
    shared.write_bytes(b"")
    assert choose("mine.tar.gz", shared, env={})[0] == [f"data.root={Path('mine.tar.gz').absolute()}"]
    assert choose("", shared, env={"FEDMOMENTUM_DATA": "/data/c10"})[0] == ["data.root=/data/c10"]
    for args in (["data=cifar10"], ["num_rounds=3", "data.root=/x"], ["+data.name=cifar10"]):
        assert choose("mine", shared, args, env={})[0] == []


def test_cli_prints_overrides_and_says_why_first(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "server.run.data_choice", "--shared", str(tmp_path / "none"), "--", "num_rounds=2"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == DOWNLOAD
    assert proc.stderr.startswith("make run: data: no copy at")


def test_make_run_uses_the_choice():
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # under `make test`
    proc = subprocess.run(
        ["make", "--no-print-directory", "-n", "run", "VENV=/nonexistent-venv"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    run_line = proc.stdout.strip().splitlines()[-1]
    assert "-m server.run.data_choice" in run_line and "--shared" in run_line and "flower-simulation" in run_line
