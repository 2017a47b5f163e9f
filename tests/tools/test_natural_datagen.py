"""The vectorised copy writers of tools/natural_datagen.py (the full-size copies of benchmarks/natural_tasks.py),
small: each copy is in its task's hub schema and loads through the project's loader with the asked numbers of rows
and clients."""

from __future__ import annotations

import numpy as np
import pytest

import tools.natural_datagen as gen
from client.datasets import load_task


def test_client_sizes_sum_and_spread():
    sizes = gen.client_sizes(100_000, 300, 1.66, np.random.default_rng(0))
    assert sizes.sum() == 100_000 and sizes.min() >= 1 and len(sizes) == 300
    assert 1.2 < sizes.std() / sizes.mean() < 2.2  # heavy-tailed as asked (a lognormal sample of 300)


@pytest.mark.parametrize(
    "task, writer, rows, clients",
    [
        ("femnist", gen.write_femnist_copy, 900, 7),
        ("shakespeare", gen.write_shakespeare_copy, 700, 5),
        ("stackoverflow_nwp", gen.write_stackoverflow_copy, 800, 9),
        ("stackoverflow_tp", gen.write_stackoverflow_copy, 800, 9),
    ],
)
def test_copy_loads_with_its_rows_and_clients(task, writer, rows, clients, tmp_path):
    root = writer(tmp_path / "copy", rows, clients, seed=1)
    data = load_task(task, str(root), str(tmp_path / "cache"))
    assert data.num_partitions == clients and int(data.offsets[-1]) == rows
    assert np.diff(data.offsets).min() >= 1
    if task == "shakespeare":  # in-alphabet windows: x[i + 1] is x[i] shifted by one character, then y[i]
        x, y = data.client(0).x, data.client(0).y
        assert np.array_equal(x[1, :-1], x[0, 1:]) and x[1, -1] == y[0] and x.max() < 80


def test_cifar100_copy_splits_into_whole_clients(tmp_path):
    root = gen.write_cifar100_copy(tmp_path / "copy", 1_000, 200)
    data = load_task("cifar100", str(root), str(tmp_path / "cache"))
    assert data.num_partitions == 10 and set(np.diff(data.offsets)) == {100}
    assert data.meta["num_rows"] == {"train": 1_000, "test": 200}
