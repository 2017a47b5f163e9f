"""The ClientApp's torch threads (client/threads.py, issue 16 item 7): the share rule and its precedence."""

from __future__ import annotations

import logging

import pytest
import torch

from client import config as C
from client import threads


@pytest.mark.parametrize(
    "cores, nodes, share",
    [
        (2, 4, 1),  # the host: 4 SuperNodes training at once on 2 cores
        (2, 2, 1),
        (2, 1, 2),
        (16, 4, 4),
        (16, 3, 5),
        (16, 100, 1),
        (8, 0, 8),
    ],
)
def test_local_share(cores, nodes, share):
    assert threads.local_share(cores, nodes) == share


def test_local_share_rejects_nonsense():
    with pytest.raises(ValueError, match="cores"):
        threads.local_share(0, 4)


@pytest.mark.parametrize(
    "config, node, expected",
    [
        ({}, {}, (0, "torch default")),  # a node nobody told: torch's default
        ({C.TORCH_THREADS: 0}, {threads.NODE_KEY: 2}, (2, "node_config torch-threads")),  # flower-deploy's share
        ({C.TORCH_THREADS: 3}, {threads.NODE_KEY: 2}, (3, "client.torch_threads")),  # the config overrides it
        ({C.TORCH_THREADS: 3}, None, (3, "client.torch_threads")),
        ({C.TORCH_THREADS: 1.0}, {threads.NODE_KEY: "4"}, (1, "client.torch_threads")),  # run configs may send floats
        ({}, {threads.NODE_KEY: 0}, (0, "torch default")),
    ],
)
def test_choose_precedence(config, node, expected):
    assert threads.CONFIG_KEY == C.TORCH_THREADS
    assert threads.choose(config, node) == expected


@pytest.mark.parametrize(
    "config, node, message",
    [
        ({C.TORCH_THREADS: -1}, {}, "client.torch_threads"),
        ({}, {threads.NODE_KEY: "two"}, "torch-threads"),
        ({}, {threads.NODE_KEY: 1.5}, "torch-threads"),
        ({}, {threads.NODE_KEY: float("inf")}, "torch-threads"),
    ],
)
def test_choose_rejects_bad_counts(config, node, message):
    with pytest.raises(ValueError, match=message):
        threads.choose(config, node)


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_apply_sets_torch_and_logs_for_told_nodes(restore_threads, caplog):
    """A told node logs what its ClientApp uses; an untold one keeps torch's count and stays silent."""
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addHandler(caplog.handler)
    try:
        assert threads.apply({}, {threads.NODE_KEY: 1}) == torch.get_num_threads() == 1
        assert "ClientApp torch threads: 1 (node_config torch-threads; node default 1" in caplog.text
        caplog.clear()
        assert threads.apply({C.TORCH_THREADS: 2}, {}) == torch.get_num_threads() == 2
        assert threads.apply({}, {}) == 2 and "torch threads" not in caplog.text  # untold: unchanged, silent
    finally:
        flwr_logger.removeHandler(caplog.handler)
