"""flower-deploy for every registered strategy the other deployment tests do not run (FedAvg and FedHBM have their
own): each run is submitted to one existing federation, a SuperLink and 2 SuperNodes started once for the module as
a lab's standing federation is (``deploy.superlink=HOST:PORT deploy.spawn_supernodes=0``), and equals the batched
engine's run of the same config: final model bitwise, the server-side metrics of every round."""

from __future__ import annotations

import pytest
from deploy_helpers import IN_PROCESS, ROOT, assert_same_model, flower_processes, overrides, rows, run_cli

from checks.engine_cases import STRATEGIES
from server.deploy.federation import Federation, FederationOptions

pytestmark = pytest.mark.e2e
OWN_TESTS = ("fedavg", "fedhbm")  # test_deploy_local.py, test_deploy_ghbm.py
KEYS = ("round", "accuracy", "loss", "train_loss", "loss_before", "num_replies", "num_failures")


@pytest.fixture(scope="module")
def federation(deploy_data, tmp_path_factory):
    """A SuperLink and the SuperNodes of partitions 0 and 1 (of 2), on loopback, for the whole module."""
    fed = Federation(tmp_path_factory.mktemp("federation"), ROOT, FederationOptions(database=False, torch_threads=1))
    fed.on_notice = lambda line: None
    left: dict[int, str] = {}
    try:
        fed.start_superlink()
        fed.start_supernodes(2, 2, str(deploy_data["folder"]))
        fed.wait_nodes(2)
        yield fed
    finally:
        left = fed.stop()
    assert not left, f"leftover processes: {left}"


@pytest.mark.parametrize("name", [n for n in STRATEGIES if n not in OWN_TESTS])
def test_each_strategy_deployed_to_an_existing_federation_equals_the_batched_engine(
    federation, deploy_data, tmp_path, name
):
    extra = (*STRATEGIES[name], "num_clients=2")  # cyclic halves: partition 0, then 1
    dep_dir, sim_dir = tmp_path / "deploy", tmp_path / "sim"
    remote = (f"deploy.superlink={federation.control_address}", "deploy.spawn_supernodes=0")
    proc = run_cli("flower-deploy", overrides(deploy_data, dep_dir, *extra, *remote), timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert not flower_processes(dep_dir / "deploy" / "flwr_home")  # the submitting CLI is gone
    sim = run_cli("flower-simulation", overrides(deploy_data, sim_dir, *extra, *IN_PROCESS), timeout=300)
    assert sim.returncode == 0, sim.stdout[-4000:]
    assert_same_model(dep_dir, sim_dir)
    assert [{k: r.get(k) for k in KEYS} for r in rows(dep_dir)] == [{k: r.get(k) for k in KEYS} for r in rows(sim_dir)]
    assert len(federation.node_ids()) == 2  # the federation outlives the run
