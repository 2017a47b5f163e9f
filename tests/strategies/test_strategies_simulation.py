"""Every strategy through a real Flower simulation (Ray backend, 4 SuperNodes, toy quadratic clients; one simulation
shared with test_server_optimizers_simulation.py, tests/strategies/conftest.py)."""

import numpy as np
import pytest
import toy_app
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvgM as FlowerFedAvgM

from strategies import GHBM, CyclicClientManager, FedAvgM, FedCM, FedHBM, LocalGHBM, LocalUpdate, LocalUpdateDecay

pytestmark = pytest.mark.e2e
NUM_NODES = 4


def initial():
    return ArrayRecord({f"p{i}": Array(np.full(s, 0.5)) for i, s in enumerate(toy_app.SHAPES)})


def trajectory_fn(store):
    def evaluate_fn(server_round, arrays):
        store[server_round] = [a.copy() for a in arrays.to_numpy_ndarrays()]
        return MetricRecord({"round": server_round})

    return evaluate_fn


GHBM_ROUNDS = 8


def run_strategies(grid: Grid, results: dict) -> None:
    """This module's runs, inside the ServerApp of the shared simulation (tests/strategies/conftest.py); the GHBM
    family keeps its node-local state under ``results["state_dir"]``."""
    for name, strategy in [
        (
            "ours",
            FedAvgM(
                server_lr=1.2,
                momentum=0.9,
                fraction_evaluate=0.0,
                min_available_nodes=NUM_NODES,
                min_train_nodes=NUM_NODES,
            ),
        ),
        (
            "flower",
            FlowerFedAvgM(
                server_learning_rate=1.2 * (1 - 0.9),
                server_momentum=0.9,
                fraction_evaluate=0.0,
                min_available_nodes=NUM_NODES,
                min_train_nodes=NUM_NODES,
            ),
        ),
    ]:
        store = results.setdefault(name, {})
        strategy.start(
            grid,
            initial(),
            num_rounds=20,
            timeout=120,
            train_config=ConfigRecord({"lr": 0.2}),
            evaluate_fn=trajectory_fn(store),
        )
    cyclic = dict(fraction_evaluate=0.0, min_available_nodes=1)
    for name, strategy in [
        ("fedavgm", FedAvgM(server_lr=1.0, momentum=0.5, client_lr=0.1, **cyclic)),
        ("fedcm", FedCM(server_lr=0.5, client_lr=0.1, momentum=0.9, **cyclic)),
        ("localupdate", LocalUpdate(server_lr=0.1, client_lr=0.1, theta=[1.0, 1.0, 1.0], **cyclic)),
        (
            "localupdate_decay",
            LocalUpdateDecay(
                server_lr=0.1,
                client_lr=0.1,
                theta="fedavg",
                local_steps=2,
                window=1,
                patience=1,
                cooldown=0,
                min_delta=100.0,
                **cyclic,
            ),
        ),
    ]:
        strategy.client_manager = CyclicClientManager(NUM_NODES, 0.5, seed=3, wait_timeout=60)
        store = results.setdefault(name, {})
        strategy.start(grid, initial(), num_rounds=3, timeout=120, evaluate_fn=trajectory_fn(store))
        results[name + "/strategy"] = strategy
    # the GHBM family; LocalGHBM under cyclic participation with p = 2 must equal GHBM(tau = 2)
    state = {"client_state_dir": str(results["state_dir"])}
    for name, strategy in [
        ("ghbm", GHBM(server_lr=1.0, client_lr=0.1, momentum=0.9, tau=2, **cyclic)),
        ("localghbm", LocalGHBM(server_lr=1.0, client_lr=0.1, momentum=0.9, **state, **cyclic)),
        ("fedhbm", FedHBM(server_lr=1.0, client_lr=0.1, momentum=1.0, **state, **cyclic)),
    ]:
        strategy.client_manager = CyclicClientManager(NUM_NODES, 0.5, seed=3, wait_timeout=60)
        store = results.setdefault(name, {})
        results[name + "/result"] = strategy.start(
            grid, initial(), num_rounds=GHBM_ROUNDS, timeout=120, evaluate_fn=trajectory_fn(store)
        )
        results[name + "/strategy"] = strategy
    # a schedule over 6 partitions on 4 nodes: partitions 4 and 5 never connect and are skipped
    missing = FedAvgM(server_lr=1.0, momentum=0.0, client_lr=0.1, **cyclic)
    missing.client_manager = CyclicClientManager(6, 0.5, groups=[[0, 4, 5], [1, 2, 3]], wait_for=NUM_NODES)
    results["missing"] = missing.start(grid, initial(), num_rounds=2, timeout=120)
    results["missing/strategy"] = missing


@pytest.fixture
def simulation_results(toy_simulation):
    return toy_simulation["strategies"]


def test_fedavgm_equals_flower_fedavgm_in_simulation(simulation_results):
    ours, flower = simulation_results["ours"], simulation_results["flower"]
    assert sorted(ours) == sorted(flower) == list(range(21))
    for t in range(21):
        for a, b in zip(ours[t], flower[t]):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
    assert not np.allclose(ours[20][0], ours[0][0])  # the model moved


@pytest.mark.parametrize(
    "name", ["fedavgm", "fedcm", "localupdate", "localupdate_decay", "ghbm", "localghbm", "fedhbm"]
)
def test_each_strategy_runs_three_cyclic_rounds(simulation_results, name):
    traj = simulation_results[name]
    strategy = simulation_results[name + "/strategy"]
    assert sorted(traj)[:4] == [0, 1, 2, 3]
    for t in (1, 2, 3):
        assert all(np.all(np.isfinite(a)) for a in traj[t])
        assert not all(np.allclose(a, b) for a, b in zip(traj[t], traj[t - 1]))
    groups = strategy.client_manager.schedule.groups
    assert sorted(strategy.client_manager.node_to_partition.values()) == list(range(NUM_NODES))
    assert strategy.client_manager.skipped == {}
    assert len(groups) == 2 and sorted(groups[0] + groups[1]) == list(range(NUM_NODES))
    if name == "localupdate_decay":
        assert strategy.decay_state.num_decays == 2  # rounds 2 and 3: no improvement of min_delta=100
        assert strategy.decay_state.client_lr == pytest.approx(0.1 * 0.1**2)


def test_missing_partitions_are_skipped_and_the_round_completes(simulation_results):
    manager = simulation_results["missing/strategy"].client_manager
    assert manager.skipped == {1: [4, 5]}
    metrics = simulation_results["missing"].train_metrics_clientapp
    assert metrics[1]["num-replies"] == 1 and metrics[2]["num-replies"] == 3
    assert metrics[1]["num-skipped"] == 2 and metrics[2]["num-skipped"] == 0


def test_localghbm_under_cyclic_participation_equals_ghbm_tau_p(simulation_results):
    """p = 1/C = 2: each client's anchor is theta^{t-3} and tau_i = 2, read back from its state files."""
    ghbm, local, fedhbm = (simulation_results[k] for k in ("ghbm", "localghbm", "fedhbm"))
    assert sorted(ghbm) == sorted(local) == list(range(GHBM_ROUNDS + 1))
    for t in ghbm:
        for a, b in zip(local[t], ghbm[t]):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert not np.allclose(ghbm[GHBM_ROUNDS][0], ghbm[0][0])
    assert any(not np.allclose(a, b) for a, b in zip(fedhbm[GHBM_ROUNDS], ghbm[GHBM_ROUNDS]))
    for name in ("localghbm", "fedhbm"):  # clients used a stored state from their second participation on
        metrics = simulation_results[name + "/result"].train_metrics_clientapp
        assert [metrics[t]["state-rounds"] for t in (1, 2, 3, GHBM_ROUNDS)] == [0, 0, 2, 2]
        assert all(metrics[t]["state-invalid"] == 0 for t in metrics)
        run = simulation_results[name + "/strategy"].state_run
        assert sorted(p.name for p in (simulation_results["state_dir"] / run).iterdir()) == [
            f"partition-{i}" for i in range(NUM_NODES)
        ]
