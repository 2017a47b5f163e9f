"""Fixtures of the deployment tests: generated data and one reference 4-SuperNode deployment run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deploy_helpers import ROOT, flower_processes, overrides, run_cli  # noqa: E402
from misbehaving_app import make_app_dir  # noqa: E402

from tools.datagen import make_image_folder  # noqa: E402


@pytest.fixture(scope="session")
def deploy_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 10-class ImageFolder tree (16 train / 4 test images per class) and a cache dir."""
    root = tmp_path_factory.mktemp("deploy-data")
    return {
        "folder": make_image_folder(root / "folder", per_class=16, test_per_class=4, seed=2),
        "cache": root / "cache",
    }


@pytest.fixture(scope="session")
def reference_deploy(deploy_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """``flower-deploy`` with 4 local SuperNodes for 2 rounds: (run_dir, output). Shared by several tests."""
    run_dir = tmp_path_factory.mktemp("deploy") / "run"
    proc = run_cli("flower-deploy", overrides(deploy_data, run_dir, "plots=true"), timeout=240)
    left = flower_processes(run_dir / "deploy" / "flwr_home")
    assert not left, f"leftover processes: {left}"
    assert proc.returncode == 0, proc.stdout[-4000:]
    return run_dir, proc.stdout


@pytest.fixture(scope="session")
def misbehaving_app_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's app with tests/deploy/misbehaving_app.py as ClientApp (honest unless node_config says so)."""
    return make_app_dir(ROOT, tmp_path_factory.mktemp("misbehaving") / "app")
