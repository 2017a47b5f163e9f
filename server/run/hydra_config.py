"""Hydra's side of the configuration: where ``conf/`` lies, and its composed config as plain Python containers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from server.run.errors import ConfigError, first_line

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"  # the Hydra config groups


def to_plain(cfg: Any) -> dict[str, Any]:
    """Resolve a Hydra DictConfig (or pass a dict through) into plain Python containers; a value that cannot be
    resolved (an interpolation of a key that does not exist, ...) is a :class:`ConfigError` naming its key."""
    try:
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException
    except ImportError:  # pragma: no cover - omegaconf comes with hydra-core
        return json.loads(json.dumps(cfg))
    if not OmegaConf.is_config(cfg):
        return json.loads(json.dumps(cfg))
    try:
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None)
        raise ConfigError(f"{key}: {first_line(err)}" if key else first_line(err)) from None
