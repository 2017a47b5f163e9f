"""Federated CIFAR-100 of Reddi et al. (2021, App. C.2), paper 2 §8: 500 training clients of 100 images.

No published Hugging Face copy carries Reddi et al.'s split (TFF ships it as its own files), so it is rebuilt here
from their description, on ``flwrlabs/cifar100`` (columns ``img``, ``fine_label``, ``coarse_label``), by
:class:`~client.datasets.pachinko.PachinkoPartitioner`, a ``flwr_datasets`` ``Partitioner``: the Pachinko Allocation
Method (Li & McCallum 2006) over the coarse -> fine label tree. Each client draws a distribution over the 20 coarse
labels from Dir(alpha = 0.1) and, per coarse label, one over its 5 fine labels from Dir(beta = 10); each of its 100
examples draws a coarse label, then a fine label, then an unused image of that label. A fine label that runs out is
removed from every client's distribution (renormalised), and so is a coarse label with no fine label left. The draw
is seeded (``seed``), so the same split comes back for the same seed; partition ids are the clients in the order
they are drawn. The test split stays whole (server-side evaluation).

Images keep CIFAR's 32x32 with the random crop (padding 4) + flip of ``client.augment``; Reddi et al. crop to
24x24 instead (a documented difference). Normalisation uses the usual CIFAR-100 channel statistics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from client.datasets.base import TaskSpec
from client.datasets.images import decode_column, labels
from client.examples import ImageExamples

NUM_CLASSES, NUM_COARSE = 100, 20
MEAN, STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)


def _partitioner(seed: int) -> Any:
    """Imported here: ``flwr_datasets`` (and Hugging Face ``datasets``, ~3 s) is only needed to build the cache."""
    from client.datasets.pachinko import PachinkoPartitioner

    return PachinkoPartitioner(seed=seed)  # 500 clients of 100 images


def _arrays(meta: Mapping[str, Any], n: int, dataset: Any) -> dict[str, tuple[tuple[int, ...], Any]]:
    return {"x": ((n, 32, 32, 3), np.uint8), "y": ((n,), np.int16)}


def _encode(rows: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, np.ndarray]:
    labels(rows["coarse_label"], "coarse_label", NUM_COARSE)
    return {"x": decode_column(rows["img"], "img", 32, 3), "y": labels(rows["fine_label"], "fine_label", NUM_CLASSES)}


def _examples(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], augment: bool) -> ImageExamples:
    return ImageExamples(arrays["x"], arrays["y"], MEAN, STD, augment=augment)


SPEC = TaskSpec(
    name="cifar100",
    hub_name="flwrlabs/cifar100",
    partition_by="fine_label",
    columns={"img": "32x32 RGB image", "fine_label": "label in [0, 100)", "coarse_label": "label in [0, 20)"},
    arrays=_arrays,
    encode=_encode,
    examples=_examples,
    prepare=lambda dataset: {"num_outputs": NUM_CLASSES},
    partitioner=_partitioner,
)
