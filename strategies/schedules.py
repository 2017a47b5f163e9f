"""Learning-rate schedules of the server and the clients, and LocalUpdateDecay's plateau rule.

Pure functions and plain dataclasses, shared like :mod:`strategies.math` by the Flower strategies
(``strategies/base.py``, ``strategies/flower.py``), the config check and the theory simulator:

- :func:`scheduled_lr`: eta_t / gamma_t of paper 1 Section IV-A and paper 2 §7 (1/t decay of both rates);
- :func:`plateau_decay_step`: paper 2 Section 9 (Algorithm 3 with the refinements W, P, C).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from strategies.math import as_number, check_lr

SCHEDULES = ("constant", "polynomial", "exponential", "inverse_time")


def check_schedule(schedule: str, param: Any, name: str = "server_lr_schedule") -> None:
    """Validate a learning-rate schedule once (see :func:`scheduled_lr`); ``name`` is the key in errors."""
    if schedule not in SCHEDULES:
        raise ValueError(f"{name} must be one of {SCHEDULES}, got {schedule!r}")
    value = np.asarray(param, dtype=float)
    if schedule == "polynomial" and (not np.all(np.isfinite(value)) or np.any(value < 0)):
        raise ValueError(f"polynomial schedule needs alpha >= 0, got {param!r}")
    if schedule == "exponential" and (np.any(value <= 0) or np.any(value > 1)):
        raise ValueError(f"exponential schedule needs gamma in (0, 1], got {param!r}")
    if schedule == "inverse_time" and (not np.all(np.isfinite(value)) or np.any(value <= 0)):
        raise ValueError(f"inverse_time schedule needs t0 > 0, got {param!r}")


def scheduled_lr(base_lr: Any, schedule: str, param: Any, t: Any) -> Any:
    """Step size at round t >= 1: the server's eta_t (paper 1 Section IV-A) or the clients' gamma_t (paper 2 §7,
    Theorem with gamma_t and eta_t decaying as 1/t: ``polynomial`` with alpha = 1, or ``inverse_time``).

    constant: eta; polynomial: eta / t^alpha; exponential: eta * gamma^t; inverse_time: eta * t0 / (t0 + t - 1),
    eta at round 1, halved at round t0 + 1 and ~ eta t0 / t after (the offset 1/(mu (t + a)) step of strongly
    convex SGD analyses). ``t`` may be an array of rounds (all eta_t at once).
    """
    if schedule == "inverse_time":
        return base_lr * param / (param + np.asarray(t, dtype=float) - 1.0)
    if schedule == "polynomial":
        return base_lr / np.power(t, param)
    if schedule == "exponential":
        return base_lr * np.power(param, t)
    return base_lr * np.ones(np.shape(t)) if np.ndim(t) else base_lr


@dataclass
class PlateauDecayConfig:
    """Knobs of LocalUpdateDecay (paper 2 Section 9: Algorithm 3 with refinements W, P, C)."""

    window: int = 100
    patience: int = 100
    cooldown: int = 100
    min_delta: float = 1e-4
    client_decay: float = 0.1
    server_decay: float = 0.9
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        for name in ("window", "patience"):
            if _knob(self, name, int) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if _knob(self, "cooldown", int) < 0:
            raise ValueError(f"cooldown must be >= 0, got {self.cooldown!r}")
        if not _knob(self, "min_delta", float) >= 0.0:
            raise ValueError(f"min_delta must be >= 0, got {self.min_delta!r}")
        for name in ("client_decay", "server_decay"):
            if not 0.0 < _knob(self, name, float) <= 1.0:
                raise ValueError(f"{name} must lie in (0, 1], got {getattr(self, name)!r}")
        check_lr(self.min_lr, "min_lr")


def _knob(config: PlateauDecayConfig, name: str, kind: type) -> Any:
    """``config.<name>`` as ``kind`` (int or float); a ValueError naming it when it is no number."""
    return as_number(getattr(config, name), name, kind)


@dataclass
class PlateauDecayState:
    """State of the plateau rule; plain floats and lists, so it serialises to JSON."""

    client_lr: float
    server_lr: float
    window: list[float]
    best: float = math.inf
    wait: int = 0
    cooldown: int = 0
    num_decays: int = 0

    @classmethod
    def start(cls, client_lr: float, server_lr: float, config: PlateauDecayConfig) -> PlateauDecayState:
        """Window of W values set to +inf; the cooldown also covers the first C rounds."""
        return cls(float(client_lr), float(server_lr), [math.inf] * int(config.window), cooldown=int(config.cooldown))


def _decayed(lr: float, factor: float, min_lr: float) -> float:
    """lr * factor floored at min_lr (a rate already below the floor is left alone)."""
    return max(lr * factor, min(lr, min_lr))


def plateau_decay_step(state: PlateauDecayState, value: float, config: PlateauDecayConfig) -> PlateauDecayState:
    """Feed one monitored value; return the new state (paper 2 Section 9, as in the authors' TFF code).

    window <- window[1:] + [value]; avg = mean(window).
    If cooldown > 0: cooldown -= 1, wait = 0.
    If avg < best - Delta: best = avg, wait = 0.
    Else if cooldown <= 0: wait += 1, and when wait >= P: gamma <- gamma * client_decay,
    eta <- eta * server_decay (floored at min_lr), cooldown = C, wait = 0.
    """
    window = state.window[1:] + [float(value)]
    avg = sum(window) / len(window)
    cooldown, wait, best = state.cooldown, state.wait, state.best
    client_lr, server_lr, num_decays = state.client_lr, state.server_lr, state.num_decays
    if cooldown > 0:
        cooldown -= 1
        wait = 0
    if avg < best - config.min_delta:
        best = avg
        wait = 0
    elif cooldown <= 0:
        wait += 1
        if wait >= config.patience:
            client_lr = _decayed(client_lr, config.client_decay, config.min_lr)
            server_lr = _decayed(server_lr, config.server_decay, config.min_lr)
            cooldown = int(config.cooldown)
            wait = 0
            num_decays += 1
    return PlateauDecayState(client_lr, server_lr, window, best, wait, cooldown, num_decays)
