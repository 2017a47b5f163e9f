"""Per-round overhead of the deployment engine (SuperLink + SuperNode processes) vs the Ray simulation.

Runs the identical Hydra config with ``flower-simulation``, with ``flower-deploy deploy.fast=false`` (stock
Flower 1.39 processes: 3 s polling, one fresh ``flwr-clientapp`` per message, state in a ``--database`` file) and
with ``flower-deploy`` (``deploy.fast=true``: short polling, warm ClientApp workers, see server/deploy/flwr_fast.py),
once with the SuperLink state in a file and once with the default (in memory for a local federation), and
reads the per-round
``seconds`` column of each run's metrics (selection + client work + aggregation + server evaluation). Round 1
carries start-up work (partition queries, first imports) and is reported apart; the overhead is the difference
of the medians of rounds 2..R. The bare client work of one round (``train_on_partition`` in this process, no
Flower) is measured too. Prints a Markdown table (docs/benchmarks.md records the figures) and the load average.

    python -m benchmarks.deploy_overhead                     # generated 32x32 data, 4 clients, 6 rounds
    python -m benchmarks.deploy_overhead --polls 0.2,0.5     # the fast mode with a 0.2 s and a 0.5 s SuperNode poll
    python -m benchmarks.deploy_overhead --idle-cpu          # CPU burnt by an idle federation of 4 SuperNodes

    python -m benchmarks.deploy_overhead --data /data/cifar10-jpeg.tar.gz --local-steps 20 --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _overrides(args: argparse.Namespace, data: Path, cache: Path, run_dir: Path) -> list[str]:
    return [
        f"data.root={data}",
        f"data.cache_dir={cache}",
        f"num_clients={args.clients}",
        f"num_rounds={args.rounds}",
        f"participation.fraction={args.fraction}",
        f"client.local_steps={args.local_steps}",
        f"client.batch_size={args.batch_size}",
        "client.torch_threads=1",
        f"eval_max_examples={args.eval_max}",
        f"run_dir={run_dir}",
        f"hydra.run.dir={run_dir}",
    ]


def engines(polls: list[float]) -> dict[str, tuple[str, list[str]]]:
    """label -> (console script, extra overrides): simulation, stock deployment (state in a file, as Flower's
    ``--database``), fast deployment with the state in a file, fast deployment (default ``deploy.database=auto``:
    in memory for this local federation) per poll interval."""
    out = {
        "flower-simulation": ("flower-simulation", []),
        "flower-deploy deploy.fast=false deploy.database=true (stock Flower)": (
            "flower-deploy",
            ["deploy.fast=false", "deploy.database=true"],
        ),
        "flower-deploy deploy.database=true (fast, state in a file)": ("flower-deploy", ["deploy.database=true"]),
    }
    for poll in polls:
        out[f"flower-deploy deploy.poll_interval={poll} (fast, default: state in memory)"] = (
            "flower-deploy",
            [f"deploy.poll_interval={poll}"],
        )
    return out


def _run(engine: str, overrides: list[str], run_dir: Path) -> dict[str, float]:
    t0 = time.monotonic()
    proc = subprocess.run([str(BIN / engine), *overrides], capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{engine} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    secs = [float(r["seconds"]) for r in rows if r["round"] >= 1]
    return {
        "wall": wall,
        "round1": secs[0],
        "median": statistics.median(secs[1:]),
        "min": min(secs[1:]),
        "max": max(secs[1:]),
    }


def _client_work(args: argparse.Namespace, data: Path, cache: Path) -> float:
    """Seconds of one round's client work done directly in this process (fraction * N clients, sequential)."""
    import torch

    from client.app import train_on_partition
    from client.models import build_model
    from server.run import config as config_lib

    cfg = {
        "model": {"name": "cnn"},
        "data": {"name": "cifar10_folder", "root": str(data), "cache_dir": str(cache), "alpha": 0.0},
        "num_clients": args.clients,
        "seed": 0,
        "client": {"batch_size": args.batch_size, "local_steps": args.local_steps, "local_epochs": 1},
    }
    config = {**config_lib.client_config(cfg), "algorithm": "fedavgm", "client-lr": 0.01, "torch-threads": 1}
    torch.manual_seed(0)
    arrays = {k: v.numpy() for k, v in build_model("cnn").state_dict().items()}
    per_round = max(1, round(args.fraction * args.clients))
    train_on_partition(config, arrays, 0)  # warm caches
    t0 = time.monotonic()
    for pid in range(per_round):
        train_on_partition(config, arrays, pid)
    return time.monotonic() - t0


def _cpu_seconds(pids: set[int]) -> dict[int, float]:
    """utime + stime of each live pid (seconds)."""
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        out[pid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _idle_cpu(fast: bool, poll: float, seconds: float = 20.0) -> tuple[float, float]:
    """CPU seconds per second used by an idle SuperLink + 4 SuperNodes: (SuperLink side, all processes)."""
    from server.deploy.federation import Federation, FederationOptions
    from server.run import procs

    with tempfile.TemporaryDirectory() as tmp:
        fed = Federation(Path(tmp) / "deploy", ROOT, FederationOptions(fast=fast, poll_interval=poll))
        try:
            fed.start_superlink()
            fed.start_supernodes(4, 4, tmp)
            fed.wait_nodes(4)
            time.sleep(5)
            table = procs.process_table()
            members = {p.name: p.members(table) for p in fed.processes()}
            before = {name: _cpu_seconds(pids) for name, pids in members.items()}
            time.sleep(seconds)
            used = {
                name: sum(v - before[name].get(pid, v) for pid, v in _cpu_seconds(pids).items()) / seconds
                for name, pids in members.items()
            }
        finally:
            fed.stop()
    return used["superlink"] + used.get("superexec", 0.0), sum(used.values())


def _idle_cpu_table(polls: list[float]) -> None:
    print(f"1-min load average {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)\n")
    print("| idle federation (SuperLink + 4 SuperNodes) | SuperLink CPU-s/s | all processes CPU-s/s |")
    print("| --- | --- | --- |")
    for label, fast, poll in [
        ("stock Flower (3 s pulls)", False, 3.0),
        *[(f"fast, poll_interval={p}", True, p) for p in polls],
    ]:
        link, total = _idle_cpu(fast, poll)
        print(f"| {label} | {link:.3f} | {total:.3f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, help="ImageFolder tree or .tar.gz (default: generated 32x32 images)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--local-steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--eval-max", type=int, default=200)
    parser.add_argument("--polls", default="0.5", help="comma-separated deploy.poll_interval values (fast mode)")
    parser.add_argument(
        "--idle-cpu",
        action="store_true",
        help="only measure the CPU use of an idle federation (SuperLink + 4 SuperNodes, no run)",
    )
    args = parser.parse_args()
    if args.idle_cpu:
        _idle_cpu_table([float(p) for p in args.polls.split(",")])
        return
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        data = args.data
        if data is None:
            from tools.datagen import make_image_folder

            data = make_image_folder(tmp_path / "data", per_class=100, test_per_class=20)
        data, cache = data.resolve(), tmp_path / "cache"
        work = _client_work(args, data, cache)
        load_before = os.getloadavg()[0]
        results = {}
        runs = engines([float(p) for p in args.polls.split(",")])
        for i, (label, (engine, extra)) in enumerate(runs.items()):
            run_dir = tmp_path / f"run{i}"
            results[label] = _run(engine, [*_overrides(args, data, cache, run_dir), *extra], run_dir)
    sim = results["flower-simulation"]
    print(
        f"config: {args.clients} clients, fraction {args.fraction}, {args.rounds} rounds, {args.local_steps} "
        f"local steps x batch {args.batch_size}, server eval on {args.eval_max} test images, torch_threads=1; "
        f"1-min load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after ({os.cpu_count()} CPUs)\n"
    )
    print("| engine | command wall (s) | round 1 (s) | rounds 2..R median (min-max) (s) | overhead vs simulation |")
    print("| --- | --- | --- | --- | --- |")
    for name, r in results.items():
        over = f"{r['median'] - sim['median']:+.2f} s (x{r['median'] / sim['median']:.2f})"
        print(
            f"| {name} | {r['wall']:.1f} | {r['round1']:.1f} | {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f}) "
            f"| {over} |"
        )
    print(f"\nclient work of one round in-process (no Flower): {work:.2f} s")


if __name__ == "__main__":
    main()
