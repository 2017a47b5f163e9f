"""Faults on a real deployment: a SuperNode killed mid-round (TLS + node authentication) and a SuperLink crash."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from deploy_helpers import IN_PROCESS, assert_same_model, compose, flower_processes, overrides, rows, run_cli

from server.deploy.cli import deploy
from server.deploy.federation import Federation
from server.run import procs

pytestmark = pytest.mark.e2e
CRASH_SETTING = ("num_clients=2", "participation.fraction=1.0")  # the SuperLink-crash runs: 2 SuperNodes, both train


@pytest.fixture(scope="module")
def uninterrupted(deploy_data, tmp_path_factory):
    """The SuperLink-crash experiment without a crash, in simulation on the batched engine: bitwise the model and
    server metrics of an uninterrupted deployment (tests/deploy/test_deploy_ghbm.py, test_deploy_local.py)."""
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    proc = run_cli("flower-simulation", overrides(deploy_data, run_dir, *CRASH_SETTING, *IN_PROCESS), timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return run_dir


def _kill_when_training(
    fed: Federation, partition: int, sig: int, restart: bool, out: dict, victim: dict, gate: Path | None = None
) -> None:
    """Thread: once SuperNode ``partition``'s ClientApp is inside its round-1 training (it created
    ``victim["train-started"]`` and holds until ``victim["train-gate"]`` exists: test ClientApp keys), signal its
    whole process group, open its gate (for the restarted node's later rounds), then maybe restart it. The message
    was pulled, so the node's reply can no longer arrive."""
    node = fed.supernodes[partition]
    started, victim_gate = Path(victim["train-started"]), Path(victim["train-gate"])
    deadline = time.monotonic() + 300
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    out["mid_training"] = started.exists()
    node.signal(sig)
    procs.wait_gone([node], 20)
    out["killed"] = True
    victim_gate.touch()
    if restart:
        fed.start_supernode(partition, fed.num_partitions)  # rejoin: the same command (and key) again
    if gate is not None:  # open the others' gate once the SuperLink lists the restarted node online
        deadline = time.monotonic() + 180
        while not _back_online(sig, fed.node_ids(), out["ids_before"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        gate.touch()


def _back_online(sig: int, ids: list[int], before: list[int]) -> bool:
    """Whether the restarted node is online: after SIGTERM (a goodbye) the node left and comes back under its ID
    (node authentication), so the list is the one before again; after SIGKILL the dead node stays listed until its
    heartbeat expires and the new one registers under a new ID."""
    if sig == signal.SIGKILL:
        return bool(set(ids) - set(before))
    return sorted(ids) == before


def _victim(tmp_path: Path, partition: int, num_nodes: int, gate: Path | None = None) -> tuple[dict, dict]:
    """(victim, node_config): the node of ``partition`` holds in training until killed (it creates
    ``victim["train-started"]`` and waits for ``victim["train-gate"]``); with a ``gate`` file the others hold their
    round-1 training until the killer thread has seen the victim back online, so round 2 finds it. ``node_config``
    goes to ``deploy``: the SuperNodes start with it (test ClientApp keys)."""
    victim = {
        "train-started": str(tmp_path / f"partition-{partition}.train-started"),
        "train-gate": str(tmp_path / f"partition-{partition}.killed"),
    }
    others = {p: {"train-gate": str(gate)} for p in range(num_nodes) if p != partition} if gate else {}
    return victim, {partition: victim, **others}


def _held_victim(
    fed: Federation, out: dict, partition: int, sig: int, restart: bool, victim: dict, gate: Path | None = None
) -> None:
    """on_start part: wait for every spawned node, start the killer thread."""
    out["ids_before"] = sorted(fed.wait_nodes(len(fed.supernodes)))
    threading.Thread(
        target=_kill_when_training, args=(fed, partition, sig, restart, out, victim, gate), daemon=True
    ).start()


def _watch(fed: Federation, out: dict) -> Callable[[str], None]:
    """on_line hook: record the lines, and the online node IDs after round 1."""
    lines: list[str] = out.setdefault("lines", [])

    def on_line(line: str) -> None:
        lines.append(line)
        if "[round 1/" in line and "accuracy" in line:
            out["ids_after"] = sorted(fed.node_ids())

    return on_line


def deploy_and_check_cleanup(cfg, run_dir, on_line, on_start, node_config=None):
    """Run flower-deploy's ``deploy`` and assert that no Flower process of this run is left, even on failure."""
    try:
        return deploy(cfg, on_line=on_line, on_start=on_start, node_config=node_config)
    finally:
        left = flower_processes(run_dir / "deploy" / "flwr_home")
        assert not left, left


def test_tls_auth_supernode_terminated_mid_round_rejoins(deploy_data, misbehaving_app_dir, tmp_path):
    """TLS + SuperNode auth, 2 SuperNodes; SIGTERM one SuperNode's process group while it trains: the round
    completes with the other and counts 1 failure, the restarted node rejoins under the same node ID and trains in
    round 2."""
    run_dir = tmp_path / "run"
    cfg = compose(
        overrides(
            deploy_data,
            run_dir,
            "num_clients=2",
            "participation.fraction=1.0",
            "deploy.tls=true",
            "deploy.auth=true",
            f"deploy.app_dir={misbehaving_app_dir}",
        )
    )
    out: dict = {}
    gate = tmp_path / "gate"  # the other waits for the restarted node: round 2 finds it back
    victim, node_config = _victim(tmp_path, 1, 2, gate)

    def on_start(fed: Federation) -> None:
        _held_victim(fed, out, 1, signal.SIGTERM, True, victim, gate)
        out["on_line"] = _watch(fed, out)

    result = deploy_and_check_cleanup(cfg, run_dir, lambda line: out["on_line"](line), on_start, node_config)
    assert result.ok, "\n".join(out["lines"][-60:])
    assert out.get("killed") and out.get("mid_training")
    metrics = rows(run_dir)
    assert [r["round"] for r in metrics] == [0, 1, 2]
    assert (metrics[1]["num_selected"], metrics[1]["num_replies"], metrics[1]["num_failures"]) == (2, 1, 1)
    assert (metrics[2]["num_selected"], metrics[2]["num_replies"], metrics[2]["num_failures"]) == (2, 2, 0)
    assert out["ids_after"] == out["ids_before"]  # authenticated node: same ID after the restart
    assert all(r["num_refused"] == 0 and r["num_reassigned"] == 0 for r in metrics[1:])  # it kept its partition
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 2
    connection = (run_dir / "deploy" / "flwr_home" / "config.toml").read_text()
    assert "root-certificates" in connection and "insecure" not in connection
    superlink_log = (run_dir / "deploy" / "logs" / "superlink.log").read_text()
    assert "--ssl-certfile" in superlink_log and "--enable-supernode-auth" in superlink_log
    # stopped gracefully by SIGTERM, not SIGKILLed after deploy.stop_timeout: flower-deploy closes its own Control
    # API connection first (a TLS SuperLink's shutdown waits for open connections to close)
    assert "Finished server process" in superlink_log.strip().splitlines()[-1], superlink_log[-2000:]
    assert "--insecure" not in (run_dir / "deploy" / "logs" / "supernode-0.log").read_text()


def test_supernode_crash_round_completes_and_node_rejoins(deploy_data, misbehaving_app_dir, tmp_path):
    """SIGKILL one SuperNode's process group while it trains (no goodbye): the round ends at round_timeout with
    the other client and 1 failure, the killed node is silent from then on, the restarted node registers again
    and, when its partition is scheduled again (round 3), serves it; the run finishes."""
    run_dir = tmp_path / "run"
    # round_timeout: round 1 ends by it (the dead node never replies), before the SuperLink could declare the node
    # offline (>= 30 s after the kill: 2 heartbeat intervals of 30 s after its last one)
    cfg = compose(
        overrides(deploy_data, run_dir, "round_timeout=25", "num_rounds=3", f"deploy.app_dir={misbehaving_app_dir}")
    )
    out: dict = {}
    partition = _group(cfg, 1)[0]
    victim, _ = _victim(tmp_path, partition, 4)
    # round 2's nodes hold their training until the restarted node is online, so round 3 (the victim's partition
    # again) finds it connected (without this wait, a restart slowed by a loaded machine registered 0.3 s after
    # round 3 had started, and the partition was skipped); the restart now has the rest of round 1 and round 2's
    # timeout less round 2's training to come online, and round 3 waits up to 25 s for its partition answer
    gate = tmp_path / "gate"
    node_config = {partition: victim, **{p: {"train-gate": str(gate)} for p in _group(cfg, 2)}}

    def on_start(fed: Federation) -> None:
        _held_victim(fed, out, partition, signal.SIGKILL, True, victim, gate)
        out["on_line"] = _watch(fed, out)

    result = deploy_and_check_cleanup(cfg, run_dir, lambda line: out["on_line"](line), on_start, node_config)
    assert result.ok, "\n".join(out["lines"][-60:])
    assert out.get("killed") and out.get("mid_training")
    metrics = rows(run_dir)
    assert [r["round"] for r in metrics] == [0, 1, 2, 3]
    assert (metrics[1]["num_selected"], metrics[1]["num_replies"], metrics[1]["num_failures"]) == (2, 1, 1)
    assert (metrics[2]["num_selected"], metrics[2]["num_replies"], metrics[2]["num_failures"]) == (2, 2, 0)
    assert (metrics[3]["num_selected"], metrics[3]["num_replies"], metrics[3]["num_failures"]) == (2, 2, 0)
    assert metrics[1]["seconds"] >= 25  # the dead node is only noticed by the round timeout (heartbeats: ~45 s)
    assert metrics[1]["num_silent"] == 1  # the killed node: no reply to its train message
    assert len(set(out["ids_after"]) - set(out["ids_before"])) == 1  # the restarted node is online (new ID)
    assert [r.get("num_reassigned") for r in metrics[1:]][0] == 0  # its partition moved to the new ID: visible
    assert sum(r.get("num_reassigned") for r in metrics[1:]) == 1  # (when its answer came: round 2 or 3)


def _group(cfg: dict, rnd: int) -> list[int]:
    """The partitions the run's schedule selects in round ``rnd``."""
    from strategies.participation import make_schedule

    p = cfg["participation"]
    return make_schedule(p["mode"], cfg["num_clients"], p["fraction"], cfg["seed"], p.get("groups")).clients_for_round(
        rnd
    )


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


@pytest.mark.parametrize("database", ["auto", "true"], ids=["state-in-memory", "state-in-file"])
def test_superlink_crash_resumes_to_the_same_model(uninterrupted, deploy_data, tmp_path, database):
    """Kill the SuperLink after round 1 (2 SuperNodes): flower-deploy restarts it, resumes from the checkpoint and
    ends with the bitwise-same model and metrics as the uninterrupted run. With the state in a file the SuperNodes
    reconnect by themselves (same processes); with the state in memory (``auto`` for a local federation)
    flower-deploy starts them again."""
    ref_dir = uninterrupted
    run_dir = tmp_path / "run"
    cfg = compose(overrides(deploy_data, run_dir, *CRASH_SETTING, f"deploy.database={database}"))
    out: dict = {}
    lines: list[str] = []

    def on_start(fed: Federation) -> None:
        out["supernodes"] = {str(k): p.pid for k, p in fed.supernodes.items()}
        threading.Thread(target=_crash_superlink_after_round, args=(fed, run_dir, 1, out), daemon=True).start()

    result = deploy_and_check_cleanup(cfg, run_dir, lines.append, on_start)
    assert "crashed_pid" in out
    assert result.ok, "\n".join(lines[-60:])
    text = "\n".join(lines)
    assert "SuperLink lost" in text and "Resuming" in text
    assert_same_model(run_dir, ref_dir)
    keys = ("round", "accuracy", "loss", "train_loss", "num_replies", "num_failures")
    assert [{k: r.get(k) for k in keys} for r in rows(run_dir)] == [{k: r.get(k) for k in keys} for r in rows(ref_dir)]
    after = json.loads((run_dir / "deploy" / "pids.json").read_text())["supernodes"]
    in_file = database == "true"
    assert (after == out["supernodes"]) is in_file, (out["supernodes"], after)
    assert (run_dir / "deploy" / "superlink-state.db").exists() is in_file
