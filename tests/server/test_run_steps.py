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
    assert names == {p.name for p in whole.run_dir.iterdir()} - {"run.log"}  # run_experiment adds the log file


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
