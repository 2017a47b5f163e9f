"""Fast exact driver for rounds that are linear in a larger state (the GHBM family on Lemma III.4's problem).

:mod:`theory.driver` handles the 2-dimensional state (theta^{t-1}, theta^{t-2}) of FedAvgM/FedCM. GHBM(tau)
needs the last tau + 1 global models, LocalGHBM and FedHBM one anchor per client; every round is still linear
in (state, G). The same recipe applies: evaluate the round function itself (the shared ``strategies.math``
functions) on the d + 1 basis inputs, vectorised over a chunk of rounds and all lanes, which yields each
round's augmented (d + 1) x (d + 1) map (last row (0, ..., 0, 1) carries G), stored as a batch of small
matrices so that composing is one batched matmul; compose the maps by a pairwise tree in a chunk and
sequentially across chunks.

A step function maps ``(state, G, t, lr) -> new state`` where ``state`` is a tuple of d arrays (row 0 is the
global model theta), ``t`` the round(s) and ``lr`` the scheduled step (which step it drives is the step
function's choice, see :class:`theory.ghbm.GHBMRound`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from theory.driver import Schedule, checkpoint_rounds

StepFn = Callable[[tuple, Any, Any, Any], tuple]


def state_round_maps(step: StepFn, dim: int, schedule: Schedule, t: np.ndarray) -> np.ndarray:
    """Augmented maps of rounds ``t`` for every lane, shape (L, lanes, d + 1, d + 1), from the step function."""
    lr = schedule.lr(t)
    tt = np.asarray(t)[:, None]
    one, zero = np.ones(lr.shape), np.zeros(lr.shape)
    columns = np.zeros((dim + 1, dim + 1) + lr.shape)  # filled row by row (contiguous), transposed once
    for j in range(dim + 1):
        state = tuple(one if k == j else zero for k in range(dim))
        out = step(state, one if j == dim else zero, tt, lr)
        for i in range(dim):
            columns[i, j] = out[i]
    columns[dim, dim] = 1.0  # G is carried unchanged
    return np.ascontiguousarray(np.moveaxis(columns, (0, 1), (-2, -1)))


def reduce_state_maps(maps: np.ndarray) -> np.ndarray:
    """Compose time-ordered maps (L, ..., d + 1, d + 1) into one (..., d + 1, d + 1) by a pairwise tree."""
    while maps.shape[0] > 1:
        tail = None
        if maps.shape[0] % 2:
            tail, maps = maps[-1:], maps[:-1]
        maps = maps[1::2] @ maps[0::2]  # later @ earlier, batched over rounds and lanes
        if tail is not None:
            maps = np.concatenate([maps, tail], axis=0)
    return maps[0]


def state_segment_map(
    step: StepFn, dim: int, schedule: Schedule, t_start: int, t_end: int, chunk: int = 1 << 12
) -> np.ndarray:
    """Composed augmented map of rounds t_start..t_end (inclusive), shape (lanes, d + 1, d + 1)."""
    total = np.broadcast_to(np.eye(dim + 1), (schedule.lanes, dim + 1, dim + 1)).copy()
    for lo in range(t_start, t_end + 1, chunk):
        t = np.arange(lo, min(lo + chunk, t_end + 1), dtype=float)
        total = reduce_state_maps(state_round_maps(step, dim, schedule, t)) @ total
    return total


def apply_state_map(m: np.ndarray, state: Sequence[Any], G: Any) -> tuple:
    """New state = M (state, G) for maps of shape (lanes, d + 1, d + 1)."""
    dim = m.shape[-1] - 1
    return tuple(sum(m[:, i, k] * state[k] for k in range(dim)) + m[:, i, dim] * G for i in range(dim))


def run_state_fast(
    step: StepFn,
    dim: int,
    schedule: Schedule,
    state0: Sequence[Any],
    G: Any,
    T: int,
    checkpoints: Sequence[int] | None = None,
    chunk: int = 1 << 12,
) -> np.ndarray:
    """theta^t (row 0 of the state) at each checkpoint, shape (len(checkpoints), lanes)."""
    checks = checkpoint_rounds(T, checkpoints)
    state = tuple(np.broadcast_to(np.asarray(s, dtype=float), (schedule.lanes,)).copy() for s in state0)
    out, start = [], 1
    for stop in checks:
        state = apply_state_map(state_segment_map(step, dim, schedule, start, stop, chunk), state, G)
        out.append(state[0])
        start = stop + 1
    return np.array(out)


def run_state_loop(
    step: StepFn, schedule: Schedule, state0: Sequence[Any], G: Any, T: int, checkpoints: Sequence[int] | None = None
) -> np.ndarray:
    """The plain per-round loop (reference of :func:`run_state_fast`); same output."""
    checks = checkpoint_rounds(T, checkpoints)
    shape = (schedule.lanes,)
    state = tuple(np.broadcast_to(np.asarray(s, dtype=float), shape).copy() for s in state0)
    G = np.broadcast_to(np.asarray(G, dtype=float), shape)
    want, out = set(checks), []
    for t in range(1, T + 1):
        state = step(state, G, t, schedule.lr(np.array([t]))[0])
        if t in want:
            out.append(np.array(state[0], dtype=float))
    return np.array(out)
