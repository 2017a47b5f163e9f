"""Label-skewed partition of a dataset over clients (Hsu, Qi & Brown 2019, "Measuring the effects of
non-identical data distribution for federated visual classification", §3; used by paper 1 §IV-B).

Every client receives the same number of examples (50,000 / 100 = 500 for CIFAR-10). Client i draws a class
prior q_i ~ Dir(alpha * p), p the class frequencies of the whole set, and fills its quota by sampling
classes from q_i without replacement of examples; when a class runs out, q_i is renormalised over the
classes that still have examples. Limits: ``alpha = inf`` is the IID split (a random permutation cut into
equal shards), ``alpha = 0`` gives each client one class, classes assigned in a seeded balanced order (100
clients / 10 classes: 10 clients per class): exactly one when each class's examples split evenly over its
clients, else the leftovers of other classes fill the quotas (:func:`one_class_shortfall` says how much).
Everything is deterministic given ``seed`` and uses only the labels, so it is cheap enough to recompute in every
client process.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def parse_alpha(alpha: float | int | str) -> float:
    """Concentration as a float; accepts ``"inf"``/``"iid"`` (and any float spelling) for the IID split."""
    if isinstance(alpha, str) and alpha.strip().lower() in ("iid", "inf", "infinity"):
        return math.inf
    value = float(alpha)
    if math.isnan(value) or value < 0:
        raise ValueError(f"alpha must be >= 0 (or 'inf'/'iid'), got {alpha!r}")
    return value


def client_sizes(num_examples: int, num_clients: int) -> np.ndarray:
    """Equal quotas; when ``num_examples`` is not a multiple, the first clients get one extra example."""
    if num_clients < 1 or num_clients > num_examples:
        raise ValueError(f"cannot split {num_examples} examples over {num_clients} clients")
    sizes = np.full(num_clients, num_examples // num_clients, dtype=np.int64)
    sizes[: num_examples % num_clients] += 1
    return sizes


def dirichlet_partition(
    labels: np.ndarray, num_clients: int, alpha: float | str, seed: int, num_classes: int | None = None
) -> list[np.ndarray]:
    """Indices of each client's examples (each array sorted), following Hsu et al. (2019)."""
    labels = np.asarray(labels, dtype=np.int64)
    alpha = parse_alpha(alpha)
    num_classes = int(num_classes or labels.max() + 1)
    sizes = client_sizes(len(labels), num_clients)
    rng = np.random.default_rng(seed)
    if math.isinf(alpha):
        order = rng.permutation(len(labels))
        return [np.sort(part) for part in np.split(order, np.cumsum(sizes)[:-1])]

    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    remaining = np.array([len(p) for p in pools], dtype=np.int64)
    prior = remaining / remaining.sum()
    if alpha == 0:  # one class per client, balanced over classes
        present = np.flatnonzero(remaining > 0)
        assigned = rng.permutation(np.resize(present, num_clients))
        priors = np.eye(num_classes)[assigned]
    else:
        priors = np.zeros((num_clients, num_classes))  # absent classes keep zero mass
        priors[:, prior > 0] = rng.dirichlet(alpha * prior[prior > 0], size=num_clients)

    counts = np.zeros((num_clients, num_classes), dtype=np.int64)
    for i in range(num_clients):
        counts[i] = _fill_quota(priors[i], remaining, int(sizes[i]), rng)
        remaining -= counts[i]
    taken = np.zeros(num_classes, dtype=np.int64)
    parts = []
    for i in range(num_clients):
        chunks = []
        for c in np.flatnonzero(counts[i]):
            chunks.append(pools[c][taken[c] : taken[c] + counts[i, c]])
            taken[c] += counts[i, c]
        parts.append(np.sort(np.concatenate(chunks)))
    return parts


def _fill_quota(q: np.ndarray, remaining: np.ndarray, quota: int, rng: np.random.Generator) -> np.ndarray:
    """Class counts of ``quota`` draws from q, renormalised over non-exhausted classes.

    Equivalent to drawing one class at a time: multinomial draws are capped at what is left of each
    class, and the excess is redrawn from q restricted to the classes that still have examples.
    """
    counts = np.zeros_like(remaining)
    left = remaining.copy()
    while quota > 0:
        avail = left > 0
        weights = np.where(avail, q, 0.0)
        if weights.sum() <= 0:  # q puts no mass on what is left (e.g. alpha=0 and its class ran out)
            weights = avail.astype(float)
        draw = np.minimum(rng.multinomial(quota, weights / weights.sum()), left)
        counts += draw
        left -= draw
        quota -= int(draw.sum())
    return counts


def one_class_shortfall(hist: np.ndarray) -> str | None:
    """What keeps ``alpha = 0``'s split from one class per client, from its (clients, classes) label counts, or None
    when every client holds one class. Equal quotas allow it only when each class's examples split evenly over the
    clients it is assigned to (CIFAR-10: 10, 20, 50 or 100 clients); otherwise the leftovers of other classes fill
    the quotas."""
    hist = np.asarray(hist)
    classes = (hist > 0).sum(1)
    mixed = int((classes > 1).sum())
    if not mixed:
        return None
    foreign = 1.0 - hist.max(1) / np.maximum(hist.sum(1), 1)
    return (
        f"{mixed} of {len(hist)} clients hold more than one class (up to {int(classes.max())}; up to "
        f"{foreign.max():.0%} of a client's examples outside its main class): one class per client needs each "
        "class's examples to split evenly over its clients (CIFAR-10: 10, 20, 50 or 100 clients)"
    )


# --------------------------------------------------------------------------- reports
def label_histograms(labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """(num_clients, num_classes) int64 matrix of per-client label counts."""
    labels = np.asarray(labels)
    return np.stack([np.bincount(labels[idx], minlength=num_classes) for idx in parts]).astype(np.int64)


def save_histograms(
    run_dir: str | Path,
    hist: np.ndarray,
    classes: Sequence[str],
    title: str = "",
    stem: str = "partition",
    plot: bool = True,
) -> dict[str, Path]:
    """Write ``<stem>.csv`` (client, one column per class, total), ``<stem>.json`` and (``plot``) ``<stem>.png``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = {ext: run_dir / f"{stem}.{ext}" for ext in ("csv", "json", "png")}
    with open(paths["csv"], "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["client", *classes, "total"])
        for i, row in enumerate(hist):
            writer.writerow([i, *(int(v) for v in row), int(row.sum())])
    paths["json"].write_text(
        json.dumps({"classes": list(classes), "title": title, "counts": [[int(v) for v in row] for row in hist]})
    )
    if not plot:
        return {ext: path for ext, path in paths.items() if ext != "png"}
    plot_histograms(hist, classes, paths["png"], title)
    return paths


def plot_histograms(hist: np.ndarray, classes: Sequence[str], path: str | Path, title: str = "") -> None:
    """Stacked bar chart: one bar per client, coloured by class."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 0.08 * len(hist) + 2), 3.5))
    bottom = np.zeros(len(hist))
    cmap = plt.get_cmap("tab10" if len(classes) <= 10 else "tab20")
    for c, name in enumerate(classes):
        ax.bar(np.arange(len(hist)), hist[:, c], bottom=bottom, width=1.0, color=cmap(c % cmap.N), label=name)
        bottom += hist[:, c]
    ax.set_xlabel("client")
    ax.set_ylabel("examples")
    ax.set_xlim(-0.5, len(hist) - 0.5)
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=1, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
