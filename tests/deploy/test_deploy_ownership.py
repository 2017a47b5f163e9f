"""Issue 19 on a real TLS + auth deployment (127.0.0.1): no single registered node can stall or steer a run.

Each test reproduces a finding of the probe with registered intruder keys (the Control API registers any key):
a node racing an honest one for partition 0 at a 0.05 s poll, claims out of range or of another num-partitions,
and a node that joins but never runs a ClientApp. Each asserts the honest final model bitwise (the 2-client
simulation), the counters, the log lines naming the nodes, and that no round sent a train message to, or waited
for, a node other than the two honest ones (2 selected, 2 replies, every round shorter than round_timeout).
"""

from __future__ import annotations

import re
import threading

import pytest
from deploy_helpers import IN_PROCESS, assert_same_model, compose, flower_processes, overrides, rows, run_cli
from security_helpers import open_gate_when_answered, start_intruder, start_silent_node

from server.deploy.cli import deploy
from server.deploy.federation import Federation
from server.run import procs

pytestmark = pytest.mark.e2e
SETTING = ("num_clients=2", "participation.fraction=1.0", "num_rounds=3")
ROUND_TIMEOUT = 60.0  # deploy_helpers.overrides: a round that waited for a node ends at round_timeout, never before


@pytest.fixture(scope="module")
def sim_two(deploy_data, tmp_path_factory):
    """The honest 2-client, 3-round experiment in simulation, batched engine (bitwise an honest deployment)."""
    run_dir = tmp_path_factory.mktemp("sim2") / "run"
    proc = run_cli("flower-simulation", overrides(deploy_data, run_dir, *SETTING, *IN_PROCESS), timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return run_dir


def _deploy(cfg, run_dir, tmp_path, on_start, node_config=None):
    """flower-deploy with ``on_start(fed, intruders, home)`` (SuperNodes started with ``node_config``); every
    process (intruders too) is stopped after."""
    intruders: dict[str, procs.ManagedProcess] = {}
    lines: list[str] = []
    home = tmp_path / "intruder_home"
    try:
        result = deploy(
            cfg, on_line=lines.append, on_start=lambda fed: on_start(fed, intruders, home), node_config=node_config
        )
    finally:
        for proc in intruders.values():
            proc.stop(10)
        left = {**flower_processes(run_dir / "deploy" / "flwr_home"), **flower_processes(home)}
        assert not left, left
    assert result.ok, "\n".join(lines[-60:])
    return intruders


def _only_the_honest_nodes_were_asked_and_waited_for(metrics: list[dict]) -> bool:
    """Every round sent its 2 train messages to the honest nodes, got both replies and did not end at round_timeout."""
    return all(r["num_selected"] == r["num_replies"] == 2 and r["seconds"] < ROUND_TIMEOUT for r in metrics[1:])


def _registered(fed: Federation, name: str) -> list[str]:
    """TLS + a key registered through the (loopback, unauthenticated) Control API: what the probe used."""
    return ["--root-certificates", str(fed.ca_cert), "--auth-supernode-private-key", str(fed.node_key(name).private)]


def test_racing_and_bad_claims_of_registered_nodes_are_refused(deploy_data, misbehaving_app_dir, sim_two, tmp_path):
    """Findings 1 and 3: a registered intruder polling every 0.05 s claims partition 0 (and would send x1.1
    updates) and has answered before the honest node 0 answers (a gate file holds node 0's answer until then);
    two more claim partition 7 of 2 and partition 1 of 5. All three are refused once each, with the reason in
    run.log; node 0 serves partition 0; nothing is reassigned or silent; the model is the honest one. The honest
    round-1 training waits until every intruder has answered (a second gate), so round 2 collects every answer."""
    run_dir = tmp_path / "run"
    cfg = compose(
        overrides(
            deploy_data,
            run_dir,
            *SETTING,
            "deploy.tls=true",
            "deploy.auth=true",
            "participation.query_timeout=20",
            f"deploy.app_dir={misbehaving_app_dir}",
        )
    )
    ids: dict[str, set[int]] = {}
    query_gate, train_gate = tmp_path / "query-gate", tmp_path / "train-gate"

    node_config = {
        0: {"query-gate": str(query_gate), "train-gate": str(train_gate)},
        1: {"train-gate": str(train_gate)},
    }

    def on_start(fed: Federation, intruders: dict, home) -> None:
        ids["honest"] = set(fed.wait_nodes(2))
        intruders["racer"] = start_intruder(
            fed,
            "racer",
            _registered(fed, "racer"),
            'partition-id=0 num-partitions=2 misbehave="scale"',
            home,
            max_wait=30,
            poll_interval=0.05,
        )
        intruders["out-of-range"] = start_intruder(
            fed, "out-of-range", _registered(fed, "out-of-range"), "partition-id=7 num-partitions=2", home, max_wait=30
        )
        intruders["other-n"] = start_intruder(
            fed, "other-n", _registered(fed, "other-n"), "partition-id=1 num-partitions=5", home, max_wait=30
        )
        fed.wait_nodes(5)
        logs = [fed.log_dir / f"{name}.log" for name in intruders]
        threading.Thread(target=open_gate_when_answered, args=(logs[:1], query_gate), daemon=True).start()
        threading.Thread(target=open_gate_when_answered, args=(logs, train_gate), daemon=True).start()

    _deploy(cfg, run_dir, tmp_path, on_start, node_config)
    metrics = rows(run_dir)
    assert sum(r["num_refused"] for r in metrics[1:]) == 3 and metrics[3]["num_refused"] == 0
    assert all(r["num_reassigned"] == 0 and r["num_silent"] == 0 for r in metrics[1:])
    assert _only_the_honest_nodes_were_asked_and_waited_for(metrics), metrics
    log = (run_dir / "run.log").read_text()
    refused = dict(re.findall(r"refused the partition claim of node (\d+): (.*)", log))
    assert len(refused) == 3 and not {int(n) for n in refused} & ids["honest"], refused
    reasons = sorted(refused.values())
    assert any("claims partition 0, but its key SHA256:" in r and "owns no partition" in r for r in reasons)
    assert any("partition 7 is outside [0, 2)" in r for r in reasons)
    assert any("num-partitions=5, the run has 2" in r for r in reasons)
    serves0 = re.search(r"node (\d+) serves partition 0", log)
    assert serves0 and int(serves0.group(1)) in ids["honest"]
    assert_same_model(run_dir, sim_two)


def test_silent_registered_node_does_not_stall_rounds(deploy_data, sim_two, tmp_path):
    """Finding 2: a registered node that joins but never runs a ClientApp (round_timeout=60 s) is asked once,
    named silent in run.log after participation.query_timeout=2 s, counted in num_silent, and never waited for:
    no round selects it or ends at round_timeout (60 s); the model is the honest one."""
    run_dir = tmp_path / "run"
    cfg = compose(
        overrides(
            deploy_data, run_dir, *SETTING, "deploy.tls=true", "deploy.auth=true", "participation.query_timeout=2"
        )
    )
    ids: dict[str, int] = {}

    def on_start(fed: Federation, intruders: dict, home) -> None:
        honest = set(fed.wait_nodes(2))
        intruders["silent"] = start_silent_node(fed, "silent", "partition-id=1 num-partitions=2", home)
        (ids["silent"],) = set(fed.wait_nodes(3)) - honest

    _deploy(cfg, run_dir, tmp_path, on_start)
    metrics = rows(run_dir)
    assert _only_the_honest_nodes_were_asked_and_waited_for(metrics), metrics
    assert metrics[-1]["num_silent"] == 1 and all(r["num_refused"] == 0 for r in metrics[1:])
    log = (run_dir / "run.log").read_text()
    assert f"node {ids['silent']} is silent (no answer to the partition query within 2 s)" in log
    assert re.search(rf"silent nodes \[{ids['silent']}\] are not waited for", log)
    assert_same_model(run_dir, sim_two)
