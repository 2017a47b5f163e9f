"""Which models are convex, and μ of a config: read by config validation and ``flower-optimum`` before any heavy
import (no torch here), so bad input is a one-line error in about a second."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from server.run.errors import ConfigError

CONVEX_MODELS = ("logreg",)  # models whose population objective is convex (flower-optimum, eval_gap)


def check_convex(cfg: Mapping[str, Any], what: str) -> float:
    """μ = ``client.weight_decay`` of a config whose model is convex; ConfigError (naming ``what``) otherwise."""
    model = cfg.get("model", {}).get("name")
    if model not in CONVEX_MODELS:
        raise ConfigError(f"{what}: model.name={model} is not convex; f* and pop_gap need model={CONVEX_MODELS[0]}")
    mu = cfg.get("client", {}).get("weight_decay", 0.0)
    if isinstance(mu, bool) or not isinstance(mu, int | float) or not math.isfinite(mu) or mu < 0:
        raise ConfigError(f"'client.weight_decay' (μ of f) must be a finite number >= 0, got {mu!r}")
    return float(mu)
