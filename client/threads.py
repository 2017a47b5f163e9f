"""How many intra-op threads a ClientApp's torch uses.

Torch starts with one intra-op thread per core. Ray gives each simulation actor one (``OMP_NUM_THREADS``), but
a deployment's ClientApp processes get torch's default: k SuperNodes on one host then run k x cores busy threads
on its cores (4 nodes on 2 cores: ~3x slower rounds, docs/benchmarks.md). So ``flower-deploy`` tells each
SuperNode it spawns its share of the host, :func:`local_share`, in ``--node-config torch-threads=<n>``, and
:func:`apply` sets it in the ClientApp. Precedence: ``client.torch_threads`` > 0 (the message config, every
node) > the node's ``torch-threads`` > torch's default (nodes not started by ``flower-deploy``, unless told).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from logging import INFO
from typing import Any

NODE_KEY = "torch-threads"  # node_config key: this node's default intra-op threads (> 0), set by flower-deploy
CONFIG_KEY = "torch-threads"  # = client.config.TORCH_THREADS (client.torch_threads; > 0 overrides the node's)
# (not imported: client.config imports torch, and flower-deploy uses local_share without torch)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which taskset/cpusets restrict), else ``os.cpu_count()``."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def local_share(cores: int, concurrent_nodes: int) -> int:
    """Threads of each of ``concurrent_nodes`` nodes training at once on ``cores`` cores: max(1, cores // nodes)."""
    if cores < 1 or concurrent_nodes < 0:
        raise ValueError(f"cores must be >= 1 and concurrent_nodes >= 0, got {cores}, {concurrent_nodes}")
    return max(1, cores // max(1, concurrent_nodes))


def _count(value: Any, name: str) -> int:
    """A thread count >= 0 from a config value (run and node configs deliver ints, floats or strings)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not (math.isfinite(number) and number >= 0 and number == int(number)):
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return int(number)


def choose(config: Mapping[str, Any], node_config: Mapping[str, Any] | None) -> tuple[int, str]:
    """(threads, source): ``client.torch_threads`` > 0, else the node's ``torch-threads`` > 0, else (0, default)."""
    configured = _count(config.get(CONFIG_KEY, 0), "client.torch_threads")
    if configured:
        return configured, "client.torch_threads"
    node = _count((node_config or {}).get(NODE_KEY, 0), f"node_config {NODE_KEY!r}")
    if node:
        return node, f"node_config {NODE_KEY}"
    return 0, "torch default"


def apply(config: Mapping[str, Any], node_config: Mapping[str, Any] | None = None) -> int:
    """Set torch's intra-op threads as :func:`choose` says; returns the count torch now uses.

    Logs one line when the node was told a count (a ``flower-deploy`` SuperNode), so its log shows what each
    ClientApp process used; Ray actors and untold nodes stay silent.
    """
    import torch

    threads, source = choose(config, node_config)
    if threads and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    used = torch.get_num_threads()
    if NODE_KEY in (node_config or {}):
        from flwr.common.logger import log

        log(
            INFO,
            "ClientApp torch threads: %d (%s; node default %s, %d cores)",
            used,
            source,
            (node_config or {})[NODE_KEY],
            usable_cores(),
        )
    return used
