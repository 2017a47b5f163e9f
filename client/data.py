"""CIFAR-10 loading with a decode-once, memory-mapped cache shared by every client process.

Two sources (paper 1 §IV-B uses CIFAR-10):

- ``"cifar10"``: torchvision's ``CIFAR10`` (python pickles; downloaded into ``root`` when
  ``download=True`` and the machine is online);
- ``"cifar10_folder"``: an ImageFolder tree ``train/<class>/*``, ``test/<class>/*`` or a ``.tar.gz``
  (``.tgz``/``.tar``) of one. Classes are sorted alphabetically, as torchvision's ``ImageFolder`` does.

Either source is converted once per machine into ``x_train.npy`` (N, 32, 32, 3) uint8, ``y_train.npy``
int64, the same for the test split, and ``meta.json`` (classes, per-channel mean/std). The entry lives in
``<cache_dir>/<name>-<key>`` where ``key`` hashes the source's absolute path, size and mtime, so editing the
source invalidates it. Files are written to temporary names and renamed (``meta.json`` last, as the
completion marker) under an ``flock``, so concurrent client processes decode at most once and never read a
half-written cache. Arrays are opened with ``np.load(mmap_mode="r")``: loading costs milliseconds.

Normalisation uses the per-channel mean/std of the **train split of the loaded source** (pixels in [0, 1]),
computed once and stored in ``meta.json``. For the JPEG copy these differ slightly from the usual CIFAR-10
constants (``CIFAR10_MEAN``/``CIFAR10_STD``, kept for reference) because JPEG is lossy.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import tarfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

DATASETS = ("cifar10", "cifar10_folder")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp")
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)  # standard constants of the binary release (reference only)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CACHE_VERSION = 1

T = TypeVar("T")
DECODE_STATS = {"decoded": 0}  # how many times this process built a cache entry (tests read it)


@dataclass(frozen=True)
class Dataset:
    """Train/test arrays of one dataset (read-only memory maps when they come from the cache)."""

    x_train: np.ndarray  # (N, 32, 32, 3) uint8
    y_train: np.ndarray  # (N,) int64
    x_test: np.ndarray
    y_test: np.ndarray
    classes: tuple[str, ...]
    mean: tuple[float, float, float]  # per-channel mean of x_train / 255
    std: tuple[float, float, float]
    cache_path: Path

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def default_cache_dir() -> Path:
    """``$FEDMOMENTUM_CACHE`` or ``~/.cache/fedmomentum``."""
    return Path(os.environ.get("FEDMOMENTUM_CACHE", Path.home() / ".cache" / "fedmomentum"))


# --------------------------------------------------------------------------- public API
def load_dataset(
    name: str, root: str | os.PathLike, cache_dir: str | os.PathLike | None = None, download: bool = False
) -> Dataset:
    """Load ``name`` ("cifar10" | "cifar10_folder") from ``root``, decoding only when no cache entry exists.

    Raises FileNotFoundError (naming the path) for a missing source, ValueError for an unknown name or a
    malformed tree, before any decoding.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; expected one of {DATASETS}")
    root = Path(root).expanduser().absolute()
    if name == "cifar10":
        source = _torchvision_source(root, download)
    else:
        if not root.exists():
            raise FileNotFoundError(f"dataset source not found: {root}")
        source = root
    entry = cache_entry(name, source, cache_dir)

    def build() -> None:
        arrays, classes = _decode_torchvision(root) if name == "cifar10" else _decode_folder(source)
        _write_entry(entry, arrays, classes, str(source))

    return cached_entry(entry, build, lambda: _read_entry(entry))


def normalisation_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 images (N, H, W, 3) scaled to [0, 1], exact from 256-bin histograms."""
    values = np.arange(256, dtype=np.float64) / 255.0
    mean, std = [], []
    for c in range(x.shape[-1]):
        counts = np.bincount(np.asarray(x[..., c]).ravel(), minlength=256).astype(np.float64)
        m = float(counts @ values / counts.sum())
        mean.append(m)
        std.append(float(np.sqrt(max(counts @ (values - m) ** 2 / counts.sum(), 0.0))))
    return tuple(mean), tuple(std)


# --------------------------------------------------------------------------- cache entry
def cache_entry(name: str, source: Path, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache folder of ``source`` (complete once it holds ``meta.json``)."""
    return Path(cache_dir or default_cache_dir()).expanduser().absolute() / f"{name}-{_source_key(name, source)}"


def _source_key(name: str, source: Path) -> str:
    """Hash of the source's path and content: a file by its bytes (a touched or re-copied archive keeps its entry),
    a directory by size and mtime of every split and class directory."""
    parts = [f"v{CACHE_VERSION}", name, str(source)]
    if source.is_file():
        parts.append(_file_digest(source))
    else:
        paths = [source, *sorted(p for split in ("train", "test") for p in [source / split, *_subdirs(source / split)])]
        for p in paths:
            if p.exists():
                st = p.stat()
                parts.append(f"{p.name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


_DIGESTS: dict[tuple, str] = {}  # (path, inode, size, mtime, ctime) -> sha256 of the bytes, per process


def _file_digest(path: Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks (CIFAR-10's archives: 20-170 MB, under a second)."""
    st = path.stat()
    memo = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)  # any write changes ctime
    if memo not in _DIGESTS:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _DIGESTS[memo] = f"{st.st_size}:{digest.hexdigest()}"
    return _DIGESTS[memo]


def _subdirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir()) if path.is_dir() else []


class BrokenCacheEntry(ValueError):
    """A complete cache entry (it has ``meta.json``) whose files cannot be read or do not fit together."""


def cached_entry(entry: Path, build: Callable[[], None], read: Callable[[], T]) -> T:
    """``read()`` of the cache entry ``entry``, built first by ``build()`` (once per machine: under the entry's lock,
    ``meta.json`` written last) when it is not complete, and built again when ``read`` finds it broken
    (:class:`BrokenCacheEntry`: a file cut short, changed or removed; a warning names the entry and why)."""
    if (entry / "meta.json").exists():
        try:
            return read()
        except BrokenCacheEntry as err:
            logging.getLogger("flwr").warning("cache entry %s cannot be read (%s): building it again", entry, err)
    entry.mkdir(parents=True, exist_ok=True)
    with locked(entry / ".lock"):
        if (entry / "meta.json").exists():
            try:
                return read()  # complete and readable: another process built it meanwhile
            except BrokenCacheEntry:
                for stale in [p for p in entry.iterdir() if p.name != ".lock" and p.is_file()]:
                    stale.unlink()  # readers that map a file keep it until they let go
        for stale in entry.glob(".*.tmp"):  # left by a build that was killed (only the lock's holder writes them)
            stale.unlink()
        try:
            build()
        except OSError as err:  # e.g. a full disk: the partial files go (they hold its room), the error names them
            for part in [p for p in entry.iterdir() if p.name != ".lock" and p.is_file()]:
                part.unlink(missing_ok=True)
            if err.errno is None:  # numpy's short write ("N requested and M written")
                short = "a short write: the disk is full, or a quota or a file-size limit was reached"
                raise OSError(errno.ENOSPC, short, str(entry)) from None
            raise
    return read()


def unreadable(err: BaseException) -> BrokenCacheEntry:
    """The :class:`BrokenCacheEntry` of an error reading an entry's files: its type and first line."""
    lines = str(err).strip().splitlines()
    return BrokenCacheEntry(f"{type(err).__name__}: {lines[0][:200] if lines else ''}")


def check_entry(condition: bool, what: str) -> None:
    """:class:`BrokenCacheEntry` saying ``what`` unless ``condition``."""
    if not condition:
        raise BrokenCacheEntry(what)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Exclusive advisory lock (POSIX flock); a no-op where fcntl does not exist."""
    with open(path, "a") as handle:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - non-POSIX
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _atomic_save(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        np.save(handle, array)
    os.replace(tmp, path)


def _write_entry(entry: Path, arrays: dict[str, np.ndarray], classes: list[str], source: str) -> None:
    """Write the four arrays, then meta.json (the completion marker), each atomically."""
    for key, array in arrays.items():
        _atomic_save(entry / f"{key}.npy", array)
    mean, std = normalisation_stats(arrays["x_train"])
    meta = {
        "version": CACHE_VERSION,
        "source": source,
        "classes": classes,
        "mean": mean,
        "std": std,
        "num_train": len(arrays["y_train"]),
        "num_test": len(arrays["y_test"]),
    }
    tmp = entry / f".meta.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, entry / "meta.json")
    DECODE_STATS["decoded"] += 1


def _read_entry(entry: Path) -> Dataset:
    """The entry's arrays (memory maps) and ``meta.json``, checked to fit together; :class:`BrokenCacheEntry` else."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        arrays = {k: np.load(entry / f"{k}.npy", mmap_mode="r") for k in ("x_train", "y_train", "x_test", "y_test")}
        ds = Dataset(
            **arrays,
            classes=tuple(str(c) for c in meta["classes"]),
            mean=tuple(float(m) for m in meta["mean"]),
            std=tuple(float(s) for s in meta["std"]),
            cache_path=entry,
        )
    except (OSError, ValueError, EOFError, KeyError, TypeError) as err:
        raise unreadable(err) from None
    for split in ("train", "test"):
        x, y = getattr(ds, f"x_{split}"), getattr(ds, f"y_{split}")
        check_entry(x.dtype == np.uint8 and x.ndim == 4 and x.shape[-1] == 3, f"x_{split} is {x.dtype}{x.shape}")
        check_entry(
            y.dtype == np.int64 and y.shape == (len(x),), f"y_{split} is {y.dtype}{y.shape} for {len(x)} images"
        )
        check_entry(
            not len(y) or 0 <= y.min() <= y.max() < len(ds.classes), f"y_{split} has labels outside the classes"
        )
    check_entry(len(ds.mean) == len(ds.std) == 3, "meta.json's mean or std is not per channel")
    return ds


# --------------------------------------------------------------------------- torchvision source
def _torchvision_source(root: Path, download: bool) -> Path:
    """The ``cifar-10-batches-py`` directory under ``root``, downloading it first when allowed."""
    batches = root / "cifar-10-batches-py"
    if not batches.is_dir():
        if not download:
            raise FileNotFoundError(f"CIFAR-10 (torchvision format) not found under {root} and download=False")
        with quiet_torchvision():
            from torchvision.datasets import CIFAR10

        CIFAR10(str(root), train=True, download=True)
    return batches


@contextlib.contextmanager
def quiet_torchvision() -> Iterator[None]:
    """Use torchvision without its warning (at import and on every ``decode_jpeg``) that ``torchvision.io``
    decoding is deprecated in favour of TorchCodec (0.29+): we decode JPEGs once per machine with the pinned
    version, and users need not see it."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="The image decoding and encoding capabilities of TorchVision", category=DeprecationWarning
        )
        yield


def _decode_torchvision(root: Path) -> tuple[dict[str, np.ndarray], list[str]]:
    with quiet_torchvision():
        from torchvision.datasets import CIFAR10

    train, test = CIFAR10(str(root), train=True), CIFAR10(str(root), train=False)
    arrays = {
        "x_train": np.ascontiguousarray(train.data, dtype=np.uint8),
        "y_train": np.asarray(train.targets, dtype=np.int64),
        "x_test": np.ascontiguousarray(test.data, dtype=np.uint8),
        "y_test": np.asarray(test.targets, dtype=np.int64),
    }
    return arrays, list(train.classes)


# --------------------------------------------------------------------------- ImageFolder source
def _iter_folder(root: Path) -> Iterator[tuple[str, bytes]]:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            yield path.relative_to(root).as_posix(), path.read_bytes()


def _iter_tar(path: Path) -> Iterator[tuple[str, bytes]]:
    with tarfile.open(path, "r:*") as archive:
        for member in archive:
            if member.isfile():
                handle = archive.extractfile(member)
                if handle is not None:
                    yield member.name, handle.read()


def _decode_folder(source: Path) -> tuple[dict[str, np.ndarray], list[str]]:
    """Read every image of an ImageFolder tree (or archive of one) and decode it to (N, 32, 32, 3) uint8."""
    if source.is_file() and not tarfile.is_tarfile(source):
        raise ValueError(f"{source} is neither a directory nor a tar archive")
    files = _iter_folder(source) if source.is_dir() else _iter_tar(source)
    by_split: dict[str, dict[str, list[tuple[str, bytes]]]] = {"train": {}, "test": {}}
    for name, blob in files:
        key = split_and_class(name)
        if key is not None:
            by_split[key[0]].setdefault(key[1], []).append((name, blob))
    if not by_split["train"] or not by_split["test"]:
        raise ValueError(f"{source} has no train/<class>/<image> and test/<class>/<image> files")
    classes = sorted(set(by_split["train"]) | set(by_split["test"]))
    arrays: dict[str, np.ndarray] = {}
    for split, per_class in by_split.items():
        names, blobs, labels = [], [], []
        for label, cls in enumerate(classes):
            for name, blob in sorted(per_class.get(cls, [])):  # files sorted by name within a class
                names.append(name)
                blobs.append(blob)
                labels.append(label)
        arrays[f"x_{split}"] = decode_images(blobs, names=names)
        arrays[f"y_{split}"] = np.asarray(labels, dtype=np.int64)
    return arrays, classes


def split_and_class(name: str) -> tuple[str, str] | None:
    """("train" | "test", class) of an image path inside an ImageFolder tree, or None for any other file.

    The layout rule of every ImageFolder source: ``[top/]split/class/image`` (an optional top-level directory).
    """
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if len(parts) >= 3 and parts[-3] in ("train", "test") and Path(parts[-1]).suffix.lower() in IMAGE_SUFFIXES:
        return parts[-3], parts[-2]
    return None


class BadImage(ValueError):
    """An image of a dataset source that cannot be decoded, or is not size x size; the message names the file."""


def decode_images(blobs: list[bytes], size: int = 32, names: Sequence[str] | None = None) -> np.ndarray:
    """Decode encoded images to (N, size, size, 3) uint8: libjpeg-turbo batches via torchvision (~6x faster
    than PIL per image here, identical pixels), PIL for other formats. Images must already be size x size; one that
    is not, or cannot be decoded, raises :class:`BadImage` naming it (``names``: the files' names)."""
    import torch

    with quiet_torchvision():
        from torchvision.io import ImageReadMode, decode_jpeg

    def name(i: int) -> str:
        return names[i] if names is not None else f"image {i}"

    def one_jpeg(i: int) -> torch.Tensor:
        try:
            with quiet_torchvision():
                return decode_jpeg(torch.frombuffer(bytearray(blobs[i]), dtype=torch.uint8), mode=ImageReadMode.RGB)
        except RuntimeError as err:  # torchvision's message: "decode_jpeg, <source file:line>, <reason>"
            raise BadImage(f"{name(i)} cannot be decoded ({_first_line(err).rsplit(', ', 1)[-1]})") from None

    out = np.empty((len(blobs), size, size, 3), dtype=np.uint8)
    jpeg = [i for i, b in enumerate(blobs) if b[:3] == b"\xff\xd8\xff"]
    for start in range(0, len(jpeg), 4096):
        chunk = jpeg[start : start + 4096]
        tensors = [torch.frombuffer(bytearray(blobs[i]), dtype=torch.uint8) for i in chunk]
        try:
            with quiet_torchvision():  # it warns on every call
                images = decode_jpeg(tensors, mode=ImageReadMode.RGB)
        except RuntimeError:  # a corrupt file fails the whole batch: find it
            images = [one_jpeg(i) for i in chunk]
        for i, img in zip(chunk, images):
            out[i] = _check_size(img.permute(1, 2, 0).numpy(), size, name(i))
    other = sorted(set(range(len(blobs))) - set(jpeg))
    if other:
        import io

        from PIL import Image

        for i in other:
            try:
                img = np.asarray(Image.open(io.BytesIO(blobs[i])).convert("RGB"))
            except Exception as err:  # whatever PIL raises for a file it cannot read
                raise BadImage(f"{name(i)} cannot be decoded ({type(err).__name__}: {_first_line(err)})") from None
            out[i] = _check_size(img, size, name(i))
    return out


def _first_line(err: BaseException) -> str:
    """The first line of ``err``'s message without object reprs (``<_io.BytesIO object at 0x...>``)."""
    return re.sub(r" ?<[^>]* at 0x[0-9a-f]+>", "", (str(err).strip().splitlines() or [""])[0])[:200]


def _check_size(img: np.ndarray, size: int, name: str) -> np.ndarray:
    if img.shape != (size, size, 3):
        raise BadImage(f"{name} is {img.shape[1]}x{img.shape[0]} pixels, expected {size}x{size}")
    return img
