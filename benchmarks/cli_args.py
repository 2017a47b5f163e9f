"""Argument checks the benchmark scripts share: one line (``parser.error``, exit 2) before any work."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def require_data(parser: argparse.ArgumentParser, flag: str, path: str | os.PathLike) -> Path:
    """``path`` resolved, or exit 2 naming ``flag`` when nothing is there (a CIFAR-10 folder or .tar.gz)."""
    data = Path(path).resolve()
    if not data.exists():
        parser.error(f"{flag}: no CIFAR-10 folder or .tar.gz at {data}")
    return data
