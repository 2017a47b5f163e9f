"""The round loop's steps (:class:`server.run.app.Run`) driven one by one give what :func:`run_experiment` gives,
and every step but ``train_round`` runs without a Flower Grid; the config is validated once, where it enters."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from checks.engine_cases import NUM_CLIENTS, experiment_overrides
from server.batched.grid import BatchedGrid
from server.run import config as config_lib
from server.run.app import DivergenceError, Run, run_experiment
from server.run.config import CONF_DIR, RunConfig

TIMING = ("seconds", "elapsed")


def make_cfg(data, run_dir, *overrides) -> dict:
    """4 clients, C = 0.5 cyclic, 3 rounds of logistic regression with B = 8; plain, not validated."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(
            config_name="config",
            overrides=[
                *experiment_overrides(run_dir, data["tarball"], data["cache"]),
                "model=logreg",
                "checkpoint_every=2",
                *overrides,
            ],
        )
    return config_lib.to_plain(cfg)


def rows(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def test_a_driver_calling_the_steps_gets_the_run_of_run_experiment(tiny_data, tmp_path):
    whole = RunConfig.from_dict(make_cfg(tiny_data, tmp_path / "whole"))
    grid = BatchedGrid(NUM_CLIENTS)
    try:
        run_experiment(grid, whole)
    finally:
        grid.close()

    cfg = RunConfig.from_dict(make_cfg(tiny_data, tmp_path / "steps"))
    assert (cfg.num_rounds, cfg.eval_every, cfg.checkpoint_every, cfg.plots, cfg.engine) == (3, 1, 2, False, "ray")
    run = Run(cfg)
    assert run.resume() == 0  # no grid: config.json, partition files, round 0
    assert [r["round"] for r in rows(run.run_dir)] == [0]
    grid = BatchedGrid(NUM_CLIENTS)
    try:
        progress = run.progress_grid(grid)
        for rnd in range(1, cfg.num_rounds + 1):
            row = run.train_round(progress, rnd)
            diverged = run.evaluate(rnd, row)
            run.record(row)
            run.stop_if_diverged(rnd, diverged)
            run.checkpoint(rnd)
    finally:
        grid.close()
    summary = run.finish()
    assert summary["rounds"] == 3 and json.loads((run.run_dir / "status.json").read_text())["status"] == "finished"
    assert rows(run.run_dir) == rows(whole.run_dir)
    a, b = np.load(whole.run_dir / "final_model.npz"), np.load(run.run_dir / "final_model.npz")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    names = {p.name for p in run.run_dir.iterdir()}
    assert names == {p.name for p in whole.run_dir.iterdir()} - {"run.log", ".lock"}  # run_experiment adds both


def test_the_steps_that_need_no_grid_work_without_one(tiny_data, tmp_path):
    """resume, evaluate, record and stop_if_diverged on the initial model (checkpoint needs a trained round)."""
    run = Run(RunConfig.from_dict(make_cfg(tiny_data, tmp_path / "run", "num_rounds=1")))
    run.resume()
    row = {"round": 1}
    assert run.evaluate(1, row) == "" and {"loss", "accuracy"} <= set(row)
    counts = ("num_replies", "num_selected", "num_rejected", "num_failures", "num_skipped", "num_refused")
    run.record({**row, **dict.fromkeys((*counts, "num_reassigned", "num_silent"), 0)})
    assert [r["round"] for r in rows(run.run_dir)] == [0, 1]
    with pytest.raises(DivergenceError, match="diverged at round 1 \\(why\\)"):
        run.stop_if_diverged(1, "why")
    assert json.loads((run.run_dir / "status.json").read_text())["status"] == "diverged"


@pytest.mark.parametrize(
    "overrides, evaluated",
    [
        (["num_rounds=5", "eval_every=2"], [0, 2, 4, 5]),  # the last round too, whatever eval_every says
        (["num_rounds=5", "eval_every=100"], [0, 5]),
        (["num_rounds=6", "eval_every=3", "eval_tail=2"], [0, 3, 5, 6]),
        (["num_rounds=6", "eval_every=4", "eval_tail=1", "eval_tail_at=[2]"], [0, 2, 4, 6]),
    ],
)
def test_the_rounds_evaluated_are_every_eval_every_the_last_and_the_tails(tiny_data, tmp_path, overrides, evaluated):
    run = Run(RunConfig.from_dict(make_cfg(tiny_data, tmp_path / "run", *overrides)))
    run.resume()
    due = [0]
    for rnd in range(1, run.num_rounds + 1):
        row: dict = {"round": rnd}
        run.evaluate(rnd, row)
        due += [rnd] if "accuracy" in row else []
    assert due == evaluated


def test_a_run_config_is_validated_once_where_it_enters(tiny_data, tmp_path, monkeypatch):
    """RunConfig.from_dict validates; run_experiment and the batched engine take the RunConfig as it is."""
    from server.batched import engine
    from server.run import validation

    calls = []
    real = validation.validate

    def counted(cfg, check_paths=True):
        calls.append(cfg["run_dir"])
        return real(cfg, check_paths)

    monkeypatch.setattr(validation, "validate", counted)
    monkeypatch.setattr(config_lib, "validate", counted)  # what RunConfig.from_dict calls
    cfg = RunConfig.from_dict(make_cfg(tiny_data, tmp_path / "run", "num_rounds=1", "engine=batched"))
    assert RunConfig.of(cfg) is cfg and len(calls) == 1
    engine.simulate(cfg)
    assert len(calls) == 1 and (cfg.run_dir / "summary.json").is_file()
    with pytest.raises(config_lib.ConfigError, match="num_rounds"):
        RunConfig.from_dict(make_cfg(tiny_data, tmp_path / "bad", "num_rounds=0"))
    assert len(calls) == 2


def state_rounds(run_dir) -> list[int]:
    return sorted(int(p.name[1:9]) for p in (run_dir / "client_state").glob("*/partition-*/r*.npz"))


def drive(run: Run, grid: BatchedGrid, rounds: range, due_only: int | None = None) -> None:
    """The loop's steps for ``rounds``; at round ``due_only`` the checkpoint is only announced
    (``checkpoint_due``), not saved: the process dies between the clients' flush and the checkpoint."""
    progress = run.progress_grid(grid)
    for rnd in rounds:
        row = run.train_round(progress, rnd)
        run.record(row | {"round": rnd})
        if rnd == due_only:
            run.strategy.checkpoint_due(rnd)
            return
        run.checkpoint(rnd)


@pytest.mark.parametrize("due_only", [None, 6], ids=["killed-after-round-5", "killed-between-flush-and-checkpoint"])
def test_fedhbm_states_kept_in_memory_resume_bitwise_from_the_last_checkpoint(tiny_data, tmp_path, due_only):
    """FedHBM on the batched engine (cyclic p = 2, a checkpoint every 3 rounds): the nodes keep their states in
    memory, so only the states alive at a checkpoint reach files (never those of rounds 1 and 4, replaced before
    one). A process that dies after round 5, or between the flush and the checkpoint of round 6, loses what memory
    held; resumed from the checkpoint of round 3, the run ends bitwise as the uninterrupted one."""
    extra = ("strategy=fedhbm", "num_rounds=7", "checkpoint_every=3", "eval_every=100", "eval_tail=0")
    whole = RunConfig.from_dict(make_cfg(tiny_data, tmp_path / "whole", *extra))
    grid = BatchedGrid(NUM_CLIENTS)
    try:
        run_experiment(grid, whole)
    finally:
        grid.close()
    assert set(state_rounds(whole.run_dir)) <= {2, 3, 5, 6, 7} and 7 in state_rounds(whole.run_dir)

    killed = Run(RunConfig.from_dict(make_cfg(tiny_data, tmp_path / "killed", *extra)))
    killed.resume()
    grid = BatchedGrid(NUM_CLIENTS)
    try:
        drive(killed, grid, range(1, 7 if due_only else 6), due_only)
    finally:
        grid.close()
    killed.close()  # what a dead process leaves: the files, not the memory
    assert json.loads((killed.run_dir / "checkpoint" / "state.json").read_text())["round"] == 3
    resumed = RunConfig.from_dict(make_cfg(tiny_data, tmp_path / "killed", *extra, "resume=true"))
    grid = BatchedGrid(NUM_CLIENTS)
    try:
        run_experiment(grid, resumed)
    finally:
        grid.close()
    a, b = np.load(whole.run_dir / "final_model.npz"), np.load(killed.run_dir / "final_model.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a)
    keys = ("round", "train_loss", "loss_before", "update_norm", "loss", "accuracy")
    assert [{k: r.get(k) for k in keys} for r in rows(killed.run_dir)] == [
        {k: r.get(k) for k in keys} for r in rows(whole.run_dir)
    ]
