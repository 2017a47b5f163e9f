"""The ClientApp through Flower's Message API, offline (no simulation): messages are built after setting
the internal TaskIdentity, as in /work/shared/notes/flower-1.39.md §1."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from client import config as C
from client.app import app, evaluate_on_partition, train_on_partition
from client.models import build_model
from client.train import NONFINITE
from strategies import protocol as P


@pytest.fixture(autouse=True)
def task_identity():
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def _config(tarball: Path, cache: Path, **extra) -> dict:
    base = {
        C.DATASET: "cifar10_folder",
        C.DATA_ROOT: str(tarball),
        C.CACHE_DIR: str(cache),
        C.MODEL: "cnn",
        C.NUM_PARTITIONS: 5,
        C.ALPHA: 0.5,
        C.PARTITION_SEED: 2,
        C.BATCH_SIZE: 8,
        C.SEED: 1,
        P.ALGORITHM: "fedavgm",
        P.CLIENT_LR: 0.05,
        P.LOCAL_EPOCHS: 1,
        P.SERVER_ROUND: 3,
        P.MOMENTUM: 0.9,
    }
    return {**base, **extra}


def _context(pid: int, **node) -> Context:
    return Context(run_id=1, node_id=7, node_config={P.PARTITION_ID: pid, **node}, state=RecordDict(), run_config={})


def _global_record() -> tuple[torch.nn.Module, ArrayRecord]:
    torch.manual_seed(0)
    model = build_model("cnn", num_classes=4)
    # as strategies/flower.py sends it: Arrays built from numpy, keyed by the initial record's keys
    return model, ArrayRecord({k: Array(v.numpy().astype(np.float64)) for k, v in model.state_dict().items()})


def test_train_message_round_trip(tarball: Path, tmp_path: Path) -> None:
    model, record = _global_record()
    cfg = _config(tarball, tmp_path)
    msg = Message(
        RecordDict({P.ARRAYS: record, P.CONFIG: ConfigRecord(cfg)}), dst_node_id=7, message_type=MessageType.TRAIN
    )
    reply = app(msg, _context(2))
    assert not reply.has_error()
    metrics = reply.content[P.METRICS]
    arrays = reply.content[P.ARRAYS]
    assert list(arrays.keys()) == list(model.state_dict().keys())
    assert metrics[P.NUM_EXAMPLES] == 20 and metrics[P.NUM_STEPS] == 3 and metrics[NONFINITE] == 0
    assert all(isinstance(metrics[k], int | float) for k in metrics)
    # the plain function does the identical work
    plain_arrays, plain_metrics = train_on_partition(cfg, record, 2)
    for k, v in arrays.items():
        np.testing.assert_array_equal(v.numpy(), plain_arrays[k])
    assert plain_metrics[P.TRAIN_LOSS] == metrics[P.TRAIN_LOSS]
    # partition 3 holds other data
    other, _ = train_on_partition(cfg, record, 3)
    assert not np.array_equal(other["fc3.bias"], plain_arrays["fc3.bias"])


def test_localupdate_and_fedcm_messages(tarball: Path, tmp_path: Path) -> None:
    model, record = _global_record()
    cfg = _config(tarball, tmp_path, **{P.ALGORITHM: "localupdate", P.CLIENT_LR: 0.0, P.THETA: [1.0, 1.0]})
    reply = app(
        Message(
            RecordDict({P.ARRAYS: record, P.CONFIG: ConfigRecord(cfg)}), dst_node_id=7, message_type=MessageType.TRAIN
        ),
        _context(0),
    )
    assert reply.content[P.METRICS][P.NUM_STEPS] == 2
    assert float(np.abs(reply.content[P.ARRAYS]["fc3.bias"].numpy()).sum()) > 0  # q, not the model
    corr = ArrayRecord([np.full(v.shape, 0.01) for v in model.state_dict().values()])  # "0", "1", ... keys
    cfg = _config(tarball, tmp_path, **{P.ALGORITHM: "fedcm", P.CLIENT_LR: 0.0})
    reply = app(
        Message(
            RecordDict({P.ARRAYS: record, P.CONFIG: ConfigRecord(cfg), P.FEDCM_CORRECTION: corr}),
            dst_node_id=7,
            message_type=MessageType.TRAIN,
        ),
        _context(0),
    )
    moved = reply.content[P.ARRAYS]["fc3.bias"].numpy() - model.state_dict()["fc3.bias"].numpy()
    np.testing.assert_allclose(moved, 0.01, atol=1e-6)


def test_evaluate_and_query(tarball: Path, tmp_path: Path) -> None:
    _, record = _global_record()
    cfg = _config(tarball, tmp_path)
    ctx = _context(4)
    reply = app(
        Message(
            RecordDict({P.ARRAYS: record, P.CONFIG: ConfigRecord(cfg)}),
            dst_node_id=7,
            message_type=MessageType.EVALUATE,
        ),
        ctx,
    )
    metrics = reply.content[P.METRICS]
    assert set(metrics) == {P.NUM_EXAMPLES, "loss", "accuracy"} and metrics[P.NUM_EXAMPLES] == 48 // 5
    assert 0.0 <= metrics["accuracy"] <= 1.0
    # train split; the test shards of all partitions cover the test split once
    train_metrics = evaluate_on_partition({**cfg, C.EVAL_SPLIT: "train"}, record, 4)
    assert train_metrics[P.NUM_EXAMPLES] == 20
    assert sum(evaluate_on_partition(cfg, record, p)[P.NUM_EXAMPLES] for p in range(5)) == 48
    reply = app(Message(RecordDict({P.CONFIG: ConfigRecord({})}), dst_node_id=7, message_type=MessageType.QUERY), ctx)
    assert reply.content[P.CONFIG][P.PARTITION_ID] == 4


def test_node_config_overrides_data_root(tarball: Path, tmp_path: Path) -> None:
    _, record = _global_record()
    cfg = _config(tmp_path / "not-there.tar.gz", tmp_path)
    with pytest.raises(FileNotFoundError, match="not-there"):
        train_on_partition(cfg, record, 0)
    _, metrics = train_on_partition(cfg, record, 0, node_config={C.DATA_ROOT: str(tarball)})
    assert metrics[P.NUM_EXAMPLES] == 20


def test_bad_configs(tarball: Path, tmp_path: Path) -> None:
    _, record = _global_record()
    with pytest.raises(ValueError, match="partition-id"):
        train_on_partition(_config(tarball, tmp_path), record, 5)
    with pytest.raises(ValueError, match="data-root"):
        train_on_partition(_config(tarball, tmp_path, **{C.DATA_ROOT: ""}), record, 0)
    with pytest.raises(ValueError, match="client-lr"):
        train_on_partition({k: v for k, v in _config(tarball, tmp_path).items() if k != P.CLIENT_LR}, record, 0)
