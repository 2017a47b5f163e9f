"""Adaptive server optimizers through a real Flower simulation (Ray, 4 SuperNodes, toy quadratic clients):
our FedAvgM / LocalUpdate with Yogi, Adagrad, Adam against Flower's own FedYogi, FedAdagrad, FedAdam."""

import numpy as np
import pytest
from flwr.app import ConfigRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedYogi
from test_strategies_simulation import initial, trajectory_fn

from strategies import FedAvgM, LocalUpdate

pytestmark = pytest.mark.e2e
NUM_NODES, ROUNDS, ETA, GAMMA = 4, 8, 0.05, 0.2
ALL_NODES = dict(fraction_evaluate=0.0, min_available_nodes=NUM_NODES, min_train_nodes=NUM_NODES)
YOGI = dict(beta_1=0.9, beta_2=0.99, tau=1e-3)  # seed 001 Section 8.4's betas
ADAM = dict(beta_1=0.8, beta_2=0.9, tau=1e-2)
PAIRS = {
    # name: (ours, Flower's peer) on identical clients; plain clients take 2 steps of lr GAMMA
    "yogi": (
        FedAvgM(server_lr=ETA, momentum=0.0, server_optimizer="yogi", **YOGI, **ALL_NODES),
        FedYogi(eta=ETA, **YOGI, **ALL_NODES),
    ),
    "adagrad": (
        FedAvgM(server_lr=ETA, momentum=0.0, server_optimizer="adagrad", tau=1e-2, **ALL_NODES),
        FedAdagrad(eta=ETA, tau=1e-2, **ALL_NODES),
    ),
    "adam": (
        FedAvgM(server_lr=ETA, momentum=0.0, server_optimizer="adam", **ADAM, **ALL_NODES),
        FedAdam(eta=ETA, **ADAM, **ALL_NODES),
    ),
    # LocalUpdate, Theta_{1:2}: q_i = (x - x_i) / gamma, so Yogi on mean q with tau equals Yogi on Delta with
    # gamma * tau (m scales by gamma, sqrt(v) by gamma)
    "localupdate-yogi": (
        LocalUpdate(
            server_lr=ETA, client_lr=GAMMA, theta="fedavg", local_steps=2, server_optimizer="yogi", **YOGI, **ALL_NODES
        ),
        FedYogi(eta=ETA, beta_1=0.9, beta_2=0.99, tau=GAMMA * 1e-3, **ALL_NODES),
    ),
}


def run_pairs(grid: Grid, results: dict) -> None:
    """This module's runs, inside the ServerApp of the shared simulation (tests/strategies/conftest.py)."""
    for name, (ours, theirs) in PAIRS.items():
        for side, strategy in (("ours", ours), ("flower", theirs)):
            store = results.setdefault((name, side), {})
            strategy.start(
                grid,
                initial(),
                num_rounds=ROUNDS,
                timeout=120,
                train_config=ConfigRecord({"lr": GAMMA}),
                evaluate_fn=trajectory_fn(store),
            )


@pytest.fixture
def trajectories(toy_simulation):
    return toy_simulation["optimizers"]


@pytest.mark.parametrize("name", list(PAIRS))
def test_adaptive_server_optimizer_equals_flowers_in_simulation(trajectories, name):
    ours, flower = trajectories[(name, "ours")], trajectories[(name, "flower")]
    assert sorted(ours) == sorted(flower) == list(range(ROUNDS + 1))
    worst = 0.0
    for t in range(ROUNDS + 1):
        for a, b in zip(ours[t], flower[t], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
            worst = max(worst, float(np.abs(a - b).max()))
    print(f"{name}: max |ours - flower| over {ROUNDS} rounds = {worst:.3g}")
    assert not np.allclose(ours[ROUNDS][0], ours[0][0], atol=1e-3)  # the model moved
