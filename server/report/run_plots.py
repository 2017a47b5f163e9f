"""A run directory's plots (:func:`plot_run`) and ``flower-plot``, which aggregates several run directories (e.g. a
Hydra multirun over seeds) into mean +/- std curves per group of any per-round column (test accuracy: paper 1
Figure 1).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from server.report.metrics import COLUMNS, gap_tolerance, read_metrics
from server.report.runs import STORAGE_KEYS, untimed
from server.run.errors import ConfigError, make_dir
from server.run.hydra_config import MISSING, config_value


def _series(rows: list[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [(r["round"], r[key]) for r in rows if r.get(key) is not None and not _isnan(r[key])]
    return np.array([p[0] for p in pts]), np.array([p[1] for p in pts], dtype=float)


def _isnan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def plot_run(run_dir: Path | str, f_star: float | None = None) -> list[Path]:
    """accuracy.png, loss.png, lr.png and norm.png of one run (what the seeds plot per round), and gap.png with
    ``pop_gap`` (``f_star``: the run's f*, which tells rounding from a wrong f* there)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    out = []
    panels = [
        (
            "accuracy.png",
            [
                ("accuracy", "test accuracy"),
                ("pop_accuracy", "population train accuracy"),
                ("avg_accuracy", "test accuracy, mean of the last W models"),
            ],
            "accuracy",
        ),
        (
            "loss.png",
            [
                ("loss", "test loss"),
                ("train_loss", "train loss"),
                ("loss_before", "loss before training"),
                ("pop_loss", "population train loss f(x)"),
            ],
            "loss",
        ),
        ("lr.png", [("server_lr", "server lr"), ("client_lr", "client lr")], "learning rate"),
        (
            "norm.png",
            [("update_norm", "||aggregated update||"), ("client_update_norm", "mean client ||update||")],
            "L2 norm",
        ),
    ]
    with np.errstate(over="ignore"):  # log-scale ticks of values near the float range (a diverged run's lr)
        for name, series, ylabel in panels:
            fig, ax = plt.subplots(figsize=(6, 4))
            for key, label in series:
                x, y = _series(rows, key)
                if len(x):
                    ax.plot(x, y, label=label, marker="." if len(x) < 50 else None)
            ax.set_xlabel("round")
            ax.set_ylabel(ylabel)
            if name in ("lr.png", "norm.png") and any(len(_series(rows, k)[0]) for k, _ in series):
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
            ax.legend()
            fig.tight_layout()
            fig.savefig(run_dir / name, dpi=120)
            plt.close(fig)
            out.append(run_dir / name)
    gap = plot_gap(rows, run_dir / "gap.png", f_star)
    return out + ([gap] if gap else [])


def gap_marks(gaps: np.ndarray, f_star: float | None) -> tuple[np.ndarray, np.ndarray]:
    """(within rounding, below) masks of the gaps ≤ 0: a gap below −:func:`gap_tolerance` (the run's own check) means
    f* is not this run's minimum, not rounding (f* unknown: the tolerance at |f*| ≤ 1)."""
    tolerance = gap_tolerance(0.0 if f_star is None else f_star)
    return (gaps <= 0) & (gaps >= -tolerance), gaps < -tolerance


def plot_gap(rows: list[dict[str, Any]], path: Path, f_star: float | None = None) -> Path | None:
    """gap.png: ``pop_gap`` = f(x^t) − f* on a log scale (eval_gap; docs/convex.md); None when the run has none.
    Rounds whose gap is ≤ 0 are drawn as marks on the bottom edge: grey when f* is reached to rounding, red when the
    gap is below it (:func:`gap_marks`: f* is wrong)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x, y = _series(rows, "pop_gap")
    if not len(x):
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    positive = y > 0
    if positive.any():
        ax.plot(x[positive], y[positive], marker="." if len(x) < 50 else None, label="f(x^t) − f*")
    xa, ya = _series(rows, "avg_pop_gap")
    if (ya > 0).any():  # eval_average: f at the mean of the last W server models
        ax.plot(xa[ya > 0], ya[ya > 0], "--", marker="." if len(xa) < 50 else None, label="f(mean of last W) − f*")
    edge = y[positive].min() if positive.any() else 1e-12
    rounding, below = gap_marks(y, f_star)
    for mask, color, label in (
        (rounding, "grey", "≤ 0 (at f* to rounding)"),
        (below, "red", "< 0: f below f*, so f* is wrong (run.log)"),
    ):
        if mask.any():
            ax.plot(x[mask], np.full(mask.sum(), edge), "v", color=color, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel("population gap f(x) − f*")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


GROUP_BY = ("strategy.name", "strategy.momentum", "model.name")  # flower-plot's curves by default
# config keys a run's results do not depend on (how it ran: the engines give equal results), besides STORAGE_KEYS
EXECUTION_KEYS = (
    *("engine.", "deploy.", "backend.", "client.torch_threads", "client.state_dir", "progress_every", "round_timeout"),
    *("participation.wait_timeout", "participation.query_timeout"),
)


def _flat(node: Any, prefix: str = "") -> dict[str, str]:
    """A config's leaves as {dotted key: JSON text}."""
    if not isinstance(node, dict):
        return {prefix[:-1]: json.dumps(node, sort_keys=True)}
    out: dict[str, str] = {}
    for key, value in node.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return out


def _averaged_keys(run_dirs: Sequence[Path], keys: Sequence[str]) -> list[str]:
    """The config keys, besides ``keys``, ``seed``, where a run is stored and how it ran, that take several values
    within a curve of ``keys``: each one, in name order, that splits some curve of the keys before it (a key set by
    another, e.g. a strategy's default server_lr by strategy.name, splits none)."""
    configs = []
    for run_dir in run_dirs:
        try:
            cfg = json.loads((Path(run_dir) / "config.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(cfg, dict):
            configs.append(_flat(cfg))
    ignored = {"seed", *STORAGE_KEYS, *keys}
    chosen = list(keys)
    candidates = sorted({k for c in configs for k in c} - ignored)
    for key in candidates:
        if key.startswith(EXECUTION_KEYS):
            continue
        values: dict[tuple, set] = defaultdict(set)
        for c in configs:
            values[tuple(c.get(k) for k in chosen)].add(c.get(key))
        if any(len(v) > 1 for v in values.values()):
            chosen.append(key)
    return chosen[len(keys) :]


def _group_label(run_dir: Path, keys: Sequence[str], found: set[str] | None = None) -> str:
    """``k1=v1, k2=v2`` of the run's config.json (its folder's name without one); ``found`` collects the keys the
    config has."""
    cfg_path = run_dir / "config.json"
    if not cfg_path.exists():
        return run_dir.name
    try:
        cfg = json.loads(cfg_path.read_text())
    except ValueError:
        raise ValueError(f"{cfg_path} is no JSON object") from None
    parts = []
    for dotted in keys:
        node = config_value(cfg, dotted)
        if node is not MISSING and found is not None:
            found.add(dotted)
        parts.append(f"{dotted}={None if node is MISSING else node}")
    return ", ".join(parts)


def aggregate_runs(
    run_dirs: Sequence[Path | str],
    group_by: Sequence[str],
    metric: str = "accuracy",
    required: Sequence[str] | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """Per group: rounds where every run of the group has ``metric``, its mean and std, number of runs. A key of
    ``required`` that no run's config.json has is a ValueError (a mistyped --group-by would average every run into
    one curve)."""
    groups: dict[str, list[dict[int, float]]] = defaultdict(list)
    found: set[str] = set()
    configured = False  # some run has a config.json
    for run_dir in map(Path, run_dirs):
        rows = read_metrics(run_dir)
        x, y = _series(rows, metric)
        configured = configured or (run_dir / "config.json").exists()
        if len(x):
            groups[_group_label(run_dir, group_by, found)].append(dict(zip(x.tolist(), y.tolist())))
    unknown = [k for k in required or () if k not in found]
    if configured and groups and unknown:
        raise ValueError(f"--group-by: no run's config.json has the key {unknown[0]!r}")
    out = {}
    for label, runs in groups.items():
        rounds = sorted(set.intersection(*(set(r) for r in runs)))
        acc = np.array([[r[t] for t in rounds] for r in runs])
        out[label] = {"round": np.array(rounds), "mean": acc.mean(0), "std": acc.std(0), "runs": np.array(len(runs))}
    return out


def place_legend(ax: Any, fontsize: float | None = None) -> None:
    """The legend inside the axes, or below them when a label is long (many keys): call it after
    ``tight_layout`` and save with ``bbox_inches="tight"``, so the figure grows instead of the axes shrinking."""
    labels = ax.get_legend_handles_labels()[1]
    if max(map(len, labels), default=0) > 60:
        ax.legend(fontsize=fontsize or 7, loc="upper left", bbox_to_anchor=(0.0, -0.13), frameon=False)
    else:
        ax.legend(fontsize=fontsize)


def _legend_labels(labels: Sequence[str]) -> dict[str, str]:
    """Legend text per group label "k1=v1, k2=v2": only the keys whose values differ between groups, each by the
    last part of its dotted name (the full labels stay the keys of the JSON summary)."""
    pieces = [label.split(", ") for label in labels]
    if not all("=" in p for piece in pieces for p in piece):  # a directory name, or a value holding ", "
        return {label: label for label in labels}
    parts = [dict(p.split("=", 1) for p in piece) for piece in pieces]
    keys = list(parts[0]) if parts and all(p.keys() == parts[0].keys() for p in parts) else []
    varying = [k for k in keys if len({p[k] for p in parts}) > 1]
    if not varying:
        return {label: label for label in labels}
    return {label: ", ".join(f"{k.rsplit('.', 1)[-1]}={p[k]}" for k in varying) for label, p in zip(labels, parts)}


def distinct_runs(run_dirs: Sequence[Path]) -> tuple[list[Path], int]:
    """Each configuration and seed once (the same config.json but where the run is stored; the report's rule,
    :func:`server.report.runs.one_run_per_seed`, on run directories): a copied run would count twice in its curve's
    mean and n. Of runs whose metrics agree (one's rows may stop early: killed) the longest is kept; returns the runs
    kept, in the given order, and how many were left out. ValueError: two runs of one configuration and seed with
    different metrics. Metrics are read only for runs whose configuration and seed another run has."""
    kept: dict[str, Path] = {}
    no_config: list[Path] = []
    for run_dir in run_dirs:
        identity = _identity(run_dir)
        if identity is None:
            no_config.append(run_dir)
        elif identity not in kept:
            kept[identity] = run_dir
        else:
            first = kept[identity]
            first_rows, rows = untimed(read_metrics(first)), untimed(read_metrics(run_dir))
            shorter, longer = sorted((first_rows, rows), key=len)
            if longer[: len(shorter)] != shorter:
                raise ValueError(
                    f"{first} and {run_dir} are runs of one configuration and seed with different metrics: a seed "
                    "counts once; give one of them"
                )
            if len(rows) > len(first_rows):
                kept[identity] = run_dir
    chosen = {*kept.values(), *no_config}
    out = [run_dir for run_dir in run_dirs if run_dir in chosen]
    return out, len(run_dirs) - len(out)


def _identity(run_dir: Path) -> str | None:
    """The run's config.json without where it is stored (None without a readable one)."""
    try:
        cfg = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    for dotted in STORAGE_KEYS:
        *parents, leaf = dotted.split(".")
        node = cfg
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return json.dumps(cfg, sort_keys=True)


def plot_runs(
    run_dirs: Sequence[Path | str],
    out: Path | str,
    group_by: Sequence[str],
    title: str = "",
    metric: str = "accuracy",
    log: bool = False,
    required: Sequence[str] | None = None,
) -> tuple[Path, int]:
    """Mean +/- std of ``metric`` (test accuracy: paper 1 Figure 1) vs round, one curve per group; ``log``: log y;
    ``required``: keys of ``group_by`` some run must have (see :func:`aggregate_runs`). Returns the PNG's path and
    how many runs its curves hold (a run without ``metric`` rows is in none)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = aggregate_runs(run_dirs, group_by, metric, required)
    if not curves:
        raise ValueError(f"no run directory with {metric} rows in metrics.jsonl was given")
    fig, ax = plt.subplots(figsize=(6, 4))
    legend = _legend_labels(sorted(curves))
    for label, c in sorted(curves.items()):
        ax.plot(c["round"], c["mean"], label=f"{legend[label]} (n={int(c['runs'])})")
        ax.fill_between(c["round"], c["mean"] - c["std"], c["mean"] + c["std"], alpha=0.25)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy" if metric == "accuracy" else metric)
    if log:
        if not any((c["mean"] > 0).any() for c in curves.values()):
            plt.close(fig)
            raise ValueError(f"--log: no mean value of {metric} is above 0, so a log scale has nothing to draw")
        ax.set_yscale("log")  # band values <= 0 are clipped to the axis bottom
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    place_legend(ax)
    out = Path(out)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    summary = {k: {kk: v.tolist() for kk, v in c.items()} for k, c in curves.items()}
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    return out, sum(int(c["runs"]) for c in curves.values())


def plot_main(argv: Sequence[str] | None = None) -> None:
    """``flower-plot RUN_DIR... [--out PNG] [--group-by KEY ...] [--metric COLUMN] [--log]``: multi-run curves of a
    metrics.csv column (test accuracy by default), mean +/- std over the runs of each group."""
    parser = argparse.ArgumentParser(prog="flower-plot", description=plot_main.__doc__.replace("``", ""))
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (or a multirun folder)")
    parser.add_argument("--out", type=Path, default=None, help="PNG path (default <metric>_mean_std.png)")
    parser.add_argument("--metric", default="accuracy", help="a metrics.csv column, e.g. pop_gap or client_lr")
    parser.add_argument("--log", action="store_true", help="log-scale y axis (pop_gap, learning rates)")
    parser.add_argument(
        "--group-by",
        nargs="+",
        default=None,
        help="config keys that name a curve; runs differing only in other keys are averaged (default: "
        f"{' '.join(GROUP_BY)} and every other key whose value differs between the runs of a curve, so that only "
        "seeds are averaged; given keys that leave other differences are named on the output; a key given here "
        "that no run has is an error)",
    )
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    if args.metric not in COLUMNS[1:]:
        parser.error(f"--metric must be a metrics.csv column other than round, got {args.metric!r}")
    out_path = args.out or Path(f"{args.metric}_mean_std.png")
    try:  # before reading any run: a folder for the PNG that cannot be made is one line
        make_dir(out_path.parent, "--out's folder")
    except ConfigError as err:
        parser.error(str(err))
    runs = []
    for path in args.runs:
        if not path.is_dir():
            parser.error(f"{path} is not a directory")
        runs += [path] if (path / "metrics.jsonl").exists() else sorted(p.parent for p in path.glob("*/metrics.jsonl"))
    runs = list({run.resolve(): run for run in runs}.values())  # each run once, however many arguments name it
    try:
        runs, copies = distinct_runs(runs)
        averaged = _averaged_keys(runs, args.group_by or GROUP_BY)
        group_by = args.group_by or [*GROUP_BY, *averaged]
        out, used = plot_runs(runs, out_path, group_by, args.title, args.metric, args.log, args.group_by)
    except ValueError as err:
        parser.error(str(err))
    except OSError as err:  # the PNG or its JSON cannot be written (the runs were read by then)
        parser.error(f"--out {out_path}: cannot write it ({err.strerror or type(err).__name__})")
    if args.group_by and averaged:
        print(f"flower-plot: each curve averages runs that differ in {', '.join(averaged)} (not only in seed)")
    left = f" ({len(runs) - used} without {args.metric} rows left out)" if used < len(runs) else ""
    if copies:
        left += f" ({copies} {'copy' if copies == 1 else 'copies'} of a run of one configuration and seed left out)"
    print(f"wrote {out} and {out.with_suffix('.json')} from {used} run{'' if used == 1 else 's'}{left}")


if __name__ == "__main__":  # pragma: no cover
    plot_main(sys.argv[1:])
