"""Hsu et al. (2019) Dirichlet partition (client/partition.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from client.partition import (
    client_sizes,
    dirichlet_partition,
    label_histograms,
    one_class_shortfall,
    parse_alpha,
    save_histograms,
)

LABELS = np.repeat(np.arange(10), 500)  # 5,000 examples, 10 balanced classes


def _check_cover(parts: list[np.ndarray], n: int) -> None:
    merged = np.concatenate(parts)
    assert len(merged) == n and len(np.unique(merged)) == n  # disjoint and complete


@pytest.mark.parametrize("alpha", [0, 0.05, 0.5, 10.0, math.inf])
def test_equal_sizes_and_cover(alpha: float) -> None:
    parts = dirichlet_partition(LABELS, 100, alpha, seed=1)
    assert [len(p) for p in parts] == [50] * 100
    _check_cover(parts, len(LABELS))


def test_alpha_zero_one_class_per_client() -> None:
    hist = label_histograms(LABELS, dirichlet_partition(LABELS, 100, 0, seed=3), 10)
    assert ((hist > 0).sum(1) == 1).all()
    assert ((hist > 0).sum(0) == 10).all()  # 10 clients per class


@pytest.mark.parametrize("num_clients", [10, 20, 50, 100])
def test_alpha_zero_says_nothing_when_each_class_splits_evenly(num_clients: int) -> None:
    hist = label_histograms(LABELS, dirichlet_partition(LABELS, num_clients, 0, seed=3), 10)
    assert ((hist > 0).sum(1) == 1).all() and one_class_shortfall(hist) is None


def test_alpha_zero_says_how_far_from_one_class_per_client() -> None:
    """8 clients of 625 over 10 classes of 500: no client can hold one class; the split was silently mixed."""
    hist = label_histograms(LABELS, dirichlet_partition(LABELS, 8, 0, seed=3), 10)
    classes, foreign = (hist > 0).sum(1), 1 - hist.max(1) / hist.sum(1)
    message = one_class_shortfall(hist)
    assert message.startswith(f"8 of 8 clients hold more than one class (up to {classes.max()}; up to ")
    assert f"{foreign.max():.0%} of a client's examples outside its main class)" in message
    assert one_class_shortfall(np.array([[3, 0], [0, 3], [2, 1]])).startswith("1 of 3 clients")


def test_iid_roughly_uniform() -> None:
    labels = np.repeat(np.arange(10), 5000)
    hist = label_histograms(labels, dirichlet_partition(labels, 100, "iid", seed=0), 10)
    assert hist.sum(1).tolist() == [500] * 100
    assert hist.min() >= 20 and hist.max() <= 85  # Binomial(500, 0.1): mean 50, sd 6.7


def test_small_alpha_is_skewed_large_alpha_is_not() -> None:
    skewed = label_histograms(LABELS, dirichlet_partition(LABELS, 100, 0.1, seed=0), 10)
    flat = label_histograms(LABELS, dirichlet_partition(LABELS, 100, 100.0, seed=0), 10)
    assert (skewed.max(1) / 50).mean() > 0.6
    assert (flat.max(1) / 50).mean() < 0.4


def test_deterministic_and_seed_dependent() -> None:
    a = dirichlet_partition(LABELS, 100, 0.5, seed=7)
    b = dirichlet_partition(LABELS, 100, 0.5, seed=7)
    c = dirichlet_partition(LABELS, 100, 0.5, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_uneven_sizes_and_unbalanced_classes() -> None:
    labels = np.concatenate([np.zeros(700, int), np.ones(200, int), np.full(103, 2)])
    parts = dirichlet_partition(labels, 10, 0, seed=0)
    assert client_sizes(1003, 10).tolist() == [101, 101, 101] + [100] * 7
    assert sorted(len(p) for p in parts) == sorted(client_sizes(1003, 10).tolist())
    _check_cover(parts, len(labels))


def test_parse_alpha_and_errors() -> None:
    assert parse_alpha("inf") == parse_alpha("IID") == parse_alpha(float("inf")) == math.inf
    assert parse_alpha("0.1") == 0.1 and parse_alpha(0) == 0.0
    with pytest.raises(ValueError):
        parse_alpha(-1)
    with pytest.raises(ValueError):
        client_sizes(5, 10)


def test_save_histograms(tmp_path: Path) -> None:
    hist = label_histograms(LABELS, dirichlet_partition(LABELS, 20, 0.5, seed=0), 10)
    paths = save_histograms(tmp_path / "run", hist, [f"c{i}" for i in range(10)], title="alpha=0.5")
    assert all(p.exists() and p.stat().st_size > 0 for p in paths.values())
    lines = paths["csv"].read_text().splitlines()
    assert lines[0].startswith("client,c0") and len(lines) == 21 and lines[1].endswith(",250")
    assert json.loads(paths["json"].read_text())["counts"] == hist.tolist()
