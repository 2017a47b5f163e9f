"""Intruders on a real deployment (127.0.0.1): refused SuperNodes, APIs kept on loopback, partition hijacks.

Threat model (docs/deploy.md "Security"): an attacker on the network or on a SuperNode host can start its own
SuperNodes and talk to any port it reaches. With TLS + SuperNode auth the federation refuses unregistered keys,
plain-text nodes and nodes trusting another CA; the Control/Runtime API never leaves 127.0.0.1; a SuperNode's
Runtime API hands tasks only to the holder of the SuperExec auth secret; and a node that claims a partition
another node holds is refused (with auth: any partition its key does not own; tests/deploy/test_deploy_ownership.py).
"""

from __future__ import annotations

import ipaddress
import threading

import pytest
from deploy_helpers import IN_PROCESS, assert_same_model, compose, flower_processes, overrides, rows, run_cli
from security_helpers import (
    acquire_task,
    federation_sockets,
    open_gate_when_answered,
    open_gate_when_logged,
    runtime_port,
    start_intruder,
)

from server.deploy import tls
from server.deploy.cli import deploy
from server.deploy.federation import LOOPBACK, Federation

pytestmark = pytest.mark.e2e
SETTING = ("num_clients=2", "participation.fraction=1.0", "num_rounds=3")  # 2 SuperNodes, both train


@pytest.fixture(scope="module")
def sim_reference(deploy_data, tmp_path_factory):
    """The 2-client, 3-round experiment in simulation, batched engine (bitwise equal to an honest deployment and
    to Ray)."""
    run_dir = tmp_path_factory.mktemp("sim3") / "run"
    proc = run_cli("flower-simulation", overrides(deploy_data, run_dir, *SETTING, *IN_PROCESS), timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return run_dir


def _run_with_hijacker(cfg, run_dir, tmp_path, on_start=None, hijacker_security=None):
    """flower-deploy with an intruder that also claims partition 0 (and would scale its weights x1.1); it answers
    the partition query only once the ServerApp has logged the real node 0's claim (a gate file), so node 0 claims
    first whatever the load. The honest nodes' round-1 training waits until
    the intruder has sent its answer (a gate file), so round 2 collects it. Returns (result, lines, intruders).
    Every process is stopped; none may be left."""
    intruders: dict = {}
    lines: list[str] = []
    home = tmp_path / "intruder_home"
    gate, query_gate = tmp_path / "gate", tmp_path / "query-gate"

    def start(fed: Federation) -> None:
        fed.wait_nodes(2)
        if on_start is not None:
            on_start(fed, intruders, home)
        security = hijacker_security(fed) if hijacker_security else ["--insecure"]
        intruders["hijacker"] = start_intruder(
            fed,
            "hijacker",
            security,
            f'partition-id=0 num-partitions=2 misbehave="scale" query-gate="{query_gate}"',
            home,
            max_wait=30,
        )
        fed.wait_nodes(3)
        threading.Thread(
            target=open_gate_when_logged,
            args=(lines, "serves partition 0", query_gate),
            kwargs={"log_file": run_dir / "run.log"},
            daemon=True,
        ).start()
        threading.Thread(
            target=open_gate_when_answered, args=([fed.log_dir / "hijacker.log"], gate), daemon=True
        ).start()

    try:
        result = deploy(
            cfg, on_line=lines.append, on_start=start, node_config={p: {"train-gate": str(gate)} for p in range(2)}
        )
    finally:
        for proc in intruders.values():
            proc.stop(10)
        left = {**flower_processes(run_dir / "deploy" / "flwr_home"), **flower_processes(home)}
        assert not left, left
    return result, lines, intruders


def _check_sockets(fed: Federation) -> None:
    """Control/Runtime APIs on 127.0.0.1 only; the Fleet API on deploy.host (127.0.0.2 here); nothing else."""
    sockets = federation_sockets(fed)
    assert (LOOPBACK, fed.control_port) in sockets["superlink"]
    assert ("127.0.0.2", fed.fleet_port) in sockets["superlink"]
    for name, found in sockets.items():
        for ip, port in found:
            assert ipaddress.ip_address(ip).is_loopback, (name, ip, port)
            assert ip == LOOPBACK or (name, port) == ("superlink", fed.fleet_port), (name, ip, port)
    for i in range(2):
        assert (LOOPBACK, runtime_port(fed.supernodes[i])) in sockets[f"supernode-{i}"]


def _check_runtime_auth(fed: Federation) -> None:
    """Only the SuperExec auth secret's holder may take tasks from a Runtime API (SuperNode and SuperLink)."""
    secret = fed.secret_file.read_bytes()
    node_api = f"{LOOPBACK}:{runtime_port(fed.supernodes[0])}"
    with pytest.raises(Exception, match="(?i)auth|401|403|denied|permission|unauthenticated"):
        acquire_task(node_api, None)
    assert not acquire_task(node_api, secret).HasField("task")  # signed: accepted (nothing to do yet)
    link_api = f"{LOOPBACK}:{fed.control_port}"
    with pytest.raises(Exception, match="(?i)auth|401|403|denied|permission|unauthenticated"):
        acquire_task(link_api, None, fed.ca_cert)
    assert not acquire_task(link_api, secret, fed.ca_cert).HasField("task")


def _start_refused_intruders(fed: Federation, intruders: dict, home) -> None:
    """Three SuperNodes that must never join: unregistered key, --insecure, a CA of their own."""
    node_config = "partition-id=1 num-partitions=2"
    own_key = tls.make_node_key(home / "keys", "unregistered")
    evil = tls.make_tls(home / "evil-ca", ["127.0.0.2"])
    cases = {
        "unregistered-key": [
            "--root-certificates",
            str(fed.ca_cert),
            "--auth-supernode-private-key",
            str(own_key.private),
        ],
        "insecure": ["--insecure"],
        "own-ca": [
            "--root-certificates",
            str(evil.ca_cert),
            "--auth-supernode-private-key",
            str(fed.node_key("node1").private),
        ],  # even with a registered key
    }
    for name, security in cases.items():
        intruders[name] = start_intruder(fed, name, security, node_config, home)


def test_intruders_refused_apis_on_loopback_hijack_refused(deploy_data, misbehaving_app_dir, sim_reference, tmp_path):
    """TLS + auth, Fleet API on 127.0.0.2: the Control/Runtime APIs listen on 127.0.0.1 only; Runtime APIs refuse
    unsigned task requests; a SuperNode with an unregistered key, one with --insecure and one trusting its own CA
    exit 1 without joining; a registered intruder claiming partition 0 is refused and counted; the final model is
    the honest one."""
    run_dir = tmp_path / "run"
    cfg = compose(
        overrides(
            deploy_data,
            run_dir,
            *SETTING,
            "deploy.tls=true",
            "deploy.auth=true",
            "deploy.host=127.0.0.2",
            "deploy.address=127.0.0.2",
            "deploy.cert_hosts=[127.0.0.2]",
            f"deploy.app_dir={misbehaving_app_dir}",
        )
    )

    def on_start(fed: Federation, intruders: dict, home) -> None:
        _check_sockets(fed)
        _check_runtime_auth(fed)
        _start_refused_intruders(fed, intruders, home)

    def hijacker_security(fed: Federation) -> list[str]:  # its key registered through the open Control API
        return [
            "--root-certificates",
            str(fed.ca_cert),
            "--auth-supernode-private-key",
            str(fed.node_key("hijacker").private),
        ]

    result, lines, intruders = _run_with_hijacker(cfg, run_dir, tmp_path, on_start, hijacker_security)
    assert result.ok, "\n".join(lines[-60:])
    metrics = rows(run_dir)
    assert sum(r.get("num_refused", 0) for r in metrics) == 1
    assert all(r.get("num_reassigned", 0) == 0 for r in metrics)
    assert "owns no partition" in (run_dir / "run.log").read_text()  # its key is registered, but owns nothing
    assert_same_model(run_dir, sim_reference)
    for name in ("unregistered-key", "insecure", "own-ca"):
        proc = intruders[name]
        assert proc.returncode() == 1, (name, proc.returncode(), proc.tail())
    assert "Failed to activate SuperNode" in intruders["unregistered-key"].tail()
    assert "Giving up reconnection" in intruders["insecure"].tail()  # bounded by --max-wait-time
    assert "handshake" in intruders["own-ca"].tail()
    for name in ("unregistered-key", "insecure", "own-ca"):
        assert "did not join the SuperLink" in intruders[name].tail(), intruders[name].tail()
    assert "--insecure" in intruders["insecure"].tail(1) and "registered" in intruders["unregistered-key"].tail(1)


def test_hijack_without_auth_is_refused_while_the_holder_answers(
    deploy_data, misbehaving_app_dir, sim_reference, tmp_path
):
    """No auth: an intruder that claims partition 0 after its node did (held until then) is a duplicate claim: refused,
    counted and logged; its x1.1 update never goes in. (Without auth it could still win by answering first, or
    take a partition whose node left or went silent, counted in num_reassigned: docs/deploy.md "Security".)"""
    run_dir = tmp_path / "run"
    cfg = compose(overrides(deploy_data, run_dir, *SETTING, f"deploy.app_dir={misbehaving_app_dir}"))
    result, lines, _ = _run_with_hijacker(cfg, run_dir, tmp_path)
    assert result.ok, "\n".join(lines[-60:])
    metrics = rows(run_dir)
    assert sum(r.get("num_refused", 0) for r in metrics) == 1
    assert all(r.get("num_reassigned", 0) == 0 for r in metrics)
    assert "claims partition 0, which node" in (run_dir / "run.log").read_text()
    assert_same_model(run_dir, sim_reference)
