"""Node-local client state of LocalGHBM / FedHBM: newest valid state, resume segments, pruning, untrusted files."""

import logging
import resource
import signal

import numpy as np
import pytest

from strategies import client_state as cs
from strategies import math as fm
from strategies import protocol

LIKE = {"w": np.zeros((2, 3), dtype=np.float32), "b": np.zeros(3, dtype=np.float32)}


def arrays(value):
    return {k: np.full(v.shape, value, dtype=v.dtype) for k, v in LIKE.items()}


def store(root, starts=(1,), ids=("a0",), keep=0, partition=3, run="run1"):
    return cs.ClientStateStore(root, run, partition, cs.Lineage(tuple(starts), tuple(ids)), keep)


def rounds_on_disk(s):
    return [(r, seg) for r, seg, _ in s._files()]


def test_uses_the_newest_state_from_an_earlier_round(tmp_path):
    s = store(tmp_path, keep=0)  # no checkpoint yet: every state may still be needed
    assert s.load(1, LIKE) is None
    for t in (1, 4, 7):
        s.save(t, arrays(t))
    made_in, state = s.load(7, LIKE)  # a state of round 7 is never used in round 7 (a rerun of round 7)
    assert made_in == 4 and state["w"][0, 0] == 4.0
    assert s.load(20, LIKE)[0] == 7
    assert s.path == tmp_path / "run1" / "partition-3"


def test_pruning_keeps_what_a_resume_from_the_last_checkpoint_needs(tmp_path):
    s = store(tmp_path, keep=5)
    for t in (1, 3, 5, 7, 9):
        s.save(t, arrays(t))
    assert rounds_on_disk(s) == [(5, "a0"), (7, "a0"), (9, "a0")]  # newest <= 5, then everything after it
    s.keep_round = 8
    s.save(11, arrays(11))
    assert rounds_on_disk(s) == [(7, "a0"), (9, "a0"), (11, "a0")]
    no_checkpoints = store(tmp_path / "x", keep=0)
    for t in (1, 2, 3):
        no_checkpoints.keep_round = t - 1  # what the server sends without checkpoints
        no_checkpoints.save(t, arrays(t))
    assert rounds_on_disk(no_checkpoints) == [(2, "a0"), (3, "a0")]


def test_after_a_resume_states_of_forgotten_rounds_are_ignored_and_deleted(tmp_path):
    before = store(tmp_path, keep=4)
    for t in (2, 4, 6, 8):  # the killed run went on to round 8; its last checkpoint was round 4
        before.save(t, arrays(t))
    after = store(tmp_path, starts=(1, 5), ids=("a0", "b1"), keep=4)
    assert after.load(7, LIKE)[0] == 4  # rounds 6, 8 belong to the forgotten timeline
    after.save(7, arrays(70))
    assert rounds_on_disk(after) == [(4, "a0"), (7, "b1")]
    again = store(tmp_path, starts=(1, 5, 9), ids=("a0", "b1", "c2"), keep=8)
    assert again.load(10, LIKE)[0] == 7 and again.load(10, LIKE)[1]["b"][0] == 70.0


@pytest.mark.parametrize("damage", ["truncate", "shape", "dtype", "nan", "keys", "pickle"])
def test_a_corrupt_state_falls_back_to_a_first_participation(tmp_path, damage, caplog):
    s = store(tmp_path, keep=1)
    path = s.save(1, arrays(1.0))
    bad = arrays(1.0)
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:50])
    else:
        if damage == "shape":
            bad["w"] = np.zeros((3, 2), dtype=np.float32)
        elif damage == "dtype":
            bad["w"] = bad["w"].astype(np.float64)
        elif damage == "nan":
            bad["b"][1] = np.nan
        elif damage == "keys":
            bad["extra"] = bad.pop("b")
        elif damage == "pickle":
            bad["w"] = np.array([{"evil": 1}], dtype=object)
        with open(path, "wb") as fh:
            np.savez(fh, **bad)
    with pytest.raises(cs.CorruptState):
        s.load(2, LIKE)
    with caplog.at_level(logging.WARNING):
        extra, metrics = cs.round_input(s, "fedhbm", 2, arrays(2.0))
    assert extra is None and metrics == {protocol.STATE_ROUNDS: 0, protocol.STATE_INVALID: 1}
    assert "first participation" in caplog.text


def test_round_input_forms_localghbm_momentum_and_fedhbm_anchor(tmp_path):
    s = store(tmp_path, keep=10)
    received_before, local_before = arrays(1.0), arrays(3.0)
    cs.remember(s, "localghbm", 2, received_before, local_before)
    received = arrays(0.25)
    m, metrics = cs.round_input(s, "localghbm", 5, received)
    assert metrics == {protocol.STATE_ROUNDS: 3, protocol.STATE_INVALID: 0}
    for k in LIKE:
        np.testing.assert_array_equal(m[k], fm.ghbm_momentum([received_before[k]], [received[k]], 3)[0])
    f = store(tmp_path / "f", keep=10)
    assert cs.round_input(f, "fedhbm", 1, received) == (None, {protocol.STATE_ROUNDS: 0, protocol.STATE_INVALID: 0})
    cs.remember(f, "fedhbm", 1, received_before, local_before)
    anchor, _ = cs.round_input(f, "fedhbm", 3, received)
    np.testing.assert_array_equal(anchor["w"], local_before["w"])
    with pytest.raises(ValueError, match="keeps no client state"):
        cs.round_input(f, "ghbm", 3, received)


def test_config_is_checked_before_any_file_is_touched(tmp_path):
    cfg = {
        protocol.STATE_DIR: str(tmp_path),
        protocol.STATE_RUN: "r1",
        protocol.STATE_STARTS: [1, 4],
        protocol.STATE_IDS: ["a", "b"],
        protocol.STATE_KEEP: 3,
    }
    s = cs.ClientStateStore.from_config(cfg, 2, {protocol.STATE_DIR: str(tmp_path / "node")})
    assert s.path == tmp_path / "node" / "r1" / "partition-2" and s.lineage.segment_of(5) == "b"
    for key, value, message in [
        (protocol.STATE_RUN, "../../etc", "run id"),
        (protocol.STATE_IDS, ["a", "b/c"], "segment id"),
        (protocol.STATE_STARTS, [4, 1], "increase"),
        (protocol.STATE_IDS, ["a"], "as many"),
    ]:
        with pytest.raises(ValueError, match=message):
            cs.ClientStateStore.from_config({**cfg, key: value}, 2)
    with pytest.raises(ValueError, match=protocol.STATE_DIR):
        cs.ClientStateStore.from_config({k: v for k, v in cfg.items() if k != protocol.STATE_DIR}, 2)
    assert not any(tmp_path.iterdir())


def test_a_state_as_the_store_writes_it_is_read_without_parsing_each_header_and_equals_np_load(tmp_path):
    """The direct reader (each member's ``.npy`` header compared with the one np.savez writes for the expected dtype
    and shape) takes every file the store writes, for a model of many arrays and dtypes, and reads np.load's values."""
    rng = np.random.default_rng(0)
    like = {f"layer{i}.weight": rng.normal(size=(i + 1, 3)).astype(np.float32) for i in range(12)}
    like.update({"scale": np.float64(2.5) * np.ones((), np.float64), "steps": np.arange(4, dtype=np.int64)})
    path = store(tmp_path).save(1, like)
    direct = cs._read_expected(path, like)
    assert direct is not None, "the store's own file fell back to np.load"
    with np.load(path) as npz:
        assert sorted(direct) == sorted(npz.files)
        for k in npz.files:
            assert direct[k].dtype == npz[k].dtype and direct[k].shape == npz[k].shape
            assert np.array_equal(direct[k], npz[k]) and direct[k].flags.writeable
    assert cs._read_expected(path, {**like, "steps": like["steps"].astype(np.int32)}) is None  # judged by np.load


def test_a_state_that_cannot_be_written_leaves_no_partial_file(tmp_path):
    """A full disk (here a real file-size limit: EFBIG) left the partial temporary file, which nothing removes."""
    s = store(tmp_path, keep=0)
    s.save(1, arrays(1.0))
    big = {"w": np.zeros((200, 200), dtype=np.float64), "b": np.zeros(3, dtype=np.float32)}  # 320 kB
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))
    try:
        with pytest.raises(OSError):
            s._write(2, s.lineage.current, big)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert [p.name for p in s.path.iterdir() if p.name.startswith(".tmp")] == []
    assert rounds_on_disk(s) == [(1, "a0")]  # the earlier state is kept
