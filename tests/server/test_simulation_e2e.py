"""`flower-simulation` end to end: every strategy, resume, bad configs, divergence, plots.

The runs are on the batched engine (``IN_PROCESS``): their subject is the CLI, the sweep, the strategies, resume
and divergence handling, not Ray (the Ray engine runs the same round loop: tests/server/test_batched_engine.py;
Ray's own start-up, signals, resume with node-local state and cluster: test_ray_local.py, test_ghbm_e2e.py,
test_ray_cluster.py). The bad-config tests keep the default engine (Ray): they check that it never starts."""

import json
import re

import numpy as np
import pytest
from simcli import IN_PROCESS, full_and_resumed, run_cli, sim_args

from server.report.metrics import read_metrics

pytestmark = pytest.mark.e2e
STRATEGIES = ["fedavg", "fedavgm", "fedcm", "localupdate", "localupdate_decay"]


@pytest.fixture(scope="module")
def multirun(tiny_data, tmp_path_factory):
    """One Hydra multirun: 5 strategies, cyclic participation, 2 rounds each, on the .tar.gz data (the uniform
    mode, shared by every strategy through the client manager, runs in the diverging-clients test)."""
    sweep = tmp_path_factory.mktemp("sweep")
    args = [
        "-m",
        *sim_args(tiny_data, sweep / "unused")[:-1],
        *IN_PROCESS,
        f"strategy={','.join(STRATEGIES)}",
        "participation=cyclic",
        "plots=true",
        f"hydra.sweep.dir={sweep}",
        "hydra.sweep.subdir=${strategy.name}_${hydra:runtime.choices.strategy}_${participation.mode}",
    ]
    proc = run_cli("flower-simulation", args, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return sweep, proc.stdout + proc.stderr


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_runs_two_rounds(multirun, strategy):
    sweep, _ = multirun
    mode = "cyclic"
    [run_dir] = [p for p in sweep.iterdir() if p.name.endswith(f"_{strategy}_{mode}")]
    rows = read_metrics(run_dir)
    assert [r["round"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert r["num_replies"] == r["num_selected"] == 2 and r["num_failures"] == r["num_rejected"] == 0
        assert np.isfinite(
            [r["accuracy"], r["loss"], r["train_loss"], r["loss_before"], r["server_lr"], r["client_lr"], r["seconds"]]
        ).all()
        assert r["update_norm"] > 0 and r["client_update_norm"] >= r["update_norm"] * (1 - 1e-9)  # triangle ineq.
    header = (run_dir / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"round", "accuracy", "loss", "server_lr", "client_lr", "seconds"} <= set(header)
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["participation"]["mode"] == mode
    for name in ("accuracy.png", "loss.png", "partition.png", "partition.csv", "final_model.npz", "run.log"):
        assert (run_dir / name).stat().st_size > 0
    log = (run_dir / "run.log").read_text()
    first, last = (next(line for line in log.splitlines() if f"[round {r}/2] accuracy" in line) for r in (1, 2))
    assert re.search(r", run ETA \d+ s$", first) and "ETA" not in last, (first, last)  # the last round has none


def test_cyclic_runs_alternate_groups(multirun):
    sweep, output = multirun
    assert "[round 2/2]" in output and "Round 1: partitions" not in output  # a detail of run.log (verbose=true)
    run_dir = next(p for p in sweep.iterdir() if p.name.endswith("_fedavg_cyclic"))
    log = (run_dir / "run.log").read_text()
    first = log.split("Round 1: partitions ")[1].split(" on")[0]
    second = log.split("Round 2: partitions ")[1].split(" on")[0]
    assert not set(json.loads(first)) & set(json.loads(second))


def test_flower_plot_aggregates_runs(multirun, tmp_path):
    sweep, _ = multirun
    out = tmp_path / "fig.png"
    proc = run_cli("flower-plot", [sweep, "--out", out, "--group-by", "strategy.name"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    curves = json.loads(out.with_suffix(".json").read_text())
    assert set(curves) == {f"strategy.name={s}" for s in ("fedavgm", "fedcm", "localupdate", "localupdate_decay")}
    assert curves["strategy.name=fedavgm"]["runs"] == 2 and curves["strategy.name=fedcm"]["round"] == [0, 1, 2]
    assert out.stat().st_size > 0


@pytest.mark.parametrize("momenta", ["1.5,0.5", "${nope},0.5"])
def test_an_invalid_job_of_a_multirun_fails_alone_and_the_sweep_exits_2(tiny_data, tmp_path, momenta):
    """Hydra's own launcher runs jobs one after another: the invalid first job does not end the sweep."""
    sweep = tmp_path / "sweep"
    args = ["-m", *sim_args(tiny_data, sweep / "unused")[:-1], *IN_PROCESS, "strategy=fedavgm"]
    proc = run_cli("flower-simulation", [*args, f"strategy.momentum={momenta}", f"hydra.sweep.dir={sweep}"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    bad = [line for line in proc.stderr.splitlines() if "invalid configuration" in line]
    assert len(bad) == 1 and "strategy.momentum" in bad[0] and str(sweep / "0_") in bad[0], proc.stderr[-3000:]
    statuses = sorted(json.loads((p / "status.json").read_text())["status"] for p in sweep.iterdir() if p.is_dir())
    assert statuses == ["failed", "finished"]
    assert "1 job(s) invalid" in proc.stderr


def test_resume_after_kill_equals_uninterrupted(tiny_data, tmp_path):
    extra = [*IN_PROCESS, "num_rounds=4", "strategy=fedcm", "data.root=" + str(tiny_data["folder"])]
    full_dir, killed_dir = full_and_resumed(tiny_data, tmp_path, extra)
    rows_a, rows_b = read_metrics(full_dir), read_metrics(killed_dir)
    assert [r["round"] for r in rows_b] == [0, 1, 2, 3, 4]
    for ra, rb in zip(rows_a, rows_b):
        assert (ra["accuracy"], ra["loss"], ra.get("train_loss")) == (rb["accuracy"], rb["loss"], rb.get("train_loss"))


@pytest.mark.parametrize(
    "override, key",
    [
        ("strategy.name=adam", "strategy.name"),
        ("strategy.momentum=1.0", "strategy.momentum"),
        ("strategy.client_lr=-0.1", "strategy.client_lr"),
        ("participation.fraction=0.3", "participation.fraction"),
        ("model.name=vgg", "model.name"),
        ("data.root=/nonexistent/cifar.tar.gz", "data.root"),
        ("client.local_steps=abc", "client.local_steps"),
        ("run_dir=/proc/x", "run_dir"),
    ],
)
def test_bad_config_fails_before_ray_starts(tiny_data, tmp_path, override, key):
    proc = run_cli("flower-simulation", sim_args(tiny_data, tmp_path / "bad", override), timeout=120)
    assert proc.returncode == 2
    assert key in proc.stderr
    assert "ActorPool" not in proc.stdout + proc.stderr
    assert not (tmp_path / "bad" / "metrics.csv").exists()


@pytest.mark.parametrize(
    "override, expected",
    [
        ("strategy=sgd", "Could not find 'strategy/sgd' (options: fedavg, fedavgm, "),
        ("data.bogus=1", "use +data.bogus=1 (the config has no key 'data.bogus')"),
        ("seed=[", "cannot parse the override 'seed=['"),
        ("num_rounds=${nope}", "num_rounds: Interpolation key 'nope' not found"),
    ],
)
def test_hydras_own_errors_are_one_line_and_exit_2(tiny_data, tmp_path, override, expected):
    """An unknown config group option or key, an override that does not parse, a value that does not resolve: one
    line on stderr (not Hydra's report and stack trace), exit 2, before any work."""
    proc = run_cli("flower-simulation", sim_args(tiny_data, tmp_path / "bad", override), timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("flower-simulation: invalid configuration: "), proc.stderr
    assert expected in lines[0]
    assert not (tmp_path / "bad" / "metrics.csv").exists()


@pytest.mark.parametrize(
    "server_lr, why",
    [("1e30", "the test loss of the global model is nan"), ("1e300", "the global model has non-finite weights")],
)
def test_divergence_of_the_global_model_stops_with_a_clear_message_and_keeps_results(
    tiny_data, tmp_path, server_lr, why
):
    """The run says why in one line, with no warning of the overflow that got it there (the server rule's, or the
    plots' log scale of a learning rate near the float range)."""
    run_dir = tmp_path / "nan"
    args = sim_args(tiny_data, run_dir, *IN_PROCESS, f"strategy.server_lr={server_lr}", "num_rounds=5", "plots=true")
    proc = run_cli("flower-simulation", args)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert f"training diverged at round 1 ({why})" in proc.stderr
    assert "Warning" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert (run_dir / "lr.png").stat().st_size > 0
    rows = read_metrics(run_dir)
    assert rows and rows[0]["round"] == 0 and len(rows) < 6


def test_diverging_clients_are_rejected_and_do_not_end_the_run(tiny_data, tmp_path):
    """Every client diverges (NaN local training): each reply is rejected, the model stays as it was. Uniform
    participation: 2 of 4 partitions drawn per round."""
    run_dir = tmp_path / "clients-nan"
    proc = run_cli(
        "flower-simulation",
        sim_args(tiny_data, run_dir, *IN_PROCESS, "strategy.client_lr=1e12", "participation=uniform"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((run_dir / "config.json").read_text())["participation"]["mode"] == "uniform"
    rows = read_metrics(run_dir)
    assert [r["num_selected"] for r in rows[1:]] == [2, 2]
    assert [(r["num_replies"], r["num_rejected"]) for r in rows[1:]] == [(0, 2), (0, 2)]
    assert rows[1]["loss"] == rows[2]["loss"] == rows[0]["loss"]  # unchanged global model
    assert "rejected the reply of node" in (run_dir / "run.log").read_text()
