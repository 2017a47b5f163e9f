"""Natural-partition federated datasets through ``flwr-datasets`` (paper 2 §8 and App. C).

A task (:class:`TaskSpec`) names its Hugging Face dataset, the column that identifies a natural client and how
rows become arrays. Its data come from, in order:

- ``root`` (``data.root``): a local copy in the hub schema — a folder saved by ``Dataset.save_to_disk`` /
  ``DatasetDict.save_to_disk``, or parquet files (one ``.parquet`` file, or a folder of them; a file or folder
  whose name starts with ``test`` is the test split, the rest is ``train``; they are streamed into one
  memory-mapped Arrow file per split under ``HF_DATASETS_CACHE``, a record batch at a time), or CSV files named
  the same way for the text tasks (the hub's ``flwrlabs/shakespeare`` is one ``shakespeare.csv``): read by
  ``datasets``' CSV builder, as the download is, but every field as the string it is (no type guessing, no
  "NA"/"null" turned into a missing value);
- otherwise, with ``download`` true, the hub copy through ``flwr_datasets.FederatedDataset`` (``datasets``
  caches the download in ``$HF_HOME``); a failed download is a :class:`DataSourceError` naming the dataset.

The train split is partitioned by the real ``flwr_datasets`` partitioner of the task (``NaturalIdPartitioner``
on the natural-id column, as its subclass ``ArrowNaturalIdPartitioner`` with lean index tables, or the task's own
``Partitioner`` subclass). Partition id ``p`` is the p-th natural id
in sorted order (``NaturalIdPartitioner``'s documented order), so ids are stable across runs and machines.

Encoding runs once per machine into a cache entry (like ``client.data``): every array is written partition by
partition, in partition-id order, straight into ``.npy`` memory maps (``np.lib.format.open_memmap``), so one
client's data is a contiguous slice, ``offsets[p]:offsets[p + 1]``, and a process holds no copy of the data
besides the page cache: the Arrow source is memory-mapped too. ``meta.json`` is written last (the completion
marker) under the same ``flock`` as ``client.data``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from client.data import BrokenCacheEntry, cached_entry, check_entry, default_cache_dir, unreadable
from client.datacheck import DataSourceError

CACHE_VERSION = 1
ENCODE_CHUNK = 4096
SPLITS = ("train", "test")


@dataclass(frozen=True)
class TaskSpec:
    """What one task needs: source, schema, partitioning, encoding and its examples."""

    name: str
    hub_name: str | None  # the default download; None: no published copy, a local copy is required
    partition_by: str  # the natural-id column (CIFAR-100: the column its own partitioner reads)
    columns: Mapping[str, str]  # required column -> what it must hold (for error messages)
    arrays: Callable[[Mapping[str, Any], int, Any], dict[str, tuple[tuple[int, ...], Any]]]  # (meta, n, split)
    encode: Callable[[Any, Mapping[str, Any]], dict[str, np.ndarray]]  # (rows, meta) -> arrays
    examples: Callable[[Mapping[str, np.ndarray], Mapping[str, Any], bool], Any]  # (arrays, meta, augment)
    prepare: Callable[[Any], dict[str, Any]] = lambda dataset: {}  # one pass over train (vocabularies, ...)
    partitioner: Callable[[int], Any] | None = None  # (seed) -> Partitioner; None: NaturalIdPartitioner
    extra: Mapping[str, Any] = field(default_factory=dict)
    arrow: bool = False  # encode takes pyarrow Tables of many clients' rows, not dicts of Python values
    hub_kwargs: Mapping[str, Any] = field(default_factory=dict)  # datasets.load_dataset options of the hub copy


@dataclass(frozen=True)
class NaturalData:
    """The memory-mapped arrays of one cache entry: per split, arrays in partition order plus offsets."""

    spec: TaskSpec
    meta: Mapping[str, Any]
    arrays: Mapping[str, Mapping[str, np.ndarray]]  # split -> name -> array
    offsets: np.ndarray  # (num_partitions + 1,) row offsets of the train split
    cache_path: Path

    @property
    def num_partitions(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_classes(self) -> int:
        return int(self.meta["num_outputs"])

    def client(self, partition_id: int, augment: bool = True) -> Any:
        """The Examples of training client ``partition_id`` (views, no copy)."""
        if not 0 <= partition_id < self.num_partitions:
            raise ValueError(f"partition-id {partition_id} outside [0, {self.num_partitions})")
        return self._rows("train", int(self.offsets[partition_id]), int(self.offsets[partition_id + 1]), augment)

    def split(self, split: str, stop: int | None = None) -> Any:
        """Examples of a whole split (``stop``: its first rows only), never augmented."""
        n = int(self.meta["num_rows"][split])
        return self._rows(split, 0, n if stop is None else min(stop, n), False)

    def _rows(self, split: str, start: int, stop: int, augment: bool) -> Any:
        arrays, views = self.arrays[split], {}
        for name, array in arrays.items():
            if name.endswith("_ptr"):  # ragged: row offsets into the flat array of the same name
                ptr = views[name] = array[start : stop + 1]
                views[name[: -len("_ptr")]] = arrays[name[: -len("_ptr")]][int(ptr[0]) : int(ptr[-1])]
            elif name + "_ptr" not in arrays:
                views[name] = array[start:stop]
        return self.spec.examples(views, self.meta, augment)


# --------------------------------------------------------------------------- sources
def source_key(spec: TaskSpec, root: str | None, seed: int) -> str:
    """Cache key: task, partitioner seed and the local copy's files (path, size, mtime) or the hub name."""
    parts = [f"v{CACHE_VERSION}", spec.name, str(seed) if spec.partitioner else ""]
    if root:
        path = Path(root)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        parts += _stamps(files)
    else:
        parts.append(f"hub:{spec.hub_name}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _stamps(files: list[Path] | list[str]) -> list[str]:
    """'path:size:mtime' of each file: what makes a cache built from them stale."""
    return [f"{f}:{os.stat(f).st_size}:{os.stat(f).st_mtime_ns}" for f in files]


def _local_files(path: Path, suffix: str) -> dict[str, list[str]]:
    """{split: files} of a local copy: ``path`` itself, or the ``suffix`` files under it."""
    files = [path] if path.is_file() else sorted(path.rglob(f"*{suffix}"))
    out: dict[str, list[str]] = {}
    for f in files:
        rel = f.relative_to(path) if path.is_dir() else Path(f.name)
        split = "test" if any(part.startswith("test") for part in rel.parts) else "train"
        out.setdefault(split, []).append(str(f))
    return out


def open_source(spec: TaskSpec, root: str | None, download: bool) -> dict[str, Any]:
    """{"train": datasets.Dataset, ["test": ...]} of a local copy or of the hub (DataSourceError otherwise)."""
    import datasets

    datasets.disable_progress_bars()
    if root:
        path = Path(root).expanduser().absolute()
        if not path.exists():
            raise DataSourceError(
                f"no local copy of {spec.name} at {path} (a saved Hugging Face dataset or parquet files)"
            )
        try:
            if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
                loaded = datasets.load_from_disk(str(path))
                splits = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
            elif path.suffix == ".csv" or (
                path.is_dir() and not any(path.rglob("*.parquet")) and any(path.rglob("*.csv"))
            ):
                splits = _from_csv(_local_files(path, ".csv"))
            else:
                files = _local_files(path, ".parquet")
                if "train" not in files:
                    raise DataSourceError(f"{path} holds no saved Hugging Face dataset and no train parquet files")
                splits = {s: _from_parquet(f) for s, f in files.items()}
        except DataSourceError:
            raise
        except Exception as err:  # arrow / parquet / json decoding errors: one line
            raise DataSourceError(f"cannot read {path}: {str(err).splitlines()[0]}") from None
    else:
        splits = _download(spec, download)
    if "train" not in splits:
        raise DataSourceError(f"{root or spec.hub_name} has no 'train' split (found {sorted(splits)})")
    for split, dataset in splits.items():
        check_columns(spec, dataset, f"{root or spec.hub_name} [{split}]")
    return {s: d for s, d in splits.items() if s in SPLITS}


def _from_parquet(files: list[str]) -> Any:
    """One split's parquet files as a memory-mapped Hugging Face Dataset: written into an Arrow file under
    ``HF_DATASETS_CACHE`` one record batch at a time (reused while the files are unchanged), read without
    pyarrow's pre-buffering. ``Dataset.from_parquet`` did the same conversion holding 1.5x the arrays in memory at
    Stack Overflow's full size (docs/benchmarks.md)."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(files[0])
    stamp = "|".join(_stamps(files))
    path = (
        Path(datasets.config.HF_DATASETS_CACHE)
        / "fedmomentum-parquet"
        / f"{hashlib.sha256(stamp.encode()).hexdigest()[:16]}.arrow"
    )
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
                for f in files:
                    parquet = pq.ParquetFile(f, pre_buffer=False)  # pre_buffer keeps every row group read
                    if not parquet.schema_arrow.equals(schema):
                        raise DataSourceError(f"{f} has another schema than {files[0]}")
                    for batch in parquet.iter_batches(batch_size=16_384):
                        writer.write_batch(pa.RecordBatch.from_arrays(batch.columns, schema=schema))
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return datasets.Dataset.from_file(str(path))


def _from_csv(files: dict[str, list[str]]) -> dict[str, Any]:
    """{split: Dataset} of CSV files (``datasets``' CSV builder, cached under ``HF_DATASETS_CACHE``), every column
    read as strings: pandas would otherwise guess a column's type chunk by chunk and read "NA", "null" or "None"
    (a Stack Overflow sentence, a role's name) as missing."""
    import csv

    import datasets

    if "train" not in files:
        raise DataSourceError(f"no train CSV file among {sorted(f for fs in files.values() for f in fs)}")
    with open(files["train"][0], newline="", encoding="utf-8") as f:
        header = next(csv.reader(f), [])
    features = datasets.Features({name: datasets.Value("string") for name in header})
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # a parse error is ours to say, in one line
    try:
        return dict(datasets.load_dataset("csv", data_files=files, features=features, na_filter=False))
    except datasets.exceptions.DatasetGenerationError as err:  # the builder's own words hide pandas' reason
        raise (err.__cause__ or err) from None
    finally:
        datasets.logging.set_verbosity(verbosity)


def _download(spec: TaskSpec, download: bool) -> dict[str, Any]:
    if spec.hub_name is None:
        raise DataSourceError(
            f"{spec.name} has no published copy to download: give data.root (a local copy in "
            f"the schema {dict(spec.columns)})"
        )
    if not download:
        raise DataSourceError(f"no data.root for {spec.name} and data.download is false")
    from flwr_datasets import FederatedDataset
    from flwr_datasets.partitioner import NaturalIdPartitioner

    from server.internals.flower_datasets import split_names

    try:  # flwr-datasets downloads every split of the named dataset through datasets.load_dataset
        fds = FederatedDataset(
            dataset=spec.hub_name,
            shuffle=False,
            partitioners={"train": NaturalIdPartitioner(partition_by=spec.partition_by)},
            **spec.hub_kwargs,
        )
        train = fds.load_split("train")  # the download (every split) happens here, on first use
        return {"train": train, **{s: fds.load_split(s) for s in split_names(fds) if s != "train"}}
    except Exception as err:  # offline, unknown name, auth: one line
        raise DataSourceError(
            f"could not download {spec.hub_name!r} for {spec.name}: "
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        ) from None


def check_columns(spec: TaskSpec, dataset: Any, where: str) -> None:
    """Every required column is present (names only; values are checked while encoding)."""
    missing = [c for c in spec.columns if c not in dataset.column_names]
    if missing:
        raise DataSourceError(
            f"{where} lacks column {missing[0]!r} ({spec.columns[missing[0]]}); it has {dataset.column_names}"
        )
    if len(dataset) == 0:
        raise DataSourceError(f"{where} has no rows")


# --------------------------------------------------------------------------- partition + encode
def make_partitioner(spec: TaskSpec, seed: int) -> Any:
    """The task's own partitioner, else flwr-datasets' NaturalIdPartitioner with lean index tables
    (:mod:`client.datasets.natural_ids`: the same partitions, 12 bytes of index per row)."""
    from client.datasets.natural_ids import ArrowNaturalIdPartitioner

    return spec.partitioner(seed) if spec.partitioner else ArrowNaturalIdPartitioner(partition_by=spec.partition_by)


def _row_batches(spec: TaskSpec, dataset: Any, partitioner: Any | None) -> Iterator[Any]:
    """The rows of a split in partition order (``partitioner`` None: in the split's order), in batches: dicts of
    Python values of one partition's view, or, for an ``arrow`` task, Arrow tables."""
    if spec.arrow and hasattr(partitioner, "partition_indices"):
        yield from _arrow_partition_batches(dataset, partitioner)
        return
    parts = (
        [dataset] if partitioner is None else (partitioner.load_partition(p) for p in range(partitioner.num_partitions))
    )
    for part in parts:
        if spec.arrow:
            from client.datasets.arrow_text import batches

            yield from batches(part)
        else:
            yield from part.iter(batch_size=ENCODE_CHUNK)


def _arrow_partition_batches(dataset: Any, partitioner: Any) -> Iterator[Any]:
    """Arrow tables of whole partitions, gathered from the partitioner's index table (no ``Dataset.select`` per
    partition: ~3.6 ms each, 20 min at Stack Overflow's 342k users); a run of adjacent rows is a zero-copy slice."""
    from client.datasets.arrow_text import BATCH

    table, group, rows = dataset.with_format("arrow"), [], 0
    for p in range(partitioner.num_partitions):
        group.append(partitioner.partition_indices(p))
        rows += len(group[-1])
        if rows >= BATCH or p == partitioner.num_partitions - 1:
            idx = np.concatenate(group)
            adjacent = idx[-1] - idx[0] + 1 == len(idx) and bool(np.all(np.diff(idx) == 1))
            yield table[int(idx[0]) : int(idx[-1]) + 1] if adjacent else table[idx]
            group, rows = [], 0


def _open(entry: Path, split: str, shapes: Mapping[str, tuple[tuple[int, ...], Any]]) -> dict[str, np.ndarray]:
    return {
        k: np.lib.format.open_memmap(entry / f".{split}_{k}.npy.tmp", mode="w+", dtype=dtype, shape=shape)
        for k, (shape, dtype) in shapes.items()
    }


def _write(out: dict[str, np.ndarray], pos: dict[str, int], arrays: Mapping[str, np.ndarray]) -> None:
    for k, v in arrays.items():
        if k.endswith("_ptr"):
            continue
        out[k][pos[k] : pos[k] + len(v)] = v
        if k + "_ptr" in out:
            lengths = arrays[k + "_ptr"]
            row = pos[k + "_ptr"]
            out[k + "_ptr"][row + 1 : row + 1 + len(lengths)] = pos[k] + np.cumsum(lengths)
            pos[k + "_ptr"] = row + len(lengths)
        pos[k] += len(v)


def encode_split(
    spec: TaskSpec,
    dataset: Any,
    n: int,
    meta: Mapping[str, Any],
    entry: Path,
    split: str,
    partitioner: Any | None = None,
) -> None:
    """Encode the ``n`` rows of one split into ``<split>_*.npy``; with a ``partitioner``, its partitions' rows in
    partition order (they may leave rows out: a CIFAR-100 copy holds only whole clients).

    Ragged arrays ``k`` come with ``k_ptr`` (row -> start in ``k``): the encoder returns per-row lengths as
    ``k_ptr`` and their values flat as ``k``; their sizes are counted by ``spec.arrays``.
    """
    out = _open(entry, split, spec.arrays(meta, n, dataset))
    pos = {k: 0 for k in out}
    for rows in _row_batches(spec, dataset, partitioner):
        _write(out, pos, spec.encode(rows, meta))
    for k, array in out.items():
        expected = len(array) - 1 if k.endswith("_ptr") else len(array)
        if pos[k] != expected:
            raise RuntimeError(f"{spec.name}: encoded {pos[k]} entries of {split}_{k}, expected {expected}")
        array.flush()
        del array
        os.replace(entry / f".{split}_{k}.npy.tmp", entry / f"{split}_{k}.npy")


def check_partitions(spec: TaskSpec, sizes: list[int], ids: list[str]) -> None:
    """Every partition holds an example; DataSourceError naming the first empty one otherwise."""
    empty = [p for p, n in enumerate(sizes) if n == 0]
    if empty:
        raise DataSourceError(
            f"{spec.name}: partition {empty[0]} (natural id {ids[empty[0]]!r}) of the train split "
            f"has no examples ({len(empty)} of {len(sizes)} partitions are empty)"
        )


def build_entry(spec: TaskSpec, splits: Mapping[str, Any], entry: Path, seed: int) -> None:
    """Partition the train split with the task's flwr-datasets partitioner and encode every split."""
    train = splits["train"]
    partitioner = make_partitioner(spec, seed)
    partitioner.dataset = train
    os.environ.setdefault("TQDM_DISABLE", "1")  # NaturalIdPartitioner's progress bar
    num = partitioner.num_partitions
    if not num:
        raise DataSourceError(f"{spec.name}: the train split of {len(train)} rows yields no client partition")
    ids = [str(v) for v in getattr(partitioner, "partition_id_to_natural_id", {}).values()] or [
        str(p) for p in range(num)
    ]
    # One partition view at a time: a non-contiguous Dataset.select() holds ~200 KB while it lives (CIFAR-100's
    # 500 views held together: 104 MiB, docs/benchmarks.md); the project's partitioners know their sizes.
    sizes = (
        [int(n) for n in partitioner.partition_sizes()]
        if hasattr(partitioner, "partition_sizes")
        else [len(partitioner.load_partition(p)) for p in range(num)]
    )
    check_partitions(spec, sizes, ids)  # before any encoding
    meta = dict(spec.prepare(train))
    encode_split(spec, train, sum(sizes), meta, entry, "train", partitioner)
    rows = {"train": sum(sizes)}
    if "test" in splits:
        encode_split(spec, splits["test"], len(splits["test"]), meta, entry, "test")
        rows["test"] = len(splits["test"])
    np.save(entry / "train_offsets.npy", np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
    meta = {k: v for k, v in meta.items() if not k.startswith("_")}  # drop per-process lookup tables
    meta.update(task=spec.name, version=CACHE_VERSION, num_rows=rows, natural_ids=ids)
    tmp = entry / f".meta.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, entry / "meta.json")


def read_entry(spec: TaskSpec, entry: Path) -> NaturalData:
    """The entry's arrays (memory maps), offsets and ``meta.json``, checked to fit together and to give the first
    client's and the test split's examples; :class:`client.data.BrokenCacheEntry` else."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        arrays = {
            s: {
                p.name[len(s) + 1 : -4]: np.load(p, mmap_mode="r")
                for p in sorted(entry.glob(f"{s}_*.npy"))
                if p.name != "train_offsets.npy"
            }
            for s in meta["num_rows"]
        }
        data = NaturalData(spec, meta, arrays, np.load(entry / "train_offsets.npy"), entry)
        offsets, rows = data.offsets, {s: int(n) for s, n in meta["num_rows"].items()}
        check_entry(offsets.ndim == 1 and len(offsets) >= 2, f"train_offsets.npy is {offsets.dtype}{offsets.shape}")
        ends = int(offsets[0]) == 0 and int(offsets[-1]) == rows["train"] and bool((np.diff(offsets) >= 0).all())
        check_entry(ends, f"train_offsets.npy does not split the {rows['train']} train rows")
        for split, named in arrays.items():
            for name, array in named.items():
                if name.endswith("_ptr"):  # a ragged array's row offsets: one more than the rows, ending at its size
                    flat = named.get(name[: -len("_ptr")])
                    fits = flat is not None and len(array) == rows[split] + 1 and int(array[-1]) == len(flat)
                    check_entry(fits, f"{split}_{name}.npy does not index {split}_{name[: -len('_ptr')]}.npy")
                elif name + "_ptr" not in named:
                    check_entry(len(array) == rows[split], f"{split}_{name}.npy has {len(array)} of {rows[split]} rows")
        data.client(0, augment=False)  # the task's own reading of its arrays: a missing one is a KeyError
        for split in arrays:
            data.split(split, stop=1)
    except BrokenCacheEntry:
        raise
    except (OSError, ValueError, EOFError, KeyError, TypeError, IndexError) as err:
        raise unreadable(err) from None
    return data


def load_natural(
    spec: TaskSpec, root: str | None, cache_dir: str | None = None, download: bool = False, seed: int = 0
) -> NaturalData:
    """The task's cache entry, building it first when absent (once per machine, under a lock)."""
    if root and not Path(root).expanduser().exists():
        raise DataSourceError(
            f"no local copy of {spec.name} at {Path(root).expanduser().absolute()} (a saved "
            "Hugging Face dataset or parquet files)"
        )
    entry = (
        Path(cache_dir or default_cache_dir()).expanduser().absolute() / f"{spec.name}-{source_key(spec, root, seed)}"
    )
    build = lambda: build_entry(spec, open_source(spec, root, download), entry, seed)  # noqa: E731
    return cached_entry(entry, build, lambda: read_entry(spec, entry))
