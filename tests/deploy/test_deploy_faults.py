"""Faults on a real deployment: a SuperNode killed mid-round (TLS + node authentication) and a SuperLink crash."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from deploy_helpers import assert_same_model, compose, flower_processes, overrides, rows

from server import procs
from server.deploy import deploy
from server.federation import Federation

pytestmark = pytest.mark.e2e


def _kill_when_training(fed: Federation, partition: int, sig: int, restart: bool, out: dict) -> None:
    """Signal SuperNode ``partition``'s whole process group once round-1 training was sent, then maybe restart it.

    Waits (up to 4 s) for a ``flwr-clientapp`` process that appeared after the train messages went out, so the
    node is killed while it trains; the message was pulled, so the node's reply can no longer arrive.
    """
    node = fed.supernodes[partition]
    before = set(out["clientapps"])
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        table = procs.process_table()
        node.snapshot(table)
        if {pid for pid in node.members(table) if "flwr-clientapp" in procs.cmdline(pid)} - before:
            out["mid_training"] = True
            break
        time.sleep(0.05)
    node.signal(sig)
    procs.wait_gone([node], 20)
    out["killed"] = True
    if restart:
        fed.start_supernode(partition, fed.num_partitions)  # rejoin: the same command (and key) again


def _watch(fed: Federation, out: dict, partition: int, sig: int, restart: bool) -> Callable[[str], None]:
    """on_line hook: kill SuperNode ``partition`` when round-1 training starts; record node IDs after round 1."""
    lines: list[str] = out.setdefault("lines", [])

    def on_line(line: str) -> None:
        lines.append(line)
        if "Round 1: partitions" in line:  # the partition queries are answered; their processes may linger
            table = procs.process_table()
            out["clientapps"] = {pid for pid in table if "flwr-clientapp" in procs.cmdline(pid)}
        if "configure_train: round 1" in line:
            _kill_when_training(fed, partition, sig, restart, out)
        if "[round 1/2]" in line:
            out["ids_after"] = sorted(fed.node_ids())

    return on_line



def deploy_and_check_cleanup(cfg, run_dir, on_line, on_start):
    """Run flower-deploy's ``deploy`` and assert that no Flower process of this run is left, even on failure."""
    try:
        return deploy(cfg, on_line=on_line, on_start=on_start)
    finally:
        left = flower_processes(run_dir / "deploy" / "flwr_home")
        assert not left, left

def test_tls_auth_supernode_terminated_mid_round_rejoins(deploy_data, tmp_path):
    """TLS + SuperNode auth; SIGTERM one SuperNode's process group while it trains: the round completes with the
    other 3 and counts 1 failure, the restarted node rejoins under the same node ID and trains in round 2."""
    run_dir = tmp_path / "run"
    cfg = compose(overrides(deploy_data, run_dir, "participation.fraction=1.0", "deploy.tls=true", "deploy.auth=true"))
    out: dict = {}

    def on_start(fed: Federation) -> None:
        out["ids_before"] = sorted(fed.wait_nodes(4))
        out["on_line"] = _watch(fed, out, 1, signal.SIGTERM, True)

    result = deploy_and_check_cleanup(cfg, run_dir, lambda line: out["on_line"](line), on_start)
    assert result.ok, "\n".join(out["lines"][-60:])
    assert out.get("killed")
    metrics = rows(run_dir)
    assert [r["round"] for r in metrics] == [0, 1, 2]
    assert (metrics[1]["num_selected"], metrics[1]["num_replies"], metrics[1]["num_failures"]) == (4, 3, 1)
    assert (metrics[2]["num_selected"], metrics[2]["num_replies"], metrics[2]["num_failures"]) == (4, 4, 0)
    assert out["ids_after"] == out["ids_before"]  # authenticated node: same ID after the restart
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 2
    connection = (run_dir / "deploy" / "flwr_home" / "config.toml").read_text()
    assert "root-certificates" in connection and "insecure" not in connection
    superlink_log = (run_dir / "deploy" / "logs" / "superlink.log").read_text()
    assert "--ssl-certfile" in superlink_log and "--enable-supernode-auth" in superlink_log
    assert "--insecure" not in (run_dir / "deploy" / "logs" / "supernode-0.log").read_text()


def test_supernode_crash_round_completes_and_node_rejoins(deploy_data, tmp_path):
    """SIGKILL one SuperNode's process group while it trains (no goodbye): the round ends at round_timeout with
    the other client and 1 failure, the restarted node registers again, and the run finishes."""
    run_dir = tmp_path / "run"
    cfg = compose(overrides(deploy_data, run_dir, "round_timeout=25"))
    out: dict = {}

    def on_start(fed: Federation) -> None:
        out["fed"] = fed
        out["ids_before"] = sorted(fed.wait_nodes(4))
        out["on_line"] = _watch(fed, out, _first_group(cfg)[0], signal.SIGKILL, True)

    result = deploy_and_check_cleanup(cfg, run_dir, lambda line: out["on_line"](line), on_start)
    assert result.ok, "\n".join(out["lines"][-60:])
    metrics = rows(run_dir)
    assert [r["round"] for r in metrics] == [0, 1, 2]
    assert (metrics[1]["num_selected"], metrics[1]["num_replies"], metrics[1]["num_failures"]) == (2, 1, 1)
    assert (metrics[2]["num_selected"], metrics[2]["num_replies"], metrics[2]["num_failures"]) == (2, 2, 0)
    assert metrics[1]["seconds"] >= 25  # the dead node is only noticed by the round timeout (heartbeats: ~45 s)
    assert len(set(out["ids_after"]) - set(out["ids_before"])) == 1  # the restarted node is online (new ID)


def _first_group(cfg: dict) -> list[int]:
    from strategies.participation import make_schedule

    p = cfg["participation"]
    return make_schedule(p["mode"], cfg["num_clients"], p["fraction"], cfg["seed"], p.get("groups")) \
        .clients_for_round(1)


def _crash_superlink_after_round(fed: Federation, run_dir: Path, rnd: int, out: dict) -> None:
    """SIGKILL the SuperLink (with its SuperExec and ServerApp) as soon as round ``rnd`` is checkpointed."""
    state = run_dir / "checkpoint" / "state.json"
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        try:
            if json.loads(state.read_text())["round"] >= rnd:
                assert fed.superlink is not None
                out["crashed_pid"] = fed.superlink.pid
                fed.superlink.kill()
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)


def test_superlink_crash_resumes_to_the_same_model(reference_deploy, deploy_data, tmp_path):
    """Kill the SuperLink after round 1: flower-deploy restarts it, resumes from the checkpoint and ends with the
    bitwise-same model and metrics as the uninterrupted reference run."""
    ref_dir, _ = reference_deploy
    run_dir = tmp_path / "run"
    cfg = compose(overrides(deploy_data, run_dir))
    out: dict = {}
    lines: list[str] = []

    def on_start(fed: Federation) -> None:
        threading.Thread(target=_crash_superlink_after_round, args=(fed, run_dir, 1, out), daemon=True).start()

    result = deploy_and_check_cleanup(cfg, run_dir, lines.append, on_start)
    assert "crashed_pid" in out
    assert result.ok, "\n".join(lines[-60:])
    text = "\n".join(lines)
    assert "SuperLink lost" in text and "Resuming" in text
    assert_same_model(run_dir, ref_dir)
    keys = ("round", "accuracy", "loss", "train_loss", "num_replies", "num_failures")
    assert [{k: r.get(k) for k in keys} for r in rows(run_dir)] == [{k: r.get(k) for k in keys} for r in rows(ref_dir)]
