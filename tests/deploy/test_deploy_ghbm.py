"""flower-deploy with stateful clients: FedHBM over real SuperLink/SuperNode processes equals the simulation.

Every message runs in a fresh flwr-clientapp process, so the clients' state lives only in their node-local
files (strategies/client_state.py); 3 rounds with cyclic p = 2 make every client of the first group use it.
"""

from __future__ import annotations

import pytest
from deploy_helpers import IN_PROCESS, assert_same_model, flower_processes, overrides, rows, run_cli

pytestmark = pytest.mark.e2e


def test_fedhbm_deployment_equals_simulation(deploy_data, tmp_path):
    extra = ("strategy=fedhbm", "num_rounds=3", "num_clients=2")  # cyclic: 0, 1, then 0 again
    dep_dir, sim_dir = tmp_path / "deploy", tmp_path / "sim"
    proc = run_cli("flower-deploy", overrides(deploy_data, dep_dir, *extra), timeout=300)
    left = flower_processes(dep_dir / "deploy" / "flwr_home")
    assert not left, f"leftover processes: {left}"
    assert proc.returncode == 0, proc.stdout[-4000:]
    sim = run_cli("flower-simulation", overrides(deploy_data, sim_dir, *extra, *IN_PROCESS), timeout=300)
    assert sim.returncode == 0, sim.stdout[-4000:]
    assert_same_model(dep_dir, sim_dir)
    keys = ("round", "accuracy", "loss", "train_loss", "num_replies", "num_failures")
    assert [{k: r.get(k) for k in keys} for r in rows(dep_dir)] == [{k: r.get(k) for k in keys} for r in rows(sim_dir)]
    states = sorted(
        p.relative_to(dep_dir / "client_state").parts[1:]
        for p in (dep_dir / "client_state").glob("*/partition-*/r*.npz")
    )
    assert len(states) == 3 and {s[0] for s in states} == {f"partition-{i}" for i in range(2)}
