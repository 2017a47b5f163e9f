"""flower-simulation on a real two-node Ray cluster on this machine (issue 11 §2).

`ray start --head` (1 CPU) and `ray start --address=...` (1 CPU), both with a private temp dir and free ports,
both stopped by the fixture (also when a test fails). The run joins with ``backend.address=auto`` (the
``ray_current_cluster`` file in that temp dir), and the test watches the ClientApp actor processes: a Ray
worker keeps the process group of its node's `ray start`, so the group tells the node it runs on, and a
mapped libtorch tells that it ran our ClientApp (the client module imports torch on its first message).
"""

import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from simcli import IN_PROCESS, run_cli, sim_args

from server.report.metrics import read_metrics
from tools.natural_datagen import MAKERS, write
from tools.raytools import BIN, RayNodes, private_ray_tmp, ray_env

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster():
    nodes = RayNodes(private_ray_tmp())
    try:
        nodes.start_head(num_cpus=1)
        nodes.add_worker(num_cpus=1)
        yield nodes
    finally:
        left = nodes.stop()
    assert not left, f"cluster processes survived: {left}"


def _client_actors(ray_tmp: Path) -> dict[int, tuple[int, bool]]:
    """{pid: (process group, ran the ClientApp)} of this cluster's ClientApp actors now alive."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or not (entry / "cmdline").read_bytes().startswith(b"ray::ClientAppActor"):
                continue
            if str(ray_tmp).encode() not in (entry / "environ").read_bytes():
                continue
            group = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2])
            found[int(entry.name)] = (group, "libtorch" in (entry / "maps").read_text())
        except (OSError, ValueError, IndexError):
            continue
    return found


def _watch_actors(proc: subprocess.Popen, ray_tmp: Path) -> dict[int, tuple[int, bool]]:
    """Every ClientApp actor seen while ``proc`` runs (killed after 400 s): {pid: (process group, ran the app)}."""
    seen: dict[int, tuple[int, bool]] = {}
    deadline = time.time() + 400
    while proc.poll() is None and time.time() < deadline:
        for pid, (group, ran) in _client_actors(ray_tmp).items():
            seen[pid] = (group, ran or seen.get(pid, (group, False))[1])
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
    return seen


def test_clients_run_on_both_nodes_and_the_model_equals_a_single_node_run(cluster, tiny_data, tmp_path):
    extra = ("num_rounds=2", "client.torch_threads=1")
    proc = subprocess.Popen(
        [str(BIN / "flower-simulation"), *sim_args(tiny_data, tmp_path / "cluster", *extra, "backend.address=auto")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ray_env(cluster.ray_tmp),
    )
    seen = _watch_actors(proc, cluster.ray_tmp)
    output = proc.communicate()[0]
    assert proc.returncode == 0, output[-4000:]
    port = cluster.address.rsplit(":", 1)[1]  # `ray start` records the node's IP, whatever we bound it to
    assert re.search(rf"Ray cluster at [\d.]+:{port}: 2 nodes, 2 CPUs, 0 GPUs, 2 ClientApp actors", output), output
    assert [r["round"] for r in read_metrics(tmp_path / "cluster")] == [0, 1, 2]
    nodes_that_trained = {group for group, ran in seen.values() if ran}
    assert nodes_that_trained == set(cluster.groups), f"ClientApp actors seen: {seen}"

    # the single-node reference on the batched engine, bitwise the Ray engine for the CNN
    # (tests/server/test_batched_engine.py): one Ray start less
    single = run_cli("flower-simulation", sim_args(tiny_data, tmp_path / "single", *extra, *IN_PROCESS), timeout=400)
    assert single.returncode == 0, single.stderr[-3000:]
    a, b = np.load(tmp_path / "cluster" / "final_model.npz"), np.load(tmp_path / "single" / "final_model.npz")
    assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)


def test_a_natural_task_runs_on_both_nodes(cluster, tmp_path):
    """Seed 001's femnist preset (generated copy in the hub schema) on the two-node cluster: the driver builds the
    task's cache, the ClientApp actors of both nodes read it and train (issue 20: every engine), to the batched
    engine's model bitwise (the CNN one client after another through the ClientApp's code). This is the femnist
    preset's Ray run: tests/server/test_natural_e2e.py runs it on the batched engine only."""
    root = write(MAKERS["femnist"](num_clients=4), tmp_path / "copy")
    run_dir = tmp_path / "run"
    preset = [
        "+experiment=seed001_femnist",
        f"data.root={root}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "num_rounds=2",
        "participation.clients_per_round=2",
        "client.local_steps=2",
        "client.torch_threads=1",
        "eval_every=1",
        "plots=false",
    ]
    args = [*preset, "backend.address=auto", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(
        [str(BIN / "flower-simulation"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ray_env(cluster.ray_tmp),
    )
    seen = _watch_actors(proc, cluster.ray_tmp)
    output = proc.communicate()[0]
    assert proc.returncode == 0, output[-4000:]
    assert re.search(r"Ray cluster at [\d.]+:\d+: 2 nodes, 2 CPUs, 0 GPUs, 2 ClientApp actors", output), output
    rows = read_metrics(run_dir)
    assert [r["round"] for r in rows] == [0, 1, 2] and all(r["num_replies"] == 2 for r in rows[1:])
    assert {group for group, ran in seen.values() if ran} == set(cluster.groups), f"ClientApp actors seen: {seen}"
    batched = run_cli("flower-simulation", [*preset, *IN_PROCESS, f"hydra.run.dir={tmp_path / 'batched'}"], timeout=400)
    assert batched.returncode == 0, batched.stderr[-3000:]
    a, b = np.load(run_dir / "final_model.npz"), np.load(tmp_path / "batched" / "final_model.npz")
    assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)
    assert [r["loss"] for r in rows] == [r["loss"] for r in read_metrics(tmp_path / "batched")]


def test_a_node_that_cannot_load_the_data_stops_the_run_before_it_starts(cluster, tiny_data, tmp_path):
    """A third node whose decode cache cannot be created (its FEDMOMENTUM_CACHE points into /proc)."""
    cluster.add_worker(num_cpus=1, env={"FEDMOMENTUM_CACHE": "/proc/version/cache"})
    args = [a for a in sim_args(tiny_data, tmp_path / "bad", "backend.address=auto") if "cache_dir" not in a]
    proc = subprocess.run(
        [str(BIN / "flower-simulation"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=ray_env(cluster.ray_tmp),
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    assert "'data.cache_dir' on node " in line and "/proc/version/cache" in line
    assert not (tmp_path / "bad" / "metrics.csv").exists()


def test_the_node_check_of_a_natural_task_names_a_missing_copy(tmp_path):
    """What each node runs (no Ray needed): a natural task whose local copy is not on the node is refused with
    the key and the reason, before any actor starts."""
    from server.ray.cluster import node_report

    key, reason = node_report("femnist", str(tmp_path / "missing"), str(tmp_path / "cache"))
    assert key == "data.root" and "femnist" in reason and "\n" not in reason, reason
    root = write(MAKERS["femnist"](num_clients=2), tmp_path / "copy")
    assert node_report("femnist", str(root), str(tmp_path / "cache")) == ("", "")
