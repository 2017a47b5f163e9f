"""f at the average of a run's last P server models against f at each of them: is server momentum a cycle average?

Under cyclic participation the server model of FedAvg oscillates with the period P = 1/C of the schedule (paper 1,
Lemma III.4) around a point that no single iterate reaches; heavy-ball momentum (FedAvgM) low-pass filters that
oscillation. This script measures how much of a run's ``pop_gap`` floor is the oscillation: for each finished
convex run (``model=logreg``, ``eval_gap=true``; docs/convex.md) it

1. copies the run directory to ``--out`` and continues the copy to round T + P in one ``flower-simulation`` call
   with the run's own Hydra overrides (``resume=true``: exact resume, so these are the rounds the run itself would
   have made) plus ``eval_tail=P eval_average=P``;
2. reads what that call evaluated, in float64 with the run's own objective and f* (``pop_gap``): the gap
   f(x^t) − f* of each of the P models and, at round T + P, the gap of their mean, f(x̄) − f* with
   x̄ = (1/P) Σ_t x^t (``avg_pop_gap``, server/run/window.py; the copy keeps x̄ as ``final_model_avg.npz``).
   For runs not yet started, ``eval_average=P`` computes the same during the run.

f is convex, so f(x̄) ≤ mean f(x^t) (Jensen); the difference is what averaging the cycle's iterates removes. It prints
one JSON line per run and, over the seeds of each configuration (run directories whose names differ only in
``_seedN``), mean ± 95 % CI (Student t) of both gaps and their paired difference.

    python -m studies.tail_average RUN_DIR [RUN_DIR ...] --out DIR [--period P] [--plot FILE.png]

``--plot`` draws each run's gap over the P continued rounds (log scale) and, dashed in the same colour, the gap of
their mean model; runs whose directory names differ only in ``_seedN`` share a colour.

P defaults to 1/``participation.fraction`` of a cyclic run. Bad input (a directory that is not a finished convex run
with a checkpoint, a run that is not cyclic without ``--period``, P < 1, two runs with the same directory name, whose
copies would collide in ``--out``, an ``--out`` or ``--plot`` folder that cannot be created): one line, exit 2, before
any work. A configuration with one run gets no CI.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from server.report.stats import paired, summarise
from server.run.errors import make_dir

SIMULATION = Path(sys.executable).parent / "flower-simulation"
CONTINUE_TIMEOUT = 900  # seconds for the continuation (start-up, f* check, P rounds, 2P evaluations)
# overrides of the run that the continuation replaces (run_dir/hydra.run.dir: it must write to the copy only)
DROPPED = (
    "num_rounds=",
    "checkpoint_every=",
    "plots=",
    "hydra.run.dir=",
    "run_dir=",
    "resume=",
    "eval_tail=",
    "eval_average=",
)


def check_run(run: Path, period: int | None) -> tuple[dict[str, Any], list[str], int, int]:
    """The run's config, its Hydra overrides, its last round T and the period P; ValueError names what is wrong."""
    for needed in ("config.json", "status.json", ".hydra/overrides.yaml", "checkpoint/state.json"):
        if not (run / needed).is_file():
            raise ValueError(f"{run}: no {needed} (not a run directory with a checkpoint)")
    cfg = json.loads((run / "config.json").read_text())
    status = json.loads((run / "status.json").read_text())
    if status.get("status") != "finished":
        raise ValueError(f"{run}: status {status.get('status')!r}, not a finished run")
    if cfg["model"]["name"] != "logreg" or not cfg.get("eval_gap"):
        raise ValueError(
            f"{run}: needs model=logreg with eval_gap=true (f* and pop_gap), got "
            f"model={cfg['model']['name']} eval_gap={cfg.get('eval_gap')}"
        )
    last = int(json.loads((run / "checkpoint/state.json").read_text())["round"])
    if last != int(status.get("round", -1)):
        raise ValueError(
            f"{run}: checkpoint at round {last}, run ended at {status.get('round')}: "
            "give checkpoint_every a divisor of num_rounds"
        )
    if period is None:
        part = cfg["participation"]
        if part.get("mode") != "cyclic":
            raise ValueError(f"{run}: not a cyclic run; give --period")
        period = round(1 / float(part["fraction"]))
    overrides = [
        line[2:].strip() for line in (run / ".hydra/overrides.yaml").read_text().splitlines() if line.startswith("- ")
    ]
    return cfg, [o for o in overrides if not o.startswith(DROPPED)], last, period


def continue_run(run: Path, out: Path, overrides: list[str], last: int, period: int) -> tuple[list[float], float]:
    """Copy ``run`` into ``out`` and resume it to ``last + period`` with every round and the mean of the ``period``
    new models evaluated; (f(x^t) − f* of each new model, f(x̄) − f* of their mean)."""
    from server.report.metrics import read_metrics

    copy, end = out / run.name, last + period
    if not _continued(copy, end):  # else an earlier call finished this run
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(run, copy)
        cmd = [
            str(SIMULATION),
            *overrides,
            f"num_rounds={end}",
            f"eval_tail={period}",
            f"eval_average={period}",
            f"checkpoint_every={period}",
            "resume=true",
            "plots=false",
            f"hydra.run.dir={copy}",
            f"run_dir={copy}",
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CONTINUE_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{run}: resuming to round {end} took over {CONTINUE_TIMEOUT} s") from None
        if proc.returncode != 0:
            raise RuntimeError(
                f"{run}: resuming to round {end} failed (exit {proc.returncode}): "
                f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}"
            )
    rows = {row["round"]: row for row in read_metrics(copy)}
    return [float(rows[r]["pop_gap"]) for r in range(last + 1, end + 1)], float(rows[end]["avg_pop_gap"])


def _continued(copy: Path, end: int) -> bool:
    """Whether ``copy`` is a continuation finished at ``end`` with the gap of the mean model there."""
    from server.report.metrics import read_metrics

    status = copy / "status.json"
    if not status.is_file() or json.loads(status.read_text()) != {"status": "finished", "round": end, "reason": ""}:
        return False
    return any(row["round"] == end and row.get("avg_pop_gap") is not None for row in read_metrics(copy))


def group_of(name: str) -> str:
    """A run directory's name without its ``_seedN`` suffix: the runs whose statistics are pooled."""
    return re.sub(r"_seed\d+$", "", name)


def plot(curves: list[tuple[str, list[int], list[float], float]], path: Path) -> None:
    """Each run's per-round gaps (solid) and the gap of its mean model (dashed), one colour per run group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(group_of(name) for name, *_ in curves))
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for name, rounds, each, averaged in curves:
        group = group_of(name)
        colour = colours(groups.index(group) % 10)
        first = name == next(n for n, *_ in curves if group_of(n) == group)
        ax.plot(rounds, each, color=colour, lw=1, alpha=0.7, label=f"{group}: f(x^t) − f*" if first else None)
        ax.hlines(
            averaged,
            rounds[0],
            rounds[-1],
            colors=[colour],
            linestyles="dashed",
            lw=1.2,
            label=f"{group}: f(mean of the {len(rounds)} models) − f*" if first else None,
        )
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel("pop_gap")
    ax.set_title("One cycle past the end of each run: per-round gap and the gap of the cycle's mean model", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished convex run directories")
    parser.add_argument("--out", type=Path, required=True, help="where the continued copies are kept")
    parser.add_argument("--period", type=int, default=None, help="P: rounds averaged (default 1/C, cyclic)")
    parser.add_argument("--plot", type=Path, default=None, help="PNG of the per-round gaps and the averaged ones")
    args = parser.parse_args(argv)
    try:
        if args.period is not None and args.period < 1:
            raise ValueError(f"--period must be >= 1, got {args.period}")
        names = [run.name for run in args.runs]
        if len(set(names)) < len(names):
            raise ValueError(f"two runs share a directory name (their copies in --out would collide): {names}")
        checked = [(run, *check_run(run, args.period)) for run in args.runs]
        make_dir(args.out, "--out")  # and the plot's folder: both before any run is continued
        if args.plot is not None:
            make_dir(args.plot.parent, "--plot's folder")
    except (ValueError, KeyError, json.JSONDecodeError) as err:
        print(f"tail_average: {err}", file=sys.stderr)
        return 2
    per_round_means, of_mean, curves = [], [], []
    for run, _, overrides, last, period in checked:
        each, averaged = continue_run(run, args.out, overrides, last, period)
        curves.append((run.name, list(range(last + 1, last + period + 1)), each, averaged))
        per_round_means.append(float(np.mean(each)))
        of_mean.append(averaged)
        print(
            json.dumps(
                {
                    "run": str(run),
                    "rounds": [last + 1, last + period],
                    "gaps": each,
                    "mean_gap": per_round_means[-1],
                    "gap_of_mean_model": averaged,
                }
            ),
            flush=True,
        )
    if args.plot is not None:
        plot(curves, args.plot)
    by_group: dict[str, list[int]] = {}
    for i, (name, *_) in enumerate(curves):
        by_group.setdefault(group_of(name), []).append(i)
    for group, members in by_group.items():
        if len(members) < 2:
            print(f"{group}: one run, no confidence interval")
            continue
        means, averaged = [per_round_means[i] for i in members], [of_mean[i] for i in members]
        for name, values in (("mean gap over the P rounds", means), ("gap of the P rounds' mean model", averaged)):
            s = summarise(values)
            print(f"{group}: {name}: {s.mean:.5g} ± {s.ci:.2g} (95 % CI, n = {s.n})")
        d = paired(means, averaged)
        print(f"{group}: averaging removes {-d.mean:.5g} ± {d.ci:.2g} (paired, p = {d.p:.2g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
