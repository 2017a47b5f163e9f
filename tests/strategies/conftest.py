"""One Ray simulation for the in-process strategy simulations: each ``flwr.simulation.run_simulation`` starts Ray
(~8-10 s on 2 cores), so the runs of test_strategies_simulation.py and test_server_optimizers_simulation.py share
one (same 4 toy SuperNodes, same backend). Their clients are stateless (the GHBM family's node-local state lives
under a directory of its run), so one module's runs cannot change the other's."""

import pytest
import toy_app
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

NUM_NODES = 4


@pytest.fixture(scope="session")
def toy_simulation(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """{"strategies": results of test_strategies_simulation.run_strategies, "optimizers": results of
    test_server_optimizers_simulation.run_pairs}, both run by one ServerApp in one simulation."""
    from test_server_optimizers_simulation import run_pairs
    from test_strategies_simulation import run_strategies

    results: dict[str, dict] = {"strategies": {"state_dir": tmp_path_factory.mktemp("client_state")}, "optimizers": {}}
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_strategies(grid, results["strategies"])
        run_pairs(grid, results["optimizers"])

    run_simulation(
        app,
        toy_app.app,
        num_supernodes=NUM_NODES,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2, "num_gpus": 0},
        },
    )
    return results
