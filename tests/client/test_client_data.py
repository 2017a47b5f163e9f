"""Dataset loading and its cache (client/data.py)."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from client import data
from client.data import DECODE_STATS, load_dataset, normalisation_stats

ROOT = Path(__file__).resolve().parents[2]
NUM_CLASSES, PER_CLASS, TEST_PER_CLASS = 4, 25, 12  # the image_folder fixture of conftest.py


def test_folder_layout_and_labels(image_folder: Path, tmp_path: Path) -> None:
    ds = load_dataset("cifar10_folder", image_folder, tmp_path)
    assert ds.classes == ("airplane", "bird", "cat", "dog")  # sorted like ImageFolder
    assert ds.x_train.shape == (NUM_CLASSES * PER_CLASS, 32, 32, 3) and ds.x_train.dtype == np.uint8
    assert ds.y_train.dtype == np.int64 and np.bincount(ds.y_train).tolist() == [PER_CLASS] * NUM_CLASSES
    assert ds.x_test.shape[0] == len(ds.y_test) == NUM_CLASSES * TEST_PER_CLASS
    assert isinstance(ds.x_train, np.memmap)
    # pixels equal PIL's decoding of the files (class "bird" is label 1, first file 0000.jpg)
    first_bird = int(np.flatnonzero(ds.y_train == 1)[0])
    expected = np.asarray(Image.open(image_folder / "train" / "bird" / "0000.jpg").convert("RGB"))
    np.testing.assert_array_equal(ds.x_train[first_bird], expected)


def test_folder_and_tarball_identical(image_folder: Path, tarball: Path, tmp_path: Path) -> None:
    a = load_dataset("cifar10_folder", image_folder, tmp_path)
    b = load_dataset("cifar10_folder", tarball, tmp_path)
    assert a.cache_path != b.cache_path
    for key in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key))
    assert a.classes == b.classes and a.mean == b.mean and a.std == b.std


def test_cache_is_reused_and_invalidated(tarball: Path, tmp_path: Path) -> None:
    before = DECODE_STATS["decoded"]
    first = load_dataset("cifar10_folder", tarball, tmp_path)
    assert DECODE_STATS["decoded"] == before + 1
    meta_mtime = (first.cache_path / "meta.json").stat().st_mtime_ns
    second = load_dataset("cifar10_folder", tarball, tmp_path)
    assert DECODE_STATS["decoded"] == before + 1  # no second decode
    assert second.cache_path == first.cache_path
    assert (first.cache_path / "meta.json").stat().st_mtime_ns == meta_mtime
    assert not list(first.cache_path.glob("*.tmp"))
    copy = tmp_path / "copy.tar.gz"  # another source path gets its own entry
    copy.write_bytes(tarball.read_bytes())
    entry = load_dataset("cifar10_folder", copy, tmp_path).cache_path
    assert entry != first.cache_path and DECODE_STATS["decoded"] == before + 2
    os.utime(copy, ns=(1, 1))  # touched, same bytes: the same entry, no decode
    assert load_dataset("cifar10_folder", copy, tmp_path).cache_path == entry
    assert DECODE_STATS["decoded"] == before + 2
    changed = bytearray(copy.read_bytes())  # modified in place with its size and mtime kept: a new entry
    changed[-1] ^= 0xFF
    copy.write_bytes(bytes(changed))
    os.utime(copy, ns=(1, 1))
    assert data.cache_entry("cifar10_folder", copy, tmp_path) != entry


# A child interpreter: import, say ready, wait for "go" (all three load at once), load, print its decode count.
CHILD = """
import sys, time
from pathlib import Path
from client.data import DECODE_STATS, load_dataset
ready, go = Path(sys.argv[3]), Path(sys.argv[4])
ready.touch()
while not go.exists():
    time.sleep(0.01)
load_dataset("cifar10_folder", sys.argv[1], sys.argv[2])
print(DECODE_STATS["decoded"])
"""


def test_concurrent_processes_decode_once(tarball: Path, tmp_path: Path) -> None:
    """Three fresh processes load the same source at once: exactly one decodes (the cache's flock), every one gets
    the data. Fresh interpreters, not forks of this (threaded) test worker: a fork can inherit a held lock."""
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(3)]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tarball), str(tmp_path / "cache"), str(r), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for r in ready
    ]
    try:
        while not all(r.exists() for r in ready):
            assert all(c.poll() is None for c in children), [c.communicate() for c in children]
            time.sleep(0.01)
        go.touch()
        outs = [c.communicate(timeout=120) for c in children]
    finally:
        for c in children:
            c.kill()
    assert [c.returncode for c in children] == [0, 0, 0], outs
    assert sorted(int(out.split()[-1]) for out, _ in outs) == [0, 0, 1]
    ds = load_dataset("cifar10_folder", tarball, tmp_path / "cache")
    assert len(ds.y_train) == NUM_CLASSES * PER_CLASS


def test_missing_sources_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.tar.gz"
    with pytest.raises(FileNotFoundError, match="nope.tar.gz"):
        load_dataset("cifar10_folder", missing, tmp_path / "cache")
    with pytest.raises(FileNotFoundError, match="download=False"):
        load_dataset("cifar10", tmp_path / "tv", tmp_path / "cache", download=False)
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("mnist", tmp_path, tmp_path / "cache")
    assert not (tmp_path / "cache").exists()  # nothing was started


def test_malformed_sources(tmp_path: Path) -> None:
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.jpg").write_bytes(b"")
    with pytest.raises(ValueError, match="train/<class>"):
        load_dataset("cifar10_folder", tmp_path / "flat", tmp_path / "cache")
    (tmp_path / "junk.bin").write_bytes(b"not a tar")
    with pytest.raises(ValueError, match="neither"):
        load_dataset("cifar10_folder", tmp_path / "junk.bin", tmp_path / "cache")


def test_normalisation_stats_match_numpy() -> None:
    x = np.random.default_rng(0).integers(0, 256, size=(50, 32, 32, 3), dtype=np.uint8)
    mean, std = normalisation_stats(x)
    flat = x.reshape(-1, 3) / 255.0
    np.testing.assert_allclose(mean, flat.mean(0), rtol=1e-12)
    np.testing.assert_allclose(std, flat.std(0), rtol=1e-10)


def test_default_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FEDMOMENTUM_CACHE", str(tmp_path))
    assert data.default_cache_dir() == tmp_path
    monkeypatch.delenv("FEDMOMENTUM_CACHE")
    assert data.default_cache_dir() == Path(os.path.expanduser("~")) / ".cache" / "fedmomentum"


def test_an_image_that_cannot_be_used_is_named(image_folder: Path) -> None:
    """A corrupt JPEG in a batch of good ones, bytes of no image format, an image of another size: BadImage naming
    the file; the good images alone decode to the same pixels as before."""
    files = sorted((image_folder / "train").rglob("*.*"))[:6]
    blobs, names = [f.read_bytes() for f in files], [f.name for f in files]
    good = data.decode_images(blobs, names=names)
    buffer = io.BytesIO()
    Image.new("RGB", (40, 32)).save(buffer, format="PNG")
    jpeg = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(jpeg, format="JPEG")
    for bad, words in (
        (jpeg.getvalue()[:150], "cannot be decoded ("),
        (b"no pixels here", "cannot be decoded (UnidentifiedImageError: cannot identify image file)"),
        (buffer.getvalue(), "is 40x32 pixels, expected 32x32"),
    ):
        with pytest.raises(data.BadImage, match=re.escape(f"bad.jpg {words}")):
            data.decode_images([*blobs[:3], bad, *blobs[3:]], names=[*names[:3], "bad.jpg", *names[3:]])
    assert np.array_equal(data.decode_images(blobs), good)


def _labels_out_of_range(entry: Path) -> None:
    np.save(entry / "y_train.npy", np.full(len(np.load(entry / "y_train.npy")), 99, dtype=np.int64))


BROKEN_ENTRIES = {
    "an array cut short": (lambda e: os.truncate(e / "x_train.npy", 100), "ValueError: "),
    "meta.json not JSON": (lambda e: (e / "meta.json").write_text("{not json"), "JSONDecodeError: "),
    "an array missing": (lambda e: (e / "y_test.npy").unlink(), "FileNotFoundError: "),
    "labels out of range": (_labels_out_of_range, "y_train has labels outside the classes"),
    "images of another dtype": (
        lambda e: np.save(e / "x_test.npy", np.load(e / "x_test.npy").astype(np.float32)),
        "x_test is float32",
    ),
}


def test_a_killed_build_s_files_are_removed_when_the_entry_is_built(tarball: Path, tmp_path: Path) -> None:
    entry = data.cache_entry("cifar10_folder", tarball.absolute(), tmp_path)
    entry.mkdir(parents=True)
    (entry / ".x_train.npy.999999.tmp").write_bytes(b"a killed build's half")  # no meta.json: not complete
    built = load_dataset("cifar10_folder", tarball, tmp_path)
    assert built.cache_path == entry and not list(entry.glob("*.tmp")) and not list(entry.glob(".*.tmp"))


@pytest.mark.parametrize("name", list(BROKEN_ENTRIES))
def test_a_broken_cache_entry_is_decoded_again(tarball: Path, tmp_path: Path, caplog, name: str) -> None:
    """A complete entry (it has meta.json) whose files cannot be read or do not fit together: a warning naming the
    entry and why, then the entry is built again, with the same arrays (it was a stack trace, on every run)."""
    good = load_dataset("cifar10_folder", tarball, tmp_path)
    expected = {k: np.array(getattr(good, k)) for k in ("x_train", "y_train", "x_test", "y_test")}
    breaks, why = BROKEN_ENTRIES[name]
    breaks(good.cache_path)
    before = DECODE_STATS["decoded"]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        again = load_dataset("cifar10_folder", tarball, tmp_path)
    assert DECODE_STATS["decoded"] == before + 1 and again.cache_path == good.cache_path
    assert all(np.array_equal(getattr(again, k), v) for k, v in expected.items())
    assert (again.mean, again.std, again.classes) == (good.mean, good.std, good.classes)
    [warning] = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert warning.startswith(f"cache entry {good.cache_path} cannot be read (") and why in warning, warning
    load_dataset("cifar10_folder", tarball, tmp_path)
    assert DECODE_STATS["decoded"] == before + 1  # whole again: read, not decoded


def test_a_folder_source_needs_cifar10_s_ten_classes_in_train_and_no_other_in_test(tmp_path: Path) -> None:
    """A test class that train/ lacks (a misnamed folder) or a class count other than the models' 10 outputs made
    the first round a stack trace (model arrays of 11 or 9 rows against 10); now one line before any work."""
    from client.datacheck import DataSourceError, check_source
    from tools.datagen import make_image_folder

    root = make_image_folder(tmp_path / "src", per_class=1, test_per_class=1)
    assert check_source("cifar10_folder", root, tmp_path / "cache").num_classes == 10
    (root / "test" / "cat").rename(root / "test" / "kitten")
    with pytest.raises(DataSourceError, match=r"src: test/kitten is no class of train/ \(1 such class\(es\)\)"):
        check_source("cifar10_folder", root, tmp_path / "cache")
    (root / "test" / "kitten").rename(root / "test" / "cat")
    for split in ("train", "test"):
        for image in (root / split / "dog").iterdir():
            image.unlink()
        (root / split / "dog").rmdir()
    with pytest.raises(DataSourceError, match=r"src holds 9 classes; CIFAR-10's models have 10 outputs"):
        check_source("cifar10_folder", root, tmp_path / "cache")
