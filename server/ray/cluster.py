"""Which Ray ``flower-simulation`` uses, and the checks made on a cluster before the run starts.

``backend.address`` null (or ``local``) always starts a fresh local Ray: ``ray.init(address="local")``
ignores ``RAY_ADDRESS`` and the ``ray_current_cluster`` file that ``ray start`` leaves behind (a stale one
used to make ``ray.init()`` retry a dead cluster for minutes). ``auto`` or ``HOST:PORT`` joins an existing
cluster (see docs/scale.md): the address is resolved here, must answer on TCP within seconds, and then one
tiny Ray task per node checks, with the clients' own code (:mod:`client.datacheck`), that the node can read
``data.root`` and create the decode cache. Every failure is a ConfigError naming the key (exit 2).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from client.tasks import NATURAL_DATASETS
from server.run.config import ConfigError

PROBE_TIMEOUT = 5.0  # seconds for the head's GCS port to accept a TCP connection
NODE_CHECK_TIMEOUT = 120.0  # seconds for every node to run its check task (workers may start cold)


@dataclass(frozen=True)
class ClusterSummary:
    address: str
    num_nodes: int
    num_cpus: float
    num_gpus: float
    num_actors: int  # ClientApp actors Flower will place, summed over nodes

    def describe(self) -> str:
        return (
            f"Ray cluster at {self.address}: {self.num_nodes} nodes, {self.num_cpus:g} CPUs, "
            f"{self.num_gpus:g} GPUs, {self.num_actors} ClientApp actors; data.root readable on every node"
        )


def resolve_address(address: str | None) -> str | None:
    """HOST:PORT of the cluster to join, or None for a fresh local Ray. ``auto`` reads ``RAY_ADDRESS``, else
    the ``ray_current_cluster`` file of the last ``ray start`` on this machine (in Ray's temp dir)."""
    if address in (None, "local"):
        return None
    origin = "backend.address"
    if address == "auto":
        address, origin = _auto_address()
    _probe(address, origin)
    return address


def _auto_address() -> tuple[str, str]:
    env = os.environ.get("RAY_ADDRESS", "")
    if env and env not in ("auto", "local"):
        return env, "RAY_ADDRESS"
    from server.internals.ray_cluster import ray_address_file

    path = ray_address_file()
    try:
        with open(path) as handle:
            return handle.read().strip(), path
    except OSError:
        raise ConfigError(
            f"'backend.address' = auto but no Ray cluster was started here: neither RAY_ADDRESS "
            f"nor {path} names one (start one with `ray start --head`)"
        ) from None


def _probe(address: str, origin: str) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"'backend.address': {origin} gives {address!r}, not HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT):
            pass
    except OSError as err:
        stale = f" (a stale {origin} left by a stopped cluster?)" if origin != "backend.address" else ""
        raise ConfigError(
            f"'backend.address': no Ray cluster answers at {address} from {origin}{stale}: {err.strerror or err}"
        ) from None


def driver_pythonpath() -> str:
    """The PYTHONPATH Flower gives its actors (the driver's sys.path), so cluster workers import our code."""
    path = os.pathsep.join(sys.path)
    return f"{path}{os.pathsep}{os.environ['PYTHONPATH']}" if os.environ.get("PYTHONPATH") else path


def inspect_cluster(
    address: str, cfg: dict[str, Any], client_resources: Callable[[bool], dict[str, float]]
) -> ClusterSummary:
    """Connect, count nodes and actors, run the data check on every node, disconnect.

    ``client_resources(gpus_visible)`` gives one client's Ray resources once the cluster's GPUs are known.
    """
    import ray

    from server.internals.ray_cluster import flower_actor_pool_size

    ray.init(
        address=address,
        runtime_env={"env_vars": {"PYTHONPATH": driver_pythonpath()}},
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources")]
        num_gpus = sum(n["Resources"].get("GPU", 0) for n in nodes)
        resources = client_resources(num_gpus > 0)
        try:
            num_actors = flower_actor_pool_size(resources)  # Flower's own per-node count
        except ValueError:
            raise ConfigError(
                f"'backend.num_cpus'/'backend.num_gpus': no node of the cluster at {address} fits "
                f"one client with {client_resources}"
            ) from None
        _check_nodes(nodes, cfg["data"])
        return ClusterSummary(
            address, len(nodes), sum(n["Resources"].get("CPU", 0) for n in nodes), num_gpus, num_actors
        )
    finally:
        ray.shutdown()


def _check_nodes(nodes: list[dict[str, Any]], data: dict[str, Any]) -> None:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(node_report)
    refs = {
        n["NodeManagerAddress"] + " " + n["NodeID"][:8]: task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(data["name"], data["root"], data.get("cache_dir"))
        for n in nodes
    }
    for node, ref in refs.items():
        try:
            key, error = ray.get(ref, timeout=NODE_CHECK_TIMEOUT)
        except Exception as err:  # the task could not run there: fedmomentum missing, node lost, timeout
            raise ConfigError(
                f"'backend.address': node {node} could not run the data check "
                f"({type(err).__name__}: {str(err).strip().splitlines()[-1]}); install fedmomentum "
                "at the same path on every node"
            ) from None
        if error:
            raise ConfigError(
                f"'{key}' on node {node}: {error} (every node needs the data at the same path, or a shared file system)"
            )


def node_report(name: str, root: str, cache_dir: str | None) -> tuple[str, str]:
    """Run on one node: ("", "") when the clients there can load the data, else (config key, reason)."""
    from client import datacheck

    try:
        datacheck.check_cache_dir(cache_dir)
    except datacheck.DataSourceError as err:
        return "data.cache_dir", str(err)
    try:
        if name in NATURAL_DATASETS:  # paper 2's tasks: the cache the actors read (built here if missing)
            from client import datasets

            datasets.check_task(name, root, cache_dir, download=False)
        else:
            datacheck.check_source(name, root, cache_dir, download=False)
    except datacheck.DataSourceError as err:
        return "data.root", str(err)
    return "", ""
