"""Figures of ``flower-report``: mean ± 95 % CI curves of chosen configurations and a heatmap over two swept keys."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

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
    """``metric`` vs round, mean ± 95 % CI over seeds, one curve per configuration (seed 001 Figs. 5 and 8)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for config in configs:
        curve = mean_curve(config, metric)
        if curve is None:
            continue
        rounds, mean, half = curve
        label = ", ".join(f"{k.split('.')[-1]}={config.values[k]}" for k in keys) or "all runs"
        ax.plot(rounds, mean, label=f"{label} (n={sum(r.status == FINISHED for r in config.runs)})")
        ax.fill_between(rounds, mean - half, mean + half, alpha=0.2)
    ax.set_xlabel("round")
    ax.set_ylabel(f"{metric} (mean ± 95% CI over seeds)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
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


def plot_heatmap(path: Path, configs: Sequence[Config], grid: Sequence[str], criterion: str, minimize: bool,
                 last: int) -> Path:
    """Last-K mean of ``criterion`` over two swept keys (seed 000 Appendix A's grid); when other keys are swept,
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
