"""Server-side validation of client replies: nothing a client sends is aggregated unchecked.

Every strategy of :mod:`strategies.flower` passes each train reply through :func:`check_reply` before any
aggregation. A reply is accepted only if

- it holds exactly one ArrayRecord and exactly one MetricRecord (Flower's reply convention);
- the ArrayRecord has exactly the expected keys, and every array the expected shape and floating dtype
  (those of the global model: the local model for FedAvgM/FedCM, q for LocalUpdate) and only finite values;
- the MetricRecord holds the weight ``num-examples`` as a finite number > 0 (and <= ``max_num_examples``
  when a cap is set), every metric the strategy needs (e.g. ``loss-before`` for LocalUpdateDecay), only
  finite scalar metrics, and no client-side divergence flag (``nonfinite`` > 0);
- the L2 norm of the client's update is finite (and <= ``max_update_norm`` when a cap is set).

A rejected reply raises :class:`RejectedReply` with a one-line reason; the strategy logs it with the node and
partition id, counts it (``num-rejected``) and aggregates the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from strategies import npy, protocol
from strategies.math import Params, l2_norm


class RejectedReply(ValueError):
    """A client reply that must not be aggregated; the message is the reason."""


@dataclass(frozen=True)
class ReplySpec:
    """What a strategy expects back from a client in one round."""

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]
    weighted_by_key: str = protocol.NUM_EXAMPLES
    required_metrics: tuple[str, ...] = ()
    max_num_examples: float | None = None
    max_update_norm: float | None = None

    @classmethod
    def like(cls, keys: Sequence[str], model: Params, **kwargs: object) -> ReplySpec:
        """Arrays with the keys, shapes and dtypes of ``model``."""
        return cls(tuple(keys), tuple(tuple(a.shape) for a in model), tuple(np.dtype(a.dtype) for a in model), **kwargs)


@dataclass
class CheckedReply:
    """An accepted reply: arrays in the spec's key order, its weight, scalar metrics and update norm."""

    arrays: list[np.ndarray]
    weight: float
    metrics: dict[str, float]
    update_norm: float


def check_cap(value: float | None, name: str) -> float | None:
    """Validate an optional positive cap (None = off); returns it as float."""
    if value is None:
        return None
    cap = float(value)
    if not math.isfinite(cap) or cap <= 0:
        raise ValueError(f"{name} must be a positive number or None, got {value!r}")
    return cap


def check_reply(content: RecordDict, spec: ReplySpec, client_update: Callable[[Params], Params]) -> CheckedReply:
    """Validate one train reply against ``spec``; raise :class:`RejectedReply` naming the first problem.

    ``client_update`` maps the reply's arrays to the client's update (theta^{t-1} - theta_i for the
    model-returning strategies, q itself for LocalUpdate), whose L2 norm is checked against the cap.
    """
    arrays = _check_arrays(content, spec)
    metrics, weight = _check_metrics(content, spec)
    norm = l2_norm(client_update(arrays))
    if not math.isfinite(norm):
        raise RejectedReply(f"update norm is not finite ({norm})")
    if spec.max_update_norm is not None and norm > spec.max_update_norm:
        raise RejectedReply(f"update norm {norm:.6g} exceeds max_update_norm {spec.max_update_norm:.6g}")
    return CheckedReply(arrays, weight, metrics, norm)


def _check_arrays(content: RecordDict, spec: ReplySpec) -> list[np.ndarray]:
    records = _of_type(content, ArrayRecord)
    if len(records) != 1:
        raise RejectedReply(f"expected exactly one ArrayRecord, got {len(records)}")
    record = records[0]
    keys = list(record.keys())
    if sorted(keys) != sorted(spec.keys):
        missing, extra = sorted(set(spec.keys) - set(keys)), sorted(set(keys) - set(spec.keys))
        raise RejectedReply(f"array keys differ from the model's (missing {missing[:3]}, unexpected {extra[:3]})")
    out = []
    for key, shape, dtype in zip(spec.keys, spec.shapes, spec.dtypes):
        array = record[key]
        if tuple(array.shape) != shape:  # checked on the metadata before decoding any bytes
            raise RejectedReply(f"array {key!r} has shape {tuple(array.shape)}, expected {shape}")
        if str(array.dtype) != npy.dtype_name(dtype):
            raise RejectedReply(f"array {key!r} has dtype {array.dtype}, expected {dtype}")
        try:
            value = npy.to_numpy(array)
        except Exception as err:  # corrupt bytes: whatever numpy raises, the reply is unusable
            raise RejectedReply(f"array {key!r} cannot be decoded ({type(err).__name__})") from None
        if value.shape != shape or value.dtype != dtype:
            raise RejectedReply(f"array {key!r} decodes to {value.dtype}{value.shape}, expected {dtype}{shape}")
        if not np.isfinite(value).all():
            raise RejectedReply(f"array {key!r} has non-finite values")
        out.append(value)
    return out


def _check_metrics(content: RecordDict, spec: ReplySpec) -> tuple[dict[str, float], float]:
    records = _of_type(content, MetricRecord)
    if len(records) != 1:
        raise RejectedReply(f"expected exactly one MetricRecord, got {len(records)}")
    record = records[0]
    metrics: dict[str, float] = {}
    for key, value in record.items():
        if isinstance(value, list):  # list metrics are not aggregated; they only need to be finite
            if not all(_is_number(v) and math.isfinite(v) for v in value):
                raise RejectedReply(f"metric {key!r} has non-finite entries")
            continue
        if not _is_number(value) or not math.isfinite(value):
            raise RejectedReply(f"metric {key!r} is not a finite number ({value!r})")
        metrics[key] = float(value)
    if spec.weighted_by_key not in metrics:
        raise RejectedReply(f"metric {spec.weighted_by_key!r} is missing")
    weight = metrics.pop(spec.weighted_by_key)
    if weight <= 0:
        raise RejectedReply(f"{spec.weighted_by_key} must be > 0, got {weight:g}")
    if spec.max_num_examples is not None and weight > spec.max_num_examples:
        raise RejectedReply(f"{spec.weighted_by_key} {weight:g} exceeds max_num_examples {spec.max_num_examples:g}")
    for key in spec.required_metrics:
        if key not in metrics:
            raise RejectedReply(f"metric {key!r} is missing")
    if metrics.get(protocol.NONFINITE, 0.0) > 0:
        raise RejectedReply("the client reported non-finite local training")
    return metrics, weight


def _of_type(content: RecordDict, kind: type) -> list[Any]:
    """The records of ``content`` of type ``kind``, in order (``content.array_records`` and the like build a synced
    dictionary, checking each entry, on every access)."""
    return [record for record in content.values() if isinstance(record, kind)]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def aggregate_metrics(metrics: Sequence[dict[str, float]], weights: Sequence[float]) -> dict[str, float]:
    """Example-weighted mean of the scalar metrics that every accepted reply reports."""
    total = float(sum(weights))
    common = set(metrics[0]).intersection(*metrics[1:]) if metrics else set()
    return {key: sum(m[key] * w for m, w in zip(metrics, weights)) / total for key in sorted(common)}
