"""Reddi et al.'s federated CIFAR-100 split (2021, App. C.2) as a ``flwr_datasets`` ``Partitioner``: the Pachinko
Allocation Method over the coarse -> fine label tree (:mod:`client.datasets.cifar100` describes the draw). A module
of its own so that reading a built cache never imports ``flwr_datasets``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr_datasets.partitioner import Partitioner

NUM_CLIENTS, CLIENT_SIZE = 500, 100
ALPHA, BETA = 0.1, 10.0


def pachinko_split(
    fine: np.ndarray,
    coarse: np.ndarray,
    num_clients: int,
    client_size: int,
    seed: int,
    alpha: float = ALPHA,
    beta: float = BETA,
) -> list[np.ndarray]:
    """Row indices of each client (Reddi et al. 2021, App. C.2); needs num_clients * client_size <= rows."""
    if num_clients * client_size > len(fine):
        raise ValueError(f"{num_clients} clients x {client_size} examples exceed the {len(fine)} rows")
    rng = np.random.default_rng(seed)
    fines_of = [np.unique(fine[coarse == c]) for c in range(int(coarse.max()) + 1)]
    pools = {int(f): list(rng.permutation(np.flatnonzero(fine == f))) for f in np.unique(fine)}
    coarse_p = rng.dirichlet(np.full(len(fines_of), alpha), size=num_clients)
    fine_p = [
        [rng.dirichlet(np.full(len(fs), beta)) if len(fs) else np.zeros(0) for fs in fines_of]
        for _ in range(num_clients)
    ]
    alive = {int(f) for f in pools}
    parts = []
    for i in range(num_clients):
        rows = []
        for _ in range(client_size):
            live_c = np.array([len([f for f in fs if int(f) in alive]) > 0 for fs in fines_of])
            pc = np.where(live_c, coarse_p[i], 0.0)
            pc = pc / pc.sum() if pc.sum() > 0 else live_c / live_c.sum()
            c = int(rng.choice(len(fines_of), p=pc))
            fs = fines_of[c]
            live_f = np.array([int(f) in alive for f in fs])
            pf = np.where(live_f, fine_p[i][c], 0.0)
            pf = pf / pf.sum() if pf.sum() > 0 else live_f / live_f.sum()
            f = int(fs[rng.choice(len(fs), p=pf)])
            rows.append(pools[f].pop())
            if not pools[f]:
                alive.discard(f)
        parts.append(np.sort(np.asarray(rows, dtype=np.int64)))
    return parts


class PachinkoPartitioner(Partitioner):
    """flwr-datasets Partitioner of Reddi et al.'s CIFAR-100 split (see the module docstring)."""

    def __init__(
        self,
        num_partitions: int = NUM_CLIENTS,
        partition_size: int = CLIENT_SIZE,
        seed: int = 0,
        fine_column: str = "fine_label",
        coarse_column: str = "coarse_label",
    ) -> None:
        super().__init__()
        self._num, self._size, self._seed = num_partitions, partition_size, seed
        self._fine, self._coarse = fine_column, coarse_column
        self._parts: list[np.ndarray] | None = None

    def _split(self) -> list[np.ndarray]:
        if self._parts is None:
            fine = np.asarray(self.dataset[self._fine], dtype=np.int64)
            coarse = np.asarray(self.dataset[self._coarse], dtype=np.int64)
            num = min(self._num, len(fine) // self._size)  # small (test) copies: as many full clients as fit
            self._parts = pachinko_split(fine, coarse, num, self._size, self._seed)
        return self._parts

    @property
    def num_partitions(self) -> int:
        return len(self._split())

    def load_partition(self, partition_id: int) -> Any:
        return self.dataset.select(self._split()[partition_id])

    def partition_sizes(self) -> np.ndarray:
        """Rows of each partition, in partition-id order (from the split: no ``Dataset.select``)."""
        return np.asarray([len(rows) for rows in self._split()])
