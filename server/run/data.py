"""The server's copy of the clients' dataset, and the one-time download before a run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from client.data import BadImage, Dataset, load_dataset
from client.datasets import NaturalData, load_task
from client.tasks import NATURAL_DATASETS
from server.run.errors import ConfigError
from server.run.validation import validate_data


def server_dataset(cfg: Mapping[str, Any]) -> Dataset | NaturalData:
    """The dataset the clients use (same source and cache), for server-side evaluation."""
    d = cfg["data"]
    if d["name"] in NATURAL_DATASETS:
        return load_task(d["name"], d.get("root"), d.get("cache_dir"), bool(d.get("download", False)))
    try:
        return load_dataset(d["name"], d["root"], d.get("cache_dir") or None, download=bool(d.get("download", False)))
    except BadImage as err:  # found while decoding, after the cheap checks of the source passed
        raise ConfigError(f"'data.root': {err}") from None


def train_size(ds: Dataset | NaturalData) -> int | None:
    """Training examples of a CIFAR-10 split (for trust.max_num_examples=auto); None for a natural task,
    whose cap :func:`server.run.config.validate` sets to its largest selected client."""
    return None if isinstance(ds, NaturalData) else len(ds.y_train)


def prepare_data(cfg: dict[str, Any]) -> None:
    """Download torchvision's CIFAR-10 now, once, if asked to (not in every client at the same time)."""
    d = cfg["data"]
    if d["name"] != "cifar10" or not d.get("download"):
        return
    from client import datacheck

    try:
        datacheck.download_cifar10(d["root"])
    except datacheck.DataSourceError as err:
        raise ConfigError(
            f"'data.download': {err} (offline? point data.root at an ImageFolder tree "
            "or .tar.gz of CIFAR-10 with data=cifar10_folder)"
        ) from None
    validate_data(cfg)  # now the counts are known: num_clients against the examples
