"""The split names of a ``flwr_datasets.FederatedDataset`` (flwr-datasets 0.6 internals: its loaded
``datasets.DatasetDict`` is the private ``_dataset``; there is no public accessor)."""

from __future__ import annotations

from typing import Any


def split_names(federated_dataset: Any) -> list[str]:
    """The splits of a FederatedDataset whose data was loaded (by ``load_split``)."""
    return list(federated_dataset._dataset)
