"""Ray's address file and Flower's per-node actor count, for ``backend.address`` checks (Ray and flwr internals).

``backend.address=auto`` reads the address a ``ray start --head`` on this machine wrote, from the file Ray itself
reads for ``ray.init(address="auto")`` (``ray._common.utils.get_ray_address_file``); a cluster's capacity is counted
with the function Flower's Ray backend sizes its actor pool with
(``flwr.simulation.ray_transport.ray_actor.pool_size_from_resources``).
"""

from __future__ import annotations


def ray_address_file() -> str:
    """The path of the file in which a local ``ray start --head`` records the cluster's address."""
    from ray._common.utils import get_ray_address_file

    return get_ray_address_file(None)


def flower_actor_pool_size(client_resources: dict[str, float]) -> int:
    """How many ClientApp actors Flower's Ray backend starts on the connected cluster for ``client_resources``
    (Flower's own count; ValueError when no node fits one)."""
    from flwr.simulation.ray_transport.ray_actor import pool_size_from_resources

    return pool_size_from_resources(client_resources)
