"""``flower-report``: tables and figures of a Hydra multirun (a learning-rate grid over any keys and seeds).

    flower-report multirun/2026-11-30/10-00-00 --best-per strategy.client_lr --select strategy.server_lr \
        --minimize pop_loss --grid strategy.server_lr strategy.client_lr

A *configuration* is one combination of the swept keys (the Hydra overrides that differ between the jobs),
``seed`` excepted: the runs of a configuration are its seeds. For each configuration the report gives the mean ± the
95 % Student-t confidence half-width over seeds (and, in report.csv, the std with ddof = 0, as ``flower-plot``, and n)
of the final value of ``--metric`` and of its mean over the last K rounds (paper 2 Section 8.3: "the smallest
average training loss over the last 100 rounds"). ``--select`` picks, for every combination of the other swept
keys (``--best-per``), the value(s) of the selected keys with the best last-K mean: paper 2's tuned eta for each
gamma. Runs that diverged (exit 3, ``status.json``), stopped early, never aggregated a reply or lack the metric
are listed as such; a configuration with such a run is never selected.
``--compare KEY=A KEY=B [KEY=C ...]`` adds paired differences B − A over matched seeds (:mod:`server.report.compare`;
``--ratio``: the paired ratios B / A too; with ``--amplitude``, of the amplitude too).
``--only KEY=VALUE ...`` keeps the runs with those override values (one method's runs of a sweep of several).
``--upto T`` reports every run as it stood after round T (rows up to T; a run that got past T counts as finished
there): the floor at 5,000 rounds of runs that went on to 10,000 (``eval_tail_at=[5000]`` evaluates every round
before T).
``--amplitude`` (implied by ``--period``/``--cycles``) adds the amplitude of the period-p oscillation over the last
cycles (:mod:`server.report.oscillation`). Outputs in ``--out`` (default: the first sweep dir): report.md,
report.csv, curves.png, gap_curves.png (when the runs have pop_gap), heatmap.png (``--grid``), compare.csv
(``--compare``).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence
from pathlib import Path

from server.report import compare as compare_lib
from server.report import oscillation
from server.report.runs import (
    AVERAGED,
    FINISHED,
    STATUSES,
    Config,
    ReportError,
    Run,
    Summary,
    check_keys,
    configurations,
    load_runs,
    normalise,
    one_run_per_seed,
    only,
    swept_keys,
    upto,
)
from server.report.stats import format_summary
from server.run.errors import ConfigError, make_dir


def select_best(configs: Sequence[Config], group_keys: Sequence[str], criterion: str, minimize: bool) -> list[dict]:
    """For every combination of ``group_keys``: the complete configuration with the best last-K ``criterion``."""
    groups: dict[tuple, list[Config]] = {}
    for config in configs:
        groups.setdefault(tuple(normalise(config.values[k]) for k in group_keys), []).append(config)
    out = []
    for members in groups.values():
        scored = [
            (c.stats[f"{criterion}_last"].mean, c) for c in members if c.complete and c.stats[f"{criterion}_last"]
        ]
        best = (min if minimize else max)(scored, key=lambda item: item[0])[1] if scored else None
        if best is not None:
            best.selected = True
        out.append(
            {
                "group": {k: members[0].values[k] for k in group_keys},
                "best": best,
                "candidates": len(members),
                "excluded": len(members) - len(scored),
            }
        )
    return out


# --------------------------------------------------------------------------- outputs
AGGREGATES = ("mean", "std", "ci95", "n")  # report.csv columns of every figure: std ddof = 0, ci95 = t half-width


def _cells(stat: Summary | None) -> list:
    return (
        [""] * len(AGGREGATES)
        if stat is None
        else [repr(stat.mean), repr(stat.std), "" if stat.ci is None else repr(stat.ci), stat.n]
    )


def write_csv(
    path: Path,
    configs: Sequence[Config],
    keys: Sequence[str],
    metrics: Sequence[str],
    last: int,
    amplitude: str | None = None,
) -> None:
    stat_cols = [f"{m}_{kind}_{agg}" for m in metrics for kind in ("final", f"last{last}") for agg in AGGREGATES]
    stat_cols += [f"{amplitude}_amplitude_{agg}" for agg in AGGREGATES] if amplitude else []
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*keys, "runs", *STATUSES, *stat_cols, "selected", "note"])
        for c in configs:
            counts = [sum(r.status == s for r in c.runs) for s in STATUSES]
            stats = []
            for m in metrics:
                for kind in ("final", "last"):
                    stats += _cells(c.stats[f"{m}_{kind}"])
            stats += _cells(c.stats["amplitude"]) if amplitude else []
            writer.writerow([*(c.values[k] for k in keys), len(c.runs), *counts, *stats, c.selected, c.note])


def write_markdown(
    path: Path,
    args: argparse.Namespace,
    runs: Sequence[Run],
    configs: Sequence[Config],
    keys: Sequence[str],
    best: list[dict] | None,
    figures: Sequence[str],
    compared: list[str] | None = None,
    extra: list[str] | None = None,
    duplicates: Sequence[tuple[Run, Run]] = (),
) -> None:
    m, k = args.metric, args.last
    lines = [
        f"# flower-report: {', '.join(map(str, args.sweep_dirs))}",
        "",
        f"{len(runs)} runs, {len(configs)} configurations (swept: {', '.join(keys) or 'none'}; "
        f"averaged over: {AVERAGED}). Values: mean ± 95 % confidence half-width over n seeds (Student t, "
        f"t_0.975,n−1 · s/√n; std in report.csv) of `{m}` at the last round and of its mean over the last {k} "
        "rounds. Runs that diverged, did not finish or never aggregated a reply are listed in *note* and their "
        "configurations are never selected."
        + (f" Every run as it stood after round {args.upto} (--upto)." if getattr(args, "upto", None) else ""),
        "",
        f"| {' | '.join(keys)} | runs | {m} final | {m} last {k} | note |",
        f"|{'---|' * (len(keys) + 4)}",
    ]
    for c in configs:
        mark = " **(best)**" if c.selected else ""
        lines.append(
            f"| {' | '.join(c.values[key] for key in keys)} | {len(c.runs)} | {format_summary(c.stats[f'{m}_final'])} "
            f"| {format_summary(c.stats[f'{m}_last'])}{mark} | {c.note} |"
        )
    if best is not None:
        group_keys = list(best[0]["group"]) if best else []
        crit = args.criterion
        lines += [
            "",
            f"## Best {', '.join(args.select)} per {', '.join(group_keys) or 'sweep'} "
            f"({'smallest' if args.minimize_criterion else 'largest'} mean {crit} over the last {k} rounds)",
            "",
            f"| {' | '.join(group_keys + list(args.select))} | {crit} last {k} | {m} final | excluded |",
            f"|{'---|' * (len(group_keys) + len(args.select) + 3)}",
        ]
        for item in best:
            b = item["best"]
            chosen = [b.values[s] for s in args.select] if b else ["none finished"] * len(args.select)
            lines.append(
                f"| {' | '.join([*item['group'].values(), *chosen])} | "
                f"{format_summary(b.stats[f'{crit}_last']) if b else '—'} | "
                f"{format_summary(b.stats[f'{m}_final']) if b else '—'} "
                f"| {item['excluded']} of {item['candidates']} |"
            )
    lines += extra or []
    lines += compared or []
    bad = [r for r in runs if r.status != FINISHED]
    if bad or duplicates:
        lines += ["", "## Runs left out", ""]
        lines += [
            f"- `{r.path}`: {r.status} at round {r.last_round} {('— ' + r.reason) if r.reason else ''}" for r in bad
        ]
        lines += [
            f"- `{r.path}`: the configuration and seed of `{kept.path}`, counted once"
            + (
                f" ({r.status} at round {r.last_round}{' — ' + r.reason if r.reason else ''})"
                if r.status != FINISHED
                else ""
            )
            for r, kept in duplicates
        ]
    lines += [""] + [f"![{name}]({name})" for name in figures]
    path.write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------- CLI
def build_report(args: argparse.Namespace) -> list[Path]:
    """Load, check, summarise, write; returns the written files. Raises ReportError on bad input."""
    from server.report import sweep_plots as report_plots  # matplotlib only when writing figures

    runs = only(load_runs(args.sweep_dirs), args.only or [])
    if args.upto is not None:
        runs = upto(runs, args.upto)
    runs, duplicates = one_run_per_seed(runs)
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
    comparisons = None
    for flag, given in (("--pair-by", args.pair_by is not None), ("--ratio", args.ratio)):
        if given and not args.compare:
            raise ReportError(f"{flag} needs --compare")
    amp_metric, amp_info = _amplitude_metric(args, columns), None
    oscillation.check_options(args.period, args.cycles)
    amplitude = (
        (amp_metric, lambda run: oscillation.run_amplitude(run, amp_metric, args.period, args.cycles)[0])
        if amp_metric
        else None
    )
    if args.compare:
        key, a, bs = compare_lib.parse(args.compare, runs, swept)
        if args.pair_by:
            check_keys(runs, swept, args.pair_by, "--pair-by")
        comparisons = {
            b: compare_lib.compare(runs, keys, key, a, b, args.metric, args.last, args.pair_by, amplitude, args.ratio)
            for b in bs
        }
    metrics = list(dict.fromkeys([args.metric, args.criterion]))
    configs = configurations(runs, keys, metrics, args.last)
    if amp_metric:
        amp_info = oscillation.amplitudes(configs, amp_metric, args.period, args.cycles)
    best = None
    if args.best_per or args.select:
        args.select = args.select or [k for k in keys if k not in (args.best_per or [])]
        if not args.select:
            raise ReportError("--best-per names every swept key: no key is left to select (give --select)")
        best = select_best(configs, [k for k in keys if k not in args.select], args.criterion, args.minimize_criterion)
    out = Path(args.out or args.sweep_dirs[0])
    try:
        make_dir(out, "--out")
    except ConfigError as err:
        raise ReportError(str(err)) from None
    shown = [b["best"] for b in best if b["best"]] if best is not None else list(configs)
    figures = [report_plots.plot_curves(out / "curves.png", shown, keys, args.metric)]
    if "pop_gap" in columns:
        zoom = max(amp_info["period"]) * max(amp_info["cycles"]) if amp_info and amp_info["period"] else None
        figures.append(report_plots.plot_gap_curves(out / "gap_curves.png", shown, keys, "pop_gap", zoom))
    if args.grid:
        figures.append(
            report_plots.plot_heatmap(
                out / "heatmap.png", configs, args.grid, args.criterion, args.minimize_criterion, args.last
            )
        )
    compared, written = None, []
    if comparisons is not None:
        compared = [
            line
            for b, found in comparisons.items()
            for line in compare_lib.markdown(found, key, a, b, args.metric, args.last, amplitude, args.ratio)
        ]
        compare_lib.write_csv(out / "compare.csv", comparisons, key, a, args.last)
        written.append(out / "compare.csv")
    write_csv(out / "report.csv", configs, keys, metrics, args.last, amp_metric)
    extra = oscillation.markdown(configs, keys, amp_metric, amp_info) if amp_metric else None
    names = [f.name for f in figures]
    write_markdown(out / "report.md", args, runs, configs, keys, best, names, compared, extra, duplicates)
    return [out / "report.md", out / "report.csv", *written, *figures]


def _amplitude_metric(args: argparse.Namespace, columns: set[str]) -> str | None:
    """The metric of the oscillation amplitude (None: not asked): --amplitude's, else pop_gap when present."""
    if args.amplitude is None and args.period is None and args.cycles is None:
        return None
    metric = args.amplitude or ("pop_gap" if "pop_gap" in columns else args.metric)
    if metric not in columns:
        raise ReportError(
            f"--amplitude: metric '{metric}' is in no run's metrics (columns: {', '.join(sorted(columns))})"
        )
    return metric


def build_parser() -> argparse.ArgumentParser:
    """flower-report's command line (also used by studies/convex_study.py)."""
    parser = argparse.ArgumentParser(prog="flower-report", description=__doc__.split("\n\n")[0].replace("``", ""))
    parser.add_argument("sweep_dirs", nargs="+", type=Path, help="Hydra multirun folder(s) (hydra.sweep.dir)")
    parser.add_argument("--metric", help="reported metric (default: pop_loss when present, else loss)")
    parser.add_argument("--last", type=int, default=100, help="K: mean over the last K rounds (default 100 or all)")
    parser.add_argument("--best-per", nargs="+", metavar="KEY", help="pick the best configuration per value of KEY")
    parser.add_argument("--select", nargs="+", metavar="KEY", help="the swept keys being chosen (default: the rest)")
    crit = parser.add_mutually_exclusive_group()
    crit.add_argument("--minimize", metavar="METRIC", help="selection criterion: smallest last-K mean of METRIC")
    crit.add_argument("--maximize", metavar="METRIC", help="selection criterion: largest last-K mean of METRIC")
    parser.add_argument("--grid", nargs=2, metavar=("X", "Y"), help="heatmap of two swept keys")
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="KEY=V",
        help="report only the runs with KEY=V (each given pair), e.g. one method's runs of a sweep of several",
    )
    parser.add_argument(
        "--upto",
        type=int,
        metavar="T",
        help="report every run as it stood after round T (a floor "
        "at an earlier horizon of longer runs: evaluate every round before T with eval_tail_at)",
    )
    parser.add_argument("--out", type=Path, help="output folder (default: the first sweep dir)")
    parser.add_argument(
        "--compare",
        nargs="+",
        metavar="KEY=V",
        help="KEY=A KEY=B [KEY=C ...]: paired differences B − A (C − A, ...) of --metric over matched "
        "seeds: mean, 95%% CI, t-test p",
    )
    parser.add_argument(
        "--ratio",
        action="store_true",
        help="with --compare: also the paired ratios B / A "
        "(geometric mean, 95%% CI of the t interval of log B/A, p of H0: ratio 1)",
    )
    parser.add_argument(
        "--pair-by",
        nargs="*",
        metavar="KEY",
        help="swept keys within which seeds are paired (default: those with several values on a side of --compare)",
    )
    parser.add_argument(
        "--amplitude",
        nargs="?",
        const="",
        metavar="METRIC",
        help="oscillation amplitude of METRIC "
        "over the last cycles (default metric: pop_gap when present, else --metric)",
    )
    parser.add_argument(
        "--period",
        type=int,
        help="the oscillation's period in rounds (default: 1/participation.fraction of cyclic runs)",
    )
    parser.add_argument(
        "--cycles",
        type=int,
        help="M: amplitude over the last M full cycles (default: every full "
        "cycle of per-round evaluations at the end, eval_tail)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """``flower-report SWEEP_DIR...``: report.md/csv, curves.png and heatmap.png of a Hydra multirun."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        written = build_report(args)
    except ReportError as err:
        print(f"flower-report: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"flower-report: wrote {', '.join(map(str, written))}")


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
