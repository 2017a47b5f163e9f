"""Seed 001's protocol end to end on generated data: a real 2 x 2 x 2-seed Hydra multirun of LocalUpdate with Yogi
(one eta diverges), population loss and update norms checked by hand, `flower-report` cell by cell, resume.

Every run is on the batched engine (``IN_PROCESS``): the subject is the protocol, the sweep and the report, not
Ray; the same round loop on Ray is tests/server/test_batched_engine.py's subject (bitwise the same CNN)."""

import csv
import json
import math
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from simcli import IN_PROCESS, report, run_cli, sim_args

from client.app import train_on_partition
from client.data import load_dataset
from client.models import build_model
from client.partition import dirichlet_partition
from server.report.metrics import read_metrics
from server.run import config as config_lib
from strategies import math as fm
from strategies.participation import make_schedule

pytestmark = pytest.mark.e2e
GAMMAS, ETAS, SEEDS = ("0.05", "0.1"), ("0.01", "1e30"), (0, 1)
FIXED = [
    *IN_PROCESS,
    "strategy=localupdate",
    "strategy.server_optimizer=yogi",
    "participation=uniform",
    "eval_train=true",
    "num_rounds=3",
    "client.loss_before_batches=1",
    "plots=true",
]


@pytest.fixture(scope="module")
def sweep(tiny_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("protocol")
    args = [
        "-m",
        *sim_args(tiny_data, root / "unused")[:-1],
        *FIXED,
        f"strategy.client_lr={','.join(GAMMAS)}",
        f"strategy.server_lr={','.join(ETAS)}",
        f"seed={SEEDS[0]},{SEEDS[1]}",
        f"hydra.sweep.dir={root}",
        "hydra.sweep.subdir=g${strategy.client_lr}_e${strategy.server_lr}_s${seed}",
    ]
    proc = run_cli("flower-simulation", args, timeout=900)
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]  # the sweep ran on, then exit 3
    assert "4 job(s) diverged" in proc.stderr
    return root


def job(sweep, gamma, eta, seed):
    return sweep / f"g{float(gamma)}_e{float(eta)}_s{seed}"


def test_every_job_ran_and_the_huge_eta_diverged(sweep):
    for gamma in GAMMAS:
        for seed in SEEDS:
            assert json.loads((job(sweep, gamma, "0.01", seed) / "status.json").read_text())["status"] == "finished"
            status = json.loads((job(sweep, gamma, "1e30", seed) / "status.json").read_text())
            assert status["status"] == "diverged" and status["round"] == 1
            assert not (job(sweep, gamma, "1e30", seed) / "summary.json").exists()


def test_pop_loss_equals_an_independent_full_pass_over_the_partitions(sweep, tiny_data):
    run = job(sweep, "0.05", "0.01", 1)
    cfg = json.loads((run / "config.json").read_text())
    ds = load_dataset("cifar10_folder", tiny_data["tarball"], tiny_data["cache"])
    parts = dirichlet_partition(ds.y_train, cfg["num_clients"], cfg["data"]["alpha"], cfg["seed"], 10)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(ds.y_train)))  # the union is the train set
    model = build_model("cnn")
    model.load_state_dict({k: torch.from_numpy(v) for k, v in np.load(run / "final_model.npz").items()})
    model.eval()
    mean, std = torch.tensor(ds.mean).view(1, 3, 1, 1), torch.tensor(ds.std).view(1, 3, 1, 1)
    losses, accs = [], []
    with torch.no_grad():
        for idx in parts:
            x = (torch.from_numpy(np.asarray(ds.x_train[idx])).permute(0, 3, 1, 2).float() / 255 - mean) / std
            logits, y = model(x), torch.from_numpy(np.asarray(ds.y_train[idx]))
            losses.append(float(F.cross_entropy(logits, y)))
            accs.append(int((logits.argmax(1) == y).sum()) / len(idx))
    last = read_metrics(run)[-1]
    assert last["round"] == 3
    assert last["pop_loss"] == pytest.approx(np.mean(losses), rel=1e-5)  # seed 001 Eq. 2, P uniform
    assert last["pop_accuracy"] == pytest.approx(np.mean(accs), abs=1e-9)
    assert f"pop_loss {last['pop_loss']:.4f}" in (run / "run.log").read_text()
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"pop_loss", "pop_accuracy", "update_norm", "client_update_norm"} <= set(header)
    assert (run / "norm.png").stat().st_size > 0


def test_update_norms_by_hand(sweep):
    """Replay round 3's clients from the checkpoint's theta^2: ||mean q|| and the weighted mean of ||q_i||."""
    run = job(sweep, "0.1", "0.01", 0)
    cfg = json.loads((run / "config.json").read_text())
    with np.load(run / "checkpoint" / "arrays.npz") as npz:
        prev = {k.split("/", 1)[1]: npz[k] for k in npz.files if k.startswith("prev_model/")}
    schedule = make_schedule("uniform", cfg["num_clients"], cfg["participation"]["fraction"], cfg["seed"])
    round_config = {
        **config_lib.client_config(cfg),
        "torch-threads": 1,
        "algorithm": "localupdate",
        "server-round": 3,
        "server-lr": 0.01,
        "momentum": 0.0,
        "client-lr": 0.1,
        "theta": "fedavg",
    }
    updates, weights = [], []
    for pid in schedule.clients_for_round(3):
        arrays, metrics = train_on_partition(round_config, prev, pid)
        updates.append([arrays[k] for k in prev])
        weights.append(metrics["num-examples"])
    row = read_metrics(run)[3]
    assert row["update_norm"] == pytest.approx(fm.l2_norm(fm.weighted_mean(updates, weights)), rel=1e-5)
    by_hand = sum(
        w * math.sqrt(sum(float(np.sum(a.astype(np.float64) ** 2)) for a in q)) for q, w in zip(updates, weights)
    ) / sum(weights)
    assert row["client_update_norm"] == pytest.approx(by_hand, rel=1e-5)


def read_report(out):
    with open(out / "report.csv") as f:
        return {(r["strategy.client_lr"], r["strategy.server_lr"]): r for r in csv.DictReader(f)}


def test_flower_report_cell_by_cell(sweep, tmp_path):
    out = tmp_path / "report"
    proc = report(
        sweep,
        "--best-per",
        "strategy.client_lr",
        "--select",
        "strategy.server_lr",
        "--minimize",
        "pop_loss",
        "--last",
        "2",
        "--grid",
        "strategy.server_lr",
        "strategy.client_lr",
        "--out",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    rows = read_report(out)
    assert len(rows) == 4
    for gamma in GAMMAS:
        ok = rows[(str(float(gamma)), "0.01")]
        runs = [read_metrics(job(sweep, gamma, "0.01", s)) for s in SEEDS]
        finals = [r[-1]["pop_loss"] for r in runs]
        lasts = [np.mean([row["pop_loss"] for row in r if row["round"] > 1]) for r in runs]
        assert (ok["runs"], ok["finished"], ok["diverged"], ok["selected"]) == ("2", "2", "0", "True")
        assert float(ok["pop_loss_final_mean"]) == pytest.approx(np.mean(finals), rel=1e-12)
        assert float(ok["pop_loss_final_std"]) == pytest.approx(np.std(finals), rel=1e-9, abs=1e-15)
        assert float(ok["pop_loss_last2_mean"]) == pytest.approx(np.mean(lasts), rel=1e-12)
        assert float(ok["pop_loss_last2_std"]) == pytest.approx(np.std(lasts), rel=1e-9, abs=1e-15)
        bad = rows[(str(float(gamma)), "1e+30")]
        assert (bad["finished"], bad["diverged"], bad["selected"], bad["pop_loss_final_mean"]) == (
            "0",
            "2",
            "False",
            "",
        )
        assert bad["note"] == "diverged at round 1"
    md = (out / "report.md").read_text()
    assert "## Best strategy.server_lr per strategy.client_lr" in md and md.count("diverged at round 1") >= 6
    best = md.split("## Best")[1].split("##")[0]
    assert "| 0.05 | 0.01 |" in best and "| 0.1 | 0.01 |" in best and "1e+30" not in best  # tuned eta per gamma
    for name in ("curves.png", "heatmap.png"):
        assert (out / name).stat().st_size > 0


def test_killed_and_idle_runs_keep_their_configurations_out_of_the_selection(sweep, tmp_path):
    """A run killed mid-way (status running, no summary) is incomplete; a run whose rounds aggregated no reply
    (what a simulation engine that failed to start leaves) is reported as such; neither is selected."""
    copy = tmp_path / "sweep"
    shutil.copytree(sweep, copy)
    killed = job(copy, "0.05", "0.01", 1)
    (killed / "summary.json").unlink()
    (killed / "status.json").write_text(json.dumps({"status": "running", "round": 2, "reason": ""}))
    idle = job(copy, "0.1", "0.01", 1)
    rows = [{**r, "num_replies": 0} if r["round"] else r for r in read_metrics(idle)]
    (idle / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = report(copy, "--metric", "accuracy", "--select", "strategy.server_lr", "--out", tmp_path / "r")
    assert proc.returncode == 0, proc.stderr
    rows = read_report(tmp_path / "r")
    cell = rows[("0.05", "0.01")]
    assert (cell["finished"], cell["incomplete"], cell["selected"]) == ("1", "1", "False")
    assert cell["note"].startswith("incomplete (last round 2)")
    cell = rows[("0.1", "0.01")]
    assert (cell["finished"], cell["no_replies"], cell["selected"]) == ("1", "1", "False")
    assert cell["note"].startswith("no accepted reply in any round")
    assert (tmp_path / "r" / "report.md").read_text().count("none finished") == 2  # no complete eta is left


@pytest.mark.parametrize(
    "args, message",
    [
        (["--best-per", "strategy.momentum"], "unknown key 'strategy.momentum'"),
        (["--grid", "strategy.server_lr", "model.name"], "'model.name' was not swept"),
        (["--select", "strategy.theta"], "'strategy.theta' was not swept"),
        (["--metric", "perplexity"], "metric 'perplexity' is in no run's metrics"),
        (["--best-per", "seed"], "'seed' is averaged over"),
    ],
)
def test_bad_report_input_exits_2_with_one_line(sweep, tmp_path, args, message):
    proc = report(sweep, *args, "--out", tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "report.md").exists()


def test_report_of_a_folder_without_runs_exits_2(tmp_path):
    proc = report(tmp_path)
    assert proc.returncode == 2 and "no Hydra job directories" in proc.stderr and proc.stderr.count("\n") == 1


def test_yogi_state_survives_a_resume_bitwise(sweep, tiny_data, tmp_path):
    """2 rounds, then resume=true to 3 rounds == the sweep's uninterrupted 3-round job (m, v from the checkpoint)."""
    extra = [*FIXED[:-2], "client.loss_before_batches=1", "strategy.client_lr=0.1", "strategy.server_lr=0.01", "seed=0"]
    first = run_cli("flower-simulation", sim_args(tiny_data, tmp_path / "run", *extra, "num_rounds=2"))
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = run_cli("flower-simulation", sim_args(tiny_data, tmp_path / "run", *extra, "num_rounds=3", "resume=true"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    full = job(sweep, "0.1", "0.01", 0)
    for name in ("final_model.npz", "checkpoint/arrays.npz"):
        a, b = np.load(full / name), np.load(tmp_path / "run" / name)
        assert sorted(a.files) == sorted(b.files)
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key])
    assert any(k.startswith("server_opt_v/") for k in np.load(full / "checkpoint/arrays.npz").files)
    assert [r["pop_loss"] for r in read_metrics(full)] == [r["pop_loss"] for r in read_metrics(tmp_path / "run")]
