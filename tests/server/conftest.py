"""Shared fixture of the end-to-end tests: small generated CIFAR-like data (helpers: simcli.py)."""

import pytest
from datagen import make_image_folder, make_tarball


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """A 10-class ImageFolder tree (12 train / 4 test images per class), its .tar.gz and a cache dir."""
    root = tmp_path_factory.mktemp("data")
    folder = make_image_folder(root / "folder", per_class=12, test_per_class=4, seed=1)
    tarball = make_tarball(folder, root / "tiny.tar.gz")
    return {"folder": folder, "tarball": tarball, "cache": root / "cache"}
