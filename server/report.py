"""``flower-report``: tables and figures of a Hydra multirun (a learning-rate grid over any keys and seeds).

    flower-report multirun/2026-11-30/10-00-00 --best-per strategy.client_lr --select strategy.server_lr \
        --minimize pop_loss --grid strategy.server_lr strategy.client_lr

A *configuration* is one combination of the swept keys (the Hydra overrides that differ between the jobs),
``seed`` excepted: the runs of a configuration are its seeds. For each configuration the report gives mean ± std
over seeds (ddof = 0, as ``flower-plot``) of the final value of ``--metric`` and of its mean over the last K
rounds (seed 001 Section 8.3: "the smallest average training loss over the last 100 rounds"). ``--select``
picks, for every combination of the other swept keys (``--best-per``), the value(s) of the selected keys with the
best last-K mean: seed 001's tuned eta for each gamma. Runs that diverged (exit 3, ``status.json``), stopped early,
never aggregated a reply or lack the metric are listed as such; a configuration with such a run is never selected.
Outputs in ``--out`` (default: the first sweep dir): report.md, report.csv, curves.png, heatmap.png (``--grid``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from server.results import read_metrics

AVERAGED = "seed"  # runs differing only in these keys are the seeds of one configuration
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
    stats: dict[str, tuple[float, float] | None] = field(default_factory=dict)
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
    items = yaml.safe_load((path / ".hydra" / "overrides.yaml").read_text()) or []
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
        record = json.loads(status_file.read_text())
        status = {"finished": FINISHED, "diverged": DIVERGED}.get(record.get("status"), INCOMPLETE)
        return status, record.get("round", last), record.get("reason", "")
    if (path / "summary.json").exists():
        return FINISHED, last, ""
    return INCOMPLETE, last, "no status.json or summary.json (killed, or failed before round 0)"


def load_run(path: Path) -> Run:
    rows = read_metrics(path)
    status, last, reason = _status(path, rows)
    trained = [r for r in rows if r["round"] >= 1]
    if status == FINISHED and trained and not any(r.get("num_replies") for r in trained):
        # e.g. the simulation engine crashed at start-up: every round skipped its partitions, the model never moved
        status, reason = NO_REPLIES, f"finished, but none of its {len(trained)} rounds aggregated a reply"
    cfg_file = path / "config.json"
    num_rounds = json.loads(cfg_file.read_text()).get("num_rounds") if cfg_file.exists() else None
    return Run(path, _overrides(path), status, last, reason, rows, num_rounds)


def load_runs(sweep_dirs: Sequence[Path]) -> list[Run]:
    runs = [load_run(p) for d in sweep_dirs for p in job_dirs(Path(d))]
    if not runs:
        raise ReportError(f"no Hydra job directories (.hydra/overrides.yaml) under {', '.join(map(str, sweep_dirs))}")
    return runs


def swept_keys(runs: Sequence[Run]) -> list[str]:
    """Override keys whose (normalised) value is not the same in every run, in first-seen order."""
    keys = list(dict.fromkeys(k for r in runs for k in r.params))
    return [k for k in keys if len({normalise(r.params.get(k)) for r in runs}) > 1]


def _in_config(run: Run, dotted: str) -> bool:
    """Whether the run's config.json has the dotted key (a config group name like "strategy" counts)."""
    cfg_file = run.path / "config.json"
    node: Any = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


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
def _mean_std(values: list[float]) -> tuple[float, float] | None:
    return (float(np.mean(values)), float(np.std(values))) if values else None


def configurations(runs: Sequence[Run], keys: Sequence[str], metrics: Sequence[str], last: int) -> list[Config]:
    """Group runs by the values of ``keys``; mean ± std over seeds of final and last-K values of ``metrics``."""
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
            config.stats[f"{metric}_final"] = _mean_std(finals)
            config.stats[f"{metric}_last"] = _mean_std(lasts)
            missing = sum(r.status == FINISHED and r.last_mean(metric, last) is None for r in config.runs)
            if missing:
                problems.append(f"{missing} finished run(s) without {metric}")
            config.complete &= len(lasts) == len(config.runs)
        config.note = "; ".join(dict.fromkeys(problems))
    return sorted(groups.values(), key=lambda c: [_sort_key(normalise(c.values[k])) for k in keys])


def _sort_key(value: Any) -> tuple:
    return (0, value, "") if isinstance(value, float) else (1, 0.0, str(value))


def select_best(configs: Sequence[Config], group_keys: Sequence[str], criterion: str, minimize: bool) -> list[dict]:
    """For every combination of ``group_keys``: the complete configuration with the best last-K ``criterion``."""
    groups: dict[tuple, list[Config]] = {}
    for config in configs:
        groups.setdefault(tuple(normalise(config.values[k]) for k in group_keys), []).append(config)
    out = []
    for members in groups.values():
        scored = [(c.stats[f"{criterion}_last"][0], c) for c in members if c.complete and c.stats[f"{criterion}_last"]]
        best = (min if minimize else max)(scored, key=lambda item: item[0])[1] if scored else None
        if best is not None:
            best.selected = True
        out.append({"group": {k: members[0].values[k] for k in group_keys}, "best": best,
                    "candidates": len(members), "excluded": len(members) - len(scored)})
    return out


# --------------------------------------------------------------------------- outputs
def _fmt(stat: tuple[float, float] | None) -> str:
    return "—" if stat is None else f"{stat[0]:.4g} ± {stat[1]:.2g}"


def write_csv(path: Path, configs: Sequence[Config], keys: Sequence[str], metrics: Sequence[str], last: int) -> None:
    stat_cols = [f"{m}_{kind}_{agg}" for m in metrics for kind in ("final", f"last{last}") for agg in ("mean", "std")]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*keys, "runs", *STATUSES, *stat_cols, "selected", "note"])
        for c in configs:
            counts = [sum(r.status == s for r in c.runs) for s in STATUSES]
            stats = []
            for m in metrics:
                for kind in ("final", "last"):
                    stat = c.stats[f"{m}_{kind}"]
                    stats += ["", ""] if stat is None else [repr(stat[0]), repr(stat[1])]
            writer.writerow([*(c.values[k] for k in keys), len(c.runs), *counts, *stats, c.selected, c.note])


def write_markdown(path: Path, args: argparse.Namespace, runs: Sequence[Run], configs: Sequence[Config],
                   keys: Sequence[str], best: list[dict] | None, figures: Sequence[str]) -> None:
    m, k = args.metric, args.last
    lines = [f"# flower-report: {', '.join(map(str, args.sweep_dirs))}", "",
             f"{len(runs)} runs, {len(configs)} configurations (swept: {', '.join(keys) or 'none'}; "
             f"averaged over: {AVERAGED}). Values: mean ± std over seeds of `{m}` at the last round and its mean over "
             f"the last {k} rounds. Runs that diverged, did not finish or never aggregated a reply are listed in "
             "*note* and their configurations are never selected.", "",
             f"| {' | '.join(keys)} | runs | {m} final | {m} last {k} | note |",
             f"|{'---|' * (len(keys) + 4)}"]
    for c in configs:
        mark = " **(best)**" if c.selected else ""
        lines.append(f"| {' | '.join(c.values[key] for key in keys)} | {len(c.runs)} | {_fmt(c.stats[f'{m}_final'])} "
                     f"| {_fmt(c.stats[f'{m}_last'])}{mark} | {c.note} |")
    if best is not None:
        group_keys = list(best[0]["group"]) if best else []
        crit = args.criterion
        lines += ["", f"## Best {', '.join(args.select)} per {', '.join(group_keys) or 'sweep'} "
                  f"({'smallest' if args.minimize_criterion else 'largest'} mean {crit} over the last {k} rounds)", "",
                  f"| {' | '.join(group_keys + list(args.select))} | {crit} last {k} | {m} final | excluded |",
                  f"|{'---|' * (len(group_keys) + len(args.select) + 3)}"]
        for item in best:
            b = item["best"]
            chosen = [b.values[s] for s in args.select] if b else ["none finished"] * len(args.select)
            lines.append(f"| {' | '.join([*item['group'].values(), *chosen])} | "
                         f"{_fmt(b.stats[f'{crit}_last']) if b else '—'} | {_fmt(b.stats[f'{m}_final']) if b else '—'} "
                         f"| {item['excluded']} of {item['candidates']} |")
    bad = [r for r in runs if r.status != FINISHED]
    if bad:
        lines += ["", "## Runs left out", ""]
        lines += [f"- `{r.path}`: {r.status} at round {r.last_round} {('— ' + r.reason) if r.reason else ''}"
                  for r in bad]
    lines += [""] + [f"![{name}]({name})" for name in figures]
    path.write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------- CLI
def build_report(args: argparse.Namespace) -> list[Path]:
    """Load, check, summarise, write; returns the written files. Raises ReportError on bad input."""
    from server import report_plots

    runs = load_runs(args.sweep_dirs)
    swept = swept_keys(runs)
    keys = [k for k in swept if k != AVERAGED]
    columns = {c for r in runs for row in r.rows for c, v in row.items() if v is not None}
    args.metric = args.metric or ("pop_loss" if "pop_loss" in columns else "loss")
    args.criterion = args.minimize or args.maximize or args.metric
    args.minimize_criterion = args.maximize is None and (args.minimize is not None or "accuracy" not in args.criterion)
    for metric in {args.metric, args.criterion}:
        if metric not in columns:
            raise ReportError(f"metric '{metric}' is in no run's metrics (columns: {', '.join(sorted(columns))})")
    if args.last < 1:
        raise ReportError(f"--last must be >= 1, got {args.last}")
    args.last = min(args.last, max([r.num_rounds or 0 for r in runs] + [1]))  # "the last 100 rounds, or all"
    check_keys(runs, swept, args.best_per or [], "--best-per")
    check_keys(runs, swept, args.select or [], "--select")
    check_keys(runs, swept, args.grid or [], "--grid")
    metrics = list(dict.fromkeys([args.metric, args.criterion]))
    configs = configurations(runs, keys, metrics, args.last)
    best = None
    if args.best_per or args.select:
        args.select = args.select or [k for k in keys if k not in (args.best_per or [])]
        if not args.select:
            raise ReportError("--best-per names every swept key: no key is left to select (give --select)")
        best = select_best(configs, [k for k in keys if k not in args.select], args.criterion, args.minimize_criterion)
    out = Path(args.out or args.sweep_dirs[0])
    out.mkdir(parents=True, exist_ok=True)
    shown = [b["best"] for b in best if b["best"]] if best is not None else list(configs)
    figures = [report_plots.plot_curves(out / "curves.png", shown, keys, args.metric)]
    if args.grid:
        figures.append(report_plots.plot_heatmap(out / "heatmap.png", configs, args.grid, args.criterion,
                                                 args.minimize_criterion, args.last))
    write_csv(out / "report.csv", configs, keys, metrics, args.last)
    write_markdown(out / "report.md", args, runs, configs, keys, best, [f.name for f in figures])
    return [out / "report.md", out / "report.csv", *figures]


def main(argv: Sequence[str] | None = None) -> None:
    """``flower-report SWEEP_DIR...``: report.md/csv, curves.png and heatmap.png of a Hydra multirun."""
    parser = argparse.ArgumentParser(prog="flower-report", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dirs", nargs="+", type=Path, help="Hydra multirun folder(s) (hydra.sweep.dir)")
    parser.add_argument("--metric", help="reported metric (default: pop_loss when present, else loss)")
    parser.add_argument("--last", type=int, default=100, help="K: mean over the last K rounds (default 100 or all)")
    parser.add_argument("--best-per", nargs="+", metavar="KEY", help="pick the best configuration per value of KEY")
    parser.add_argument("--select", nargs="+", metavar="KEY", help="the swept keys being chosen (default: the rest)")
    crit = parser.add_mutually_exclusive_group()
    crit.add_argument("--minimize", metavar="METRIC", help="selection criterion: smallest last-K mean of METRIC")
    crit.add_argument("--maximize", metavar="METRIC", help="selection criterion: largest last-K mean of METRIC")
    parser.add_argument("--grid", nargs=2, metavar=("X", "Y"), help="heatmap of two swept keys")
    parser.add_argument("--out", type=Path, help="output folder (default: the first sweep dir)")
    args = parser.parse_args(argv)
    try:
        written = build_report(args)
    except ReportError as err:
        print(f"flower-report: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"flower-report: wrote {', '.join(map(str, written))}")


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
