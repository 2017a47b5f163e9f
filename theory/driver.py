"""Drivers for the paper 1 recurrences: a plain per-round loop and a fast exact linear solver.

A round theta^t = R_t(theta^{t-1}, theta^{t-2}, G) of FedAvgM/FedCM on the problem of Lemma III.4 is
*linear* in (theta^{t-1}, theta^{t-2}, G) (Eq. 3: theta^t = p_t theta^{t-1} - r_t theta^{t-2} + q_t (-1)^t G).
The fast driver never writes p_t, q_t, r_t down: it evaluates the round function itself (i.e. the shared
``strategies.math`` functions) on the three basis states, vectorised over all rounds of a chunk and all
configuration lanes, which gives the 2x3 transition map of every round (the state-space form of
Eq. 4 / 121 with the input G folded in). Maps are then composed by a pairwise tree inside each chunk
and sequentially across chunks. Same arithmetic, different association order: the result equals the
loop up to round-off (tests/theory/test_driver.py).

Maps are arrays of shape (2, 3, ...): row 0 gives theta^t, row 1 gives theta^{t-1}, columns multiply
(theta^{t-1}, theta^{t-2}, G); the implicit third row (0, 0, 1) carries G.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from strategies import math as fm
from strategies import schedules

RoundFn = Callable[[Any, Any, Any, Any, Any], Any]  # (theta, theta_prev, G, t, server_lr) -> theta_new


@dataclass
class Schedule:
    """Per-lane server learning-rate schedules eta_t (paper 1 Section IV-A), evaluated by ``scheduled_lr``.

    ``kinds[k]`` is "constant" | "polynomial" | "exponential" for lane k, ``base_lr[k]`` is eta and
    ``params[k]`` is alpha or gamma (ignored for constant).
    """

    base_lr: np.ndarray
    kinds: Sequence[str]
    params: np.ndarray

    def __post_init__(self) -> None:
        self.base_lr = np.atleast_1d(np.asarray(self.base_lr, dtype=float))
        self.params = np.broadcast_to(np.asarray(self.params, dtype=float), self.base_lr.shape).copy()
        if isinstance(self.kinds, str):
            self.kinds = [self.kinds] * self.base_lr.size
        if len(self.kinds) != self.base_lr.size:
            raise ValueError("one schedule kind per lane is required")
        fm.check_lr(self.base_lr, "server_lr")
        self._groups: dict[str, np.ndarray] = {}
        for kind in sorted(set(self.kinds)):
            idx = np.array([k for k, name in enumerate(self.kinds) if name == kind])
            schedules.check_schedule(kind, self.params[idx] if kind != "constant" else 1.0)
            self._groups[kind] = idx

    @property
    def lanes(self) -> int:
        return self.base_lr.size

    def lr(self, t: np.ndarray) -> np.ndarray:
        """eta_t for rounds ``t`` (shape (L,)) and every lane: shape (L, lanes)."""
        t = np.asarray(t, dtype=float)[:, None]
        if len(self._groups) == 1:
            kind, idx = next(iter(self._groups.items()))
            return np.asarray(schedules.scheduled_lr(self.base_lr, kind, self.params, t), dtype=float)
        out = np.empty((t.shape[0], self.lanes))
        for kind, idx in self._groups.items():
            out[:, idx] = schedules.scheduled_lr(self.base_lr[idx], kind, self.params[idx], t)
        return out


# --------------------------------------------------------------------------- naive loop
def run_loop(
    round_fn: RoundFn,
    schedule: Schedule,
    theta0: Any,
    G: Any,
    T: int,
    checkpoints: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Straightforward per-round loop over t = 1..T, starting from theta^{-1} = theta^0 = theta0.

    Returns (theta^t, theta^{t-1}) at each checkpoint (default: only T), shapes (len(checkpoints), lanes).
    """
    checks = checkpoint_rounds(T, checkpoints)
    shape = (schedule.lanes,)
    theta = np.broadcast_to(np.asarray(theta0, dtype=float), shape).copy()
    prev = theta.copy()
    G = np.broadcast_to(np.asarray(G, dtype=float), shape)
    out_t, out_p = [], []
    want = set(checks)
    for t in range(1, T + 1):
        lr = schedule.lr(np.array([t]))[0]
        theta, prev = round_fn(theta, prev, G, t, lr), theta
        if t in want:
            out_t.append(theta.copy())
            out_p.append(prev.copy())
    return np.array(out_t), np.array(out_p)


# --------------------------------------------------------------------------- fast exact solver
def round_maps(round_fn: RoundFn, schedule: Schedule, t: np.ndarray) -> np.ndarray:
    """Transition maps of rounds ``t`` for every lane, shape (2, 3, L, lanes), from the round function."""
    lr = schedule.lr(t)
    tt = np.asarray(t)[:, None]
    one, zero = np.ones(lr.shape), np.zeros(lr.shape)
    maps = np.zeros((2, 3) + lr.shape)
    maps[0, 0] = round_fn(one, zero, zero, tt, lr)  # d theta^t / d theta^{t-1}  (p_t)
    maps[0, 1] = round_fn(zero, one, zero, tt, lr)  # d theta^t / d theta^{t-2}  (-r_t)
    maps[0, 2] = round_fn(zero, zero, one, tt, lr)  # d theta^t / d G           ((-1)^t q_t)
    maps[1, 0] = 1.0  # theta^{t-1} is shifted into the second slot
    return maps


def compose(later: np.ndarray, earlier: np.ndarray) -> np.ndarray:
    """Map of ``earlier`` followed by ``later`` (2x3 maps with implicit last row (0, 0, 1))."""
    out = later[:, 0:1] * earlier[0:1] + later[:, 1:2] * earlier[1:2]
    out[:, 2] += later[:, 2]
    return out


def reduce_maps(maps: np.ndarray) -> np.ndarray:
    """Compose time-ordered maps (2, 3, L, ...) into one (2, 3, ...) by a pairwise tree."""
    while maps.shape[2] > 1:
        tail = None
        if maps.shape[2] % 2:
            tail, maps = maps[:, :, -1:], maps[:, :, :-1]
        maps = compose(maps[:, :, 1::2], maps[:, :, 0::2])
        if tail is not None:
            maps = np.concatenate([maps, tail], axis=2)
    return maps[:, :, 0]


def identity_map(lanes: int) -> np.ndarray:
    m = np.zeros((2, 3, lanes))
    m[0, 0] = m[1, 1] = 1.0
    return m


def segment_map(round_fn: RoundFn, schedule: Schedule, t_start: int, t_end: int, chunk: int = 1 << 13) -> np.ndarray:
    """Composed map of rounds t_start..t_end (inclusive), in chunks of ``chunk`` rounds."""
    total = identity_map(schedule.lanes)
    for lo in range(t_start, t_end + 1, chunk):
        t = np.arange(lo, min(lo + chunk, t_end + 1), dtype=float)
        total = compose(reduce_maps(round_maps(round_fn, schedule, t)), total)
    return total


def apply_map(m: np.ndarray, theta: Any, prev: Any, G: Any) -> tuple[np.ndarray, np.ndarray]:
    """(theta^t, theta^{t-1}) = M (theta^{s}, theta^{s-1}, G)."""
    return m[0, 0] * theta + m[0, 1] * prev + m[0, 2] * G, m[1, 0] * theta + m[1, 1] * prev + m[1, 2] * G


def run_fast(
    round_fn: RoundFn,
    schedule: Schedule,
    theta0: Any,
    G: Any,
    T: int,
    checkpoints: Sequence[int] | None = None,
    chunk: int = 1 << 13,
) -> tuple[np.ndarray, np.ndarray]:
    """Same output as :func:`run_loop`, computed from composed round maps (exact up to round-off)."""
    checks = checkpoint_rounds(T, checkpoints)
    theta = np.broadcast_to(np.asarray(theta0, dtype=float), (schedule.lanes,)).copy()
    prev = theta.copy()
    out_t, out_p, start = [], [], 1
    for stop in checks:
        theta, prev = apply_map(segment_map(round_fn, schedule, start, stop, chunk), theta, prev, G)
        out_t.append(theta)
        out_p.append(prev)
        start = stop + 1
    return np.array(out_t), np.array(out_p)


def checkpoint_rounds(T: int, checkpoints: Sequence[int] | None) -> list[int]:
    """The sorted rounds to record (``[T]`` when None), each in [1, T]."""
    if int(T) < 1:
        raise ValueError(f"T must be >= 1, got {T}")
    checks = sorted({int(c) for c in (checkpoints if checkpoints is not None else [T])})
    if checks[0] < 1 or checks[-1] > T:
        raise ValueError(f"checkpoints must lie in [1, {T}]")
    return checks


def log_checkpoints(T: int, num: int = 60, start: int = 2) -> list[int]:
    """Roughly log-spaced rounds in [start, T], always including T."""
    pts = np.unique(np.round(np.logspace(np.log10(start), np.log10(T), num)).astype(int))
    return sorted(set(pts.tolist()) | {int(T)})
