"""Flower ``MetricRecord``, ``RecordDict`` and ``ArrayRecord`` built in one pass over values of known types.

Flower's constructors check every entry through a generic type check (``typing.get_args`` and union ``isinstance``
per value: ~18 µs for a reply's four metrics, ~12 µs for a two-record RecordDict), several times in each round of
every client. Here, when every key is a ``str`` and every value has exactly one of the types the record holds
(``int`` or ``float`` for metrics; ``ArrayRecord``, ``MetricRecord`` or ``ConfigRecord`` for a RecordDict; ``Array``
for an ArrayRecord), the record is made with the attributes Flower's constructor sets (the tests compare them);
anything else (a subclass, a list, a bool, a wrong type) goes through Flower's constructor, so what is accepted and
what raises is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

T = TypeVar("T", MetricRecord, RecordDict, ArrayRecord)
METRIC_TYPES = (int, float)  # exact types only: bool is an int, and Flower refuses it
RECORD_TYPES = (ArrayRecord, MetricRecord, ConfigRecord)
# the attributes a constructor sets besides the entries (its key and value checks, which later setitems still use)
_CHECKS: dict[type, dict[str, Any]] = {
    cls: {k: v for k, v in vars(cls()).items() if k != "_data"} for cls in (MetricRecord, RecordDict, ArrayRecord)
}


def _built(cls: type[T], values: Mapping[str, Any], types: tuple[type, ...], other: Callable[[dict], T]) -> T:
    """``cls`` holding ``values`` when every key is a str and every value's type is one of ``types``, else
    ``other(values)`` (Flower's way)."""
    data = dict(values)
    for key, value in data.items():
        if type(key) is not str or type(value) not in types:
            return other(data)
    record = cls.__new__(cls)
    record.__dict__.update(_CHECKS[cls], _data=data)
    return record


def metric_record(values: Mapping[str, Any]) -> MetricRecord:
    """``MetricRecord(dict(values))``."""
    return _built(MetricRecord, values, METRIC_TYPES, MetricRecord)


def record_dict(records: Mapping[str, Any]) -> RecordDict:
    """``RecordDict(dict(records))``."""
    return _built(RecordDict, records, RECORD_TYPES, RecordDict)


def array_record(arrays: Mapping[str, Any]) -> ArrayRecord:
    """An ArrayRecord holding ``arrays`` (name -> Flower ``Array``) as they are: what setting each entry of an empty
    ``ArrayRecord()`` makes."""
    record = _built(ArrayRecord, arrays, (Array,), _set_one_by_one)
    if record:
        record.__dict__["_is_dirty"] = True  # what ArrayRecord.__setitem__ sets
    return record


def _set_one_by_one(arrays: dict[str, Any]) -> ArrayRecord:
    record = ArrayRecord()
    for key, value in arrays.items():
        record[key] = value
    return record
