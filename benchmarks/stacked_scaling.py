"""Throughput of one stacked program as its group grows: 1, 8, 32 and 64 jobs of logistic regression (the convex
study's setting), the CNN and ResNet-20 (paper 1's presets: 100 one-class clients, cyclic C = 0.1, one epoch of
B = 64), each group run by the stacked launcher's program on ``engine=batched`` (jobs: FedAvg, FedCM, GHBM, FedHBM
in turn, a seed per four jobs).

    python -m benchmarks.stacked_scaling --data cifar10-jpeg.tar.gz --out /tmp/scaling          # every model, 1-64
    python -m benchmarks.stacked_scaling --data cifar10-jpeg.tar.gz --models logreg --jobs 1 8 20
    python -m benchmarks.stacked_scaling --smoke --out /tmp/scaling      # tiny generated data: the pipeline only

For each (model, jobs) it reports the median seconds of a group's training round (rounds 3..R that evaluate
nothing) and of a round that also evaluates every job, job-rounds/s, and for the networks the training FLOP/s: a
client step's FLOPs (torch's ``FlopCounterMode`` on a forward and backward pass of one batch) times the images of a
round, against a float32 matrix product measured on the same device in the same run (TF32 off, as the engine
trains). The forward passes of ``loss_before`` are not counted. From the best rate measured it projects the convex
study (39,500 tuning and 550,000 final job-rounds, f(x) in 4 % of them) and paper 1's Figure 1 with the CNN
(4 methods x 5 seeds x 10,000 rounds, the preset's evaluation every round at the evaluation round's cost):
projections, not runs.

The logistic-regression jobs evaluate ``pop_gap`` as the study does (one pass over the float64 training set for
every job's model); its f* is solved once and cached under ``--out``/cache (copy a cache's ``optimum/`` there to
skip the solve). Without ``--data`` the images are generated (CIFAR-10's size: 5,000 a class). Writes
``scaling.json`` (each measurement as it is made) and ``scaling.md``; a measurement that would start after
``--budget`` seconds is listed as skipped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.stacked_sweep import METHODS, composed
from server.batched.engine import device_of
from server.stacked.launch import run_jobs

MODELS = ("logreg", "cnn", "resnet20")
STUDY_ROUNDS, STUDY_EVAL_SHARE = 39_500 + 550_000, 0.04  # docs/convex.md "Cost": pop_gap in 200 of 5,000 rounds
FIGURE1_JOB_ROUNDS = 4 * 5 * 10_000


def job_overrides(model: str, index: int, run_dir: Path, data: str, cache: str, args: argparse.Namespace) -> list[str]:
    method, seed = METHODS[index % len(METHODS)], index // len(METHODS)
    common = [f"run_dir={run_dir}", f"seed={seed}", "plots=false", f"num_rounds={args.rounds}", "eval_every=2"]
    common.append("overwrite=true")  # a measurement run again into the same --out replaces the last one
    common += [f"checkpoint_every={args.rounds}", f"data.root={data}", f"data.cache_dir={cache}", "engine=batched"]
    if model == "logreg":
        setting = ["+sweep=convex_seed000", f"method={method}", "eval_tail=0"]
    else:
        setting = [f"+experiment={method}_{model}"]
    smoke = ["num_clients=6", "participation.fraction=0.5", "client.batch_size=8"] if args.smoke else []
    return [*setting, *common, "data=cifar10_folder", *smoke]


def round_seconds(run_dir: Path) -> tuple[float, float | None]:
    """Medians of a job's training-only and evaluated rounds' seconds, from round 3 on (the first rounds warm up)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    later = [r for r in rows if r["round"] >= 3] or [r for r in rows if r["round"] >= 1]
    train = [r["seconds"] for r in later if r.get("accuracy") is None]
    evaluated = [r["seconds"] for r in later if r.get("accuracy") is not None]
    return statistics.median(train or evaluated), statistics.median(evaluated) if evaluated else None


def images_per_round(run_dir: Path) -> float:
    """A round's clients x their mean examples (one epoch each)."""
    cfg = json.loads((run_dir / "config.json").read_text())
    totals = [int(line.rsplit(",", 1)[1]) for line in (run_dir / "partition.csv").read_text().splitlines()[1:]]
    return round(cfg["num_clients"] * cfg["participation"]["fraction"]) * sum(totals) / len(totals)


def train_flops_per_image(model_name: str, batch: int) -> float:
    """FLOPs of one training step (forward, loss, backward) per image, counted by torch."""
    from torch.utils.flop_counter import FlopCounterMode

    from client.models import build_model

    model = build_model(model_name)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    return counter.get_total_flops() / batch


def gemm_tflops(device: torch.device) -> float:
    """float32 matrix product rate on ``device`` (TF32 off), TFLOP/s."""
    n = 8192 if device.type == "cuda" else 2048
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        times = []
        for _ in range(6):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            a @ b
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return 2 * n**3 / min(times[1:]) / 1e12
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def measure(model: str, jobs: int, out: Path, data: str, args: argparse.Namespace, gemm: float) -> dict[str, Any]:
    root = out / model / f"jobs{jobs}"
    cfgs = [composed(job_overrides(model, i, root / f"job{i}", data, str(out / "cache"), args)) for i in range(jobs)]
    start = time.perf_counter()
    outcomes = run_jobs(cfgs)
    wall = time.perf_counter() - start
    failed = [o.message for o in outcomes if o.status != "finished"]
    if failed:
        return {"model": model, "jobs": jobs, "error": failed[0]}
    train, evaluated = round_seconds(root / "job0")
    row: dict[str, Any] = {"model": model, "jobs": jobs, "wall_s": wall, "train_round_s": train}
    row["eval_round_s"] = evaluated
    row["job_rounds_per_s"] = jobs / train
    if model != "logreg":
        flops = images_per_round(root / "job0") * train_flops_per_image(model, cfgs[0]["client"]["batch_size"])
        row["train_tflops"] = jobs * flops / train / 1e12
        row["percent_of_gemm"] = 100 * row["train_tflops"] / gemm
    return row


def projections(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model, job_rounds, eval_share, what in (
        ("logreg", STUDY_ROUNDS, STUDY_EVAL_SHARE, "convex_study_hours"),
        ("cnn", FIGURE1_JOB_ROUNDS, 1.0, "figure1_cnn_hours"),
    ):
        done = [r for r in rows if r["model"] == model and "train_round_s" in r]
        if not done:
            continue
        best = max(done, key=lambda r: r["job_rounds_per_s"])
        extra = (best["eval_round_s"] or best["train_round_s"]) - best["train_round_s"]
        seconds = job_rounds * (best["train_round_s"] + eval_share * extra) / best["jobs"]
        out[what] = {"hours": seconds / 3600, "from_jobs": best["jobs"]}
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = [f"Device: {report['device']}; float32 matrix product {report['gemm_tflops']:.2f} TFLOP/s (TF32 off).", ""]
    lines += [
        "| model | jobs | training round | evaluated round | job-rounds/s | training TFLOP/s | % of the product |"
    ]
    lines += ["| --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["rows"]:
        if "train_round_s" not in r:
            lines.append(f"| {r['model']} | {r['jobs']} | {r.get('error', 'skipped (budget)')} | | | | |")
            continue
        ev = f"{r['eval_round_s']:.3f} s" if r["eval_round_s"] is not None else "-"
        tf = f"{r['train_tflops']:.2f}" if "train_tflops" in r else "-"
        pc = f"{r['percent_of_gemm']:.0f} %" if "percent_of_gemm" in r else "-"
        lines.append(f"| {r['model']} | {r['jobs']} | {r['train_round_s']:.3f} s | {ev} | "
                     f"{r['job_rounds_per_s']:.1f} | {tf} | {pc} |")  # fmt: skip
    for what, p in report["projections"].items():
        lines.append(f"\nProjected {what.removesuffix('_hours').replace('_', ' ')}: {p['hours']:.2f} h "
                     f"(from the {p['from_jobs']}-job rate; not run)")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="run dirs, scaling.json and scaling.md")
    parser.add_argument("--data", help="CIFAR-10 ImageFolder tree or .tar.gz (default: generated images)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--budget", type=float, default=480.0, help="seconds after which no measurement starts")
    parser.add_argument("--smoke", action="store_true", help="6 clients of generated data, B = 8: seconds on a CPU")
    args = parser.parse_args(argv)
    if min(args.jobs) < 1 or args.rounds < 3:
        parser.error("--jobs must be >= 1 and --rounds >= 3")
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.data
    if data is None:
        from tools.datagen import make_image_folder

        per_class = 12 if args.smoke else 5000
        data = str(args.out / f"images{per_class}")
        if not Path(data).exists():
            make_image_folder(data, per_class=per_class, test_per_class=max(4, per_class // 5), seed=1)
    device = device_of(composed(job_overrides("logreg", 0, args.out / "probe", data, str(args.out / "cache"), args)))
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    report["gemm_tflops"] = gemm_tflops(device)
    report["rows"] = []
    for model in args.models:
        for jobs in args.jobs:
            if time.perf_counter() - started > args.budget:
                report["rows"].append({"model": model, "jobs": jobs, "skipped": "budget"})
                continue
            report["rows"].append(measure(model, jobs, args.out, data, args, report["gemm_tflops"]))
            print(json.dumps(report["rows"][-1]), flush=True)
            (args.out / "scaling.json").write_text(json.dumps(report, indent=1))
    report["projections"] = projections(report["rows"])
    (args.out / "scaling.json").write_text(json.dumps(report, indent=1))
    (args.out / "scaling.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
