"""Small synthetic CIFAR-like datasets for tests, checks and benchmarks: an ImageFolder tree of 32x32 JPEGs and a
.tar.gz of it.

Each class has its own mean colour plus noise, so a model can learn something from a few hundred images.
"""

from __future__ import annotations

import tarfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

DEFAULT_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def make_image_folder(
    root: str | Path,
    per_class: int = 20,
    classes: Sequence[str] = DEFAULT_CLASSES,
    seed: int = 0,
    test_per_class: int | None = None,
    size: int = 32,
) -> Path:
    """Write ``root/{train,test}/<class>/NNNN.jpg`` and return ``root``.

    ``per_class`` train images and ``test_per_class`` (default: per_class // 2, at least 1) test images per class.
    """
    root = Path(root)
    rng = np.random.default_rng(seed)
    colours = rng.integers(30, 226, size=(len(classes), 3))
    counts = {"train": per_class, "test": test_per_class if test_per_class is not None else max(1, per_class // 2)}
    for split, count in counts.items():
        for c, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                noise = rng.normal(0, 25, size=(size, size, 3))
                pixels = np.clip(colours[c] + noise, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i:04d}.jpg", quality=90)
    return root


def make_tarball(folder: str | Path, out_path: str | Path, top_level: str | None = None) -> Path:
    """Pack ``folder/train`` and ``folder/test`` into a .tar.gz (optionally under one top-level directory)."""
    folder, out_path = Path(folder), Path(out_path)
    with tarfile.open(out_path, "w:gz") as archive:
        for split in ("train", "test"):
            archive.add(folder / split, arcname=f"{top_level}/{split}" if top_level else split)
    return out_path
