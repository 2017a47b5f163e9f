"""Figures of ``flower-report``: mean ± 95 % CI curves of chosen configurations and a heatmap over two swept keys."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from server.report.run_plots import place_legend
from server.report.runs import FINISHED, Config, normalise, sort_key
from server.report.stats import t_quantile


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def mean_curve(config: Config, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Rounds written by every finished run of the configuration, mean over its seeds and the half-width of the
    95 % Student-t CI (zero with one seed: no interval)."""
    series = [r.series(metric) for r in config.runs if r.status == FINISHED]
    series = [dict(zip(x.tolist(), y.tolist())) for x, y in series if len(x)]
    if not series:
        return None
    rounds = sorted(set.intersection(*(set(s) for s in series)))
    values = np.array([[s[t] for t in rounds] for s in series])
    n = len(values)
    half = t_quantile(n) * values.std(0, ddof=1) / np.sqrt(n) if n >= 2 else np.zeros(values.shape[1])
    return np.array(rounds), values.mean(0), half


def plot_curves(path: Path, configs: Sequence[Config], keys: Sequence[str], metric: str) -> Path:
    """``metric`` vs round, mean ± 95 % CI over seeds, one curve per configuration (paper 2 Figs. 5 and 8)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for config in configs:
        curve = mean_curve(config, metric)
        if curve is None:
            continue
        rounds, mean, half = curve
        ax.plot(rounds, mean, label=_label(config, keys))
        ax.fill_between(rounds, mean - half, mean + half, alpha=0.2)
    ax.set_xlabel("round")
    ax.set_ylabel(f"{metric} (mean ± 95% CI over seeds)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if ax.lines:
        place_legend(ax, 7)  # after the layout: a long legend below the axes must not squeeze them
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def _label(config: Config, keys: Sequence[str]) -> str:
    """Swept values of the configuration ("key=value"), leaving out the keys its runs do not set."""
    label = ", ".join(f"{k.split('.')[-1]}={config.values[k]}" for k in keys if config.values[k] != "") or "all runs"
    return f"{label} (n={sum(r.status == FINISHED for r in config.runs)})"


def _log_band(ax, rounds: np.ndarray, mean: np.ndarray, half: np.ndarray, label: str, floor: float) -> bool:
    """One mean line with its CI band on a log axis. Means ≤ 0 are marked (▼) on ``floor``; band edges ≤ 0 are
    clipped to ``floor``. Returns whether anything was clipped."""
    pos = mean > 0
    (line,) = ax.plot(rounds[pos], mean[pos], label=label)
    low = mean - half
    ax.fill_between(rounds, np.maximum(low, floor), np.maximum(mean + half, floor), alpha=0.2, color=line.get_color())
    if not pos.all():
        ax.plot(rounds[~pos], np.full((~pos).sum(), floor), "v", color=line.get_color(), markersize=4)
    return bool((low <= 0).any() or not pos.all())


def plot_gap_curves(
    path: Path, configs: Sequence[Config], keys: Sequence[str], metric: str = "pop_gap", zoom: int | None = None
) -> Path:
    """Paper 1 Figure 1 style: ``metric`` vs round on a log scale, mean ± 95 % CI over seeds per configuration
    (left), and the last ``zoom`` rounds (default: the last 10 %) where the period-p oscillation shows (right).
    Values ≤ 0 cannot be drawn on a log scale: means ≤ 0 are marked ▼ on the bottom edge and CI bands that reach
    ≤ 0 are clipped there (the legend says so)."""
    plt = _pyplot()
    curves = [(c, mean_curve(c, metric)) for c in configs]
    curves = [(c, curve) for c, curve in curves if curve is not None]
    positive = np.concatenate([m[m > 0] for _, (_, m, _) in curves] + [np.array([])])
    floor = float(positive.min()) / 3 if len(positive) else 1e-12
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    clipped = False
    last_round = max((int(r[-1]) for _, (r, _, _) in curves), default=0)
    start = last_round - (zoom or max(1, last_round // 10))
    for config, (rounds, mean, half) in curves:
        clipped |= _log_band(axes[0], rounds, mean, half, _label(config, keys), floor)
        tail = rounds > start
        if tail.any():
            clipped |= _log_band(axes[1], rounds[tail], mean[tail], half[tail], _label(config, keys), floor)
    for ax, title in ((axes[0], "all rounds"), (axes[1], f"last {last_round - start} rounds")):
        ax.set_yscale("log")
        ax.set_xlabel("round")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel(f"{metric} (mean ± 95% CI over seeds)")
    if clipped:
        axes[0].plot([], [], "v", color="grey", label=f"≤ 0: marked / band clipped at {floor:.2g}")
    fig.tight_layout()
    if axes[0].lines:
        place_legend(axes[0], 7)  # after the layout: a long legend below the axes must not squeeze them
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def heatmap_cells(configs: Sequence[Config], grid: Sequence[str], criterion: str, minimize: bool):
    """Sorted x and y values and, per cell, the best complete configuration (None: every one failed)."""
    xs = sorted({c.values[grid[0]] for c in configs}, key=lambda v: sort_key(normalise(v)))
    ys = sorted({c.values[grid[1]] for c in configs}, key=lambda v: sort_key(normalise(v)))
    cells: dict[tuple[str, str], Config | None] = {}
    for config in configs:
        cell = (config.values[grid[0]], config.values[grid[1]])
        stat = config.stats[f"{criterion}_last"]
        current = cells.get(cell)
        if not config.complete or stat is None:
            cells.setdefault(cell, None)
        elif current is None or (stat.mean < current.stats[f"{criterion}_last"].mean) == minimize:
            cells[cell] = config
    return xs, ys, cells


def plot_heatmap(
    path: Path, configs: Sequence[Config], grid: Sequence[str], criterion: str, minimize: bool, last: int
) -> Path:
    """Last-K mean of ``criterion`` over two swept keys (paper 1 Appendix A's grid); when other keys are swept,
    each cell shows the best configuration; cells whose runs diverged or did not finish say so."""
    plt = _pyplot()
    xs, ys, cells = heatmap_cells(configs, grid, criterion, minimize)
    values = np.full((len(ys), len(xs)), np.nan)
    for (x, y), config in cells.items():
        if config is not None:
            values[ys.index(y), xs.index(x)] = config.stats[f"{criterion}_last"].mean
    fig, ax = plt.subplots(figsize=(1.3 * len(xs) + 2.5, 0.8 * len(ys) + 2))
    cmap = plt.get_cmap("viridis_r" if minimize else "viridis").copy()
    cmap.set_bad("lightgrey")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, aspect="auto", origin="lower")
    for i, y in enumerate(ys):
        for j, x in enumerate(xs):
            if (x, y) not in cells:
                text = "not run"
            elif cells[(x, y)] is None:
                text = _failed_text([c for c in configs if (c.values[grid[0]], c.values[grid[1]]) == (x, y)])
            else:
                text = f"{values[i, j]:.4g}"
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color=_text_colour(image, values[i, j]))
    ax.set_xticks(range(len(xs)), xs)
    ax.set_yticks(range(len(ys)), ys)
    ax.set_xlabel(grid[0])
    ax.set_ylabel(grid[1])
    ax.set_title(f"{criterion}, mean over the last {last} rounds")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _text_colour(image, value: float) -> str:
    """Black on light cells (and on the grey of missing ones), white on dark ones."""
    if np.isnan(value):
        return "black"
    r, g, b, _ = image.cmap(image.norm(value))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def _failed_text(members: Sequence[Config]) -> str:
    notes = " ".join(c.note for c in members)
    for word, text in (("diverged", "diverged"), ("no accepted reply", "no replies"), ("incomplete", "incomplete")):
        if word in notes:
            return text
    return "no value"
