"""Flower's node sampling of its Message-API strategies (flwr 1.39 internals:
``flwr.serverapp.strategy.strategy_utils.sample_nodes``, what Flower's ``FedAvg`` samples with)."""

from __future__ import annotations

from flwr.serverapp.strategy.strategy_utils import sample_nodes

__all__ = ["sample_nodes"]
