"""f* of a run's population objective, cached on disk by (data, μ, split): what ``flower-optimum`` prints and what
the ``pop_gap`` column of a run subtracts (docs/convex.md).

The cache entry ``<cache dir>/optimum/<key>.npz`` holds w*, f*, ‖∇f(w*)‖ and μ; the key hashes the dataset's decode
cache entry (source path, size, mtime), μ, the per-example weights c_j of the split (so splits with the same weights
share it) and the tolerance. Nothing read back is trusted: f and ∇f are recomputed at the stored w*, and an entry
whose values do not match, whose gradient is above the tolerance or that cannot be read is solved again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import weakref
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from client.data import Dataset, default_cache_dir, locked
from server.convex.checks import check_convex
from server.convex.objective import PopulationObjective, example_weights, features, population_values
from server.convex.solver import TOL, solve
from server.run.errors import ConfigError
from server.run.partitions import client_partitions

CACHE_VERSION = 1
MATCH = 1e-12  # relative agreement of a cached f* with f recomputed at its w*
LOG = logging.getLogger("flwr")


@dataclass
class Optimum:
    """f* and its minimiser for one (data, μ, split), and where it came from."""

    f_star: float
    mu: float
    grad_norm: float
    w: np.ndarray
    converged: bool
    cached: bool
    path: Path
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    lbfgs_iterations: int = 0
    newton_iterations: int = 0

    def record(self) -> dict[str, Any]:
        """The JSON line of ``flower-optimum``."""
        return {
            "f_star": self.f_star,
            "mu": self.mu,
            "grad_norm": self.grad_norm,
            "converged": self.converged,
            "cached": self.cached,
            "seconds": round(self.seconds, 2),
            "cpu_seconds": round(self.cpu_seconds, 2),
            "lbfgs_iterations": self.lbfgs_iterations,
            "newton_iterations": self.newton_iterations,
            "cache": str(self.path),
        }


_FEATURES: weakref.WeakValueDictionary[tuple, torch.Tensor] = weakref.WeakValueDictionary()
_FEATURES_LOCK = threading.Lock()


def dataset_features(ds: Dataset) -> torch.Tensor:
    """The float64 features of ``ds``'s training images (:func:`server.convex.objective.features`), one tensor per
    decode cache entry while any objective holds it: the runs of a process that evaluate the same data (the seeds
    of a stacked sweep) share it instead of one copy each (1.2 GB for CIFAR-10)."""
    key = (str(ds.cache_path), len(ds.y_train), tuple(ds.mean), tuple(ds.std))
    with _FEATURES_LOCK:
        x = _FEATURES.get(key)
        if x is None:
            x = features(ds.x_train, ds.mean, ds.std)
            _FEATURES[key] = x
    return x


def objective(cfg: Mapping[str, Any], ds: Dataset) -> PopulationObjective:
    """The population objective of a validated config's training split (``pop_loss`` + (μ/2)‖w‖²), float64."""

    mu = check_convex(cfg, "model")
    weights = example_weights(client_partitions(cfg, ds), len(ds.y_train))
    return PopulationObjective(dataset_features(ds), np.asarray(ds.y_train), weights, mu, ds.num_classes)


def cache_path(cfg: Mapping[str, Any], ds: Dataset, obj: PopulationObjective, tol: float = TOL) -> Path:
    """``<data cache dir>/optimum/<key>.npz`` of (data, μ, split weights, tolerance)."""
    key = hashlib.sha256()
    key.update(
        json.dumps(
            [CACHE_VERSION, Path(ds.cache_path).name, cfg["model"]["name"], obj.mu.hex(), float(tol).hex()]
        ).encode()
    )
    key.update(obj.c.numpy().tobytes())
    root = cfg["data"].get("cache_dir") or default_cache_dir()
    return Path(root).expanduser().absolute() / "optimum" / f"{key.hexdigest()[:20]}.npz"


def _load(path: Path, obj: PopulationObjective, tol: float) -> Optimum | None:
    """A cache entry, checked against ``obj`` (None when absent, unreadable or wrong: it is solved again)."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            w, f_star, mu = np.asarray(npz["w"], dtype=np.float64), float(npz["f_star"]), float(npz["mu"])
        value, grad = obj.value_grad(w)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:  # e.g. a file cut short
        LOG.warning("f* cache %s unreadable (%s: %s): solving again", path, type(err).__name__, err)
        return None
    grad_norm = float(np.linalg.norm(grad))
    if mu != obj.mu or not abs(value - f_star) <= MATCH * max(1.0, abs(value)) or not grad_norm <= tol:
        LOG.warning("f* cache %s does not hold the minimiser of this objective: solving again", path)
        return None
    # the stored f*, not ``value``: f in float64 is reproducible only to BLAS's summation order (threads, alignment),
    # and a cached f* must be one number wherever it is read (a resumed run's pop_gap, flower-optimum's line)
    return Optimum(f_star, obj.mu, grad_norm, w, True, True, path)


def optimum(cfg: Mapping[str, Any], ds: Dataset, obj: PopulationObjective | None = None, tol: float = TOL) -> Optimum:
    """f* of the config's objective: from the cache (checked) or solved and stored (one process at a time)."""
    obj = obj or objective(cfg, ds)
    path = cache_path(cfg, ds, obj, tol)
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path.with_suffix(".lock")):
        found = _load(path, obj, tol)
        if found is not None:
            return found
        LOG.info("Solving for f* (μ = %g, %d examples, %d parameters; docs/convex.md)", obj.mu, len(obj.y), obj.dim)
        sol = solve(obj, tol)
        result = Optimum(
            sol.f_star,
            obj.mu,
            sol.grad_norm,
            sol.w,
            sol.converged,
            False,
            path,
            sol.seconds,
            sol.cpu_seconds,
            sol.lbfgs_iterations,
            sol.newton_iterations,
        )
        if sol.converged:
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, w=sol.w, f_star=sol.f_star, mu=obj.mu, grad_norm=sol.grad_norm)
            tmp.replace(path)
        return result


class PopulationGap:
    """``pop_gap`` = f(x^t) − f* of a run: f evaluated exactly as f* was (same objective, float64, every
    training example, whatever ``eval_train_max_examples``); f* from ``eval_fstar`` or :func:`optimum`."""

    def __init__(self, cfg: Mapping[str, Any], ds: Dataset) -> None:
        self.obj = objective(cfg, ds)
        given = cfg.get("eval_fstar")
        if given is not None:
            self.f_star = float(given)
        else:
            found = optimum(cfg, ds, self.obj)
            if not found.converged:
                raise ConfigError(
                    f"'eval_gap': the solver stopped at ‖∇f‖ = {found.grad_norm:.3g} > {TOL:g} "
                    f"(μ = {found.mu:g}: f* may not be attained); give eval_fstar or μ > 0"
                )
            self.f_star = found.f_star
        LOG.info("pop_gap: f* = %.12g (μ = %g)", self.f_star, self.obj.mu)

    def __call__(self, arrays: Mapping[str, Any]) -> float:
        """f(x) − f* of model arrays (numpy values keyed like the model's state_dict)."""
        return self.obj.value(self.obj.flatten(arrays)) - self.f_star

    def with_population(self, arrays: Mapping[str, Any]) -> dict[str, float]:
        """``pop_gap`` and, from the same float64 logits (one pass over the data instead of two), ``pop_loss``
        = f(x) − (μ/2)‖x‖² and ``pop_accuracy``: the Evaluator's float32 columns in float64."""
        w = self.obj.flatten(arrays)
        return self._row(w, self.obj.value(w), self.obj.accuracy(w))

    def _row(self, w: np.ndarray, value: float, accuracy: float) -> dict[str, float]:
        return {"pop_loss": value - 0.5 * self.obj.mu * float(np.dot(w, w)), "pop_accuracy": accuracy,
                "pop_gap": value - self.f_star}  # fmt: skip


def with_populations(gaps: Sequence[PopulationGap], models: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    """:meth:`PopulationGap.with_population` of each (gap, model) pair, the gaps' objectives sharing their features
    (:func:`dataset_features`): one pass over the data for every model (:func:`population_values`)."""
    ws = [g.obj.flatten(m) for g, m in zip(gaps, models, strict=True)]
    values = population_values([g.obj for g in gaps], ws)
    return [g._row(w, value, acc) for g, w, (value, acc) in zip(gaps, ws, values)]
