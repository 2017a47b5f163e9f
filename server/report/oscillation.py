"""Amplitude of the period-p oscillation of a metric over the last cycles (paper 1 Lemma III.4).

Under cyclic participation with p groups (p = 1/C) the model sees the same p client groups in turn, so f(x^t)
oscillates with period p around its floor; Lemma III.4 predicts an amplitude ∝ η_l G. With rounds evaluated every
round at the end of the run (``eval_tail``), the cycles are the participation cycles c = rounds (c−1)p+1 .. cp
(round 1 starts the first cycle), and a cycle is *full* when every one of its p rounds has a finite value. The
amplitude of a run is the mean over its last M full cycles of (max − min) within each cycle; the report gives its
mean ± 95 % CI over the seeds of a configuration like every other figure.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from server.report.runs import FINISHED, Config, ReportError, Run
from server.report.stats import format_summary, summarise


def cycle_amplitude(
    rounds: np.ndarray, values: np.ndarray, period: int, cycles: int | None = None
) -> tuple[float, int]:
    """(mean of max − min over the last ``cycles`` full cycles, number of cycles used); all full cycles at the end
    of the series (the run of consecutive evaluated rounds that ends at its last round) when ``cycles`` is None.
    Raises ValueError when there is no full cycle or fewer than ``cycles``."""
    if period < 2:
        raise ValueError(f"the period must be >= 2 rounds, got {period}")
    ok = np.isfinite(values)
    known = dict(zip(rounds[ok].tolist(), values[ok].tolist()))
    if not known:
        raise ValueError("no finite value")
    last = max(known)
    spans = []
    c = last // period  # the last cycle that can be full: rounds (c-1)p+1 .. cp <= last
    while c >= 1 and (cycles is None or len(spans) < cycles):
        window = [known.get(t) for t in range((c - 1) * period + 1, c * period + 1)]
        if any(v is None for v in window):
            break
        spans.append(max(window) - min(window))
        c -= 1
    if not spans:
        raise ValueError(
            f"no full cycle of {period} consecutive evaluated rounds at the end (last round {last}; "
            "evaluate every round there: eval_tail)"
        )
    if cycles is not None and len(spans) < cycles:
        raise ValueError(f"only {len(spans)} full cycle(s) of {period} evaluated rounds at the end, --cycles {cycles}")
    return float(np.mean(spans)), len(spans)


def run_period(run: Run) -> int | None:
    """1/participation.fraction of a cyclic run (its config.json); None when the run is not cyclic."""
    cfg_file = run.path / "config.json"
    part = (json.loads(cfg_file.read_text()) if cfg_file.exists() else {}).get("participation") or {}
    if part.get("mode") != "cyclic" or not part.get("fraction"):
        return None
    if part.get("groups"):
        return len(part["groups"])
    return int(round(1.0 / float(part["fraction"])))


def run_amplitude(run: Run, metric: str, period: int | None, cycles: int | None) -> tuple[float, int, int]:
    """(amplitude, cycles used, period) of one finished run: ``period`` or the run's own 1/C. ReportError (exit 2)
    for a run that is not cyclic without ``period`` or has too few per-round evaluations at its end."""
    p = period or run_period(run)
    if p is None:
        raise ReportError(f"{run.path} is not a cyclic run (participation.mode): give --period P")
    if p < 2:
        raise ReportError(f"{run.path}: its period 1/participation.fraction is {p}; give --period >= 2")
    rounds, series = run.series(metric)
    try:
        amp, n = cycle_amplitude(rounds, series, p, cycles)
    except ValueError as err:
        raise ReportError(f"amplitude of {metric} in {run.path}: {err}") from None
    return amp, n, p


def check_options(period: int | None, cycles: int | None) -> None:
    """ReportError (exit 2) for --period < 2 or --cycles < 1."""
    if period is not None and period < 2:
        raise ReportError(f"--period must be >= 2 rounds, got {period}")
    if cycles is not None and cycles < 1:
        raise ReportError(f"--cycles must be >= 1, got {cycles}")


def amplitudes(configs: Sequence[Config], metric: str, period: int | None, cycles: int | None) -> dict:
    """Per configuration: the amplitude Summary over its finished runs in ``config.stats['amplitude']``; returns
    {"period": p or "from config", "cycles": the numbers of cycles used}. ReportError (exit 2) for bad input."""
    check_options(period, cycles)
    periods, used = set(), set()
    for config in configs:
        values = []
        for run in config.runs:
            if run.status != FINISHED:
                continue
            amp, n, p = run_amplitude(run, metric, period, cycles)
            values.append(amp)
            periods.add(p)
            used.add(n)
        config.stats["amplitude"] = summarise(values)
    return {"period": sorted(periods), "cycles": sorted(used)}


def markdown(configs: Sequence[Config], keys: Sequence[str], metric: str, info: dict) -> list[str]:
    """The report.md section "Oscillation amplitude"."""
    periods = ", ".join(map(str, info["period"])) or "—"
    cycles = ", ".join(map(str, info["cycles"])) or "—"
    lines = [
        "",
        f"## Oscillation amplitude of {metric}",
        "",
        f"Per run: the mean over its last full participation cycles (period p = {periods} rounds; cycles used: "
        f"{cycles}) of max − min of `{metric}` within the cycle, rounds evaluated every round (eval_tail); "
        "mean ± 95 % CI over seeds (paper 1 Lemma III.4: amplitude ∝ η_l G).",
        "",
        f"| {' | '.join([*keys, 'runs', f'{metric} amplitude'])} |",
        f"|{'---|' * (len(keys) + 2)}",
    ]
    for c in configs:
        lines.append(
            f"| {' | '.join([*(c.values[k] for k in keys), str(len(c.runs)), format_summary(c.stats['amplitude'])])} |"
        )
    return lines
