"""Client states kept in memory by nodes of the server's own process: no file in a round, the same files at a
checkpoint (with what a resume from the last saved checkpoint needs), the same checks as a file, a byte budget."""

import os

import numpy as np
import pytest

from strategies import client_state as cs
from strategies import protocol

LIKE = {"w": np.zeros((2, 3), dtype=np.float32), "b": np.zeros(3, dtype=np.float32)}


def arrays(value):
    return {k: np.full(v.shape, value, dtype=v.dtype) for k, v in LIKE.items()}


def config(root, keep=0, run="mem1"):
    return {
        protocol.STATE_DIR: str(root),
        protocol.STATE_RUN: run,
        protocol.STATE_STARTS: [1],
        protocol.STATE_IDS: ["s0"],
        protocol.STATE_KEEP: keep,
    }


def node(pid):
    return {"partition-id": 0, protocol.STATE_MEMORY: pid}


def rounds_on_disk(store):
    return [r for r, _, _ in store._files()]


@pytest.fixture(autouse=True)
def forget_runs():
    yield
    for run in ("mem1", "mem2"):
        cs.forget(run)


def test_a_node_of_this_process_keeps_its_state_in_memory_until_a_checkpoint(tmp_path):
    store = cs.ClientStateStore.from_config(config(tmp_path), 3, node(os.getpid()))
    assert store.in_memory
    state = arrays(1.0)
    assert store.save(1, state) is None and not store.path.exists()  # no file in a round
    state["w"][:] = 7.0  # the caller's arrays are copied: a reply's arrays may view a chunk's buffer
    made_in, loaded = store.load(2, LIKE)
    assert made_in == 1 and loaded["w"][0, 0] == 1.0
    store.save(3, arrays(3.0))  # replaces the state of round 1, which never reaches a file
    assert cs.flush("mem1", keep_round=3) == 1 and rounds_on_disk(store) == [3]
    assert cs.flush("mem1", keep_round=3) == 0  # written already: not again
    cs.forget("mem1")
    on_disk = cs.ClientStateStore.from_config(config(tmp_path), 3, node(os.getpid()))
    made_in, loaded = on_disk.load(4, LIKE)  # after a restart: the file the flush wrote
    assert made_in == 3 and loaded["w"][0, 0] == 3.0


def test_a_node_of_another_process_writes_its_files_at_once(tmp_path):
    """Another pid, no flag, no node_config, or a flag that is no pid (a SuperNode's --node-config is the user's):
    files, as a deployed node writes them."""
    others = (node(os.getpid() + 1), {"partition-id": 0}, None, node(str(os.getpid())), node(None), node([1]))
    for node_config in others:
        store = cs.ClientStateStore.from_config(config(tmp_path / str(id(node_config))), 0, node_config)
        assert not store.in_memory
        assert store.save(1, arrays(1.0)).is_file()
        assert cs.flush("mem1", keep_round=1) == 0


def test_a_flush_keeps_what_a_resume_from_the_last_saved_checkpoint_needs(tmp_path):
    """Checkpoint at round 4 (its flush wrote the state of round 3), states of rounds 5 and 7 in memory: the flush
    before the checkpoint of round 8 prunes by round 4, so the state of round 3 is kept should the process die before
    that checkpoint is saved; the flush of the next checkpoint (the one of round 8 saved) prunes it."""
    mine = node(os.getpid())
    cs.ClientStateStore.from_config(config(tmp_path), 0, mine).save(3, arrays(3.0))
    cs.flush("mem1", keep_round=4)
    cs.ClientStateStore.from_config(config(tmp_path, keep=4), 0, mine).save(5, arrays(5.0))
    store = cs.ClientStateStore.from_config(config(tmp_path, keep=4), 0, mine)
    store.save(7, arrays(7.0))
    assert rounds_on_disk(store) == [3]
    cs.flush("mem1", keep_round=4)
    assert rounds_on_disk(store) == [3, 7]
    cs.ClientStateStore.from_config(config(tmp_path, keep=8), 0, mine).save(9, arrays(9.0))
    cs.flush("mem1", keep_round=8)
    assert rounds_on_disk(store) == [7, 9]


def test_a_state_in_memory_is_checked_as_a_file_is(tmp_path, caplog):
    """A non-finite final local model (a diverging client) kept in memory makes the next participation a first one,
    as its file would."""
    store = cs.ClientStateStore.from_config(config(tmp_path), 0, node(os.getpid()))
    store.save(1, arrays(np.nan))
    state, metrics = cs.round_input(store, "fedhbm", 2, arrays(0.0))
    assert state is None and metrics == {protocol.STATE_ROUNDS: 0, protocol.STATE_INVALID: 1}
    assert "non-finite" in caplog.text


def test_past_the_memory_budget_states_go_to_their_files(tmp_path, monkeypatch):
    size = sum(a.nbytes for a in LIKE.values())
    monkeypatch.setattr(cs, "MEMORY_BUDGET", 2 * size)
    mine = node(os.getpid())
    stores = [cs.ClientStateStore.from_config(config(tmp_path), p, mine) for p in range(3)]
    assert [s.save(1, arrays(p)) is None for p, s in enumerate(stores)] == [True, True, False]
    assert rounds_on_disk(stores[2]) == [1]
    assert stores[0].save(2, arrays(10.0)) is None  # replacing a kept state frees its bytes first
    cs.ClientStateStore.from_config(config(tmp_path, run="mem2"), 0, mine).save(1, arrays(0.0))  # over: a file
    cs.forget("mem1")
    assert cs.ClientStateStore.from_config(config(tmp_path, run="mem2"), 1, mine).save(1, arrays(0.0)) is None
    assert [s.load(3, LIKE)[0] if s.load(3, LIKE) else None for s in stores] == [None, None, 1]


def test_a_newer_file_written_by_another_process_wins_over_the_memory(tmp_path):
    """A partition whose round was trained in a worker process (its file) after a round kept in memory."""
    mine = cs.ClientStateStore.from_config(config(tmp_path), 0, node(os.getpid()))
    mine.save(1, arrays(1.0))
    cs.ClientStateStore.from_config(config(tmp_path), 0, node(os.getpid() + 1)).save(3, arrays(3.0))
    assert mine.load(4, LIKE)[0] == 3 and mine.load(3, LIKE)[0] == 1
