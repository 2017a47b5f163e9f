"""The last W server models and their mean (``eval_average``): tail averaging of the global model.

Under cyclic participation the server models oscillate with the participation period p = 1/C (paper 1,
Lemma III.4), and the mean of one cycle's models, x̄^r = (1/W) Σ_{s=r−W+1}^{r} x^s with W = p, sits below the
models themselves on a convex objective (Jensen): docs/findings.md, measured it at 0.63× of
FedAvg's per-round gap. With ``eval_average=W`` every evaluated round r ≥ W also evaluates x̄^r (``avg_*`` columns),
the run ends with ``final_model_avg.npz``, and the window travels in the checkpoint so a resumed run computes the
same means as an uninterrupted one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

PREFIX = "window/"


class ModelWindow:
    """The server models after the last ``size`` rounds, oldest first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._models: deque[tuple[int, dict[str, np.ndarray]]] = deque(maxlen=size)

    def push(self, server_round: int, arrays: Mapping[str, Any]) -> None:
        """Keep a copy of the global model after ``server_round`` (numpy arrays or Flower Arrays)."""
        if self.size:
            self._models.append((server_round, {k: np.array(_numpy(v), copy=True) for k, v in arrays.items()}))

    @property
    def rounds(self) -> list[int]:
        return [rnd for rnd, _ in self._models]

    def full(self) -> bool:
        """True when the window holds ``size`` models of consecutive rounds (a resume may have left a hole)."""
        rounds = self.rounds
        return bool(self.size) and len(rounds) == self.size and rounds[-1] - rounds[0] == self.size - 1

    def mean(self) -> dict[str, np.ndarray]:
        """x̄ = (1/W) Σ x^s over the window, float64 for floating arrays (as ``pop_gap`` evaluates f); other arrays
        (integer buffers) are the newest model's."""
        models = [arrays for _, arrays in self._models]
        newest = models[-1]
        return {
            k: np.mean([m[k] for m in models], axis=0, dtype=np.float64)
            if np.issubdtype(newest[k].dtype, np.floating)
            else newest[k]
            for k in newest
        }

    def state(self) -> tuple[list[int], dict[str, np.ndarray]]:
        """(rounds, arrays keyed ``window/<i>/<name>``) for the checkpoint."""
        arrays = {f"{PREFIX}{i}/{k}": v for i, (_, model) in enumerate(self._models) for k, v in model.items()}
        return self.rounds, arrays

    def load(self, rounds: list[int], arrays: Mapping[str, np.ndarray]) -> None:
        """Refill from :meth:`state`'s output (the newest ``size`` models when the window was larger)."""
        self._models.clear()
        for i, rnd in enumerate(rounds):
            head = f"{PREFIX}{i}/"
            self.push(int(rnd), {k[len(head) :]: v for k, v in arrays.items() if k.startswith(head)})

    def check(self, model: Mapping[str, Any]) -> None:
        """ValueError unless every kept model has ``model``'s names and shapes (a checkpoint is read back, not
        trusted)."""
        shapes = {k: np.shape(_numpy(v)) for k, v in model.items()}
        for rnd, kept in self._models:
            if {k: v.shape for k, v in kept.items()} != shapes:
                raise ValueError(f"the eval_average window's model of round {rnd} does not match the run's model")


def split_arrays(arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A checkpoint's arrays as (the strategy's, the window's)."""
    window = {k: v for k, v in arrays.items() if k.startswith(PREFIX)}
    return {k: v for k, v in arrays.items() if not k.startswith(PREFIX)}, window


def _numpy(value: Any) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)
