"""Federated CIFAR-100 of Reddi et al. (2021, App. C.2), seed 001 §8: 500 training clients of 100 images.

No published Hugging Face copy carries Reddi et al.'s split (TFF ships it as its own files), so it is rebuilt
here from their description, on ``flwrlabs/cifar100`` (columns ``img``, ``fine_label``, ``coarse_label``),
by :class:`PachinkoPartitioner`, a ``flwr_datasets`` ``Partitioner``: the Pachinko Allocation Method (Li &
McCallum 2006) over the coarse -> fine label tree. Each client draws a distribution over the 20 coarse labels
from Dir(alpha = 0.1) and, per coarse label, one over its 5 fine labels from Dir(beta = 10); each of its 100
examples draws a coarse label, then a fine label, then an unused image of that label. A fine label that runs
out is removed from every client's distribution (renormalised), and so is a coarse label with no fine label
left. The draw is seeded (``seed``), so the same split comes back for the same seed; partition ids are the
clients in the order they are drawn. The test split stays whole (server-side evaluation).

Images keep CIFAR's 32x32 with the random crop (padding 4) + flip of ``client.augment``; Reddi et al. crop to
24x24 instead (a documented difference). Normalisation uses the usual CIFAR-100 channel statistics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr_datasets.partitioner import Partitioner

from client.datasets.base import TaskSpec
from client.datasets.images import decode_column, labels
from client.examples import ImageExamples

NUM_CLASSES, NUM_COARSE = 100, 20
NUM_CLIENTS, CLIENT_SIZE = 500, 100
ALPHA, BETA = 0.1, 10.0
MEAN, STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)


def pachinko_split(fine: np.ndarray, coarse: np.ndarray, num_clients: int, client_size: int, seed: int,
                   alpha: float = ALPHA, beta: float = BETA) -> list[np.ndarray]:
    """Row indices of each client (Reddi et al. 2021, App. C.2); needs num_clients * client_size <= rows."""
    if num_clients * client_size > len(fine):
        raise ValueError(f"{num_clients} clients x {client_size} examples exceed the {len(fine)} rows")
    rng = np.random.default_rng(seed)
    fines_of = [np.unique(fine[coarse == c]) for c in range(int(coarse.max()) + 1)]
    pools = {int(f): list(rng.permutation(np.flatnonzero(fine == f))) for f in np.unique(fine)}
    coarse_p = rng.dirichlet(np.full(len(fines_of), alpha), size=num_clients)
    fine_p = [[rng.dirichlet(np.full(len(fs), beta)) if len(fs) else np.zeros(0) for fs in fines_of]
              for _ in range(num_clients)]
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

    def __init__(self, num_partitions: int = NUM_CLIENTS, partition_size: int = CLIENT_SIZE, seed: int = 0,
                 fine_column: str = "fine_label", coarse_column: str = "coarse_label") -> None:
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


def _arrays(meta: Mapping[str, Any], n: int) -> dict[str, tuple[tuple[int, ...], Any]]:
    return {"x": ((n, 32, 32, 3), np.uint8), "y": ((n,), np.int16)}


def _encode(rows: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, np.ndarray]:
    labels(rows["coarse_label"], "coarse_label", NUM_COARSE)
    return {"x": decode_column(rows["img"], "img", 32, 3), "y": labels(rows["fine_label"], "fine_label",
                                                                        NUM_CLASSES)}


def _examples(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], augment: bool) -> ImageExamples:
    return ImageExamples(arrays["x"], arrays["y"], MEAN, STD, augment=augment)


SPEC = TaskSpec(
    name="cifar100", hub_name="flwrlabs/cifar100", partition_by="fine_label",
    columns={"img": "32x32 RGB image", "fine_label": "label in [0, 100)", "coarse_label": "label in [0, 20)"},
    arrays=_arrays, encode=_encode, examples=_examples, prepare=lambda dataset: {"num_outputs": NUM_CLASSES},
    partitioner=lambda seed: PachinkoPartitioner(seed=seed),
)
