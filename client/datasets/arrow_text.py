"""Text columns of Arrow batches, vectorised with ``pyarrow.compute``: split into pieces, count, look up.

The Stack Overflow tasks' encoders (:mod:`client.datasets.stackoverflow`) are built on these; a Python loop over
the full copy's 135.8M sentences would take 1–2 h (extrapolated; docs/benchmarks.md).
Imported only while a cache entry is built.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from client.datacheck import DataSourceError

BATCH = 16_384  # rows per Arrow batch
MERGE = 1 << 20  # (string, count) rows held before Counts merges them


@dataclass(frozen=True)
class Pieces:
    """The non-empty pieces of each row's string, flat in row order."""

    values: pa.Array  # the pieces (strings)
    row: np.ndarray  # (pieces,) the row of each piece, ascending
    counts: np.ndarray  # (rows,) pieces per row

    @property
    def position(self) -> np.ndarray:
        """The index of each piece within its row."""
        starts = np.cumsum(self.counts) - self.counts
        return np.arange(len(self.row)) - starts[self.row]


def batches(dataset: Any) -> Iterator[pa.Table]:
    """A Hugging Face Dataset as Arrow tables of :data:`BATCH` rows (zero-copy from its memory-mapped table)."""
    yield from dataset.with_format("arrow").iter(batch_size=BATCH)


def strings(rows: pa.Table, name: str) -> pa.Array:
    """Column ``name`` of a batch as one string array; DataSourceError unless every value is a string."""
    column = rows.column(name)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)) or column.null_count:
        raise DataSourceError(f"column {name!r} must hold strings")
    return column.combine_chunks().cast(pa.string())


def pieces(rows: pa.Table, name: str, sep: str | None = None) -> Pieces:
    """The non-empty pieces of column ``name``: split on runs of whitespace (``sep`` None: Python's
    ``str.split()``, the same Unicode whitespace) or on ``sep``."""
    column = strings(rows, name)
    lists = pc.utf8_split_whitespace(column) if sep is None else pc.split_pattern(column, sep)
    flat, parent = pc.list_flatten(lists), pc.list_parent_indices(lists)
    keep = pc.greater(pc.binary_length(flat), 0)
    row = parent.filter(keep).to_numpy().astype(np.int64)
    return Pieces(flat.filter(keep), row, np.bincount(row, minlength=len(column)))


def concat_rows(first: Pieces, second: Pieces) -> Pieces:
    """Row by row, the pieces of ``first`` followed by those of ``second``."""
    row = np.concatenate([first.row, second.row])
    order = np.argsort(row, kind="stable")
    values = pa.concat_arrays([first.values, second.values]).take(pa.array(order))
    return Pieces(values, row[order], first.counts + second.counts)


def vocabulary(meta: Mapping[str, Any], key: str) -> pa.Array:
    """``meta[key]`` (a ranked word list) as an Arrow array, built once per process."""
    cached = meta.get(f"_{key}_array")
    if cached is None:
        cached = pa.array(meta[key], type=pa.string())
        meta[f"_{key}_array"] = cached  # type: ignore[index]
    return cached


def lookup(values: pa.Array, ranked: pa.Array) -> np.ndarray:
    """The rank of each value in ``ranked`` (int64), -1 where it is absent."""
    return pc.index_in(values, value_set=ranked).fill_null(-1).to_numpy().astype(np.int64)


class Counts:
    """Occurrences of strings over many batches (Arrow hash aggregation), for a top-k vocabulary."""

    def __init__(self) -> None:
        self._parts: list[pa.Table] = []
        self._rows = 0
        self._limit = MERGE

    def add(self, values: pa.Array) -> None:
        """Count the strings of one batch."""
        if len(values):
            counted = pc.value_counts(values)
            self._parts.append(pa.table({"value": counted.field("values"), "count": counted.field("counts")}))
            self._rows += len(counted)
            if self._rows > self._limit:
                self._merge()

    def _merge(self) -> pa.Table:
        merged = pa.concat_tables(self._parts).group_by("value").aggregate([("count", "sum")])
        table = pa.table({"value": merged.column("value"), "count": merged.column("count_sum")})
        self._parts, self._rows = [table], table.num_rows
        self._limit = max(MERGE, 2 * table.num_rows)  # merging stays linear in the batches
        return table

    def top(self, k: int) -> list[str]:
        """The k most frequent strings, ties broken by code point order (Python's sort of str)."""
        if not self._parts:
            return []
        ranked = self._merge().sort_by([("count", "descending"), ("value", "ascending")])
        return ranked.column("value").slice(0, k).to_pylist()
