"""The runs of a Hydra multirun as ``flower-report`` sees them: each job's overrides, metrics and status, grouped
into configurations (the swept keys' values, ``seed`` excepted) with mean, std and 95 % CI over seeds."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from server.report.metrics import BrokenMetrics, parse_metrics, read_metrics
from server.report.stats import Summary, summarise
from server.run.hydra_config import MISSING, config_value

AVERAGED = "seed"  # runs differing only in these keys are the seeds of one configuration
# Overrides that say where or how a run is stored, never what it computes: not configuration keys, so runs started
# one by one (each with its own run_dir) still group into configurations of seeds.
STORAGE_KEYS = ("run_dir", "resume", "overwrite", "checkpoint_every", "data.cache_dir", "plots", "verbose")
HORIZON_KEYS = ("num_rounds", "eval_tail_at")  # with --upto T every run is read at T: not configuration keys
FINISHED, DIVERGED, INCOMPLETE, NO_REPLIES = "finished", "diverged", "incomplete", "no_replies"
STATUSES = (FINISHED, DIVERGED, INCOMPLETE, NO_REPLIES)


class ReportError(ValueError):
    """Bad input to flower-report (no runs, unknown or unswept key, absent metric): exit 2."""


@dataclass
class Run:
    """One job directory of the multirun."""

    path: Path
    params: dict[str, str]  # its Hydra overrides, key -> value text
    status: str  # finished | diverged | incomplete
    last_round: int | None
    reason: str
    rows: list[dict[str, Any]]
    num_rounds: int | None
    seed: Any = None  # config.json's seed (normalised), the key of a paired comparison

    def series(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """Rounds and finite-or-not values of ``metric`` where the run wrote it."""
        pts = [(r["round"], float(r[metric])) for r in self.rows if r.get(metric) is not None]
        return np.array([p[0] for p in pts], dtype=int), np.array([p[1] for p in pts], dtype=float)

    def last_mean(self, metric: str, last: int) -> float | None:
        """Mean of ``metric`` over the rounds > R - K of a finished run (None when it has no such value)."""
        rounds, values = self.series(metric)
        if self.status != FINISHED or not len(rounds):
            return None
        window = values[rounds > (self.num_rounds or rounds.max()) - last]
        return float(window.mean()) if len(window) and np.all(np.isfinite(window)) else None

    def final(self, metric: str) -> float | None:
        rounds, values = self.series(metric)
        return float(values[-1]) if self.status == FINISHED and len(values) and math.isfinite(values[-1]) else None


@dataclass
class Config:
    """The runs (seeds) of one combination of swept values, with their summaries."""

    values: dict[str, str]
    runs: list[Run]
    stats: dict[str, Summary | None] = field(default_factory=dict)
    note: str = ""
    complete: bool = True
    selected: bool = False


def normalise(value: Any) -> Any:
    """Override text -> a comparable value (numbers as floats, so "0.10" == "0.1")."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return float(text)
    except ValueError:
        return text


# --------------------------------------------------------------------------- loading
def job_dirs(sweep_dir: Path) -> list[Path]:
    """Every Hydra job directory (holding .hydra/overrides.yaml) below ``sweep_dir``."""
    return sorted(p.parent.parent for p in sweep_dir.rglob(".hydra/overrides.yaml"))


def _overrides(path: Path) -> dict[str, str]:
    """The job's Hydra overrides as {key: value}; a ValueError when .hydra/overrides.yaml is no YAML list."""
    file = path / ".hydra" / "overrides.yaml"
    try:
        items = yaml.safe_load(file.read_text()) or []
    except (OSError, yaml.YAMLError):
        items = None
    if not isinstance(items, list):
        raise ValueError(f"{file} is no YAML list of overrides")
    out = {}
    for item in items:
        key, _, value = str(item).partition("=")
        if not key.startswith("~"):
            out[key.lstrip("+")] = value
    return out


def _status(path: Path, rows: list[dict[str, Any]]) -> tuple[str, int | None, str]:
    """From status.json (written by the ServerApp); older runs: summary.json means finished."""
    last = rows[-1]["round"] if rows else None
    status_file = path / "status.json"
    if status_file.exists():
        record = _json_object(status_file)
        if record is None:
            return INCOMPLETE, last, f"{status_file} is no JSON object"
        status = {"finished": FINISHED, "diverged": DIVERGED}.get(record.get("status"), INCOMPLETE)
        return status, record.get("round", last), record.get("reason", "")
    if (path / "summary.json").exists():
        return FINISHED, last, ""
    return INCOMPLETE, last, "no status.json or summary.json (killed, or failed before round 0)"


def _json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it cannot be read or holds something else."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def load_run(path: Path) -> Run:
    """A job's run directory; a broken metrics.jsonl, status.json, config.json or .hydra/overrides.yaml makes it
    ``incomplete`` (the reason names the file), not the report's end."""
    problem = ""
    try:
        rows = read_metrics(path)
    except BrokenMetrics as err:
        rows, problem = parse_metrics(path / "metrics.jsonl")[0], str(err)
    status, last, reason = _status(path, rows)
    trained = [r for r in rows if r["round"] >= 1]
    if status == FINISHED and trained and not any(r.get("num_replies") for r in trained):
        # e.g. the simulation engine crashed at start-up: every round skipped its partitions, the model never moved
        status, reason = NO_REPLIES, f"finished, but none of its {len(trained)} rounds aggregated a reply"
    cfg_file = path / "config.json"
    cfg = _json_object(cfg_file) if cfg_file.exists() else {}
    if cfg is None:
        cfg, problem = {}, problem or f"{cfg_file} is no JSON object"
    try:
        params = _overrides(path)
    except ValueError as err:
        params, problem = {}, problem or str(err)
    if problem:
        status, reason = INCOMPLETE, problem
    seed = normalise(params.get(AVERAGED, cfg.get(AVERAGED)))
    return Run(path, params, status, last, reason, rows, cfg.get("num_rounds"), seed)


def load_runs(sweep_dirs: Sequence[Path]) -> list[Run]:
    """Every job directory below ``sweep_dirs``, each once however many of them name it (a sweep given twice, or with
    one of its own jobs, would count its runs twice: seeds, n and CIs wrong)."""
    paths = {p.resolve(): p for d in sweep_dirs for p in job_dirs(Path(d))}
    runs = [load_run(p) for p in paths.values()]
    if not runs:
        raise ReportError(f"no Hydra job directories (.hydra/overrides.yaml) under {', '.join(map(str, sweep_dirs))}")
    fill_defaults(runs)
    return runs


TIMING = ("seconds", "elapsed")  # metrics columns that differ between identical runs


def one_run_per_seed(runs: Sequence[Run]) -> tuple[list[Run], list[tuple[Run, Run]]]:
    """A configuration's seed counts once: of the runs with the same overrides and seed of which one finished (a job
    folder copied, a failed job rerun into another sweep folder reported with the first), the finished one is kept
    and the others are left out; returns the runs kept and (left out, the run kept in its place). ReportError
    (exit 2): two finished runs of one configuration and seed with different metrics (which is the seed's result?)."""
    same: dict[Any, list[Run]] = {}
    for run in runs:
        params = tuple(sorted((k, normalise(v)) for k, v in run.params.items() if k not in STORAGE_KEYS))
        same.setdefault((params, run.seed) if run.seed is not None else run.path, []).append(run)
    kept, left_out = [], []
    for group in same.values():
        group.sort(key=lambda r: (r.status != FINISHED, str(r.path)))
        first = group[0]
        if first.status != FINISHED:  # none finished: each is listed with its own reason, as before
            kept += group
            continue
        for other in group[1:]:
            if other.status == FINISHED and untimed(other.rows) != untimed(first.rows):
                raise ReportError(
                    f"{first.path} and {other.path} are runs of one configuration and seed ({seed_text(other.seed)}) "
                    "with different metrics: a seed counts once; move one of them away or report their folders apart"
                )
            left_out.append((other, first))
        kept.append(first)
    kept_ids = {id(r) for r in kept}
    return [r for r in runs if id(r) in kept_ids], left_out


def untimed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` without the columns of :data:`TIMING` (what identical runs share)."""
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def _read_config(path: Path) -> Any:
    """The run's config.json ({} when absent or broken: :func:`load_run` has listed the run as incomplete)."""
    return _json_object(path / "config.json") or {}


def _group_choices(path: Path) -> dict[str, Any]:
    """The run's Hydra group choices (``.hydra/hydra.yaml`` runtime.choices); {} when absent or unreadable."""
    hydra_file = path / ".hydra" / "hydra.yaml"
    try:
        record = yaml.safe_load(hydra_file.read_text()) if hydra_file.exists() else None
    except yaml.YAMLError:
        return {}
    runtime = ((record if isinstance(record, dict) else {}).get("hydra") or {}).get("runtime") or {}
    choices = runtime.get("choices") if isinstance(runtime, dict) else None
    return choices if isinstance(choices, dict) else {}


def fill_defaults(runs: Sequence[Run]) -> None:
    """Runs started one by one: a key that some runs set on the command line and others left at its default gets,
    in those others, the default they ran with — its Hydra group choice, else its scalar value in the resolved
    config (e.g. ``participation=uniform`` against runs that kept the preset's cyclic: cyclic vs uniform instead
    of missing vs uniform). A key a run's files do not give stays missing."""
    keys = [
        k
        for k in dict.fromkeys(k for r in runs for k in r.params)
        if k not in STORAGE_KEYS and not k.startswith("hydra.")
    ]
    for run in runs:
        missing = [k for k in keys if k not in run.params]
        if not missing:
            continue
        choices, config = _group_choices(run.path), _read_config(run.path)
        for key in missing:
            value = choices[key] if isinstance(choices.get(key), str) else config_value(config, key)
            if value is not MISSING and value is not None and not isinstance(value, (dict, list)):
                run.params[key] = str(value)


def only(runs: Sequence[Run], specs: Sequence[str]) -> list[Run]:
    """``--only KEY=VALUE ...``: the runs whose override KEY has VALUE, for every spec (e.g. one method's runs out
    of a sweep of several). ReportError (exit 2): a spec that is not KEY=VALUE, a key no run sets, no run left."""
    kept = list(runs)
    for spec in specs:
        key, sep, value = spec.partition("=")
        if not key or not sep or not value:
            raise ReportError(f"--only takes KEY=VALUE, got '{spec}'")
        if not any(key in r.params for r in runs):
            raise ReportError(
                f"--only: no run sets '{key}' (keys: {', '.join(sorted({k for r in runs for k in r.params}))})"
            )
        kept = [r for r in kept if normalise(r.params.get(key)) == normalise(value)]
    if not kept:
        raise ReportError(f"--only {' '.join(specs)}: no run matches")
    return kept


def upto(runs: Sequence[Run], horizon: int) -> list[Run]:
    """``--upto T``: every run as it stood after round T (its rows <= T; the horizon keys ``num_rounds`` and
    ``eval_tail_at`` are then no configuration keys). A run that got past T (finished, still running, or diverged
    later) is finished at T; one that stopped before T is listed as not having reached it. ReportError (exit 2):
    T < 1."""
    if horizon < 1:
        raise ReportError(f"--upto must be a round >= 1, got {horizon}")
    out = []
    for run in runs:
        rows = [row for row in run.rows if row["round"] <= horizon]
        reached = (
            run.status != NO_REPLIES
            and bool(run.rows)
            and run.rows[-1]["round"] >= horizon
            and (run.status != DIVERGED or (run.last_round or 0) > horizon)
        )
        status, reason = (FINISHED, "") if reached else (run.status, run.reason)
        if not reached and run.status == FINISHED:
            status, reason = INCOMPLETE, f"ended at round {run.last_round}, before --upto {horizon}"
        params = {k: v for k, v in run.params.items() if k not in HORIZON_KEYS}
        last = min(run.last_round, horizon) if run.last_round is not None else None
        out.append(Run(run.path, params, status, last, reason, rows, horizon if reached else run.num_rounds, run.seed))
    return out


def swept_keys(runs: Sequence[Run]) -> list[str]:
    """Override keys whose (normalised) value is not the same in every run, in first-seen order (storage keys,
    :data:`STORAGE_KEYS` and ``hydra.*``, excepted)."""
    keys = [
        k
        for k in dict.fromkeys(k for r in runs for k in r.params)
        if k not in STORAGE_KEYS and not k.startswith("hydra.")
    ]
    return [k for k in keys if len({normalise(r.params.get(k)) for r in runs}) > 1]


def _in_config(run: Run, dotted: str) -> bool:
    """Whether the run's config.json has the dotted key (a config group name like "strategy" counts)."""
    return config_value(_read_config(run.path), dotted) is not MISSING


def check_keys(runs: Sequence[Run], swept: Sequence[str], keys: Sequence[str], option: str) -> None:
    """Every key of an option must be swept; otherwise a ReportError saying whether it is unknown or fixed."""
    known = {k for r in runs for k in r.params} | {k for k in keys if any(_in_config(r, k) for r in runs)}
    for key in keys:
        if key == AVERAGED:
            raise ReportError(f"{option}: '{key}' is averaged over, not a configuration key")
        if key not in swept:
            if key in known:
                raise ReportError(f"{option}: '{key}' was not swept (it has one value; swept: {', '.join(swept)})")
            raise ReportError(f"{option}: unknown key '{key}' (swept keys: {', '.join(swept) or 'none'})")


# --------------------------------------------------------------------------- summaries
def configurations(runs: Sequence[Run], keys: Sequence[str], metrics: Sequence[str], last: int) -> list[Config]:
    """Group runs by the values of ``keys``; mean, std and 95 % CI (:mod:`server.report.stats`) over seeds of the
    final and last-K values of ``metrics``."""
    groups: dict[tuple, Config] = {}
    for run in runs:
        ident = tuple(normalise(run.params.get(k)) for k in keys)
        groups.setdefault(ident, Config({k: run.params.get(k, "") for k in keys}, [])).runs.append(run)
    for config in groups.values():
        problems = []
        for run in config.runs:
            if run.status == DIVERGED:
                problems.append(f"diverged at round {run.last_round}")
            elif run.status == INCOMPLETE:
                problems.append(f"incomplete (last round {run.last_round})")
            elif run.status == NO_REPLIES:
                problems.append("no accepted reply in any round")
        for metric in metrics:
            finals = [v for v in (r.final(metric) for r in config.runs) if v is not None]
            lasts = [v for v in (r.last_mean(metric, last) for r in config.runs) if v is not None]
            config.stats[f"{metric}_final"] = summarise(finals)
            config.stats[f"{metric}_last"] = summarise(lasts)
            missing = sum(r.status == FINISHED and r.last_mean(metric, last) is None for r in config.runs)
            if missing:
                problems.append(f"{missing} finished run(s) without {metric}")
            config.complete &= len(lasts) == len(config.runs)
        config.note = "; ".join(dict.fromkeys(problems))
    return sorted(groups.values(), key=lambda c: [sort_key(normalise(c.values[k])) for k in keys])


def seed_text(seed: Any) -> str:
    """A seed as the user gave it: 0, not 0.0 (:func:`normalise` makes numbers floats)."""
    return str(int(seed) if isinstance(seed, float) and seed.is_integer() else seed)


def sort_key(value: Any) -> tuple:
    return (0, value, "") if isinstance(value, float) else (1, 0.0, str(value))
