"""``flower-report --compare KEY=A KEY=B``: paired differences over seeds (:mod:`server.report.stats`).

For every combination of the other swept keys, the runs with KEY=A and KEY=B are matched by seed and compared on
the final value and the last-K mean of the metric (and with ``--amplitude`` the oscillation amplitude,
:mod:`server.report.oscillation`): d_s = B_s − A_s, their mean, 95 % CI and the paired t-test p-value; with
``--ratio`` also r_s = B_s / A_s, their geometric mean and its 95 % CI (the t interval of log r), which is what a
claim "x ∝ η" predicts (paper 1 Lemma III.4: the amplitude halves with the client lr).
``--compare KEY=A KEY=B KEY=C ...`` compares every later value against A. The other swept keys that have one value
on each side (e.g. each method's own tuned learning rates) go with KEY and do not split the pairs;
``--pair-by KEY2 ...`` names the keys that do instead.
Bad input is a :class:`ReportError` (exit 2): a spec that is not KEY=VALUE, two different keys, a key that
was not swept, a value no run has, seeds that appear twice or only on one side, fewer than 2 seeds. A seed whose run
of either side diverged or did not finish leaves its pair out (the row says so); fewer than 2 pairs left: no test.
A ratio with a value ≤ 0 on either side is not computed (the row says so).
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server.report.runs import AVERAGED, FINISHED, ReportError, Run, check_keys, normalise, seed_text, sort_key
from server.report.stats import Paired, Ratio, paired, paired_ratio

KINDS = ("final", "last", "amplitude")
Amplitude = tuple[str, Callable[[Run], float]]  # (metric, a finished run's amplitude of it)


@dataclass
class Comparison:
    """B − A within one combination of the other swept keys."""

    group: dict[str, str]
    seeds: list
    kinds: list[str] = field(default_factory=lambda: list(KINDS[:2]))
    results: dict[str, Paired | None] = field(default_factory=dict)
    ratios: dict[str, Ratio | None] = field(default_factory=dict)  # with --ratio
    notes: dict[str, str] = field(default_factory=dict)


def parse(specs: Sequence[str], runs: Sequence[Run], swept: Sequence[str]) -> tuple[str, str, list[str]]:
    """(KEY, A, [B, ...]) of ``--compare KEY=A KEY=B [KEY=C ...]``."""
    parts = [spec.partition("=") for spec in specs]
    if len(parts) < 2 or any(not k or not sep or not v for k, sep, v in parts):
        raise ReportError(f"--compare takes two or more KEY=VALUE, got {' '.join(specs)}")
    key, _, a = parts[0]
    for other, _, _ in parts[1:]:
        if other != key:
            raise ReportError(f"--compare: both sides must set the same key, got '{key}' and '{other}'")
    check_keys(runs, swept, [key], "--compare")
    bs = [v for _, _, v in parts[1:]]
    for b in bs:
        if normalise(a) == normalise(b):
            raise ReportError(f"--compare: both sides are {key}={a}")
    if len({normalise(b) for b in bs}) < len(bs):
        raise ReportError(f"--compare: a value is given twice in {' '.join(specs)}")
    values = {normalise(r.params.get(key)) for r in runs}
    for value in (a, *bs):
        if normalise(value) not in values:
            raise ReportError(f"--compare: no run has {key}={value} (values: {', '.join(sorted(map(str, values)))})")
    return key, a, bs


def pair_keys(runs: Sequence[Run], keys: Sequence[str], key: str, a: str, b: str) -> list[str]:
    """The swept keys other than ``key`` that split the pairs: those with more than one value on side A or B
    (a key with one value per side, e.g. a method's own tuned learning rate, belongs to the compared value)."""
    sides = [[r for r in runs if normalise(r.params.get(key)) == normalise(v)] for v in (a, b)]
    return [k for k in keys if k != key and any(len({normalise(r.params.get(k)) for r in side}) > 1 for side in sides)]


def _seeds(seeds: Any) -> str:
    """Seeds as the user gave them: [0, 1], not [0.0, 1.0]."""
    return f"[{', '.join(seed_text(s) for s in sorted(seeds, key=sort_key))}]"


def _by_seed(runs: Sequence[Run], side: str) -> dict:
    out: dict = {}
    for run in runs:
        if run.seed in out:
            raise ReportError(f"--compare: seed {run.seed} appears twice for {side} ({out[run.seed].path}, {run.path})")
        out[run.seed] = run
    return out


def _value(run: Run, kind: str, metric: str, last: int, amplitude: Amplitude | None) -> float | None:
    if kind == "final":
        return run.final(metric)
    if kind == "last":
        return run.last_mean(metric, last)
    return amplitude[1](run) if amplitude is not None and run.status == FINISHED else None


def _ratio(pairs: Sequence[tuple[float, float]]) -> Ratio | None:
    return paired_ratio(*zip(*pairs)) if all(va > 0 and vb > 0 for va, vb in pairs) else None


def compare(
    runs: Sequence[Run],
    keys: Sequence[str],
    key: str,
    a: str,
    b: str,
    metric: str,
    last: int,
    pair_by: Sequence[str] | None = None,
    amplitude: Amplitude | None = None,
    ratio: bool = False,
) -> list[Comparison]:
    """Paired comparisons of B against A on ``metric`` (final value and last-``last`` mean, and the oscillation
    amplitude when given), one per combination of the pairing keys (``pair_by``, default :func:`pair_keys`);
    with ``ratio`` also the paired ratios B / A."""
    others = list(pair_by) if pair_by is not None else pair_keys(runs, keys, key, a, b)
    if key in others:
        raise ReportError(f"--pair-by: '{key}' is the compared key")
    groups: dict[tuple, dict[str, list[Run]]] = {}
    for run in runs:
        value = normalise(run.params.get(key))
        side = "a" if value == normalise(a) else "b" if value == normalise(b) else None
        if side:
            ident = tuple(normalise(run.params.get(k)) for k in others)
            groups.setdefault(ident, {"a": [], "b": []})[side].append(run)
    out = []
    for ident in sorted(groups, key=lambda t: [sort_key(v) for v in t]):
        sides = groups[ident]
        group = {k: (sides["a"] or sides["b"])[0].params.get(k, "") for k in others}
        where = ", ".join(f"{k}={v}" for k, v in group.items()) or "the sweep"
        runs_a, runs_b = _by_seed(sides["a"], f"{key}={a} ({where})"), _by_seed(sides["b"], f"{key}={b} ({where})")
        if set(runs_a) != set(runs_b):
            only = _seeds(set(runs_a) ^ set(runs_b))
            raise ReportError(
                f"--compare: unmatched seeds in {where}: {key}={a} has seeds {_seeds(runs_a)}, {key}={b} has "
                f"{_seeds(runs_b)} (only one side: {only})"
            )
        seeds = sorted(runs_a, key=sort_key)
        if len(seeds) < 2:
            raise ReportError(
                f"--compare: {where} has {len(seeds)} seed(s); a paired CI needs at least 2 (sweep {AVERAGED}=0,1,...)"
            )
        comparison = Comparison(group, seeds, list(KINDS if amplitude else KINDS[:2]))
        for kind in comparison.kinds:
            pairs, dropped = [], []
            for s in seeds:
                va, vb = (_value(r[s], kind, metric, last, amplitude) for r in (runs_a, runs_b))
                (pairs.append((va, vb)) if va is not None and vb is not None else dropped.append(s))
            comparison.results[kind] = paired(*zip(*pairs)) if len(pairs) >= 2 else None
            notes = (
                [
                    f"seeds {dropped} left out (a run diverged, did not finish or lacks "
                    f"{metric if kind != 'amplitude' else amplitude[0]})"
                ]
                if dropped
                else []
            )
            if ratio and len(pairs) >= 2:
                comparison.ratios[kind] = _ratio(pairs)
                notes += [] if comparison.ratios[kind] else ["no ratio: a value ≤ 0"]
            if notes:
                comparison.notes[kind] = "; ".join(notes)
        out.append(comparison)
    return out


def _cell(result: Paired | None) -> list[str]:
    if result is None:
        return ["—", "—", "—"]
    return [f"{result.mean:+.4g} ± {result.ci:.2g}", f"{result.t:.3g}", f"{result.p:.3g}"]


def _ratio_cell(result: Ratio | None) -> list[str]:
    return (
        ["—", "—"]
        if result is None
        else [f"{result.mean:.4g} [{result.low:.4g}, {result.high:.4g}]", f"{result.p:.3g}"]
    )


def _label(kind: str, metric: str, last: int, amplitude: Amplitude | None) -> str:
    if kind == "amplitude":
        return f"{amplitude[0] if amplitude else metric} amplitude"
    return f"{metric} final" if kind == "final" else f"{metric} last {last}"


def markdown(
    comparisons: Sequence[Comparison],
    key: str,
    a: str,
    b: str,
    metric: str,
    last: int,
    amplitude: Amplitude | None = None,
    ratio: bool = False,
) -> list[str]:
    """The report.md section: one row per group and kind."""
    others = list(comparisons[0].group) if comparisons else []
    columns = (
        others
        + ["seeds", "value", "mean d ± CI", "t", "p"]
        + (["ratio b/a [95 % CI]", "p (ratio = 1)"] if ratio else [])
        + ["note"]
    )
    lines = [
        "",
        f"## Paired comparison: {key}={b} − {key}={a}",
        "",
        f"Per seed d = {metric}({key}={b}) − {metric}({key}={a}), the same seed on both sides; mean ± 95 % CI "
        f"half-width (Student t, n − 1 dof), t statistic and two-sided paired t-test p-value (H0: E[d] = 0)."
        + (
            " Ratio: per seed r = b / a; the geometric mean of r and the 95 % CI of the t interval of log r, "
            "exponentiated; p of the paired t-test on log r (H0: ratio 1)."
            if ratio
            else ""
        ),
        "",
        f"| {' | '.join(columns)} |",
        f"|{'---|' * len(columns)}",
    ]
    for c in comparisons:
        for kind in c.kinds:
            n = c.results[kind].n if c.results[kind] else 0
            cells = [
                *c.group.values(),
                f"{n} of {len(c.seeds)}",
                _label(kind, metric, last, amplitude),
                *_cell(c.results[kind]),
                *(_ratio_cell(c.ratios.get(kind)) if ratio else []),
                c.notes.get(kind, ""),
            ]
            lines.append(f"| {' | '.join(cells)} |")
    return lines


def write_csv(path: Path, by_b: dict[str, Sequence[Comparison]], key: str, a: str, last: int) -> None:
    """compare.csv: one row per compared value B, group and kind (final, last<K>, amplitude) with n, mean difference,
    CI half-width, t, p and, with --ratio, the geometric mean ratio, its CI and p (blank otherwise); the pairing keys
    of every B in one ``group`` column (KEY=VALUE; ...)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            [
                "group",
                "key",
                "a",
                "b",
                "value",
                "n",
                "mean_diff",
                "ci95",
                "t",
                "p",
                "ratio",
                "ratio_low",
                "ratio_high",
                "ratio_p",
                "note",
            ]
        )
        for b, comparisons in by_b.items():
            for c in comparisons:
                group = "; ".join(f"{k}={v}" for k, v in c.group.items())
                for kind in c.kinds:
                    r, q = c.results[kind], c.ratios.get(kind)
                    stats = ["", "", "", ""] if r is None else [repr(r.mean), repr(r.ci), repr(r.t), repr(r.p)]
                    ratios = ["", "", "", ""] if q is None else [repr(q.mean), repr(q.low), repr(q.high), repr(q.p)]
                    writer.writerow(
                        [
                            group,
                            key,
                            a,
                            b,
                            f"last{last}" if kind == "last" else kind,
                            r.n if r else 0,
                            *stats,
                            *ratios,
                            c.notes.get(kind, ""),
                        ]
                    )
