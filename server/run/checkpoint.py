"""Atomic checkpoints of a run: strategy state (model, previous model, decay state), round, RNG states."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT = "checkpoint"


def save(run_dir: Path, server_round: int, strategy_meta: dict[str, Any], arrays: dict[str, np.ndarray],
         config: dict[str, Any], window: list[int] | None = None) -> Path:
    """Write <run_dir>/checkpoint atomically (a temporary folder renamed over the old one); ``window``: the rounds
    of the model window whose arrays ``arrays`` holds too (``eval_average``, server/run/window.py)."""
    final = run_dir / CHECKPOINT
    tmp = run_dir / f".{CHECKPOINT}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.savez(tmp / "arrays.npz", **arrays)
    state = {
        "round": server_round,
        "strategy": strategy_meta,
        "config": config,
        "window": window or [],
        "rng": {
            "python": _jsonable(random.getstate()),
            "numpy": _jsonable(np.random.get_state()),
            "torch": torch.get_rng_state().tolist(),
        },
    }
    (tmp / "state.json").write_text(json.dumps(state))
    old = run_dir / f".{CHECKPOINT}.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def load(run_dir: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """(state, arrays) of the run's checkpoint, restoring the RNG states; None when there is none."""
    path = run_dir / CHECKPOINT
    if not (path / "state.json").exists():
        old = run_dir / f".{CHECKPOINT}.old"  # a crash between the two renames of save()
        if not (old / "state.json").exists():
            return None
        path = old
    state = json.loads((path / "state.json").read_text())
    with np.load(path / "arrays.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    rng = state["rng"]
    random.setstate(_tuples(rng["python"]))
    np_state = rng["numpy"]
    np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), *np_state[2:]))
    torch.set_rng_state(torch.tensor(rng["torch"], dtype=torch.uint8))
    return state, arrays


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
