"""Hydra's side of the configuration: where ``conf/`` lies, and its composed config as plain Python containers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"  # the Hydra config groups


def to_plain(cfg: Any) -> dict[str, Any]:
    """Resolve a Hydra DictConfig (or pass a dict through) into plain Python containers."""
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(cfg):
            return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except ImportError:  # pragma: no cover - omegaconf comes with hydra-core
        pass
    return json.loads(json.dumps(cfg))
