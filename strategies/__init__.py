"""Federated momentum and LocalUpdate strategies: pure math plus thin Flower adapters.

``strategies.math`` holds every update rule once; ``strategies.participation`` the
participation schedules; the Flower strategies and client managers are thin adapters,
imported lazily so that the math stays importable without Flower's start-up cost.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "FedAvgM": "strategies.flower",
    "FedCM": "strategies.flower",
    "LocalUpdate": "strategies.flower",
    "LocalUpdateDecay": "strategies.flower",
    "GHBM": "strategies.ghbm",
    "LocalGHBM": "strategies.ghbm",
    "FedHBM": "strategies.ghbm",
    "CyclicClientManager": "strategies.client_manager",
    "UniformClientManager": "strategies.client_manager",
    "PartitionClientManager": "strategies.client_manager",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'strategies' has no attribute {name!r}")
