"""Paper 2's federated tasks with natural client partitions, through ``flwr-datasets`` (paper 2 §8, App. C).

``data.name`` -> task: ``femnist`` (writers), ``shakespeare`` (speaking roles), ``cifar100`` (Reddi et al.'s
500-client split), ``stackoverflow_nwp`` / ``stackoverflow_tp`` (users). :func:`load_task` returns the cached,
memory-mapped :class:`~client.datasets.base.NaturalData`; :func:`check_task` is the cheap look before a run.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from client.datacheck import DataSourceError
from client.datasets.base import NaturalData, TaskSpec, load_natural
from client.tasks import NATURAL_DATASETS, TASK_MODEL  # noqa: F401 - re-exported

TASK_MODELS = TASK_MODEL  # the model each task is trained with in paper 2 §8 (App. C)


@dataclass(frozen=True)
class TaskSummary:
    """What :func:`check_task` found."""

    num_partitions: int
    num_train: int
    num_outputs: int
    sizes: np.ndarray  # examples of each partition, in partition-id order


@functools.cache
def tasks() -> dict[str, TaskSpec]:
    """Every task's spec, imported on first use. No task module imports ``flwr_datasets`` or Hugging Face
    ``datasets`` (~3 s): only building a cache does (:mod:`client.datasets.base`, :mod:`client.datasets.pachinko`),
    so neither a ClientApp that reads a built cache nor one training CIFAR-10 pays for them."""
    from client.datasets import cifar100, femnist, shakespeare, stackoverflow

    return {
        s.name: s
        for s in (femnist.SPEC, shakespeare.SPEC, cifar100.SPEC, stackoverflow.NWP_SPEC, stackoverflow.TP_SPEC)
    }


def spec(name: str) -> TaskSpec:
    if name not in tasks():
        raise DataSourceError(f"unknown natural dataset {name!r}; expected one of {NATURAL_DATASETS}")
    return tasks()[name]


def load_task(
    name: str, root: str | None, cache_dir: str | None = None, download: bool = False, seed: int = 0
) -> NaturalData:
    """Load (building the cache once per machine) task ``name`` from ``root`` or, when ``root`` is empty and
    ``download`` is true, from its hub copy."""
    return load_natural(spec(name), root or None, cache_dir or None, download, seed)


def check_task(
    name: str, root: str | None, cache_dir: str | None = None, download: bool = False, seed: int = 0
) -> TaskSummary:
    """Validate the source before a run (DataSourceError with one line otherwise).

    The first look builds the cache entry (schema, value ranges and partitions are checked while encoding,
    before any Flower process starts); every later look reads its ``meta.json``.
    """
    data = load_task(name, root, cache_dir, download, seed)
    sizes = np.diff(data.offsets)
    return TaskSummary(data.num_partitions, int(data.meta["num_rows"]["train"]), data.num_classes, sizes)
