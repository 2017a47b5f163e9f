"""``flwr_datasets``' ``NaturalIdPartitioner`` with index tables of 4 + 8 bytes per row.

The parent builds its partition -> rows table from ``np.array(dataset[partition_by])`` (every row's id as a
fixed-width NumPy unicode string: Shakespeare's 40-odd-character role ids take ~180 bytes a row, twice the
81 bytes the row encodes to) and one Python list of Python ints per natural id (~36 bytes a row). This subclass
builds the same table with Arrow and NumPy: each row's partition id (``pyarrow.compute.index_in`` against the
sorted natural ids, int32) and one stable argsort (int64); partition ``p``'s rows are a view of that sort.

Partition ids, natural ids and each partition's rows (ascending) are exactly the parent's
(tests/client/test_natural_ids.py); a row without a natural id (null) is a one-line :class:`DataSourceError`
naming the column, where the parent fails comparing None with a string.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from flwr_datasets.partitioner import NaturalIdPartitioner

from client.datacheck import DataSourceError


class ArrowNaturalIdPartitioner(NaturalIdPartitioner):
    """``NaturalIdPartitioner(partition_by)`` with lean index tables (see the module docstring)."""

    def _column(self) -> pa.ChunkedArray:
        """The natural-id column as Arrow (zero-copy from the memory-mapped table; row order of the dataset)."""
        return self.dataset.with_format("arrow")[self._partition_by]

    def _create_int_partition_id_to_natural_id(self) -> None:
        nulls = self._column().null_count
        if nulls:
            raise DataSourceError(
                f"column {self._partition_by!r}: {nulls} of {len(self.dataset)} rows have no natural id (null)"
            )
        super()._create_int_partition_id_to_natural_id()

    def _create_partition_id_to_indices(self) -> None:
        column = self._column()
        ids = pa.array(list(self._partition_id_to_natural_id.values())).cast(column.type)
        partition_of_row = pc.index_in(column, value_set=ids).to_numpy().astype(np.int32, copy=False)
        rows = np.argsort(partition_of_row, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(partition_of_row, minlength=len(ids)))])
        del partition_of_row
        self._partition_id_to_indices = {p: rows[bounds[p] : bounds[p + 1]] for p in range(len(ids))}

    def partition_sizes(self) -> np.ndarray:
        """Rows of each partition, in partition-id order (from the index table: no ``Dataset.select``)."""
        if not self._partition_id_to_indices:
            self.load_partition(0)  # builds the id maps and the index table
        return np.asarray([len(self._partition_id_to_indices[p]) for p in range(self.num_partitions)])

    def partition_indices(self, partition_id: int) -> np.ndarray:
        """The rows of partition ``partition_id``, ascending: what ``load_partition`` selects, without the view."""
        if not self._partition_id_to_indices:
            self.load_partition(0)
        return self._partition_id_to_indices[partition_id]
