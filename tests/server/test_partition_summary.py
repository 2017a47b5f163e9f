"""A run's partition summary: ``data.alpha=0`` that cannot give every client one class says so at the start."""

from test_batched_engine import make_cfg

from server.batched.grid import BatchedGrid
from server.run.app import run_experiment


def test_alpha_zero_warns_when_clients_hold_several_classes(tiny_data, tmp_path):
    """The tiny data has 12 images of each of 10 classes: 10 clients of 12 hold one class each; 4 clients of 30
    cannot (the split was labelled alpha=0 with clients of several classes, and nothing said so)."""
    logs = {}
    for num_clients in (4, 10):
        run_dir = tmp_path / f"k{num_clients}"
        cfg = make_cfg(
            tiny_data,
            run_dir,
            "model=logreg",
            "engine=batched",
            "data.alpha=0",
            f"num_clients={num_clients}",
            "num_rounds=1",
        )
        run_experiment(BatchedGrid(num_clients), cfg, cfg["run_dir"])
        logs[num_clients] = (run_dir / "run.log").read_text()
    assert "data.alpha=0 with 4 clients: 4 of 4 clients hold more than one class (up to " in logs[4]
    assert "one class per client needs each class's examples to split evenly over its clients" in logs[4]
    assert "data.alpha=0" not in logs[10]
