"""Statistics over seeds for ``flower-report``: Student-t confidence intervals and paired t-tests.

With n seeds x_1..x_n (independent runs of one configuration), mean x̄ and sample standard deviation
s = sqrt(Σ (x_i − x̄)² / (n − 1)), the 95 % confidence interval of the expected value is x̄ ± t_{0.975, n−1} s/√n
(Student 1908; e.g. Wasserman, *All of Statistics*, §10.1). A paired comparison of configurations A and B run with
the same seeds uses d_i = B_i − A_i (common randomness cancels: the same split, initial model, batch order): its mean,
CI as above and the two-sided paired t-test p = 2 P(T_{n−1} ≥ |d̄| / (s_d/√n)) of H0: E[d] = 0. n < 2 has no CI.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

LEVEL = 0.95


@dataclass
class Summary:
    """Mean, standard deviation (ddof = 0, as flower-plot), 95 % CI half-width (None for n < 2) and n."""

    mean: float
    std: float
    ci: float | None
    n: int


def _t_distribution() -> Any:
    """scipy's Student t, imported on first use: every run imports this module (its end-of-run plots) and
    ``scipy.stats`` alone costs ~0.5 s of each run's start-up."""
    from scipy import stats

    return stats.t


def t_quantile(n: int, level: float = LEVEL) -> float:
    """t_{(1 + level)/2, n − 1}, the Student-t quantile of a two-sided ``level`` interval from n values (n ≥ 2)."""
    if n < 2:
        raise ValueError(f"a confidence interval needs at least 2 values, got {n}")
    return float(_t_distribution().ppf(0.5 + level / 2, n - 1))


def ci_half_width(values: Sequence[float], level: float = LEVEL) -> float:
    """t_{0.975, n−1} · s / √n with s the sample standard deviation (ddof = 1)."""
    x = np.asarray(values, dtype=np.float64)
    return t_quantile(len(x), level) * float(np.std(x, ddof=1)) / math.sqrt(len(x))


def summarise(values: Sequence[float]) -> Summary | None:
    """Summary of the values of a configuration's seeds (None when there is none)."""
    x = np.asarray(values, dtype=np.float64)
    if not len(x):
        return None
    return Summary(float(x.mean()), float(x.std()), ci_half_width(x) if len(x) >= 2 else None, len(x))


@dataclass
class Paired:
    """Paired differences d_i = b_i − a_i over matched seeds: mean, 95 % CI half-width, t statistic, p-value."""

    mean: float
    ci: float
    t: float
    p: float
    n: int


def paired(a: Sequence[float], b: Sequence[float]) -> Paired:
    """The paired comparison of b against a (the same seeds, in the same order); n ≥ 2.

    p is the two-sided p-value of Student's paired t-test; when every difference is equal (s_d = 0) it is 0 for
    a non-zero difference and 1 for none (the t statistic is ±inf or undefined)."""
    d = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    if len(a) != len(b):
        raise ValueError(f"paired values need as many b as a, got {len(a)} and {len(b)}")
    n = len(d)
    t_quantile(n)  # raises for n < 2
    mean, sd = float(d.mean()), float(np.std(d, ddof=1))
    if sd == 0.0:
        t = math.copysign(math.inf, mean) if mean else 0.0
        return Paired(mean, 0.0, t, 0.0 if mean else 1.0, n)
    t = mean / (sd / math.sqrt(n))
    p = float(2 * _t_distribution().sf(abs(t), n - 1))
    return Paired(mean, ci_half_width(d), t, p, n)


@dataclass
class Ratio:
    """Paired ratios r_i = b_i / a_i over matched seeds, on the log scale: the geometric mean ratio exp(mean log r),
    its 95 % CI [low, high] (the t interval of mean log r, exponentiated), t and the p-value of H0: E[log r] = 0."""

    mean: float
    low: float
    high: float
    t: float
    p: float
    n: int


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> Ratio:
    """The paired ratio b / a (the same seeds, in the same order; every value > 0, n ≥ 2): :func:`paired` of
    log a and log b, back on the ratio scale. A claim "x ∝ η" predicts the ratio of the η ratio (paper 1
    Lemma III.4: the amplitude halves with η_l), which the interval contains or not."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(x) and (np.any(~(x > 0)) or np.any(~(y > 0))):
        raise ValueError("a ratio needs values > 0 on both sides")
    d = paired(np.log(x), np.log(y))
    return Ratio(math.exp(d.mean), math.exp(d.mean - d.ci), math.exp(d.mean + d.ci), d.t, d.p, d.n)


def format_summary(stat: Summary | None) -> str:
    """mean ± 95 % CI half-width (n seeds); one seed: the value and n = 1 (no interval)."""
    if stat is None:
        return "—"
    return f"{stat.mean:.4g} (n=1, no CI)" if stat.ci is None else f"{stat.mean:.4g} ± {stat.ci:.2g} (n={stat.n})"
