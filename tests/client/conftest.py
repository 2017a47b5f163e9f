"""Fixtures of the client tests: a small synthetic ImageFolder tree and its .tar.gz (see tools/datagen.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tools.datagen import make_image_folder, make_tarball

PER_CLASS, TEST_PER_CLASS = 25, 12  # test_client_data.py and test_client_app.py rely on these sizes


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    classes = ("cat", "airplane", "dog", "bird")  # deliberately unsorted: loading must sort them
    return make_image_folder(
        tmp_path_factory.mktemp("imgs") / "data",
        per_class=PER_CLASS,
        classes=classes,
        seed=0,
        test_per_class=TEST_PER_CLASS,
    )


@pytest.fixture(scope="session")
def tarball(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tarball(image_folder, tmp_path_factory.mktemp("tar") / "data.tar.gz")


@pytest.fixture(scope="module")
def client_data() -> tuple[np.ndarray, np.ndarray]:
    """40 random 32x32 RGB images (uint8) and labels, for the training tests."""
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(40, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, size=40)
