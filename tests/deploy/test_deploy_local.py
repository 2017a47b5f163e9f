"""flower-deploy on 127.0.0.1: 4 SuperNodes for 2 rounds, equality with the simulation, Ctrl-C cleanup."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
from deploy_helpers import (
    BIN,
    ENV,
    IN_PROCESS,
    ROOT,
    LineReader,
    assert_same_model,
    final_model,
    flower_processes,
    overrides,
    rows,
    run_cli,
)

from client.threads import local_share, usable_cores

pytestmark = pytest.mark.e2e


def test_four_supernodes_two_rounds(reference_deploy):
    """A full run through SuperLink + 4 SuperNode processes writes the same run dir as a simulation."""
    run_dir, output = reference_deploy
    assert "[round 1/2]" in output and "[round 2/2]" in output and "flower-deploy: finished run" in output
    assert re.search(r"\[round [12]/2\] [0-2]/2 clients done, [0-9.]+ s elapsed, run ETA", output), output[-3000:]
    metrics = rows(run_dir)
    assert [r["round"] for r in metrics] == [0, 1, 2]
    for r in metrics[1:]:
        assert r["num_selected"] == r["num_replies"] == 2 and r["num_failures"] == 0
    for name in (
        "metrics.csv",
        "final_model.npz",
        "summary.json",
        "accuracy.png",
        "loss.png",
        "run.log",
        "checkpoint/state.json",
        "checkpoint/arrays.npz",
    ):
        assert (run_dir / name).stat().st_size > 0, name
    pids = json.loads((run_dir / "deploy" / "pids.json").read_text())
    assert sorted(pids["supernodes"]) == ["0", "1", "2", "3"] and pids["control_address"].startswith("127.0.0.1:")
    for i in range(4):  # each SuperNode owned one partition through its node config
        log = (run_dir / "deploy" / "logs" / f"supernode-{i}.log").read_text()
        assert f"partition-id={i} num-partitions=4" in log
        assert "ClientApp torch threads: 1 (client.torch_threads; node default" in log  # the config overrides
    superlink_log = (run_dir / "deploy" / "logs" / "superlink.log").read_text()
    assert "Fleet API (gRPC-rere) on 127.0.0.1:" in superlink_log
    # stopped gracefully by SIGTERM, not SIGKILLed after deploy.stop_timeout (flower-deploy's own Control API
    # connection is closed first: the SuperLink's shutdown waits for open connections)
    assert "Finished server process" in superlink_log.strip().splitlines()[-1], superlink_log[-2000:]


def test_same_global_model_as_simulation(reference_deploy, deploy_data, tmp_path):
    """Same config and seed: bitwise-identical final model, groups and server-side metrics in both engines."""
    run_dir, _ = reference_deploy
    sim_dir = tmp_path / "sim"
    proc = run_cli("flower-simulation", overrides(deploy_data, sim_dir, "progress_every=0.05"), timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "clients done" in (sim_dir / "run.log").read_text()  # in-round progress in simulation too
    assert_same_model(run_dir, sim_dir)
    keys = ("round", "accuracy", "loss", "train_loss", "loss_before", "num_replies", "num_failures")
    assert [{k: r.get(k) for k in keys} for r in rows(run_dir)] == [{k: r.get(k) for k in keys} for r in rows(sim_dir)]

    def groups(path: Path) -> list[str]:
        return [
            line.split("Round ")[1] for line in (path / "run.log").read_text().splitlines() if "partitions [" in line
        ]

    assert groups(run_dir) == groups(sim_dir) and len(groups(run_dir)) == 2


def test_ctrl_c_stops_every_process(deploy_data, tmp_path):
    """SIGINT during a run (2 SuperNodes): exit code 130 and no SuperLink/SuperNode/SuperExec/ClientApp process
    left."""
    run_dir = tmp_path / "run"
    # started as a shell starts a background job (SIGINT ignored, so Python installs no handler of its own): the
    # run must end anyway, and the test does not depend on how pytest itself was started
    popen = subprocess.Popen(
        [str(BIN / "flower-deploy"), *overrides(deploy_data, run_dir, "num_clients=2")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ENV,
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    reader = LineReader(popen)
    try:
        assert reader.wait_for("[round 0/2]", timeout=90), reader.text()[-3000:]
        assert flower_processes(run_dir / "deploy" / "flwr_home")  # the federation is up
        popen.send_signal(signal.SIGINT)
        assert popen.wait(timeout=60) == 130, reader.text()[-3000:]
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait()
    assert not flower_processes(run_dir / "deploy" / "flwr_home")


def test_invalid_config_starts_nothing(deploy_data, tmp_path):
    """Validation happens before any process starts."""
    run_dir = tmp_path / "bad"
    proc = run_cli("flower-deploy", overrides(deploy_data, run_dir, "deploy.auth=true"), timeout=60)
    assert proc.returncode == 2 and "deploy.auth" in proc.stdout
    assert not (run_dir / "deploy").exists()


def test_logreg_deploys_and_equals_the_batched_engine(deploy_data, tmp_path):
    """``model=logreg`` (issue 16) runs on flower-deploy's real SuperNodes; the batched engine trains the same
    clients stacked with closed-form gradients (client/linear.py) and reaches the same model within float32
    summation order (normwise relative 1e-5, the bound of tests/server/test_batched_engine.py).

    The same federation shows that local SuperNodes share the cores: with the default ``client.torch_threads=0``
    every ClientApp of the 2 SuperNodes (both training in each round) runs max(1, cores // 2) torch threads, told
    by flower-deploy (node_config) and reported by the ClientApp itself."""
    extra = (
        "model=logreg",
        "client.augment=false",
        "client.weight_decay=1e-3",
        "client.torch_threads=0",
        "num_clients=2",
        "participation.fraction=1.0",
    )
    deploy_dir, batched_dir = tmp_path / "deploy", tmp_path / "batched"
    proc = run_cli("flower-deploy", overrides(deploy_data, deploy_dir, *extra), timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert not flower_processes(deploy_dir / "deploy" / "flwr_home")
    share = local_share(usable_cores(), 2)
    for i in range(2):
        log = (deploy_dir / "deploy" / "logs" / f"supernode-{i}.log").read_text()
        assert f"partition-id={i} num-partitions=2 torch-threads={share}" in log
        used = re.findall(r"ClientApp torch threads: (\d+) \(([^;]+);", log)
        assert used == [(str(share), "node_config torch-threads")] * 2, log[-3000:]  # a train message per round
    proc = run_cli("flower-simulation", overrides(deploy_data, batched_dir, *extra, "engine=batched"), timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    deployed, batched = final_model(deploy_dir), final_model(batched_dir)
    assert list(deployed) == ["linear.weight", "linear.bias"] == list(batched)
    assert any(np.abs(v).max() > 0 for v in deployed.values())  # it trained (zero init)
    for key in deployed:
        scale = float(np.abs(deployed[key]).max())
        assert float(np.abs(batched[key] - deployed[key]).max()) <= 1e-5 * scale, key
    replies = [[r["num_replies"] for r in rows(path)[1:]] for path in (deploy_dir, batched_dir)]
    assert replies == [[2, 2], [2, 2]]


def test_natural_task_preset_deploys_and_equals_the_batched_engine(tmp_path):
    """Seed 001's FEMNIST preset (issue 20: ``num_clients=all`` natural writers, M = 2 per round) on real SuperNodes
    (one per writer; ``deploy.spawn_supernodes`` follows ``num_clients=all`` once the copy is counted) reaches the
    batched engine's model bitwise (the CNN is trained one client after another through the ClientApp's code)."""
    from tools.natural_datagen import MAKERS, write

    root = write(MAKERS["femnist"](num_clients=2), tmp_path / "copy")
    args = [
        "+experiment=seed001_femnist",
        f"data.root={root}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "num_rounds=2",
        "participation.clients_per_round=2",
        "client.local_steps=2",
        "client.torch_threads=1",
        "eval_every=1",
        "round_timeout=60",
        "progress_every=0.2",
    ]
    deploy_dir, batched_dir = tmp_path / "deploy", tmp_path / "batched"
    proc = run_cli("flower-deploy", [*args, f"run_dir={deploy_dir}", f"hydra.run.dir={deploy_dir}"], timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert not flower_processes(deploy_dir / "deploy" / "flwr_home")
    assert len(list((deploy_dir / "deploy" / "logs").glob("supernode-*.log"))) == 2  # every natural writer
    proc = run_cli("flower-simulation", [*args, *IN_PROCESS, f"hydra.run.dir={batched_dir}"], timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert_same_model(deploy_dir, batched_dir)
    assert [[r["num_replies"] for r in rows(path)[1:]] for path in (deploy_dir, batched_dir)] == [[2, 2], [2, 2]]
