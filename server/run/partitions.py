"""The clients' partitions as the ClientApps draw them, and their summary files in the run dir
(``partition.{csv,json,png}``)."""

from __future__ import annotations

from collections.abc import Mapping
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log

from client.data import Dataset
from client.datasets import NaturalData
from client.partition import (
    dirichlet_partition,
    label_histograms,
    one_class_shortfall,
    parse_alpha,
    save_histograms,
)


def client_partitions(cfg: Mapping[str, Any], ds: Dataset) -> list[np.ndarray]:
    """Train indices of every client: the Dirichlet split the ClientApps draw (partition seed = ``seed``)."""
    return dirichlet_partition(
        np.asarray(ds.y_train),
        int(cfg["num_clients"]),
        parse_alpha(cfg["data"]["alpha"]),
        int(cfg["seed"]),
        ds.num_classes,
    )


def save_partition_summary(cfg: Mapping[str, Any], ds: Dataset | NaturalData, run_dir: Path) -> np.ndarray:
    """Per-client label histograms of the clients' split (csv, json, png unless ``plots=false``); for a natural task,
    ``partition.csv``: partition id, natural id and number of examples of every selected client."""
    if isinstance(ds, NaturalData):
        return save_natural_partitions(ds, int(cfg["num_clients"]), run_dir)
    parts = client_partitions(cfg, ds)
    hist = label_histograms(np.asarray(ds.y_train), parts, ds.num_classes)
    save_histograms(
        run_dir, hist, ds.classes, title=f"alpha={cfg['data']['alpha']}", stem="partition", plot=cfg.get("plots", True)
    )
    shortfall = one_class_shortfall(hist) if parse_alpha(cfg["data"]["alpha"]) == 0 else None
    if shortfall:
        log(WARNING, "data.alpha=0 with %d clients: %s (partition.csv)", len(hist), shortfall)
    return hist


def save_natural_partitions(ds: NaturalData, num_clients: int, run_dir: Path) -> np.ndarray:
    """``partition.csv``: partition id, natural id (writer, role, user, ...) and examples of each selected client."""
    sizes = np.diff(ds.offsets)[:num_clients]
    ids = ds.meta["natural_ids"]
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = ["client,natural_id,total"] + [f"{i},{ids[i]},{int(s)}" for i, s in enumerate(sizes)]
    (run_dir / "partition.csv").write_text("\n".join(lines) + "\n")
    return sizes[:, None]
