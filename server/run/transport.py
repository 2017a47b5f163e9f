"""How a plain config travels to a deployed ServerApp: base64 JSON in the run config key ``config-b64``."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

RUN_CONFIG_KEY = "config-b64"  # the run config key flower-deploy submits the config in


def encode(cfg: Mapping[str, Any]) -> str:
    """Base64 JSON of a plain config (the run-config value ``config-b64``)."""
    return base64.b64encode(json.dumps(cfg, sort_keys=True).encode()).decode()


def decode(text: str) -> dict[str, Any]:
    """Inverse of :func:`encode`."""
    return json.loads(base64.b64decode(text.encode()).decode())
