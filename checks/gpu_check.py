"""GPU readiness check: the CNN and ResNet-20 presets on CUDA, in simulation and in a plain loop.

    python -m checks.gpu_check                            # generated data, results in ./gpu_check/
    python -m checks.gpu_check --data /data/cifar10-jpeg.tar.gz --rounds 4 --out /tmp/gpu

Without CUDA it prints that it skipped and exits 0. On a CUDA machine, for each preset (``fedavg_cnn``,
``fedavg_resnet20``: 100 clients, C = 0.1, 1 epoch, B = 64, the paper's learning rates):

1. a plain loop (``benchmarks.sim_overhead.plain_loop``: the round's 10 clients one after another in this process,
   FedAvg on the server) checks that the clients' model parameters live on CUDA and reports images/s per
   client (examples x epochs / the client's own train-time) and seconds per round;
2. ``flower-simulation`` with ``backend.num_gpus`` 0.25 (4 clients share a GPU) and 1.0 runs the same
   rounds; it checks that the run finished, that its ClientApp actors said they train on CUDA (the line
   ``pid N trains on cuda:K (...)`` that ``client.train`` logs once per process on a GPU) and that the
   model learned (server-side test accuracy moved between round 0 and the last round, or at least the test
   loss fell); it reports seconds per round (median
   of rounds 2..R; round 1 pays Ray's and CUDA's start-up), rounds/s, images/s of a round, and the
   simulation / plain-loop overhead ratio;
3. ``flower-simulation engine=batched`` (the round's clients stacked on the GPU) runs the same rounds, with the
   same checks, and reports its rounds/s, its ratio to the Ray runs and the peak GPU memory it allocated; then
   ``engine.vectorize=false`` (the ClientApp's own code trains each client on the GPU in turn: what one Ray actor
   with a GPU does, without Ray);
4. (run first) the convex study's run (``+sweep=convex_seed000``: logreg, 100 one-class clients, cyclic C = 0.1, GHBM at
   η = 1, η_l = 0.001, ``eval_train=true``, f(x) every 50 rounds and every one of the last 100) for ``--convex-rounds``
   rounds on the batched engine, on CUDA and on this machine's CPU (a fifth of the rounds): seconds per round and
   the wall time of the run. ``eval_gap=false``: the f(x) evaluations cost the same without f*, whose solve would
   take minutes.

When Ray is not installed (a GPU box that only has the batched engine), the ``backend.num_gpus`` runs are reported
as skipped and not checked.

The data is split IID (``data.alpha=inf``) instead of the presets' one class per client, whose test accuracy
needs many more than a few rounds to move; everything else is the preset's. Both engines use one torch thread
per client (``client.torch_threads=1``), as the simulation's actors do with ``backend.num_cpus=1``.

Writes ``<out>/gpu_check.json`` and ``<out>/gpu_check.md`` and prints the Markdown; exits 1 if a check
failed. ``--data`` falls back to generated CIFAR-like JPEGs (class colour + noise, so accuracy can move)
when the path does not exist. ``--cpu-smoke`` runs the same pipeline on CPU (``backend.num_gpus=0``, device
checks skipped; the batched engine in one process, ``engine.workers=1``, as it runs on a GPU): the test suite uses
it, since no GPU is available there. No run writes PNGs (``plots=false``): the check reads the metrics only.
Budget: ``--budget`` seconds (default 480); steps that no longer fit are reported as skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PRESETS = {"fedavg_cnn": ("cnn", 1.5, 0.01), "fedavg_resnet20": ("resnet20", 1.0, 0.5)}  # model, eta, eta_l
CUDA_LINE = re.compile(r"pid (\d+) trains on cuda")
ALPHA = float("inf")  # IID: accuracy moves within a few rounds
BATCHED = {"batched": "engine=batched", "batched_seq": "engine=batched engine.vectorize=false"}
CONVEX = [
    "+sweep=convex_seed000",
    "method=ghbm",
    "strategy.server_lr=1.0",
    "strategy.client_lr=0.001",
    "eval_gap=false",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="CIFAR-10 ImageFolder tree or .tar.gz (default, or when it does not exist: generated data)",
    )
    parser.add_argument("--out", type=Path, default=Path("gpu_check"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    parser.add_argument(
        "--shares",
        nargs="*",
        type=float,
        help="backend.num_gpus values of the Ray runs (default 0.25 1.0; --cpu-smoke: 0); none: no Ray run",
    )
    parser.add_argument("--generated-per-class", type=int, default=1000, help="train images per class")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole check")
    parser.add_argument("--cpu-smoke", action="store_true", help="run the pipeline on CPU (no device checks)")
    parser.add_argument("--convex-rounds", type=int, default=1000, help="rounds of the convex run on CUDA (0: none)")
    args = parser.parse_args(argv)
    bad_shares = any(not s >= 0 for s in args.shares or [])  # nan too
    if args.rounds < 2 or args.convex_rounds < 0 or args.budget <= 0 or bad_shares or args.generated_per_class < 1:
        parser.error(
            "--rounds must be >= 2 (round 1 pays the start-up), --convex-rounds >= 0, --budget > 0, --shares >= 0 "
            "and --generated-per-class >= 1"
        )

    import torch

    if not torch.cuda.is_available() and not args.cpu_smoke:
        print(
            "gpu_check: skipped: no CUDA device is visible (torch.cuda.is_available() is False); "
            "run it on a GPU machine"
        )
        return 0
    deadline = time.time() + args.budget
    shares = args.shares if args.shares is not None else [0.0] if args.cpu_smoke else [0.25, 1.0]
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        data = _data(args.data, Path(tmp), args.generated_per_class)
        report: dict[str, Any] = {
            "environment": _environment(args.cpu_smoke),
            "data": str(data),
            "rounds": args.rounds,
            "runs": [],
            "checks": [],
        }
        if args.convex_rounds:  # first: the 90-minute horizon hangs on this number
            _check_convex(report, data, Path(tmp), args.convex_rounds, args.cpu_smoke, deadline)
        for preset in args.presets:
            _check_preset(report, preset, data, Path(tmp), args.rounds, shares, args.cpu_smoke, deadline)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    markdown = _markdown(report)
    (args.out / "gpu_check.md").write_text(markdown)
    print(markdown)
    return 0 if all(c["ok"] for c in report["checks"]) else 1


def _check_preset(
    report: dict[str, Any],
    preset: str,
    data: Path,
    tmp: Path,
    rounds: int,
    shares: list[float],
    cpu_smoke: bool,
    deadline: float,
) -> None:
    """The plain loop, then one simulation per GPU share; runs and checks are appended to ``report``."""
    plain = _plain(preset, data, tmp / "cache", rounds, deadline)
    report["runs"].append(plain)
    smoke = " (not checked: --cpu-smoke)" if cpu_smoke else ""
    device = plain.get("param_device", "skipped")
    _check(report, f"{preset} plain loop: parameters on CUDA", device.startswith("cuda") or cpu_smoke, device + smoke)
    for share in [*shares, "batched", "batched_seq"]:
        if share not in BATCHED and importlib.util.find_spec("ray") is None:
            report["runs"].append(
                {
                    "preset": preset,
                    "engine": "flower-simulation",
                    "num_gpus": share,
                    "skipped": "Ray is not installed here",
                }
            )
            continue
        sim = _simulation(preset, share, data, tmp, rounds, deadline, cpu_smoke)
        if "s_per_round" in sim and "s_per_round" in plain:
            sim["overhead_vs_plain"] = sim["s_per_round"] / plain["s_per_round"]
        report["runs"].append(sim)
        label = f"{preset} simulation " + (BATCHED[share] if share in BATCHED else f"num_gpus={share:g}")
        _check(report, f"{label}: finished", sim.get("returncode") == 0, sim.get("error", sim.get("skipped", "")))
        _check(
            report,
            f"{label}: actors trained on CUDA",
            sim.get("cuda_actors", 0) > 0 or cpu_smoke,
            f"{sim.get('cuda_actors', 0)} actor processes reported CUDA{smoke}",
        )
        _check(
            report,
            f"{label}: the model learned",
            _learned(sim),
            f"accuracy {sim.get('accuracy_first')} -> {sim.get('accuracy_last')}, "
            f"loss {sim.get('loss_first')} -> {sim.get('loss_last')}",
        )


def _environment(cpu_smoke: bool) -> dict[str, Any]:
    import torch

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "device": "cpu (smoke run)" if cpu_smoke else torch.cuda.get_device_name(0),
    }
    if not cpu_smoke:
        env["cuda"] = torch.version.cuda
        env["gpus"] = torch.cuda.device_count()
    return env


def _data(path: Path | None, tmp: Path, per_class: int) -> Path:
    if path is not None and path.exists():
        return path.resolve()
    from tools.datagen import make_image_folder

    print(f"gpu_check: no data at {path}: generating {per_class} train images per class", file=sys.stderr)
    return make_image_folder(tmp / "generated", per_class=per_class, test_per_class=max(1, per_class // 5), seed=0)


def _plain(preset: str, data: Path, cache: Path, rounds: int, deadline: float) -> dict[str, Any]:
    """The plain loop on the chosen device, plus the device of the clients' parameters and the accuracy."""
    if time.time() > deadline:
        return {"preset": preset, "engine": "plain loop", "skipped": "budget exhausted"}
    import numpy as np

    from benchmarks.sim_overhead import plain_loop
    from client.app import get_model
    from client.data import load_dataset
    from client.train import evaluate, load_arrays

    model_name, server_lr, client_lr = PRESETS[preset]
    ds = load_dataset("cifar10_folder", data, cache)
    start = plain_loop(data, cache, 0, model_name, server_lr, client_lr, threads=1, alpha=ALPHA).weights
    run = plain_loop(data, cache, rounds, model_name, server_lr, client_lr, threads=1, alpha=ALPHA)
    device = next(get_model(model_name, ds.num_classes).parameters()).device  # the model the clients used
    model = get_model(model_name, ds.num_classes)
    scores = []  # (loss, accuracy) of theta^0 and of the last round's model on the test split
    for weights in (start, run.weights):
        load_arrays(model, [np.asarray(w) for w in weights])
        scores.append(evaluate(model, ds.x_test, ds.y_test, ds.mean, ds.std)[:2])
    return {
        "preset": preset,
        "engine": "plain loop",
        "param_device": str(device),
        "s_per_round": statistics.median(run.seconds[1:] or run.seconds),
        "seconds": run.seconds,
        "images_per_s_per_client": sum(run.client_images) / sum(run.client_seconds),
        "loss_first": scores[0][0],
        "loss_last": scores[1][0],
        "accuracy_first": scores[0][1],
        "accuracy_last": scores[1][1],
    }


def _simulation(
    preset: str, share: float | str, data: Path, tmp: Path, rounds: int, deadline: float, cpu_smoke: bool = False
) -> dict[str, Any]:
    """One flower-simulation run: the Ray engine with ``backend.num_gpus=share``, or ``share`` in :data:`BATCHED`."""
    left = deadline - time.time()
    batched = share in BATCHED
    result: dict[str, Any] = {
        "preset": preset,
        "engine": share if batched else "flower-simulation",
        "num_gpus": "-" if batched else share,
    }
    if left < 30:
        result["skipped"] = "budget exhausted"
        return result
    run_dir = tmp / f"{preset}-{share}"
    engine = (
        [*BATCHED[share].split(), *(["engine.workers=1"] if cpu_smoke else [])]
        if batched
        else [f"backend.num_gpus={share}", "client.torch_threads=1"]
    )
    cmd = [
        *flower_simulation(),
        f"+experiment={preset}",
        f"data.root={data}",
        f"data.cache_dir={tmp / 'cache'}",
        f"num_rounds={rounds}",
        f"eval_every={rounds}",
        f"checkpoint_every={rounds}",
        f"data.alpha={ALPHA}",
        "plots=false",
        *engine,
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "RAY_ADDRESS": "local", "FLWR_TELEMETRY_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=left, env=env)
    except subprocess.TimeoutExpired:
        result.update(returncode=None, error=f"still running after {left:.0f} s (budget)")
        return result
    result.update(
        returncode=proc.returncode,
        wall_s=time.time() - t0,
        cuda_actors=len(set(CUDA_LINE.findall(proc.stdout + proc.stderr))),
    )
    if proc.returncode != 0:
        result["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return result
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    seconds = [r["seconds"] for r in rows if r["round"] >= 1]
    evaluated = [r for r in rows if r.get("accuracy") is not None]
    images = _images_per_round(run_dir)
    s_round = statistics.median(seconds[1:] or seconds)
    summary = json.loads((run_dir / "summary.json").read_text())
    if summary.get("peak_cuda_memory_mib") is not None:
        result["peak_cuda_memory_mib"] = summary["peak_cuda_memory_mib"]
    result.update(
        seconds=seconds,
        s_per_round=s_round,
        rounds_per_s=1.0 / s_round,
        images_per_s=images / s_round,
        accuracy_first=evaluated[0]["accuracy"],
        accuracy_last=evaluated[-1]["accuracy"],
        loss_first=evaluated[0]["loss"],
        loss_last=evaluated[-1]["loss"],
    )
    return result


def flower_simulation() -> list[str]:
    """The ``flower-simulation`` beside this Python, else its module (a project on PYTHONPATH, not installed)."""
    script = Path(sys.executable).parent / "flower-simulation"
    return [str(script)] if script.exists() else [sys.executable, "-m", "server.run.cli"]


def _check_convex(report: dict[str, Any], data: Path, tmp: Path, rounds: int, cpu_smoke: bool, deadline: float) -> None:
    """The convex study's run on the batched engine: on CUDA (``rounds``) and on this machine's CPU (a fifth)."""
    devices = [("cpu", max(rounds // 5, 2))] if cpu_smoke else [("cuda", rounds), ("cpu", max(rounds // 5, 2))]
    for device, n in devices:
        left = deadline - time.time()
        result: dict[str, Any] = {"preset": "convex_seed000", "engine": f"batched {device}", "num_gpus": "-"}
        report["runs"].append(result)
        if left < 30:
            result["skipped"] = "budget exhausted"
            continue
        run_dir = tmp / f"convex-{device}"
        cmd = [
            *flower_simulation(),
            *CONVEX,
            f"data.root={data}",
            f"data.cache_dir={tmp / 'cache'}",
            f"num_rounds={n}",
            f"eval_tail={min(100 if device == 'cuda' else 10, n)}",
            f"checkpoint_every={n}",
            "plots=false",
            f"engine.device={device}",
            f"hydra.run.dir={run_dir}",
        ]
        t0 = time.time()
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=left, env={**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
            )
        except subprocess.TimeoutExpired:
            result.update(error=f"still running after {left:.0f} s (budget)")
            continue
        result.update(returncode=proc.returncode, wall_s=time.time() - t0, rounds=n)
        if proc.returncode == 0:
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            plain = [r["seconds"] for r in rows if r["round"] >= 2 and r.get("pop_loss") is None]
            evaluated = [r["seconds"] for r in rows if r["round"] >= 2 and r.get("pop_loss") is not None]
            s_round = statistics.median(plain or evaluated)
            eval_s = statistics.median(evaluated) - s_round if evaluated else 0.0
            result.update(
                s_per_round=s_round,
                eval_s=eval_s,
                rounds_per_s=1.0 / s_round,
                run_s=rows[-1]["elapsed"],
                pop_loss_last=rows[-1].get("pop_loss"),
                projected_5000_s=5000 * s_round + 150 * eval_s,
            )  # the study's run: 150 evaluations
        else:
            result["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        _check(report, f"convex run on {device}: finished", proc.returncode == 0, result.get("error", ""))


def _images_per_round(run_dir: Path) -> float:
    """Clients per round x their mean examples (partition.csv totals; equal quotas): one epoch each."""
    cfg = json.loads((run_dir / "config.json").read_text())
    totals = [int(line.rsplit(",", 1)[1]) for line in (run_dir / "partition.csv").read_text().splitlines()[1:]]
    return round(cfg["num_clients"] * cfg["participation"]["fraction"]) * sum(totals) / len(totals)


def _learned(run: dict[str, Any]) -> bool:
    """Test accuracy moved, or at least the test loss fell (argmax may lag in a few rounds)."""
    if "loss_last" not in run:
        return False
    return run["accuracy_last"] != run["accuracy_first"] or run["loss_last"] < run["loss_first"]


def _check(report: dict[str, Any], name: str, ok: bool, detail: Any) -> None:
    report["checks"].append({"check": name, "ok": bool(ok), "detail": str(detail)})


def _markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        f"# GPU check: {env['device']}",
        "",
        f"torch {env['torch']}, CUDA {env.get('cuda', '-')}, {env.get('gpus', 0)} GPUs, {env['cpus']} CPUs; "
        f"data {report['data']}; {report['rounds']} rounds per run",
        "",
        "| preset | engine | num_gpus | s/round | rounds/s | images/s per client | images/s per round | "
        "accuracy first → last | loss first → last | CUDA actors | sim / plain | peak GPU MiB |",
        "|" + " --- |" * 12,
    ]
    for r in report["runs"]:
        if r["preset"] == "convex_seed000" and "skipped" not in r:
            continue  # its own table below
        if "skipped" in r:
            lines.append(
                f"| {r['preset']} | {r['engine']} | {r.get('num_gpus', '-')} | skipped: {r['skipped']} |" + " |" * 7
            )
            continue
        lines.append(
            "| {} | {} | {} | {} | {} | {} | {} | {} → {} | {} → {} | {} | {} | {} |".format(
                r["preset"],
                r["engine"],
                r.get("num_gpus", "-"),
                _fmt(r.get("s_per_round")),
                _fmt(r.get("rounds_per_s")),
                _fmt(r.get("images_per_s_per_client"), ".0f"),
                _fmt(r.get("images_per_s"), ".0f"),
                _fmt(r.get("accuracy_first")),
                _fmt(r.get("accuracy_last")),
                _fmt(r.get("loss_first"), ".4f"),
                _fmt(r.get("loss_last"), ".4f"),
                r.get("cuda_actors", r.get("param_device", "-")),
                _fmt(r.get("overhead_vs_plain")),
                _fmt(r.get("peak_cuda_memory_mib"), ".0f"),
            )
        )
    convex = [r for r in report["runs"] if r["preset"] == "convex_seed000" and "skipped" not in r]
    if convex:
        lines += [
            "",
            "Convex study run (GHBM, η = 1, η_l = 0.001; a round without evaluation, one f(x) evaluation, "
            "and a 5,000-round study run projected with its 150 evaluations):",
            "",
            "| engine | rounds | s/round | s per evaluation | run s | wall s (with start-up) | "
            "projected 5,000 rounds s | pop_loss last |",
            "|" + " --- |" * 8,
        ]
        lines += [
            f"| {r['engine']} | {r.get('rounds', '-')} | {_fmt(r.get('s_per_round'))} | "
            f"{_fmt(r.get('eval_s'))} | "
            f"{_fmt(r.get('run_s'), '.1f')} | {_fmt(r.get('wall_s'), '.1f')} | "
            f"{_fmt(r.get('projected_5000_s'), '.0f')} | {_fmt(r.get('pop_loss_last'), '.5f')} |"
            for r in convex
        ]
    lines += ["", "| check | ok | detail |", "| --- | --- | --- |"]
    lines += [f"| {c['check']} | {'yes' if c['ok'] else '**NO**'} | {c['detail']} |" for c in report["checks"]]
    return "\n".join(lines) + "\n"


def _fmt(value: Any, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


if __name__ == "__main__":
    sys.exit(main())
