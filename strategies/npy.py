"""numpy arrays <-> Flower ``Array`` without ``np.save`` / ``np.load`` per array.

A Flower ``Array`` of stype ``numpy.ndarray`` holds an ``.npy`` file: a header naming dtype, order and shape, then
the raw bytes. ``np.save`` and ``np.load`` build and parse that header for every array (``np.load`` evaluates it as
a Python literal), a large part of an in-process round's host work. Here the header of each (dtype, shape) is
built once; :func:`to_array` writes exactly the bytes ``Array(ndarray)`` writes, and :func:`to_numpy` reads an
array whose header is the one ``np.save`` writes for its declared dtype and shape, with its data of exactly that
size. Anything else (another order or header version, a declared dtype or shape the bytes do not match, corrupt
bytes) goes through ``Array.numpy()``, so what it accepts and raises is unchanged.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

from strategies import records

NUMPY_STYPE = "numpy.ndarray"
PLAIN_KINDS = "biufc"  # bool, integers, floats, complex: dtypes np.save writes without pickling


@lru_cache(maxsize=1024)
def _header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` header ``np.save`` writes for a C-ordered array (format 1.0; ValueError past its size)."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    )
    return buffer.getvalue()


@lru_cache(maxsize=256)
def dtype_name(dtype: np.dtype) -> str:
    """``str(dtype)`` (the name an Array carries), built once per dtype: numpy builds it in Python every time."""
    return str(dtype)


def _plain(dtype: np.dtype) -> bool:
    """Whether ``np.save`` writes ``dtype`` as raw bytes (no pickling, no structured fields)."""
    return dtype.kind in PLAIN_KINDS and dtype.fields is None and not dtype.hasobject


def to_array(value: Any) -> Array:
    """``Array(np.asarray(value))``, the same bytes, with the header of its (dtype, shape) built once and the
    array's memory copied once."""
    a = np.asarray(value)
    if not (_plain(a.dtype) and a.flags.c_contiguous):
        return Array(a)
    return _numpy_array(dtype_name(a.dtype), tuple(a.shape), b"".join((_header(a.dtype, a.shape), a.data)))


def _numpy_array(dtype: str, shape: tuple[int, ...], data: bytes) -> Array:
    """``Array(dtype=dtype, shape=shape, stype=NUMPY_STYPE, data=data)`` for arguments of the right types, without
    the constructor's argument parsing (most of its cost): the attributes it sets, which the tests compare with the
    constructor's own."""
    array = Array.__new__(Array)
    array.__dict__.update(_is_dirty=True, dtype=dtype, shape=shape, stype=NUMPY_STYPE, data=data)
    return array


def decode(data: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray | None:
    """The array of ``.npy`` bytes whose header is the one ``np.save`` writes for a C-ordered ``dtype`` array of
    ``shape`` (compared, not parsed) and whose size is that of such an array, writable and owning its memory; None
    for any other bytes (the caller then reads them the general way, and judges them)."""
    if not _plain(dtype) or min(shape, default=0) < 0:
        return None
    head, size = _header(dtype, shape), math.prod(shape)
    if not data.startswith(head) or len(data) != len(head) + size * dtype.itemsize:
        return None
    return np.frombuffer(data, dtype=dtype, count=size, offset=len(head)).reshape(shape).copy()


def to_numpy(array: Array) -> np.ndarray:
    """``array.numpy()``: the decoded array, writable and owning its memory."""
    try:
        dtype, shape = np.dtype(array.dtype), tuple(int(d) for d in array.shape)
        value = decode(array.data, dtype, shape) if array.stype == NUMPY_STYPE else None
    except (TypeError, ValueError):
        value = None
    return array.numpy() if value is None else value


def to_record(keys: Sequence[str], arrays: Sequence[Any]) -> ArrayRecord:
    """An ArrayRecord of named arrays (in ``keys`` order). Each Array is stored as built: ``ArrayRecord(dict)`` would
    build every Array a second time (its ``from_array_dict``)."""
    if len(keys) != len(arrays):
        raise ValueError(f"{len(keys)} keys for {len(arrays)} arrays")
    return records.array_record({k: to_array(a) for k, a in zip(keys, arrays)})


def record_arrays(record: ArrayRecord | Mapping[str, Array]) -> dict[str, np.ndarray]:
    """{name: decoded array} of an ArrayRecord."""
    return {k: to_numpy(v) for k, v in record.items()}
