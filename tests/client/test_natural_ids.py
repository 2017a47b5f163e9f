"""client/datasets/natural_ids.py: the lean NaturalIdPartitioner gives flwr-datasets' partitions exactly, on rows
of interleaved clients (string and integer ids), and a row without a natural id is one line naming the column."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
from flwr_datasets.partitioner import NaturalIdPartitioner

from client.datacheck import DataSourceError
from client.datasets.natural_ids import ArrowNaturalIdPartitioner
from server.run.config import ConfigError, validate
from tools.natural_datagen import make_femnist, make_shakespeare, write


def _partitions(partitioner, dataset):
    partitioner.dataset = dataset
    return [
        list(partitioner.load_partition(p)["__row"]) for p in range(partitioner.num_partitions)
    ], partitioner.partition_id_to_natural_id


@pytest.mark.parametrize("column", ["character_id", "number"])
def test_same_partitions_as_flwr_datasets(column):
    train = make_shakespeare(num_clients=9, per_client=7, seed=2)["train"].shuffle(seed=0).flatten_indices()
    train = train.add_column("number", [int(c.split("_")[1]) * 7 % 11 for c in train["character_id"]])
    train = train.add_column("__row", list(range(len(train))))
    train = datasets.concatenate_datasets([train.select(range(20)), train.select(range(20, len(train)))])  # 2 chunks
    lean = ArrowNaturalIdPartitioner(partition_by=column)
    ours, our_ids = _partitions(lean, train)
    theirs, their_ids = _partitions(NaturalIdPartitioner(partition_by=column), train)
    assert our_ids == their_ids and len(ours) == len(set(train[column])) > 1
    assert list(lean.partition_sizes()) == [len(rows) for rows in theirs]
    assert ours == theirs and any(np.any(np.diff(rows) > 1) for rows in ours)  # interleaved clients


def test_null_natural_id_is_one_line_naming_the_column(tmp_path):
    dd = make_femnist(num_clients=3)
    dd["train"] = dd["train"].map(
        lambda row, i: {"writer_id": None if i in (2, 5) else row["writer_id"]}, with_indices=True
    )
    partitioner = ArrowNaturalIdPartitioner(partition_by="writer_id")
    partitioner.dataset = dd["train"]
    with pytest.raises(DataSourceError, match=r"^column 'writer_id': 2 of \d+ rows have no natural id \(null\)$"):
        partitioner.load_partition(0)
    cfg = {
        "num_rounds": 1,
        "num_clients": "all",
        "seed": 0,
        "eval_every": 1,
        "checkpoint_every": 1,
        "model": {"name": "femnist_cnn"},
        "participation": {"mode": "uniform", "clients_per_round": 1},
        "strategy": {"name": "fedavg"},
        "client": {"batch_size": 4, "local_epochs": 1},
        "data": {
            "name": "femnist",
            "root": str(write(dd, tmp_path / "copy")),
            "cache_dir": str(tmp_path / "cache"),
            "download": False,
        },
    }
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert str(err.value).startswith("'data.root': column 'writer_id': 2 of") and "\n" not in str(err.value)
