"""Cheap checks of a dataset source before any work starts, and the one-off CIFAR-10 download.

:func:`check_source` answers "will :func:`client.data.load_dataset` read this source, and how many examples
does it hold?" without decoding an image, so a bad ``data.root`` fails in a second with a one-line message
instead of as a traceback inside Ray:

- a complete decode-cache entry of the source (same key as ``load_dataset``: path, size, mtime) is trusted,
  so every look after the first is free;
- a folder is walked (names only) with the decoder's own layout rule, :func:`client.data.split_and_class`;
- an archive (``.tar``, ``.tar.gz``/``.tgz``, ``.tar.bz2``, ``.tar.xz``) is streamed once through its tar
  headers (1-3 s for the 60,000 JPEGs of CIFAR-10 on a 2-core machine; Python's ``tarfile`` took 4-10x
  longer), so a file that is not a tar archive, or one that is truncated or corrupt, is caught here;
- torchvision's CIFAR-10 folder must hold its batch files (10,000 images each).

Every failure is a :class:`DataSourceError` (a ``ValueError``) whose message names the path.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import json
import lzma
import os
import socket
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from client.data import DATASETS, cache_entry, default_cache_dir, quiet_torchvision, split_and_class
from server.run.errors import folder_problem

BLOCK = 512  # tar header and data block size
CIFAR10_BATCHES = "cifar-10-batches-py"
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_FILES = (*CIFAR10_TRAIN_FILES, "test_batch", "batches.meta")
CIFAR10_IMAGES_PER_FILE = 10_000
DOWNLOAD_TIMEOUT = 60.0  # seconds without an answer from the download server


FOLDER_CLASSES = 10  # an ImageFolder source is CIFAR-10's: the cnn, resnet20 and logreg models have 10 outputs


class DataSourceError(ValueError):
    """A dataset source that cannot be loaded; the message names the path and the reason."""


@dataclass(frozen=True)
class SourceSummary:
    """What a cheap look at a source found."""

    num_train: int
    num_test: int
    num_classes: int
    from_cache: bool  # a complete decode-cache entry answered


def check_source(
    name: str, root: str | os.PathLike, cache_dir: str | os.PathLike | None = None, download: bool = False
) -> SourceSummary | None:
    """Check that ``load_dataset(name, root, cache_dir, download)`` will find a readable source.

    Returns its example counts, or None for torchvision's CIFAR-10 when it is missing but ``download`` is
    true (it is fetched by :func:`download_cifar10` first). Raises :class:`DataSourceError`.
    """
    if name not in DATASETS:
        raise DataSourceError(f"unknown dataset {name!r}; expected one of {DATASETS}")
    root = Path(root).expanduser().absolute()
    if name == "cifar10":
        return _check_torchvision(root, cache_dir, download)
    if not root.exists():
        raise DataSourceError(f"no ImageFolder tree or .tar.gz at {root}")
    try:
        entry = cache_entry(name, root, cache_dir)  # an archive's key hashes its bytes: the first full read
    except OSError as err:
        raise DataSourceError(f"cannot read {root}: {err.strerror or err}") from None
    summary = _check_folder_source(str(root), str(entry))
    if summary.num_classes != FOLDER_CLASSES:
        raise DataSourceError(
            f"{root} holds {summary.num_classes} classes; CIFAR-10's models have {FOLDER_CLASSES} outputs: give "
            f"train/ and test/ one folder per class, {FOLDER_CLASSES} in all"
        )
    return summary


def download_cifar10(root: str | os.PathLike, timeout: float = DOWNLOAD_TIMEOUT) -> None:
    """Fetch torchvision's CIFAR-10 into ``root`` unless it is there; DataSourceError with the reason if not."""
    root = Path(root).expanduser().absolute()
    if _missing_cifar10_files(root / CIFAR10_BATCHES) is None:
        return
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout)  # torchvision opens the URL without a timeout
    try:
        with quiet_torchvision():
            from torchvision.datasets import CIFAR10

            CIFAR10(str(root), train=True, download=True)
    except Exception as err:  # network, disk or checksum: all end as one line
        reason = getattr(err, "reason", None) or err
        raise DataSourceError(f"could not download CIFAR-10 into {root}: {str(reason).splitlines()[0]}") from None
    finally:
        socket.setdefaulttimeout(previous)


def check_cache_dir(cache_dir: str | os.PathLike | None) -> None:
    """The decode cache must be a folder this process can create and write into (created here if need be)."""
    path = Path(cache_dir or default_cache_dir()).expanduser().absolute()
    why = folder_problem(path)
    if why is not None:
        raise DataSourceError(f"cannot create or write the decode cache {path} ({why})")


# --------------------------------------------------------------------------- torchvision CIFAR-10
def _missing_cifar10_files(batches: Path) -> str | None:
    return next((f for f in CIFAR10_FILES if not (batches / f).is_file()), None)


def _check_torchvision(root: Path, cache_dir: str | os.PathLike | None, download: bool) -> SourceSummary | None:
    batches = root / CIFAR10_BATCHES
    missing = _missing_cifar10_files(batches)
    if missing is not None:
        if download:
            return None
        raise DataSourceError(
            f"no torchvision CIFAR-10 under {root} ({batches} lacks {missing}) and data.download is false"
        )
    for file in CIFAR10_FILES:
        _readable(batches / file)
    meta = _cached_meta(cache_entry("cifar10", batches, cache_dir))
    if meta is not None:
        return meta
    return SourceSummary(len(CIFAR10_TRAIN_FILES) * CIFAR10_IMAGES_PER_FILE, CIFAR10_IMAGES_PER_FILE, 10, False)


# --------------------------------------------------------------------------- ImageFolder tree or archive
@functools.lru_cache(maxsize=16)
def _check_folder_source(root: str, entry: str) -> SourceSummary:
    """Memoised per (source, cache entry): the entry's name changes with the source's size and mtime."""
    meta = _cached_meta(Path(entry))
    if meta is not None:
        return meta
    path = Path(root)
    if path.is_dir():
        names = list(_folder_names(path))
        if not names:
            raise DataSourceError(f"{path} is an empty folder")
    else:
        names = list(_tar_member_names(path))
    counts: dict[str, dict[str, int]] = {"train": {}, "test": {}}
    for name in names:
        key = split_and_class(name)
        if key is not None:
            counts[key[0]][key[1]] = counts[key[0]].get(key[1], 0) + 1
    if not counts["train"] or not counts["test"]:
        raise DataSourceError(f"{path} has no train/<class>/<image> and test/<class>/<image> files")
    untrained = sorted(set(counts["test"]) - set(counts["train"]))
    if untrained:  # a class no client trains on: a misnamed folder, most likely
        raise DataSourceError(f"{path}: test/{untrained[0]} is no class of train/ ({len(untrained)} such class(es))")
    return SourceSummary(
        sum(counts["train"].values()),
        sum(counts["test"].values()),
        len(set(counts["train"]) | set(counts["test"])),
        False,
    )


def _cached_meta(entry: Path) -> SourceSummary | None:
    try:
        meta = json.loads((entry / "meta.json").read_text())
        return SourceSummary(int(meta["num_train"]), int(meta["num_test"]), len(meta["classes"]), True)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _folder_names(root: Path) -> Iterator[str]:
    for folder, _, files in os.walk(root):
        rel = Path(folder).relative_to(root)
        for file in files:
            yield (rel / file).as_posix()


def _readable(path: Path) -> None:
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as err:
        raise DataSourceError(f"cannot read {path}: {err.strerror or err}") from None


def _open_archive(path: Path) -> IO[bytes]:
    """The decompressed byte stream of a (possibly gzip/bzip2/xz-compressed) file."""
    _readable(path)
    with open(path, "rb") as handle:
        magic = handle.read(6)
    if magic[:2] == b"\x1f\x8b":
        return gzip.open(path, "rb")
    if magic[:3] == b"BZh":
        return bz2.open(path, "rb")
    if magic == b"\xfd7zXZ\x00":
        return lzma.open(path, "rb")
    return open(path, "rb")


def _tar_member_names(path: Path) -> Iterator[str]:
    """Names of the regular files of a tar archive, read once from start to end-of-archive."""
    try:
        with _open_archive(path) as stream:
            yield from _tar_headers(stream, path)
    except (EOFError, OSError, zlib.error, lzma.LZMAError) as err:
        raise DataSourceError(f"{path} is truncated or corrupt ({err})") from None


def _tar_headers(stream: IO[bytes], path: Path) -> Iterator[str]:
    long_name: str | None = None
    first = True
    while True:
        header = stream.read(BLOCK)
        if first and (len(header) < BLOCK or not _checksum_ok(header)):
            raise DataSourceError(f"{path} is neither a folder nor a tar archive (.tar, .tar.gz, .tgz, ...)")
        first = False
        if len(header) < BLOCK:
            raise EOFError("the archive ends inside a header")
        if header == bytes(BLOCK):  # end-of-archive marker
            return
        if not _checksum_ok(header):
            raise EOFError("a member header has a wrong checksum")
        size, kind = _number(header[124:136]), header[156:157]
        data = _read_exactly(stream, (size + BLOCK - 1) // BLOCK * BLOCK, keep=kind in (b"L", b"x"))
        if kind == b"L":  # GNU long name of the next member
            long_name = data[:size].rstrip(b"\0").decode("utf-8", "replace")
        elif kind == b"x":  # pax extended header: "<len> path=<name>\n" records
            long_name = _pax_path(data[:size]) or long_name
        else:
            if kind in (b"0", b"\0", b"7"):
                yield long_name or _ustar_name(header)
            long_name = None


def _read_exactly(stream: IO[bytes], size: int, keep: bool) -> bytes:
    chunks = []
    while size > 0:
        chunk = stream.read(min(size, 1 << 20))
        if not chunk:
            raise EOFError("the archive ends inside a member")
        size -= len(chunk)
        if keep:
            chunks.append(chunk)
    return b"".join(chunks)


def _checksum_ok(header: bytes) -> bool:
    try:
        stored = _number(header[148:156])
    except ValueError:
        return False
    unsigned = sum(header) - sum(header[148:156]) + 8 * 32  # the checksum field counts as spaces
    if stored == unsigned:
        return True
    signed = unsigned - 256 * sum(1 for b in header[:148] + header[156:] if b > 127)  # old tars sign bytes
    return stored == signed


def _number(field: bytes) -> int:
    if field and field[0] & 0x80:  # GNU base-256 encoding of large sizes
        return int.from_bytes(field[1:], "big")
    text = field.rstrip(b"\0 ").lstrip(b" ").decode("ascii")
    return int(text, 8) if text else 0


def _ustar_name(header: bytes) -> str:
    name = header[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "replace")
        if prefix:
            return f"{prefix}/{name}"
    return name


def _pax_path(records: bytes) -> str | None:
    for line in records.decode("utf-8", "replace").splitlines():
        _, _, entry = line.partition(" ")
        if entry.startswith("path="):
            return entry[len("path=") :]
    return None
