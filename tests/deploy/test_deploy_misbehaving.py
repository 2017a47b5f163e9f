"""A flower-deploy federation with one misbehaving SuperNode (issue 8): its broken replies are rejected and
counted every round, and the run ends with the model of the same federation without that node."""

from __future__ import annotations

import numpy as np
import pytest
from deploy_helpers import compose, final_model, flower_processes, overrides, rows

from server.deploy.cli import deploy
from server.deploy.federation import Federation

pytestmark = pytest.mark.e2e
BROKEN = "nan,wrong-shape,zero-num-examples"  # one kind per round (tests/deploy/misbehaving_app.py)


def _deploy(cfg, run_dir, on_start=None, node_config=None):
    lines: list[str] = []
    try:
        result = deploy(cfg, on_line=lines.append, on_start=on_start, node_config=node_config)
    finally:
        left = flower_processes(run_dir / "deploy" / "flwr_home")
        assert not left, left
    assert result.ok, "\n".join(lines[-60:])
    return rows(run_dir)


def test_broken_supernode_is_rejected_and_changes_nothing(deploy_data, misbehaving_app_dir, tmp_path):
    """An honest SuperNode + 1 whose replies carry NaN weights (round 1), a wrong shape (round 2) and zero
    num-examples (round 3): all rounds complete, 1 rejection per round, and the final model equals (to 1e-12)
    that of the honest node alone (partition 1 then has no node and is skipped)."""
    extra = (
        "num_clients=2",
        "num_rounds=3",
        "participation.fraction=1.0",
        "participation.wait_timeout=3",
        f"deploy.app_dir={misbehaving_app_dir}",
    )
    honest_dir, broken_dir = tmp_path / "honest", tmp_path / "broken"
    honest = _deploy(compose(overrides(deploy_data, honest_dir, *extra, "deploy.spawn_supernodes=1")), honest_dir)

    def all_registered(fed: Federation) -> None:
        fed.wait_nodes(2)

    broken = _deploy(
        compose(overrides(deploy_data, broken_dir, *extra, "deploy.spawn_supernodes=2")),
        broken_dir,
        all_registered,
        node_config={1: {"misbehave": BROKEN}},
    )
    assert [r["round"] for r in broken] == [0, 1, 2, 3]
    for r in broken[1:]:
        assert (r["num_selected"], r["num_replies"], r["num_rejected"], r["num_failures"]) == (2, 1, 1, 0), r
    for r in honest[1:]:
        assert (r["num_selected"], r["num_replies"], r["num_rejected"], r["num_skipped"]) == (1, 1, 0, 1), r
    log = (broken_dir / "run.log").read_text()
    assert log.count("(partition 1)") == 3  # each rejection is logged once with the partition id
    a, b = final_model(broken_dir), final_model(honest_dir)
    assert a.keys() == b.keys()
    for key in a:
        assert np.max(np.abs(a[key].astype(np.float64) - b[key].astype(np.float64)), initial=0.0) <= 1e-12, key
    assert [r["accuracy"] for r in broken] == [r["accuracy"] for r in honest]
