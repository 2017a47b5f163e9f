"""flower-theory <experiment> [options]: reproduce the quadratic analyses of paper 1 and paper 2.

Each experiment writes <name>.md, <name>.csv, <name>.json (and <name>.png where the paper has a figure)
under ``--out`` (default outputs/theory). ``flower-theory all`` runs every experiment. See docs/theory.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence

from server.run.errors import ConfigError, make_dir

EXPERIMENTS = (
    "table1",
    "table2",
    "limit-cycle",
    "rates",
    "local-steps",
    "cycle-mean",
    "surrogate",
    "spectrum",
)  # `all`
GHBM_POINT = {  # flower-theory ghbm-point options: (default, converter, check, message)
    "tau": (1, int, lambda v: v >= 1, "--tau must be an integer >= 1"),
    "momentum": (0.9, float, lambda v: 0.0 <= v <= 1.0, "--momentum must lie in [0, 1]"),
    "server_lr": (1.0, float, lambda v: 0.0 <= v < math.inf, "--server-lr must be a finite number >= 0"),
    "client_lr": (0.1, float, lambda v: 0.0 <= v < math.inf, "--client-lr must be a finite number >= 0"),
    "J": (1, int, lambda v: v >= 1, "--J must be an integer >= 1"),
    "G": (10.0, float, math.isfinite, "--G must be a finite number"),
    "theta0": (0.0, float, math.isfinite, "--theta0 must be a finite number"),
    "mu": (2.0, float, lambda v: math.isfinite(v) and v >= 0.0, "--mu must be a finite number >= 0"),
    "rounds": (1000, int, lambda v: v >= 1, "--rounds must be an integer >= 1"),
}


# The fewest rounds for which an experiment's outputs mean what it reports: its limits (limit cycles, decay
# exponents) are read once the transients of its slowest lane have died out. Each is checked in tests/theory/.
MIN_T = {
    "limit-cycle": (
        1000,
        "it tells stable from unstable steps by the zero-input response decaying below 1e-8 and "
        "reads the cycle after the transients (the slowest stable lane of its grid needs ~380 rounds)",
    ),
    "local-steps": (1000, "it reads each limit cycle after the transients (beta = 0.9 contracts by 0.95 a round)"),
    "cycle-mean": (1000, "it reads each limit cycle's centre after the transients"),
    "rates": (1000, "its exponents are fitted on rounds [T/10, T], where Thm III.6's asymptotics must already hold"),
    "ghbm": (
        10_000,
        "it tells stable from unstable steps by the zero-input response decaying below 1e-8 and reads "
        "the cycle after the transients (its slowest stable lane contracts by 0.995 a round: ~3,200 rounds)",
    ),
}


def _check_rounds(experiment: str, T: int | None, parser: argparse.ArgumentParser) -> None:
    """One line (exit 2) for a ``--T`` shorter than an experiment that would run needs."""
    names = EXPERIMENTS if experiment == "all" else (experiment,)
    for name in names:
        least, why = MIN_T.get(name, (1, ""))
        if T is not None and T < least:
            parser.error(f"--T {T} is too short for {name}: {why}; use --T >= {least}")


def _least(name: str) -> str:
    least = max(MIN_T.get(n, (1, ""))[0] for n in (EXPERIMENTS if name == "all" else (name,)))
    return f"; at least {least}" if least > 1 else ""


def _positive_int(text: str) -> int:
    try:
        value = int(float(text)) if "e" in text.lower() else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flower-theory", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="experiment", required=True, metavar="experiment")
    helps = {
        "table1": "paper 1 Table I (IGD with/without momentum, T = 10^6)",
        "table2": "paper 1 Table II (alpha = 1, two initial steps)",
        "limit-cycle": "paper 1 Thm III.5: stability (Eq. 9) and limit-cycle amplitude (Eq. 10)",
        "rates": "paper 1 Thm III.6: fitted decay exponents",
        "local-steps": "paper 1 Eq. 5-7: FedAvgM vs FedCM with J local steps",
        "cycle-mean": "Lemma III.4 with unequal client curvatures: where each method's limit cycle is centred",
        "surrogate": "paper 2 Sections 3-4: surrogate vs true minimizer, LocalUpdate",
        "spectrum": "paper 2 Lemma 11 / Corollary 13 / Theorem 4",
        "ghbm": "GHBM(tau), LocalGHBM, FedHBM vs FedAvgM/FedCM: Table I, limit cycle, Thm III.6 rates",
        "ghbm-point": "one GHBM(tau) configuration on Lemma III.4's problem: prints theta^R as one JSON line",
        "all": "run every experiment",
    }
    for name, text in helps.items():
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--out", default="outputs/theory", help="output directory (default: %(default)s)")
        if name in ("table1", "table2", "rates", "limit-cycle", "local-steps", "cycle-mean", "ghbm", "all"):
            p.add_argument(
                "--T", type=_positive_int, default=None, help=f"number of rounds (paper defaults{_least(name)})"
            )
        if name == "surrogate":
            p.add_argument("--example", choices=("two-point", "figure1"), default=None)
            p.add_argument("--gamma", type=_non_negative_float, default=None, help="client learning rate")
            p.add_argument("--K", type=_positive_int, default=None, help="local steps K(Theta)")
            p.add_argument("--theta", choices=("fedavg", "fomaml"), default=None)
            p.add_argument("--rounds", type=_positive_int, default=2000, help="LocalUpdate rounds")
        if name == "ghbm-point":  # parsed as text and checked in _ghbm_point (one-line errors)
            for key, (default, _, _, _) in GHBM_POINT.items():
                p.add_argument(f"--{key.replace('_', '-')}", dest=key, default=str(default), metavar=key.upper())
    return parser


def _runners(args: argparse.Namespace) -> dict[str, Callable[[], dict]]:
    from theory.experiments import cycle_mean, ghbm_report, seed000, spectrum, surrogate, tables

    T = getattr(args, "T", None)

    def kw(default: int) -> dict:
        return {"T": T if T is not None else default}

    return {
        "table1": lambda: tables.run_table1(args.out, **kw(10**6)),
        "table2": lambda: tables.run_table2(args.out, **kw(10**6)),
        "limit-cycle": lambda: seed000.run_limit_cycle(args.out, **kw(20_000)),
        "rates": lambda: seed000.run_rates(args.out, **kw(10**6)),
        "local-steps": lambda: seed000.run_local_steps(args.out, **kw(20_000)),
        "cycle-mean": lambda: cycle_mean.run_cycle_mean(args.out, **kw(20_000)),
        "surrogate": lambda: surrogate.run_surrogate(args.out, rounds=getattr(args, "rounds", 2000)),
        "spectrum": lambda: spectrum.run_spectrum(args.out),
        "ghbm": lambda: ghbm_report.run_ghbm(args.out, **kw(10**6)),
    }


def _summary(name: str, payload: dict) -> str:
    if name in ("table1", "table2"):
        entries = payload["entries"]
        if any(e["match"] is None for e in entries):
            return f"T = {payload['setup']['T']}: not compared with the paper, whose values are for T = 10^6"
        text = f"{sum(e['match'] for e in entries)}/{len(entries)} entries match the paper"
        for e in entries:
            if not e["match"]:
                text += (
                    f"\n    mismatch: momentum={e['momentum']} {e['schedule']} {e['param']} G={e['G']:g} "
                    f"theta0={e['theta0']:g}: ours {e['value']:.3e}, paper {e['paper']:.1e}"
                )
        for v in payload.get("paper_linearity_violations", []):
            text += (
                f"\n    paper entry contradicts linearity: momentum={v['momentum']} {v['schedule']} {v['param']} "
                f"G={v['G']:g} theta0={v['theta0']:g}: paper {v['paper']:.1e}, its row implies "
                f"{v['predicted_by_linearity']:.2e}"
            )
        return text
    return "written " + ", ".join(sorted(payload.get("paths", {}).values()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # before any computation: an output directory that cannot be made is one line
        make_dir(getattr(args, "out", None) or ".", "--out")
    except ConfigError as err:
        parser.error(str(err))
    if args.experiment == "ghbm-point":
        return _ghbm_point(args)
    _check_rounds(args.experiment, getattr(args, "T", None), parser)
    if args.experiment == "surrogate" and any(getattr(args, k) is not None for k in ("example", "gamma", "K", "theta")):
        return _surrogate_point(args, parser)
    runners = _runners(args)
    names = EXPERIMENTS if args.experiment == "all" else (args.experiment,)
    start = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        payload = runners[name]()
        print(f"[{name}] {time.perf_counter() - t0:.2f} s: {_summary(name, payload)}")
    print(f"done in {time.perf_counter() - start:.2f} s; outputs in {args.out}")
    return 0


def _surrogate_point(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from pathlib import Path

    from theory.experiments import surrogate

    try:
        result = surrogate.point(
            args.example or "two-point",
            args.gamma if args.gamma is not None else 0.5,
            args.K if args.K is not None else 2,
            args.theta or "fedavg",
            args.rounds,
        )
    except ValueError as err:
        parser.error(str(err))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "surrogate_point.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


def _ghbm_point(args: argparse.Namespace) -> int:
    """Validate every option (exit 2 with one line naming it), run, print one JSON line (exit 3, theta null, when
    theta^R is not finite)."""
    from theory.experiments import ghbm

    values = {}
    for key, (_, convert, check, message) in GHBM_POINT.items():
        text = getattr(args, key)
        try:
            value = convert(float(text)) if convert is int and float(text).is_integer() else convert(text)
            ok = bool(check(value))
        except (TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            print(f"flower-theory ghbm-point: {message}, got {text!r}", file=sys.stderr)
            raise SystemExit(2)
        values[key] = value
    result = ghbm.point(**values)
    if not math.isfinite(result["theta"]):  # strict JSON has no NaN/Infinity: null, and the run's exit status 3
        print(json.dumps({**result, "theta": None}))
        print("flower-theory ghbm-point: theta^R is not finite: the iteration diverges at these rates", file=sys.stderr)
        return 3
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
