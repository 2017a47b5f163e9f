"""strategies.npy: the bytes Flower's ``Array(ndarray)`` writes, and ``Array.numpy()``'s result or error for any
Array, well-formed or not."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from strategies import npy

rng = np.random.default_rng(0)
ARRAYS = {
    "float32 matrix": rng.standard_normal((3072, 10)).astype(np.float32),
    "float64 vector": rng.standard_normal(7),
    "0-d": np.array(3.5),
    "empty": np.zeros((0, 5), np.float32),
    "int64": np.arange(7, dtype=np.int64),
    "int8": np.arange(-3, 3, dtype=np.int8),
    "bool": np.array([True, False, True]),
    "float16": rng.standard_normal(4).astype(np.float16),
    "complex64": (rng.standard_normal(3) + 1j).astype(np.complex64),
    "big-endian": rng.standard_normal((2, 3)).astype(">f8"),
    "Fortran order": np.asfortranarray(rng.standard_normal((3, 4))),
    "strided view": rng.standard_normal((4, 6))[:, ::2],
    "many dims": np.zeros((1,) * 40, np.float32),
    "conv kernel": rng.standard_normal((32, 3, 5, 5)).astype(np.float32),
}


@pytest.mark.parametrize("name", ARRAYS)
def test_to_array_writes_the_bytes_flower_writes(name: str) -> None:
    a = ARRAYS[name]
    ours, flowers = npy.to_array(a), Array(a)
    assert type(ours) is Array and vars(ours) == vars(flowers)  # every attribute, the bytes and the dirty flag
    assert ours.object_id == flowers.object_id
    ours.data = b"changed"  # what Flower's own Array does on a change
    assert not hasattr(ours, "_object_id") and ours.is_dirty


@pytest.mark.parametrize("name", ARRAYS)
def test_to_numpy_decodes_as_flower_does(name: str) -> None:
    array = Array(ARRAYS[name])
    ours, flowers = npy.to_numpy(array), array.numpy()
    assert ours.dtype == flowers.dtype and ours.shape == flowers.shape
    np.testing.assert_array_equal(ours, flowers)
    assert ours.flags.writeable
    before = bytes(array.data)
    ours[...] = 0  # the result is a copy: the message's bytes are untouched
    assert array.data == before


def _outcome(fn, array: Array):
    try:
        value = fn(array)
    except Exception as err:  # noqa: BLE001 - the error's type is what is compared
        return type(err)
    return value.dtype, value.shape, value.tobytes()


def _good(a: np.ndarray) -> Array:
    return Array(a)


def _hostile() -> dict[str, Array]:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    good = _good(a)
    header = len(good.data) - a.nbytes
    return {
        "shape declared other than the bytes": Array("float32", (4, 3), good.stype, good.data),
        "dtype declared other than the bytes": Array("float64", (3, 4), good.stype, good.data),
        "truncated data": Array("float32", (3, 4), good.stype, good.data[:-4]),
        "trailing bytes": Array("float32", (3, 4), good.stype, good.data + b"\0" * 8),
        "header only": Array("float32", (3, 4), good.stype, good.data[:header]),
        "no header": Array("float32", (3, 4), good.stype, a.tobytes()),
        "garbage": Array("float32", (3, 4), good.stype, b"\x93NUMPY garbage"),
        "empty bytes": Array("float32", (3, 4), good.stype, b""),
        "object dtype declared": Array("object", (3, 4), good.stype, good.data),
        "unknown dtype declared": Array("float99", (3, 4), good.stype, good.data),
        "negative dimension": Array("float32", (-3, -4), good.stype, good.data),
        "huge declared shape": Array("float32", (10**12, 10**6), good.stype, good.data),
        "other stype": Array("float32", (3, 4), "torch.Tensor", good.data),
        "pickled object array": Array(
            "object",
            (2,),
            good.stype,
            b"\x93NUMPY\x01\x00v\x00{'descr': '|O', 'fortran_order': False, 'shape': (2,), }",
        ),
    }


@pytest.mark.parametrize("name", list(_hostile()))
def test_a_malformed_array_gets_flowers_own_result_or_error(name: str) -> None:
    array = _hostile()[name]
    assert _outcome(npy.to_numpy, array) == _outcome(Array.numpy, array)


def test_record_helpers_keep_names_and_order() -> None:
    keys, arrays = ["w", "b"], [ARRAYS["float32 matrix"], ARRAYS["float64 vector"]]
    record = npy.to_record(keys, arrays)
    assert isinstance(record, ArrayRecord) and list(record.keys()) == keys
    decoded = npy.record_arrays(record)
    assert list(decoded) == keys
    for k, a in zip(keys, arrays):
        np.testing.assert_array_equal(decoded[k], a)
        assert record[k].data == Array(a).data
