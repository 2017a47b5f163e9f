"""`flower-simulation` with the stateful FedHBM clients: their node-local state survives rounds and a resume (on
Ray: node-local state across Ray's actors, a SIGKILLed Ray run resumed); the GHBM family on the batched engine."""

import os

import numpy as np
import pytest
from simcli import IN_PROCESS, full_and_resumed, run_cli, sim_args

from server.report.metrics import read_metrics

pytestmark = pytest.mark.e2e


def state_files(run_dir):
    """(partition, round, segment) of every client state file of the run."""
    out = []
    for path in sorted((run_dir / "client_state").glob("*/partition-*/r*.npz")):
        name = path.stem  # r<round>-<segment>
        out.append((path.parent.name, int(name[1:9]), name[10:]))
    return out


def test_fedhbm_client_state_survives_a_resume_bitwise(tiny_data, tmp_path):
    """4 clients, cyclic p = 2, 4 rounds: every client's second participation (rounds 3, 4) uses the final local
    model it stored in round 1 or 2. Killed after round 2 and resumed on the Ray engine, the run ends with the
    bitwise-same model as the uninterrupted run (on the batched engine: the same ClientApp code and state files,
    bitwise the Ray engine for FedHBM, tests/server/test_batched_engine.py; one Ray start less)."""
    extra = ["num_rounds=4", "strategy=fedhbm", "data.root=" + str(tiny_data["folder"])]
    full_dir, killed_dir = full_and_resumed(tiny_data, tmp_path, extra, full_extra=IN_PROCESS)
    files = state_files(full_dir)
    assert sorted({p for p, _, _ in files}) == [f"partition-{i}" for i in range(4)]
    assert sorted(r for _, r, _ in files) == [1, 1, 2, 2, 3, 3, 4, 4] and len({s for _, _, s in files}) == 1
    rows_a, rows_b = read_metrics(full_dir), read_metrics(killed_dir)
    assert [(r["round"], r["loss"], r.get("train_loss")) for r in rows_a] == [
        (r["round"], r["loss"], r.get("train_loss")) for r in rows_b
    ]
    resumed_files = state_files(killed_dir)
    assert len({run for run in os.listdir(killed_dir / "client_state")}) == 1  # one run id across the resume
    assert len({s for _, _, s in resumed_files}) == 2  # states of the first and of the resumed server start
    assert sorted(r for _, r, _ in resumed_files) == [1, 1, 2, 2, 3, 3, 4, 4]


def test_the_ghbm_family_runs_on_cifar_like_data(tiny_data, tmp_path):
    """GHBM and LocalGHBM through the real ClientApp: LocalGHBM with p = 2 is bitwise GHBM(tau = 2) on CPU (the
    client forms (anchor - theta^{t-1}) / 2 from its state with the same float32 arithmetic as the server). On the
    batched engine, which trains through the ClientApp's own code and is bitwise the Ray engine for both
    (tests/server/test_batched_engine.py)."""
    models = {}
    for name, extra in (("ghbm", ["strategy=ghbm", "strategy.tau=2"]), ("localghbm", ["strategy=localghbm"])):
        run_dir = tmp_path / name
        proc = run_cli("flower-simulation", sim_args(tiny_data, run_dir, *IN_PROCESS, "num_rounds=4", *extra))
        assert proc.returncode == 0, proc.stderr[-2000:]
        rows = read_metrics(run_dir)
        assert [r["round"] for r in rows] == [0, 1, 2, 3, 4]
        assert all(r["num_replies"] == 2 and r["num_rejected"] == 0 for r in rows[1:])
        with np.load(run_dir / "final_model.npz") as npz:
            models[name] = {k: npz[k] for k in npz.files}
    for key, value in models["ghbm"].items():
        np.testing.assert_array_equal(models["localghbm"][key], value)


def test_a_corrupt_client_state_is_said_on_the_console_and_in_run_log(tiny_data, tmp_path):
    """A state file cut short (a full disk, a copy interrupted) makes its client run the round as a first
    participation: the client's reason and the server's count of such clients reach the console and run.log (the
    client's warning went to no log a user reads, and the run's trajectory changed unannounced)."""
    run_dir = tmp_path / "run"
    common = [*IN_PROCESS, "model=logreg", "strategy=fedhbm", "checkpoint_every=2", f"run_dir={run_dir}"]
    first = run_cli("flower-simulation", sim_args(tiny_data, tmp_path / "hydra", *common, "num_rounds=2"))
    assert first.returncode == 0, first.stderr[-2000:]
    [(partition, _, _), *_] = state_files(run_dir)
    [path] = (run_dir / "client_state").glob(f"*/{partition}/r*.npz")
    path.write_bytes(path.read_bytes()[:200])
    again = run_cli(
        "flower-simulation", sim_args(tiny_data, tmp_path / "hydra", *common, "num_rounds=4", "resume=true")
    )
    assert again.returncode == 0, again.stderr[-2000:]
    log = (run_dir / "run.log").read_text()
    for text in (again.stdout + again.stderr, log):
        assert f"Ignoring the client state of {path.parent}" in text and "cannot be read (BadZipFile)" in text
        assert "1 client(s) ignored a corrupt stored state (a first participation instead)" in text
