"""strategies/records.py: MetricRecord and RecordDict built in one pass are Flower's own records (every attribute,
the object id, the checks of later setitems); whatever the fast path does not take goes through Flower's
constructor, which accepts or raises as before."""

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from strategies import npy, records

PLAIN_METRICS = [
    {},
    {"num-examples": 12},
    {"train_loss": 1.25, "num-examples": 12, "update_norm": 0.5, "loss_before": float("nan")},
    {"b": -3, "a": 2.0e300, "c": 0},
]
OTHER_METRICS = [  # Flower's constructor decides: it accepts the first two and refuses the rest
    {"loss": np.float64(0.5)},
    {"losses": [1.0, 2.0]},
    {"flag": True},
    {"loss": np.float32(0.5)},
    {"loss": "0.5"},
    {3: 1.0},
    {"mixed": [1.0, 2]},
]


def _same(ours, flowers) -> None:
    assert type(ours) is type(flowers)
    assert vars(ours) == vars(flowers)
    assert ours.object_id == flowers.object_id


@pytest.mark.parametrize("values", PLAIN_METRICS)
def test_a_plain_metric_record_is_flowers_without_its_constructor(values, monkeypatch):
    expected = MetricRecord(dict(values))

    def refuse(*args, **kwargs):
        raise AssertionError("Flower's constructor called on the fast path")

    monkeypatch.setattr(MetricRecord, "__init__", refuse)
    made = records.metric_record(values)
    monkeypatch.undo()
    _same(made, expected)
    values_copy = dict(values)
    made["extra"] = 1  # the record owns its entries; later setitems are still checked
    assert dict(values) == values_copy
    with pytest.raises(TypeError):
        made["bad"] = "text"


@pytest.mark.parametrize("values", OTHER_METRICS)
def test_other_metric_values_are_judged_by_flower(values):
    try:
        expected = MetricRecord(dict(values))
    except TypeError as err:
        with pytest.raises(TypeError) as ours:
            records.metric_record(values)
        assert str(ours.value) == str(err)
        return
    _same(records.metric_record(values), expected)


def _arrays() -> ArrayRecord:
    return npy.to_record(["w", "b"], [np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros(2, np.float32)])


def test_a_record_dict_of_records_is_flowers_without_its_constructor(monkeypatch):
    content = {"arrays": _arrays(), "metrics": MetricRecord({"loss": 1.0}), "config": ConfigRecord({"lr": 0.1})}
    expected = RecordDict(dict(content))
    monkeypatch.setattr(RecordDict, "__init__", lambda *a, **k: (_ for _ in ()).throw(AssertionError("called")))
    made = records.record_dict(content)
    monkeypatch.undo()
    _same(made, expected)
    assert made.array_records["arrays"] is content["arrays"] and made.config_records["config"]["lr"] == 0.1
    with pytest.raises(TypeError):
        made["bad"] = {"lr": 0.1}


@pytest.mark.parametrize("content", [{"config": {"lr": 0.1}}, {1: ConfigRecord({})}, {"metrics": np.zeros(2)}])
def test_other_record_dict_values_are_refused_as_flower_refuses_them(content):
    with pytest.raises(TypeError) as flowers:
        RecordDict(dict(content))
    with pytest.raises(TypeError) as ours:
        records.record_dict(content)
    assert str(ours.value) == str(flowers.value)


def _set_one_by_one(arrays) -> ArrayRecord:
    record = ArrayRecord()
    for key, value in arrays.items():
        record[key] = value
    return record


@pytest.mark.parametrize("n", [0, 1, 3])
def test_an_array_record_is_the_one_setitems_build(n, monkeypatch):
    arrays = {f"layer{i}": npy.to_array(np.full((i + 1, 2), i, np.float32)) for i in range(n)}
    expected = _set_one_by_one(arrays)
    monkeypatch.setattr(ArrayRecord, "__setitem__", lambda *a: (_ for _ in ()).throw(AssertionError("called")))
    made = records.array_record(arrays)
    monkeypatch.undo()
    _same(made, expected)
    assert list(made) == list(arrays) and all(made[k] is arrays[k] for k in arrays)
    assert made.is_dirty is expected.is_dirty  # object_id above reset both
    made["late"] = npy.to_array(np.zeros(1))
    assert made.__dict__["_is_dirty"] is True
    with pytest.raises(TypeError):
        made["bad"] = np.zeros(1)


def test_other_array_record_entries_are_set_one_by_one_and_refused_as_before():
    array = npy.to_array(np.zeros(2, np.float32))
    with pytest.raises(TypeError) as flowers:
        _set_one_by_one({"a": array, "b": np.zeros(2)})
    with pytest.raises(TypeError) as ours:
        records.array_record({"a": array, "b": np.zeros(2)})
    assert str(ours.value) == str(flowers.value)
    assert (
        npy.to_record(["w", "b"], [np.ones(3), np.zeros(1)]).object_id
        == _set_one_by_one({"w": npy.to_array(np.ones(3)), "b": npy.to_array(np.zeros(1))}).object_id
    )
