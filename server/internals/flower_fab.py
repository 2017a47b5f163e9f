"""Flower's FAB builder, for staging an app directory as ``flwr run`` ships it (flwr 1.39 internals:
``flwr.cli.build.build_fab_from_files``, what ``flwr build`` and ``flwr run`` call)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def build_fab(files: dict[str, Path]) -> tuple[bytes, Any]:
    """The FAB (zip bytes) of ``files`` ({path in the app: file}) and Flower's metadata of it, as
    ``flwr build`` makes it."""
    from flwr.cli.build import build_fab_from_files

    return build_fab_from_files(files)
