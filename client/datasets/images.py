"""Image decoding shared by the image tasks (FEMNIST, CIFAR-100): a column of PIL images (the ``datasets``
``Image`` feature) or ``{"bytes": ...}`` structs into one uint8 array, with the size checked."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from client.datacheck import DataSourceError


def decode_column(values: Sequence[Any], column: str, size: int, channels: int) -> np.ndarray:
    """(n, size, size, channels) uint8; DataSourceError naming ``column`` for a wrong size or an unreadable one."""
    from PIL import Image

    mode = "L" if channels == 1 else "RGB"
    out = np.empty((len(values), size, size, channels), dtype=np.uint8)
    for i, value in enumerate(values):
        try:
            if isinstance(value, dict):
                value = Image.open(io.BytesIO(value["bytes"]))
            elif isinstance(value, bytes | bytearray):
                value = Image.open(io.BytesIO(value))
            image = value.convert(mode) if hasattr(value, "convert") else value
            array = np.asarray(image, dtype=np.uint8)
        except Exception as err:
            raise DataSourceError(f"column {column!r}: cannot decode an image ({err})") from None
        array = array.reshape(*array.shape[:2], -1)
        if array.shape != (size, size, channels):
            raise DataSourceError(f"column {column!r}: image of shape {array.shape[:2]}, expected {size}x{size}")
        out[i] = array
    return out


def labels(values: Sequence[Any], column: str, num_classes: int) -> np.ndarray:
    """int16 labels in [0, num_classes); DataSourceError naming ``column`` otherwise."""
    try:
        y = np.asarray(values, dtype=np.int64)
    except (TypeError, ValueError):
        raise DataSourceError(f"column {column!r} must hold integer labels") from None
    bad = (y < 0) | (y >= num_classes)
    if bad.any():
        raise DataSourceError(f"column {column!r}: label {int(y[bad][0])} outside [0, {num_classes})")
    return y.astype(np.int16)
