"""A real Flower run_simulation with our strategies and quadratic clients follows the theory drivers to 1e-12.

Seed 000: FedAvgM (J = 1, IGD with momentum) and FedCM (J = 3) under cyclic participation on Lemma III.4's
two clients, against the vectorised fast driver; GHBM(tau=2), LocalGHBM and FedHBM (J = 3, the stateful two with
their node-local client state) against the state driver of theory.ghbm, and LocalGHBM == GHBM(tau = p = 2).
Seed 001: LocalUpdate (Theta_{1:2}) with both two-point clients every round, against the LocalUpdate driver of
theory.experiments.surrogate.
"""

import numpy as np
import pytest

ROUNDS = 50
LU_ROUNDS = 30
MU, G, THETA0 = 2.0, 10.0, 10.0
GHBM_CASES = {  # name: (strategy keywords, client lr, eta0 of the polynomial server schedule)
    "ghbm": ({"tau": 2, "momentum": 0.9}, 0.05, 1.0),
    "localghbm": ({"momentum": 0.9}, 0.05, 1.0),
    "fedhbm": ({"momentum": 1.0}, 0.05, 1.0),
}


def run_flower(state_dir) -> dict:
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from strategies.client_manager import CyclicClientManager, UniformClientManager
    from strategies.flower import FedAvgM, FedCM, LocalUpdate
    from strategies.ghbm import GHBM, FedHBM, LocalGHBM
    from theory.flower_app import app as client_app

    common = dict(fraction_evaluate=0.0, min_available_nodes=2, min_train_nodes=1)
    cases = [
        (
            "fedavgm",
            FedAvgM(
                server_lr=5.0,
                momentum=0.9,
                client_lr=1.0,
                server_lr_schedule="polynomial",
                schedule_param=0.5,
                client_manager=CyclicClientManager(2, 0.5, groups=[[0], [1]]),
                **common,
            ),
            {"mu": MU, "G": G, "local-steps": 1},
            THETA0,
            ROUNDS,
        ),
        (
            "fedcm",
            FedCM(
                server_lr=1.0,
                momentum=0.9,
                client_lr=0.05,
                server_lr_schedule="polynomial",
                schedule_param=0.5,
                client_manager=CyclicClientManager(2, 0.5, groups=[[0], [1]]),
                **common,
            ),
            {"mu": MU, "G": G, "local-steps": 3},
            THETA0,
            ROUNDS,
        ),
        (
            "localupdate",
            LocalUpdate(
                server_lr=0.4,
                client_lr=0.3,
                theta="fedavg",
                local_steps=2,
                server_lr_schedule="polynomial",
                schedule_param=0.5,
                client_manager=UniformClientManager(2, 1.0),
                **common,
            ),
            {"problem": "two-point"},
            0.0,
            LU_ROUNDS,
        ),
    ]
    for name, (kw, lr, eta0) in GHBM_CASES.items():
        cls = {"ghbm": GHBM, "localghbm": LocalGHBM, "fedhbm": FedHBM}[name]
        if name != "ghbm":
            kw = {**kw, "client_state_dir": str(state_dir)}
        strategy = cls(
            server_lr=eta0,
            client_lr=lr,
            server_lr_schedule="polynomial",
            schedule_param=0.5,
            client_manager=CyclicClientManager(2, 0.5, groups=[[0], [1]]),
            **kw,
            **common,
        )
        cases.append((name, strategy, {"mu": MU, "G": G, "local-steps": 3}, THETA0, ROUNDS))
    results: dict = {}
    server = ServerApp()

    @server.main()
    def main(grid, context):
        for name, strategy, cfg, x0, rounds in cases:
            traj: list[float] = []

            def record(server_round, arrays, traj=traj):
                traj.append(float(arrays.to_numpy_ndarrays()[0][0]))

            strategy.start(
                grid=grid,
                initial_arrays=ArrayRecord([np.array([x0])]),
                num_rounds=rounds,
                timeout=120,
                train_config=ConfigRecord(cfg),
                evaluate_fn=record,
            )
            results[name] = np.array(traj)

    run_simulation(
        server_app=server,
        client_app=client_app,
        num_supernodes=2,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2, "num_gpus": 0},
        },
    )
    return results


def theory_trajectories() -> dict:
    from theory.driver import Schedule, run_fast
    from theory.experiments.surrogate import population, run_localupdate
    from theory.problems import MomentumRound

    out = {}
    for name, rf, eta0 in [
        ("fedavgm", MomentumRound("fedavgm", mu=MU, client_lr=1.0, momentum=0.9, local_steps=1), 5.0),
        ("fedcm", MomentumRound("fedcm", mu=MU, client_lr=0.05, momentum=0.9, local_steps=3), 1.0),
    ]:
        sched = Schedule(np.array([eta0]), "polynomial", np.array([0.5]))
        th, _ = run_fast(rf, sched, THETA0, G, ROUNDS, checkpoints=range(1, ROUNDS + 1))
        out[name] = np.concatenate([[THETA0], th[:, 0]])
    traj = run_localupdate(
        population("two-point"), np.array([0.3]), np.array([[1.0, 1.0]]), LU_ROUNDS, eta0=np.array([0.4])
    )
    out["localupdate"] = traj[:, 0]
    from theory.ghbm import GHBMRound
    from theory.state_driver import run_state_fast

    for name, (kw, lr, eta0) in GHBM_CASES.items():
        rf = GHBMRound(name, mu=MU, local_steps=3, scheduled="server", client_lr=lr, **kw)
        sched = Schedule(np.array([eta0]), "polynomial", np.array([0.5]))
        th = run_state_fast(rf, rf.dim, sched, rf.initial_state(THETA0), G, ROUNDS, checkpoints=range(1, ROUNDS + 1))
        out[name] = np.concatenate([[THETA0], th[:, 0]])
    return out


@pytest.mark.e2e
@pytest.mark.slow
def test_flower_run_simulation_matches_theory_drivers(tmp_path):
    flower = run_flower(tmp_path / "client_state")
    theory = theory_trajectories()
    for name, ref in theory.items():
        got = flower[name]
        assert got.shape == ref.shape, name
        assert np.max(np.abs(got - ref) / np.maximum(1.0, np.abs(ref))) < 1e-12, name
    # the runs are not trivial: the momentum trajectories oscillate and LocalUpdate moves towards x*(gamma)
    assert np.ptp(theory["fedavgm"][-10:]) > 1e-3 and abs(theory["localupdate"][-1]) > 0.5
    # LocalGHBM under cyclic participation (p = 2) is GHBM(tau = 2), through Flower and the client state files
    np.testing.assert_allclose(flower["localghbm"], flower["ghbm"], rtol=1e-12, atol=1e-12)
    assert np.ptp(flower["fedhbm"][-10:]) > 1e-3 and not np.allclose(flower["fedhbm"], flower["ghbm"])
    assert (
        sorted(p.name for p in (tmp_path / "client_state").glob("*/partition-*"))
        == ["partition-0"] * 2 + ["partition-1"] * 2
    )  # one run id per stateful strategy, one folder per partition
