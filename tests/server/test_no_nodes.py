"""A simulation in which no client node ever answers fails clearly instead of "finishing" empty rounds.

The usual cause is a Ray backend whose actors fail to start (seen under heavy load): every partition query
comes back as an error. Here the ClientApp's query raises, which Flower turns into the same error replies.
"""

import csv
import json

import pytest
from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.simulation import run_simulation
from hydra import compose, initialize_config_dir

from server.ray.engine import CONF_DIR, backend_config
from server.run import config as config_lib
from server.run.app import make_server_app
from strategies.client_manager import NoNodesError

silent_app = ClientApp()


@silent_app.query()
def query(msg: Message, context: Context) -> Message:
    raise RuntimeError("this node's actor never came up")


@pytest.mark.e2e
def test_no_answering_node_fails_the_run_with_status_failed(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(
            config_name="config",
            overrides=[
                f"run_dir={run_dir}",
                f"data.root={tiny_data['tarball']}",
                f"data.cache_dir={tiny_data['cache']}",
                "num_clients=2",
                "num_rounds=3",
                "participation.fraction=0.5",
                "participation.wait_timeout=3",
                "round_timeout=10",
                "eval_max_examples=20",
            ],
        )
    cfg = config_lib.validate(config_lib.to_plain(cfg))
    result: dict = {}
    with pytest.raises(NoNodesError, match=r"participation\.wait_timeout=3 s"):  # flower-simulation: exit 1
        run_simulation(
            make_server_app(cfg, result),
            silent_app,
            num_supernodes=2,
            backend_name="ray",
            backend_config=backend_config(cfg),
        )
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "failed" and status["round"] == 0 and "no client node" in status["reason"]
    with open(run_dir / "metrics.csv") as f:
        assert [row["round"] for row in csv.DictReader(f)] == ["0"]  # the initial evaluation only
    assert not (run_dir / "summary.json").exists()
