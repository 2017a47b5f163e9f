"""The convex study (docs/convex.md "Study"), end to end through ``flower-simulation -m``.

Stages (``--stage``, default all, in this order; each writes as it goes and skips the jobs already finished or
diverged, so a rerun after an interruption continues; a killed job resumes from its checkpoint):

1. ``tune``: every paper 1 method (conf/method/) on its learning-rate grid (GRIDS) with the tuning seed, a shorter
   horizon; the best configuration per method = the smallest mean pop_gap over the last 10 % of rounds
   (flower-report's --best-per method --minimize pop_gap); the choices go to ``<out>/tuned.json``.
2. ``final``: the tuned values over the seeds and the full horizon, pop_gap every ``eval_every`` rounds and every
   round of the last 10 cycles (eval_tail), in three variants: ``tuned``, ``halved`` (client lr / 2: Lemma III.4's
   amplitude ∝ η_l G) and ``uniform`` (uniform participation at the same C: the control).
3. ``seed001``: LocalUpdate with γ ∈ {0, small, large} and LocalUpdateDecay, η tuned on ETA_GRID the same way, then
   run over the seeds.
4. ``report``: flower-report of every variant with the CIs, the oscillation amplitude and the paired comparisons
   against FedAvg (LocalUpdate γ = 0 on paper 2's side), cyclic − uniform and, per method, halved − tuned
   with the ratios halved / tuned (``--ratio``: Lemma III.4 predicts an amplitude ratio of 1/2); figures and
   reports under ``<out>/reports``, the figures also copied to ``--figures`` (docs/img for the doc). With
   ``--upto T`` (e.g. 5000 of ``--rounds 10000``) every report again at round T (``<name>_uptoT``). With
   ``--average`` the final runs also evaluate the mean of each cycle's server models (``eval_average`` = the period)
   and every paper 1 variant gets a ``<name>_averaged`` report of ``avg_pop_gap`` (docs/convex.md, "Use").

    python -m studies.convex_study --out outputs/convex-study --jobs 2 data.root=/data/cifar10-jpeg.tar.gz
    python -m studies.convex_study --out outputs/convex-study --stacked 2 data.root=/data/cifar10-jpeg.tar.gz
    python -m studies.convex_study --out outputs/convex-study --stage tune --dry-run     # print the commands
    python -m studies.convex_study --scale smoke --out /tmp/s data.root=tiny.tar.gz      # the test suite's

Trailing ``KEY=VALUE`` arguments are Hydra overrides added to every job (data, cache dir, engine options). Bad input
(an option, an override that does not compose or validate with the study's presets, a folder that cannot be created):
one line, exit 2, before any work.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from server.report.runs import normalise
from server.run.errors import ConfigError, make_dir

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

METHODS = ("fedavg", "fedavgm", "fedcm", "ghbm", "localghbm", "fedhbm")
SEED001 = ("localupdate_g0", "localupdate_gsmall", "localupdate_glarge", "localupdate_decay")
CLIENT_LRS = (0.001, 0.003, 0.01)
GRIDS: dict[str, dict[str, tuple[float, ...]]] = {  # server_lr x client_lr of stage 1 (FedCM: server_lr > 0)
    # FedAvg, FedAvgM, FedCM: grids extended past the edges where their best first sat (docs/convex.md, tuning)
    "fedavg": {"strategy.server_lr": (0.5, 1.0, 2.0), "strategy.client_lr": (0.0003, *CLIENT_LRS)},
    # FedAvgM's steady step is η Δ whatever β (Eq. 92's η(1 − β)): FedAvg's η range and above, not 1 − β
    "fedavgm": {"strategy.server_lr": (2.0, 3.0, 5.0, 8.0), "strategy.client_lr": (0.0003, 0.001, 0.003)},
    "fedcm": {"strategy.server_lr": (0.1, 0.3, 1.0), "strategy.client_lr": (0.003, 0.01, 0.03, 0.1)},
    "ghbm": {"strategy.server_lr": (0.5, 1.0, 1.5), "strategy.client_lr": CLIENT_LRS},
    "localghbm": {"strategy.server_lr": (0.5, 1.0, 1.5), "strategy.client_lr": CLIENT_LRS},
    "fedhbm": {"strategy.server_lr": (0.5, 1.0, 1.5), "strategy.client_lr": CLIENT_LRS},
}
ETA_GRID = {"strategy.server_lr": (0.001, 0.003, 0.01, 0.03)}  # paper 2 side: η per γ (the method fixes γ)
SCALES = {  # rounds, tune rounds, seeds, eval_every, eval_every while tuning, cycles in eval_tail, period
    "full": {"rounds": 5000, "tune_rounds": 500, "seeds": 5, "eval_every": 50, "tune_eval_every": 5, "cycles": 10},
    "smoke": {"rounds": 20, "tune_rounds": 10, "seeds": 2, "eval_every": 5, "tune_eval_every": 1, "cycles": 2},
}
SMOKE = [
    "num_clients=10",
    "participation.fraction=0.2",
    "eval_max_examples=20",
    "client.torch_threads=1",
    "client.weight_decay=0.01",  # the f* of tests/server/test_convex_smoke.py (same data, mu, weights)
    "checkpoint_every=5",
]  # 10 one-class clients of the generated data, period 5
SMOKE_GRID = {"strategy.server_lr": (1.0,), "strategy.client_lr": (0.003, 0.01)}
TUNE_SEED = 100
PRESETS = ("convex_tune", "convex_seed000", "convex_seed001")  # the conf/sweep/ presets of the study's calls


@dataclass
class Group:
    """One ``flower-simulation -m`` call: fixed overrides and a product of swept values, into ``sweep_dir``."""

    sweep_dir: Path
    preset: str
    fixed: dict[str, str]
    swept: dict[str, Sequence] = field(default_factory=dict)

    def jobs(self) -> list[dict[str, str]]:
        keys = list(self.swept)
        return [
            {**self.fixed, **{k: fmt(v) for k, v in zip(keys, combo)}}
            for combo in itertools.product(*self.swept.values())
        ]


def fmt(value) -> str:
    """An override value as Hydra prints it back in a subdir (floats as Python's repr: 0.001, 1.0)."""
    return repr(float(value)) if isinstance(value, float) else str(value)


def done_jobs(sweep_dir: Path) -> list[dict]:
    """The overrides of every job under ``sweep_dir`` that finished or diverged (both are results)."""
    out = []
    for path in sweep_dir.glob("*/status.json"):
        status = json.loads(path.read_text()).get("status")
        overrides = path.parent / ".hydra" / "overrides.yaml"
        if status in ("finished", "diverged") and overrides.exists():
            items = [str(i).lstrip("+").partition("=") for i in yaml.safe_load(overrides.read_text()) or []]
            out.append({k: normalise(v) for k, _, v in items})
    return out


def pending(group: Group) -> list[Group]:
    """The calls still to make for ``group``: all of it, nothing, or its unfinished jobs one by one."""
    done = done_jobs(group.sweep_dir)
    todo = [job for job in group.jobs() if not any(all(d.get(k) == normalise(v) for k, v in job.items()) for d in done)]
    if len(todo) == len(group.jobs()):
        return [group]
    return [Group(group.sweep_dir, group.preset, job) for job in todo]


def merged(groups: Sequence[Group]) -> list[Group]:
    """Groups that differ only in their method become one call sweeping ``method`` too (fewer process starts)."""
    out: dict[tuple, Group] = {}
    for g in groups:
        fixed = {k: v for k, v in g.fixed.items() if k != "method"}
        ident = (g.sweep_dir, g.preset, tuple(fixed.items()), tuple((k, tuple(v)) for k, v in g.swept.items()))
        if ident in out:
            out[ident].swept["method"].append(g.fixed["method"])
        else:
            out[ident] = Group(g.sweep_dir, g.preset, fixed, {"method": [g.fixed["method"]], **g.swept})
    return list(out.values())


def command(group: Group, extra: Sequence[str], stacked: int = 0) -> list[str]:
    """The ``flower-simulation -m`` call of ``group``; ``stacked`` > 0: its jobs as stacked programs in that many
    worker processes (``hydra/launcher=stacked``)."""
    swept = [f"{k}={','.join(fmt(v) for v in values)}" for k, values in group.swept.items()]
    launcher = ["hydra/launcher=stacked", f"hydra.launcher.processes={stacked}"] if stacked else []
    return [
        str(BIN / "flower-simulation"),
        "-m",
        *launcher,
        f"+sweep={group.preset}",
        *[f"{k}={v}" for k, v in group.fixed.items()],
        *swept,
        *extra,
        "resume=true",
        f"hydra.sweep.dir={group.sweep_dir}",
    ]


def run_groups(groups: Sequence[Group], extra: Sequence[str], args: argparse.Namespace) -> None:
    """Run the pending calls of ``groups``, ``--jobs`` at a time; a failing call is reported, the rest go on."""
    calls = [g for group in merged(groups) for g in pending(group)]
    if args.dry_run:
        for call in calls:
            print(" ".join(command(call, extra, args.stacked)))
        return
    for call in calls:
        call.sweep_dir.mkdir(parents=True, exist_ok=True)

    def one(call: Group) -> int:
        log = call.sweep_dir / "driver.log"
        argv = command(call, extra, args.stacked)
        with open(log, "a") as f:
            f.write(" ".join(argv) + "\n")
            f.flush()
            return subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT).returncode

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        codes = list(pool.map(one, calls))
    failed = [c for c, code in zip(calls, codes) if code not in (0, 3)]  # 3: a job diverged (a result)
    for call in failed:
        print(f"convex_study: a call into {call.sweep_dir} failed (see its driver.log)", file=sys.stderr)


# --------------------------------------------------------------------------- stages
def scale_overrides(args: argparse.Namespace, tune: bool) -> dict[str, str]:
    period = 5 if args.scale == "smoke" else 10
    rounds = args.tune_rounds if tune else args.rounds
    out = {
        "num_rounds": str(rounds),
        "eval_every": str(args.tune_eval_every if tune else args.eval_every),
        "eval_tail": "0" if tune else str(min(rounds, args.cycles * period)),
    }
    if args.upto and not tune:  # the cycles before the earlier horizon too: flower-report --upto T reads them
        out["eval_tail_at"] = f"[{args.upto}]"
    if args.average and not tune:  # the mean of each cycle's server models, evaluated beside them (avg_pop_gap)
        out["eval_average"] = str(period)
    return out


def grid(method: str, args: argparse.Namespace) -> dict[str, Sequence]:
    """The tuning grid of a method: paper 1's methods sweep both lrs (convex_tune's keys), paper 2's methods η."""
    if args.scale == "smoke":
        return dict(SMOKE_GRID) if method in METHODS else {"strategy.server_lr": (0.003, 0.01)}
    return dict(GRIDS[method]) if method in METHODS else dict(ETA_GRID)


def tune_groups(methods: Sequence[str], args: argparse.Namespace, where: str) -> list[Group]:
    base = {**scale_overrides(args, tune=True), "seed": str(TUNE_SEED)}
    preset = "convex_tune" if where == "seed000" else "convex_seed001"
    return [Group(args.out / where / "tune", preset, {"method": m, **base}, grid(m, args)) for m in methods]


def pick_tuned(methods: Sequence[str], args: argparse.Namespace, where: str) -> dict[str, dict[str, str]]:
    """flower-report --select <grid keys> --minimize pop_gap (the mean over the last 10 % of the tuning rounds), per
    method; the choices are report.csv's ``selected`` rows."""
    import csv

    from server.report import sweep as report

    out = args.out / "reports" / f"{where}_tune"
    keys = [k for k, values in grid(methods[0], args).items() if len(values) > 1]
    argv = [
        str(args.out / where / "tune"),
        "--metric",
        "pop_gap",
        "--minimize",
        "pop_gap",
        "--last",
        str(max(1, args.tune_rounds // 10)),
        "--select",
        *keys,
        "--out",
        str(out),
    ]
    try:
        report.build_report(report.build_parser().parse_args(argv))
    except report.ReportError as err:
        raise SystemExit(f"convex_study: flower-report of the tuning runs: {err}") from None
    with open(out / "report.csv") as f:
        chosen = [row for row in csv.DictReader(f) if row["selected"] == "True"]
    fixed = {k: fmt(values[0]) for k, values in grid(methods[0], args).items() if len(values) == 1}
    tuned = {row.get("method") or methods[0]: {**fixed, **{k: row[k] for k in keys}} for row in chosen}
    missing = [m for m in methods if m not in tuned]
    if missing:
        raise SystemExit(f"convex_study: no finished tuning run of {', '.join(missing)} (see {out}/report.md)")
    return {m: tuned[m] for m in methods}


def final_groups(
    tuned: dict[str, dict[str, str]], args: argparse.Namespace, where: str, variants: Sequence[str]
) -> list[Group]:
    seeds = list(range(args.seeds))
    base = scale_overrides(args, tune=False)
    groups = []
    for method, values in tuned.items():
        for variant in variants:
            fixed = {"method": method, **base, **values, "participation": "cyclic"}
            if variant == "halved":
                fixed["strategy.client_lr"] = fmt(float(values["strategy.client_lr"]) / 2)
            elif variant == "uniform":
                fixed["participation"] = "uniform"
            preset = "convex_seed001" if where == "seed001" else "convex_seed000"
            groups.append(Group(args.out / where / variant, preset, fixed, {"seed": seeds}))
    return groups


def tuned_file(args: argparse.Namespace) -> Path:
    return args.out / "tuned.json"


def stage_tune(args, extra, where="seed000", methods=None) -> dict:
    methods = methods or args.methods
    run_groups(tune_groups(methods, args, where), extra, args)
    if args.dry_run:  # the choices made already, else placeholders: the middle of each grid
        record = (json.loads(tuned_file(args).read_text()) if tuned_file(args).exists() else {}).get(where, {})
        tuned = {m: record.get(m) or {k: fmt(v[len(v) // 2]) for k, v in grid(m, args).items()} for m in methods}
        args.dry_tuned = {**getattr(args, "dry_tuned", {}), where: tuned}
        return tuned
    tuned = pick_tuned(methods, args, where)
    record = json.loads(tuned_file(args).read_text()) if tuned_file(args).exists() else {}
    record[where] = tuned
    tuned_file(args).write_text(json.dumps(record, indent=1))
    print(f"convex_study: tuned {where}: {json.dumps(tuned)}")
    return tuned


def load_tuned(args, extra, where: str, methods: Sequence[str]) -> dict:
    record = json.loads(tuned_file(args).read_text()) if tuned_file(args).exists() else {}
    record = {**record, **getattr(args, "dry_tuned", {})}
    if where in record and all(m in record[where] for m in methods):
        return {m: record[where][m] for m in methods}
    return stage_tune(args, extra, where, methods)


def stage_final(args, extra) -> None:
    run_groups(
        final_groups(load_tuned(args, extra, "seed000", args.methods), args, "seed000", args.variants), extra, args
    )


def stage_seed001(args, extra) -> None:
    tuned = load_tuned(args, extra, "seed001", args.seed001)
    run_groups(final_groups(tuned, args, "seed001", ["tuned"]), extra, args)


def stage_report(args, extra) -> None:
    """flower-report of every variant (CI, amplitude, comparisons); figures copied to --figures."""
    from server.report import sweep as report

    period = "5" if args.scale == "smoke" else "10"  # cyclic C; the uniform control's "cycles" have the same length
    s0 = args.out / "seed000"
    base = ["--metric", "pop_gap", "--period", period, "--cycles", str(args.cycles)]  # eval_tail's cycles
    vs = [f"method={m}" for m in sorted(args.methods, key=lambda m: m != "fedavg")]  # against FedAvg
    lu = [f"method={m}" for m in args.seed001]
    jobs = {f"seed000_{v}": [str(s0 / v), *(["--compare", *vs] if len(vs) > 1 else [])] for v in args.variants}
    if args.average:  # the same reports of f at the mean of the last cycle's models (eval_average)
        jobs.update({f"{name}_averaged": [*argv, "--metric", "avg_pop_gap"] for name, argv in list(jobs.items())})
    if "uniform" in args.variants and "tuned" in args.variants:
        jobs["seed000_cyclic_vs_uniform"] = [
            str(s0 / "tuned"),
            str(s0 / "uniform"),
            "--compare",
            "participation=cyclic",
            "participation=uniform",
        ]
    if "halved" in args.variants and "tuned" in args.variants:  # Lemma III.4 per method: the ratio halved / tuned
        tuned = {
            **(json.loads(tuned_file(args).read_text()) if tuned_file(args).exists() else {}),
            **getattr(args, "dry_tuned", {}),
        }.get("seed000", {})
        for m in args.methods:
            if m not in tuned:
                print(f"convex_study: no tuned client lr of {m} (tuned.json): no halved − tuned report")
                continue
            lr = tuned[m]["strategy.client_lr"]
            jobs[f"seed000_{m}_halved_vs_tuned"] = [
                str(s0 / "tuned"),
                str(s0 / "halved"),
                "--only",
                f"method={m}",
                "--compare",
                f"strategy.client_lr={lr}",
                f"strategy.client_lr={fmt(float(lr) / 2)}",
                "--ratio",
            ]
    jobs["seed001"] = [str(args.out / "seed001" / "tuned"), *(["--compare", *lu] if len(lu) > 1 else [])]
    horizons = {"": ["--last", str(max(1, args.rounds // 10))]}
    if args.upto:  # every report again at the earlier horizon (e.g. 5,000 of 10,000 rounds)
        horizons[f"_upto{args.upto}"] = ["--last", str(max(1, args.upto // 10)), "--upto", str(args.upto)]
    jobs = {name + suffix: [*argv, *at] for suffix, at in horizons.items() for name, argv in jobs.items()}
    for name, argv in jobs.items():
        argv = [*base, *argv, "--out", str(args.out / "reports" / name)]  # a job's own --metric comes last
        if args.dry_run:
            print("flower-report " + " ".join(argv))
            continue
        try:
            written = report.build_report(report.build_parser().parse_args(argv))
        except report.ReportError as err:
            raise SystemExit(f"convex_study: flower-report {name}: {err}") from None
        for path in written:
            if path.suffix == ".png" and args.figures:
                args.figures.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, args.figures / f"convex_{name}_{path.name}")
        print(f"convex_study: report {name}: {written[0]}")


STAGES = {"tune": stage_tune, "final": stage_final, "seed001": stage_seed001, "report": stage_report}


def parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="convex_study.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="study folder (every stage writes below it)")
    parser.add_argument("--stage", choices=[*STAGES, "all"], default="all")
    parser.add_argument("--scale", choices=list(SCALES), default="full", help="smoke: the test suite's tiny study")
    parser.add_argument("--rounds", type=int, help="rounds of the final runs (full: 5000)")
    parser.add_argument("--tune-rounds", type=int, help="rounds of the tuning runs (full: 500)")
    parser.add_argument("--seeds", type=int, help="final seeds 0..S-1 (full: 5)")
    parser.add_argument("--eval-every", type=int, help="pop_gap every k rounds of the final runs (full: 50)")
    parser.add_argument("--cycles", type=int, help="cycles evaluated every round at the end (eval_tail; full: 10)")
    parser.add_argument("--methods", default=",".join(METHODS), help="paper 1's methods (conf/method/)")
    parser.add_argument("--seed001", default=",".join(SEED001), help="paper 2's methods (conf/method/)")
    parser.add_argument("--variants", default="tuned,halved,uniform", help="final-run variants")
    parser.add_argument(
        "--upto",
        type=int,
        metavar="T",
        help="an earlier horizon T < --rounds: the final runs "
        "evaluate its last cycles too (eval_tail_at) and every report is repeated at T (<name>_uptoT)",
    )
    parser.add_argument(
        "--average",
        action="store_true",
        help="the final runs also evaluate the mean of each "
        "cycle's server models (eval_average = the period) and every paper 1 variant gets a "
        "<name>_averaged report of avg_pop_gap",
    )
    parser.add_argument("--jobs", type=int, default=1, help="flower-simulation calls at once (2 on 2 cores)")
    parser.add_argument(
        "--stacked",
        type=int,
        default=0,
        metavar="P",
        help="each call's jobs as stacked programs in P worker processes (hydra/launcher=stacked "
        "hydra.launcher.processes=P; with --jobs 1); 0: lone runs",
    )
    parser.add_argument("--figures", type=Path, help="copy the report figures here (e.g. docs/img)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands of the pending jobs only")
    args, extra = parser.parse_known_args(argv)
    bad = [a for a in extra if "=" not in a or a.startswith("-")]
    scale = SCALES[args.scale]
    for key in ("rounds", "tune_rounds", "seeds", "eval_every", "cycles"):
        value = getattr(args, key)
        setattr(args, key, scale[key] if value is None else value)
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    args.tune_eval_every = min(scale["tune_eval_every"], args.tune_rounds)
    if bad:
        parser.error(f"unknown argument(s) {' '.join(bad)} (trailing arguments are Hydra KEY=VALUE overrides)")
    args.methods, args.seed001 = args.methods.split(","), args.seed001.split(",")
    args.variants = args.variants.split(",")
    for name in args.methods + args.seed001:
        if not (ROOT / "conf" / "method" / f"{name}.yaml").exists():
            parser.error(f"no method '{name}' (conf/method/*.yaml)")
    unknown = set(args.methods) - set(METHODS) or set(args.variants) - {"tuned", "halved", "uniform"}
    if unknown:
        parser.error(f"unknown paper 1 method or variant: {', '.join(sorted(unknown))}")
    if args.seeds < 2 and args.stage in ("report", "all") and len(args.methods) > 1:
        parser.error("--seeds must be >= 2 for the paired comparisons of the report")
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if args.stacked < 0:
        parser.error(f"--stacked must be >= 0 (0: lone runs), got {args.stacked}")
    if args.upto is not None and not 1 <= args.upto < args.rounds:
        parser.error(f"--upto must be a round in 1..{args.rounds - 1} (before --rounds), got {args.upto}")
    overrides = (SMOKE if args.scale == "smoke" else []) + extra
    check_overrides(parser, overrides)
    try:  # before any work: folders written only at the end (the report stage's figures) included
        args.out = make_dir(args.out, "--out")
        args.figures = args.figures and make_dir(args.figures, "--figures")
    except ConfigError as err:
        parser.error(str(err))
    return args, overrides


def check_overrides(parser: argparse.ArgumentParser, overrides: Sequence[str]) -> None:
    """The trailing Hydra overrides composed with each preset the study runs and validated as ``flower-simulation``
    validates a run, before any work: an unknown key, a bad value or data that is not there is one line, exit 2 (not
    a failed call in every sweep folder)."""
    from server.convex.cli import compose
    from server.run import config as config_lib
    from server.run import hydra_errors

    for preset in PRESETS:
        try:
            try:
                cfg = compose([f"+sweep={preset}", *overrides])
            except Exception as err:  # Hydra's own errors: unknown group or key, bad override syntax
                raise ConfigError(hydra_errors.describe(err)) from None
            config_lib.validate(cfg)
        except ConfigError as err:
            parser.error(f"invalid configuration: {err}")


def main(argv: Sequence[str] | None = None) -> None:
    args, extra = parse(argv)
    stages = list(STAGES) if args.stage == "all" else [args.stage]
    for stage in stages:
        STAGES[stage](args, extra)


if __name__ == "__main__":
    main()
