"""Flower ServerApp of the experiments and the round loop shared by simulation and deployment.

One round: the strategy selects nodes and packs the message (``configure_train``),
the grid delivers it, the strategy applies its server rule (``aggregate_train``),
then the server evaluates the global model on the test set every ``eval_every``
rounds, appends a metrics row (CSV + JSONL, flushed), logs a progress line and
checkpoints every ``checkpoint_every`` rounds. ``resume=true`` restarts from the last
checkpoint with the same results as an uninterrupted run.
"""

from __future__ import annotations

import json
import logging
import math
import time
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from server.report.metrics import MetricsWriter, plot_run
from server.run import build, checkpoint
from server.run import config as config_lib
from server.run.progress import ProgressGrid, format_duration
from server.run.window import ModelWindow, split_arrays
from strategies import protocol
from strategies.client_manager import NoNodesError


class DivergenceError(RuntimeError):
    """The global model or its evaluation became NaN/inf; everything written so far is kept."""


def _train_config(cfg: dict[str, Any]) -> ConfigRecord:
    static = config_lib.client_config(cfg)
    threads = int(cfg["client"].get("torch_threads", 0))
    if threads:
        static["torch-threads"] = threads
    return ConfigRecord(static)


def _metric(metrics: Any, key: str) -> float | None:
    return float(metrics[key]) if metrics is not None and key in metrics else None


RESUME_KEYS = ("strategy", "model", "num_clients", "participation", "seed")
# strategy keys added after runs were checkpointed, with the value those runs had (a checkpoint without them resumes)
LATER_STRATEGY_KEYS = {"client_lr_schedule": "constant", "client_schedule_param": 1.0}


def resume_mismatch(saved: dict[str, Any], cfg: dict[str, Any]) -> str | None:
    """The first key of RESUME_KEYS whose value differs between a checkpoint's config and this run's (None: none)."""
    for key in RESUME_KEYS:
        old, new = saved.get(key), cfg.get(key)
        if key == "strategy" and isinstance(old, dict) and isinstance(new, dict):
            old, new = {**LATER_STRATEGY_KEYS, **old}, {**LATER_STRATEGY_KEYS, **new}
        if old != new:
            return key
    return None


def _resume(cfg: dict[str, Any], run_dir: Path, strategy: Any, window: ModelWindow) -> int:
    """Load the checkpoint into the strategy and the model window; the last completed round (0 when starting
    fresh)."""
    loaded = checkpoint.load(run_dir) if cfg.get("resume") else None
    if loaded is None:
        if cfg.get("resume"):
            log(WARNING, "resume=true but %s has no checkpoint: starting from round 1", run_dir)
        return 0
    state, arrays = loaded
    differs = resume_mismatch(state["config"], cfg)
    if differs:
        raise config_lib.ConfigError(f"cannot resume: '{differs}' differs from the checkpoint's run")
    strategy_arrays, window_arrays = split_arrays(arrays)
    strategy.load_state_dict(state["strategy"], strategy_arrays)
    window.load(state.get("window", []), window_arrays)
    try:
        window.check(strategy.model_record())
    except ValueError as err:
        raise config_lib.ConfigError(f"cannot resume: {err}") from None
    if window.size and not window.full() and int(state["round"]) >= window.size:
        held = f"the models of rounds {window.rounds} only" if window.rounds else "no model window (a run started " \
            "without eval_average)"
        log(WARNING, "eval_average=%d: the checkpoint holds %s; the averaged columns start once %d consecutive "
            "rounds are in", window.size, held, window.size)
    log(INFO, "Resuming %s after round %d", run_dir, state["round"])
    return int(state["round"])


def run_experiment(grid: Grid, cfg: dict[str, Any], run_dir: Path | str | None = None) -> dict[str, Any]:
    """Run (or resume) the configured experiment on ``grid``; returns a summary dict."""
    cfg = config_lib.validate(cfg)
    run_dir = Path(run_dir or cfg["run_dir"]).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(run_dir / "run.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addHandler(handler)
    try:
        return _run(grid, cfg, run_dir)
    finally:
        flwr_logger.removeHandler(handler)
        handler.close()


def _tail_rounds(cfg: dict[str, Any]) -> set[int]:
    """The rounds evaluated whatever ``eval_every`` says: the last ``eval_tail`` rounds before R and before each
    horizon of ``eval_tail_at`` (the oscillation over the last cycles at an earlier horizon of the same run too)."""
    tail = int(cfg.get("eval_tail", 0))
    ends = {int(cfg["num_rounds"]), *(int(t) for t in cfg.get("eval_tail_at") or ())}
    return {r for end in ends for r in range(max(1, end - tail + 1), end + 1)}


def _run(grid: Grid, cfg: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    (run_dir / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True))
    fast = bool((cfg.get("deploy") or {}).get("fast", True))  # false: the grid's own interval (HttpGrid: 3 s)
    grid = ProgressGrid(grid, poll_interval=0.1 if fast else float(getattr(grid, "pull_interval", 3.0)),
                        report_every=float(cfg.get("progress_every", 10)))
    num_rounds, eval_every, ckpt_every = int(cfg["num_rounds"]), int(cfg["eval_every"]), int(cfg["checkpoint_every"])
    tail_rounds = _tail_rounds(cfg)  # evaluated every round: the eval_tail rounds up to R and to each eval_tail_at

    dataset = build.server_dataset(cfg)
    strategy = build.build_strategy(cfg, num_train=build.train_size(dataset))
    window = ModelWindow(int(cfg.get("eval_average", 0)))  # the last W server models (eval_average)
    start = _resume(cfg, run_dir, strategy, window)
    arrays = strategy.model_record() if start else build.initial_model(cfg)
    if not start:
        build.save_partition_summary(cfg, dataset, run_dir)
    evaluator = build.Evaluator(cfg, dataset)
    writer = MetricsWriter(run_dir, keep_rounds_upto=start if start else None)
    train_config = _train_config(cfg)
    t_run = time.time()
    log(INFO, "Run dir %s: %s, %s, %d clients, rounds %d..%d", run_dir, cfg["strategy"]["name"],
        cfg["model"]["name"], cfg["num_clients"], start + 1, num_rounds)
    write_status(run_dir, "running", start)
    if start == 0:
        row0 = {"round": 0, **evaluator.metrics(arrays), "seconds": 0.0, "elapsed": 0.0}
        writer.append(row0)
        log(INFO, "[round 0/%d] accuracy %.4f loss %.4f%s", num_rounds, row0["accuracy"], row0["loss"],
            _pop_text(row0))

    for rnd in range(start + 1, num_rounds + 1):
        t0 = time.time()
        grid.begin_round(rnd, num_rounds)
        try:
            messages = list(strategy.configure_train(rnd, arrays, train_config, grid))
        except NoNodesError as err:
            write_status(run_dir, "failed", rnd - 1, str(err))
            raise
        replies = list(grid.send_and_receive(messages, timeout=float(cfg["round_timeout"]))) if messages else []
        new_arrays, metrics = strategy.aggregate_train(rnd, replies)
        manager = getattr(strategy, "client_manager", None)
        if manager is not None and metrics is not None:  # silent nodes, query answers that came in meanwhile
            manager.note_replies(rnd, messages, replies, grid)
            metrics.update(manager.round_counts(rnd))
        arrays = new_arrays if new_arrays is not None else arrays
        window.push(rnd, arrays)
        row = {
            "round": rnd,
            "server_lr": _metric(metrics, "server-lr"),
            "client_lr": _metric(metrics, "client-lr"),
            "train_loss": _metric(metrics, protocol.TRAIN_LOSS),
            "loss_before": _metric(metrics, protocol.LOSS_BEFORE),
            "num_selected": len(messages),
            "num_replies": int(_metric(metrics, "num-replies") or 0),
            "num_rejected": int(_metric(metrics, "num-rejected") or 0),
            "num_failures": int(_metric(metrics, "num-failures") or 0),
            "num_skipped": int(_metric(metrics, "num-skipped") or 0),
            "update_norm": _metric(metrics, "update-norm"),
            "client_update_norm": _metric(metrics, "client-update-norm"),
            "num_refused": int(_metric(metrics, "num-refused") or 0),
            "num_reassigned": int(_metric(metrics, "num-reassigned") or 0),
            "num_silent": int(_metric(metrics, "num-silent") or 0),
        }
        diverged = _divergence(strategy)
        if not diverged and (rnd % eval_every == 0 or rnd in tail_rounds):
            row.update(evaluator.metrics(arrays))
            if not math.isfinite(row["loss"]):
                diverged = f"the test loss of the global model is {row['loss']}"
            elif window.full():  # the mean of the last W server models (seed 000's cycle, docs/convex.md)
                row.update({f"avg_{k}": v for k, v in evaluator.metrics(window.mean()).items()})
        row["seconds"] = time.time() - t0
        row["elapsed"] = time.time() - t_run
        writer.append(row)
        _log_progress(rnd, num_rounds, row, eta=grid.run_eta(1, 1))  # the in-round lines' estimate
        if diverged:
            write_status(run_dir, "diverged", rnd, diverged)
            if cfg["plots"]:
                plot_run(run_dir)
            raise DivergenceError(f"training diverged at round {rnd} ({diverged}); metrics up to this round and "
                                  f"the last checkpoint are in {run_dir}")
        if rnd % ckpt_every == 0 or rnd == num_rounds:
            meta, state_arrays = strategy.state_dict()
            window_rounds, window_arrays = window.state()
            checkpoint.save(run_dir, rnd, meta, {**state_arrays, **window_arrays}, cfg, window_rounds)
            strategy.checkpoint_saved(rnd)
    if cfg["plots"]:
        plot_run(run_dir)
    final = {k: v.numpy() for k, v in arrays.items()}
    np.savez(run_dir / "final_model.npz", **final)
    if window.full():  # the mean of the last W models, in the model's dtypes
        np.savez(run_dir / "final_model_avg.npz", **{k: v.astype(final[k].dtype) for k, v in window.mean().items()})
    last = writer.rows[-1] if writer.rows else {}
    summary = {"run_dir": str(run_dir), "rounds": num_rounds, "accuracy": last.get("accuracy"),
               "loss": last.get("loss"), "seconds": time.time() - t_run}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    write_status(run_dir, "finished", num_rounds)
    return summary


def write_status(run_dir: Path, status: str, last_round: int, reason: str = "") -> None:
    """status.json: "running" (also what a killed run leaves), "diverged" (exit 3, with the reason),
    "failed" (no node answered before the first round, with the reason) or "finished"; ``round`` = the last
    round whose metrics were written. ``flower-report`` reads it."""
    record = {"status": status, "round": last_round, "reason": reason}
    (run_dir / "status.json").write_text(json.dumps(record))


def _pop_text(row: dict[str, Any]) -> str:
    """' pop_loss … pop_accuracy … [pop_gap …]' when the population was evaluated this round (eval_train, eval_gap)."""
    if row.get("pop_loss") is None:
        return ""
    gap = f" pop_gap {row['pop_gap']:.4e}" if row.get("pop_gap") is not None else ""
    return f" pop_loss {row['pop_loss']:.4f} pop_accuracy {row['pop_accuracy']:.4f}{gap}"


def _avg_text(row: dict[str, Any]) -> str:
    """' avg_accuracy … avg_loss … [avg_pop_gap …]' when the mean of the last eval_average models was evaluated."""
    if row.get("avg_accuracy") is None:
        return ""
    gap = f" avg_pop_gap {row['avg_pop_gap']:.4e}" if row.get("avg_pop_gap") is not None else ""
    return f" avg_accuracy {row['avg_accuracy']:.4f} avg_loss {row['avg_loss']:.4f}{gap}"


def _divergence(strategy: Any) -> str:
    """Why the run counts as diverged ('' when it does not): only the *global* model decides.

    Client replies with NaN/inf never reach the model (the strategy rejects them), so one diverging client
    cannot end a run; the test loss is checked after each evaluation.
    """
    if strategy.model is not None and not all(np.all(np.isfinite(a)) for a in strategy.model):
        return "the global model has non-finite weights"
    return ""


def _log_progress(rnd: int, num_rounds: int, row: dict[str, Any], eta: float | None = None) -> None:
    """The round's line; ``eta``: :meth:`ProgressGrid.run_eta`, seconds left at the mean pace of this process's
    rounds (with evaluations; None: not known yet)."""
    def fmt(key: str, spec: str = ".4f") -> str:
        value = row.get(key)
        return "-" if value is None else format(value, spec)

    log(INFO, "[round %d/%d] accuracy %s loss %s train_loss %s server_lr %s client_lr %s replies %d/%d "
        "rejected %d failures %d skipped %d refused %d reassigned %d silent %d %.1fs%s%s", rnd, num_rounds,
        fmt("accuracy"), fmt("loss"), fmt("train_loss"), fmt("server_lr", ".4g"), fmt("client_lr", ".4g"),
        row["num_replies"], row["num_selected"], row["num_rejected"], row["num_failures"], row["num_skipped"],
        row["num_refused"], row["num_reassigned"], row["num_silent"], row["seconds"], _pop_text(row) + _avg_text(row),
        f", run ETA {'?' if eta is None else format_duration(eta)}" if rnd < num_rounds else "")


def make_server_app(cfg: dict[str, Any], result: dict[str, Any]) -> ServerApp:
    """A ServerApp running ``cfg`` (simulation passes the config by closure); the summary lands in ``result``."""
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        try:
            result.update(run_experiment(grid, cfg, cfg["run_dir"]))
        except Exception as err:  # surfaced by flower-simulation after Ray shuts down
            result["error"] = err
            raise

    return server_app
