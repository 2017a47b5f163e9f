"""FEMNIST (Caldas et al. 2018, LEAF), paper 2 §8 / App. C: 28x28 greyscale characters of 62 classes, one
natural client per writer. Hub copy ``flwrlabs/femnist`` (columns ``image``, ``writer_id``, ``hsf_id``,
``character``), partitioned by ``writer_id`` (3,597 writers in that copy; TFF's, which paper 2 used, holds
3,400 training writers). Pixels are scaled to [0, 1] and not augmented (Reddi et al. 2021, App. C)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from client.datasets.base import TaskSpec
from client.datasets.images import decode_column, labels
from client.examples import ImageExamples

NUM_CLASSES = 62
SIZE = 28


def _arrays(meta: Mapping[str, Any], n: int, dataset: Any) -> dict[str, tuple[tuple[int, ...], Any]]:
    return {"x": ((n, SIZE, SIZE, 1), np.uint8), "y": ((n,), np.int16)}


def _encode(rows: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {
        "x": decode_column(rows["image"], "image", SIZE, 1),
        "y": labels(rows["character"], "character", NUM_CLASSES),
    }


def _examples(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], augment: bool) -> ImageExamples:
    return ImageExamples(arrays["x"], arrays["y"], (0.0,), (1.0,), augment=False)


SPEC = TaskSpec(
    name="femnist",
    hub_name="flwrlabs/femnist",
    partition_by="writer_id",
    columns={"image": "28x28 greyscale image", "writer_id": "string writer id", "character": "label in [0, 62)"},
    arrays=_arrays,
    encode=_encode,
    examples=_examples,
    prepare=lambda dataset: {"num_outputs": NUM_CLASSES},
)
