"""Federated momentum and LocalUpdate strategies: pure math plus thin Flower adapters."""
