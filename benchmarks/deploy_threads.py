"""Seconds per deployed round with the old torch threads (torch's default) vs local SuperNodes sharing the cores.

A local ``flower-deploy`` used to give every SuperNode's ClientApp torch's default, one intra-op
thread per core, so k nodes training at once ran k x cores threads on the host. Now each spawned SuperNode is told
max(1, cores // nodes training in one round) (``deploy.node_threads=auto``, client/threads.py). This runs the
same experiment (4 SuperNodes, full participation, IID split, J local steps of B) with

- ``deploy.node_threads=0``: no node_config torch-threads, torch's default in every ClientApp (the old behaviour);
- the default (``deploy.node_threads=auto``);
- ``client.torch_threads=1``;

``--repeat`` times, interleaved, and prints the per-round ``seconds`` of each run (selection + client work +
aggregation + server evaluation) and the torch threads each ClientApp reported in its SuperNode's log. The data
cache is warmed first, so round 1 carries no JPEG decoding.

    python -m benchmarks.deploy_threads --data /data/cifar10-jpeg.tar.gz        # docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SETTINGS = {
    "before: deploy.node_threads=0 (torch default in every node)": ["deploy.node_threads=0"],
    "after: default (deploy.node_threads=auto)": [],
    "client.torch_threads=1": ["client.torch_threads=1"],
}
USED = re.compile(r"ClientApp torch threads: (\d+)")


def _overrides(args: argparse.Namespace, cache: Path, run_dir: Path) -> list[str]:
    return [
        f"data.root={args.data.resolve()}",
        f"data.cache_dir={cache}",
        f"num_clients={args.nodes}",
        "participation.fraction=1.0",
        "data.alpha=inf",
        f"num_rounds={args.rounds}",
        f"client.local_steps={args.local_steps}",
        f"client.batch_size={args.batch_size}",
        f"eval_max_examples={args.eval_max}",
        f"run_dir={run_dir}",
        f"hydra.run.dir={run_dir}",
    ]


def _threads_used(run_dir: Path) -> str:
    """The torch thread counts the ClientApps logged (sorted, distinct), or torch's default when none was told."""
    counts = {
        int(n) for log in (run_dir / "deploy" / "logs").glob("supernode-*.log") for n in USED.findall(log.read_text())
    }
    return ",".join(map(str, sorted(counts))) if counts else f"torch default ({os.cpu_count()})"


def _run(overrides: list[str], run_dir: Path) -> dict[str, object]:
    """One flower-deploy run: wall seconds, per-round seconds, threads used."""
    t0 = time.monotonic()
    proc = subprocess.run([str(BIN / "flower-deploy"), *overrides], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"flower-deploy failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {
        "wall": time.monotonic() - t0,
        "rounds": [float(r["seconds"]) for r in rows if r["round"] >= 1],
        "threads": _threads_used(run_dir),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="CIFAR-10 ImageFolder tree or .tar.gz")
    parser.add_argument("--nodes", type=int, default=4, help="SuperNodes = clients, all training every round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--local-steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--eval-max", type=int, default=1000, help="server-side test images per round")
    parser.add_argument("--repeat", type=int, default=1, help="interleaved repetitions of the three settings")
    args = parser.parse_args()
    if not args.data.exists():
        raise SystemExit(f"--data: no such file or folder: {args.data}")
    from client.data import load_dataset

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        load_dataset("cifar10_folder", str(args.data.resolve()), str(cache))  # decode once, outside the timings
        load_before = os.getloadavg()[0]
        results: list[tuple[str, dict[str, object]]] = []
        for rep in range(args.repeat):
            for i, (label, extra) in enumerate(SETTINGS.items()):
                run_dir = Path(tmp) / f"run{rep}-{i}"
                results.append((label, _run([*_overrides(args, cache, run_dir), *extra], run_dir)))
                print(f"done: {label}", file=sys.stderr, flush=True)
    print(
        f"config: {args.nodes} SuperNodes, full participation, IID, {args.rounds} rounds, {args.local_steps} local "
        f"steps x batch {args.batch_size}, server eval on {args.eval_max} test images; {os.cpu_count()} CPUs, "
        f"1-min load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after\n"
    )
    print("| setting | ClientApp torch threads | seconds per round (rounds 1..R) | median | command wall (s) |")
    print("| --- | --- | --- | --- | --- |")
    for label, r in results:
        rounds = r["rounds"]
        print(
            f"| {label} | {r['threads']} | {' / '.join(f'{s:.1f}' for s in rounds)} | "
            f"{statistics.median(rounds):.1f} | {r['wall']:.0f} |"
        )


if __name__ == "__main__":
    main()
