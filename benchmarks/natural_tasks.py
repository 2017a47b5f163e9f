"""Load time, memory and seconds per round of paper 2's tasks on local copies of their real size.

For each task this writes (once; reused while its size is unchanged) a local copy in the hub schema under
``--out`` (``tools/natural_datagen.py``'s ``write_<task>_copy``: parquet files, rows grouped by client), then
measures, each in a fresh subprocess running the project's own loading path (``client.datasets.load_task``, what
``flower-simulation`` runs while validating its config):

- first load: the parquet -> Arrow conversion (``client.datasets.base._from_parquet``, into
  ``HF_DATASETS_CACHE``, emptied first),
  partitioning with the task's flwr-datasets partitioner and encoding into the memory-mapped cache (emptied
  first): wall seconds, peak RSS (``VmHWM``: counts the file pages the process maps, Arrow input and ``.npy``
  output) and peak anonymous memory (``RssAnon`` sampled every 20 ms: the process's own copies), both against
  the baseline after the imports a run has (torch, datasets, flwr-datasets, the task modules), for the
  conversion and for partition + encode (VmHWM reset between them);
- encode alone: partition + encode in a fresh process whose conversion is cached (the project's own peak,
  without the memory the Arrow pool keeps from the conversion);
- cache hit: the same call once the cache entry exists;
- sizes: the copy on disk, the Arrow conversion, the cache entry and the bytes of the arrays the loader returns
  (``data bytes``); "one copy of the data per process" holds when peak anon - baseline <= data bytes plus the
  partitioner's index tables (int64 per row);

and seconds per round of ``flower-simulation +experiment=seed001_<task> data.root=<copy> num_rounds=R`` on each
engine (``metrics.csv`` ``seconds``; round 1 reported apart, the median over rounds 2..R). The presets run as they
are except ``eval_train=false eval_max_examples=1000``: the population loss and the test set are evaluated at
round 0 (outside every round's seconds) and at round R only when R < ``eval_every`` (10), so this only shortens the
run (R's evaluation is in its seconds; the median over rounds 2..R is the training rounds').

Real sizes (``--scale 1``): FEMNIST 814,277 rows of 3,597 writers (flwrlabs/femnist: the hub's "814k" rows,
client/datasets/femnist.py's writer count); Shakespeare 4,226,158 rows of 1,129 roles (LEAF's full Shakespeare,
which flwrlabs/shakespeare is: 4.23M rows on the hub); CIFAR-100 50,000 train + 10,000 test images, 500 clients
of 100 (Reddi et al. 2021 App. C.2); Stack Overflow 342,477 users, 135,818,730 sentences (TFF, Reddi et al. 2021
Table) generated at ``--so-fraction`` (default 0.01) of its users and rows.

    python -m benchmarks.natural_tasks --out /data/natdata                       # every task, 3 rounds, batched
    python -m benchmarks.natural_tasks --out /data/natdata --tasks femnist --engines batched,ray --rounds 4
    python -m benchmarks.natural_tasks --out /tmp/nat --scale 0.01 --measure load  # a quick look
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

TASKS = ("femnist", "shakespeare", "cifar100", "stackoverflow_nwp", "stackoverflow_tp")
ENGINES = ("batched", "ray")
MEASURES = ("load", "rounds")
LOAD_MODES = ("first", "encode", "hit")  # measure_load's modes, in the order they run
# copy name, train rows, clients of the real data (see the module docstring for the sources)
REAL = {
    "femnist": ("femnist", 814_277, 3_597),
    "shakespeare": ("shakespeare", 4_226_158, 1_129),
    "cifar100": ("cifar100", 50_000, 500),
    "stackoverflow": ("stackoverflow", 135_818_730, 342_477),
}
CIFAR100_TEST = 10_000


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (and exit 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"natural_tasks.py: error: {message}\n")
        raise SystemExit(2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Options, every one checked before any work (a bad one: one line on stderr, exit 2)."""
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder of the copies, caches, run dirs and results (not in the repo)")
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, of {','.join(TASKS)}")
    p.add_argument("--rounds", type=int, default=3, help="rounds per flower-simulation run (>= 2)")
    p.add_argument("--scale", type=float, default=1.0, help="fraction of each task's real size, in (0, 1]")
    p.add_argument("--so-fraction", type=float, default=0.01, help="Stack Overflow's fraction of users and rows")
    p.add_argument("--engines", default="batched", help=f"comma-separated, of {','.join(ENGINES)}")
    p.add_argument("--measure", default=",".join(MEASURES), help=f"comma-separated, of {','.join(MEASURES)}")
    p.add_argument(
        "--load-modes",
        default=",".join(LOAD_MODES),
        help=f"the loads of --measure load, comma-separated, of {','.join(LOAD_MODES)} (a full-size "
        "Stack Overflow first load takes 10-25 min on 2 cores)",
    )
    p.add_argument("--child-load", nargs=3, metavar=("TASK", "ROOT", "CACHE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_load:
        return args
    if not args.out:
        p.error("the following arguments are required: --out")
    for key, allowed in (("tasks", TASKS), ("engines", ENGINES), ("measure", MEASURES), ("load_modes", LOAD_MODES)):
        values = [v for v in getattr(args, key).split(",") if v]
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            p.error(f"--{key.replace('_', '-')}: {bad[0] if bad else 'nothing'!r} is not one of {','.join(allowed)}")
        setattr(args, key, values)
    if args.rounds < 2:
        p.error(f"--rounds must be >= 2 (round 1 carries start-up), got {args.rounds}")
    for key in ("scale", "so_fraction"):
        if not 0 < getattr(args, key) <= 1:
            p.error(f"--{key.replace('_', '-')} must be in (0, 1], got {getattr(args, key)}")
    args.out = Path(args.out).expanduser().absolute()
    if args.out == ROOT or ROOT in args.out.parents:
        p.error(f"--out {args.out} is inside the repository; give a folder outside it")
    return args


# --------------------------------------------------------------------------- copies
def copy_sizes(task: str, scale: float, so_fraction: float) -> tuple[str, int, int]:
    """(copy name, train rows, clients) of ``task``'s copy at ``scale`` of the real size."""
    name, rows, clients = REAL["stackoverflow" if task.startswith("stackoverflow") else task]
    f = scale * (so_fraction if name == "stackoverflow" else 1.0)
    if name == "cifar100":  # whole clients of 100 images
        return name, max(1, round(clients * f)) * 100, max(1, round(clients * f))
    return name, max(1, round(rows * f)), max(1, round(clients * f))


def ensure_copy(out: Path, task: str, scale: float, so_fraction: float) -> tuple[Path, float | None]:
    """The copy's folder, written unless one of the same size is there; (folder, seconds spent writing)."""
    import tools.natural_datagen as gen

    name, rows, clients = copy_sizes(task, scale, so_fraction)
    path = out / "copies" / name
    marker = {"rows": rows, "clients": clients}
    done = path / "DONE.json"
    if done.exists() and json.loads(done.read_text()) == marker:
        return path, None
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    if name == "cifar100":
        gen.write_cifar100_copy(path, rows, max(100, round(CIFAR100_TEST * scale)))
    else:
        getattr(gen, f"write_{name}_copy")(path, rows, clients)
    done.write_text(json.dumps(marker))
    return path, time.perf_counter() - t0


def du(path: Path) -> int:
    """Bytes of the files under ``path`` (0 when absent)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


# --------------------------------------------------------------------------- load measurement (child process)
def proc_status() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile of this process, in bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


class PeakSampler(threading.Thread):
    """Largest RssAnon seen, read every ``interval`` seconds until :meth:`stop`."""

    def __init__(self, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.interval, self.peak_anon, self._done = interval, 0, threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            self.peak_anon = max(self.peak_anon, proc_status()["RssAnon"])
            self._done.wait(self.interval)

    def stop(self) -> int:
        self._done.set()
        self.join()
        self.peak_anon = max(self.peak_anon, proc_status()["RssAnon"])
        return self.peak_anon


def child_load(task: str, root: str, cache: str) -> dict[str, Any]:
    """One ``load_task`` in this fresh process, with the imports of a ``flower-simulation`` process first."""
    import datasets  # noqa: F401
    import flwr_datasets  # noqa: F401
    import torch  # noqa: F401

    from client.datasets import load_task, spec
    from client.datasets.base import open_source, source_key

    spec(task)  # imports the task modules
    base = proc_status()
    convert: dict[str, float] = {}
    first = not any(Path(cache).glob(f"{task}-{source_key(spec(task), root, 0)}/meta.json"))
    if first:  # phase 1: the datasets library's parquet -> Arrow conversion alone (load_task repeats it, cached)
        sampler = PeakSampler()
        sampler.start()
        t0 = time.perf_counter()
        open_source(spec(task), root, False)
        convert = {"seconds": time.perf_counter() - t0, "peak_anon": sampler.stop(), "peak_rss": proc_status()["VmHWM"]}
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    sampler = PeakSampler()
    sampler.start()
    t0 = time.perf_counter()
    data = load_task(task, root, cache)  # phase 2 (all of a cache hit): partition + encode
    seconds = time.perf_counter() - t0
    peak_anon = sampler.stop()
    end = proc_status()
    data_bytes = data.offsets.nbytes + sum(a.nbytes for split in data.arrays.values() for a in split.values())
    return {
        "seconds": seconds + convert.get("seconds", 0.0),
        "encode_seconds": seconds,
        "convert": convert,
        "base_rss": base["VmRSS"],
        "base_anon": base["RssAnon"],
        "peak_rss": max(end["VmHWM"], convert.get("peak_rss", 0)),
        "encode_peak_anon": peak_anon,
        "peak_anon": max(peak_anon, convert.get("peak_anon", 0)),
        "data_bytes": data_bytes,
        "partitions": data.num_partitions,
        "rows": int(data.meta["num_rows"]["train"]),
        "cache_bytes": du(data.cache_path),
        "code": str(Path(load_task.__code__.co_filename).parent),
    }


def measure_load(task: str, root: Path, out: Path, mode: str) -> dict[str, Any]:
    """A load in a fresh subprocess. ``mode``: "first" empties the Arrow conversion and the encoded cache first
    (what a run's first load does), "encode" the encoded cache only (partition + encode in a process that did not
    convert: the project's own peak), "hit" nothing."""
    cache, hf = out / "cache" / task, out / "hf" / task
    if mode in ("first", "encode"):
        shutil.rmtree(cache, ignore_errors=True)
    if mode == "first":
        shutil.rmtree(hf, ignore_errors=True)
    env = {**os.environ, "HF_DATASETS_CACHE": str(hf), "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    load0 = os.getloadavg()[0]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.natural_tasks", "--child-load", task, str(root), str(cache)],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{task} load failed: {proc.stderr.strip().splitlines()[-1:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(load_avg=(load0, os.getloadavg()[0]), hf_bytes=du(hf))
    return result


# --------------------------------------------------------------------------- rounds
def round_seconds(task: str, engine: str, root: Path, out: Path, rounds: int) -> dict[str, Any]:
    """Seconds of each round of the task's preset on ``engine`` (``flower-simulation`` as a user runs it)."""
    run_dir = out / "runs" / f"{task}-{engine}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    cmd = [
        str(Path(sys.executable).parent / "flower-simulation"),
        f"+experiment=seed001_{task}",
        f"data.root={root}",
        f"data.cache_dir={out / 'cache' / task}",
        f"num_rounds={rounds}",
        f"engine={engine}",
        "eval_train=false",
        "eval_max_examples=1000",
        f"hydra.run.dir={run_dir}",
    ]
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    with open(run_dir / "stdout.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{task} on {engine}: exit {proc.returncode}, see {run_dir / 'stdout.log'}")
    seconds = [float(r["seconds"]) for r in csv.DictReader(open(run_dir / "metrics.csv")) if int(r["round"]) >= 1]
    return {
        "round1": seconds[0],
        "per_round": statistics.median(seconds[1:]),
        "seconds": seconds,
        "wall": wall,
        "load_avg": (load0, os.getloadavg()[0]),
    }


# --------------------------------------------------------------------------- table
def mib(n: float) -> str:
    return f"{n / 2**20:,.0f}"


def _phases(r: dict[str, Any], key: str, fmt: str, unit: float, base: float = 0.0) -> str:
    """'total (convert, encode)' of a first load; '' when not measured."""
    if not r:
        return ""
    encode = r["encode_seconds"] if key == "seconds" else r["encode_peak_anon"]
    parts = [(r[key] - base) / unit, (r["convert"].get(key, base) - base) / unit, (encode - base) / unit]
    return f"{fmt.format(parts[0])} ({fmt.format(parts[1])}, {fmt.format(parts[2])})"


def print_table(results: dict[str, dict[str, Any]], engines: list[str]) -> None:
    head = [
        "task",
        "rows",
        "clients",
        "copy MiB",
        "arrow MiB",
        "first load s (convert + encode)",
        "peak RSS MiB",
        "peak anon - base MiB (convert, encode)",
        "encode alone: peak anon - base MiB",
        "data MiB",
        "cache hit s",
        *[f"s/round {e} (r1)" for e in engines],
        "load avg",
    ]
    print("| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
    for task, r in results.items():
        first, hit, encode = r.get("first") or {}, r.get("hit") or {}, r.get("encode") or {}
        cells = [
            task,
            f"{first.get('rows', r['rows']):,}",
            f"{first.get('partitions', r['clients']):,}",
            mib(r["copy_bytes"]),
            mib(first.get("hf_bytes", 0)) if first else "",
            _phases(first, "seconds", "{:.1f}", 1.0),
            f"{mib(first['peak_rss'])} (base {mib(first['base_rss'])})" if first else "",
            _phases(first, "peak_anon", "{:,.0f}", 2**20, first.get("base_anon", 0)),
            mib(encode["encode_peak_anon"] - encode["base_anon"]) if encode else "",
            mib(first["data_bytes"]) if first else "",
            f"{hit['seconds']:.2f}" if hit else "",
        ]
        cells += [f"{r[e]['per_round']:.2f} ({r[e]['round1']:.1f})" if e in r else "" for e in engines]
        loads = [x["load_avg"][0] for x in (first, encode, hit, *(r.get(e, {}) for e in engines)) if x]
        cells.append(f"{min(loads):.1f}-{max(loads):.1f}" if loads else "")
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child_load:
        print(json.dumps(child_load(*args.child_load)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    for task in args.tasks:
        root, wrote = ensure_copy(args.out, task, args.scale, args.so_fraction)
        _, rows, clients = copy_sizes(task, args.scale, args.so_fraction)
        r = results[task] = {"rows": rows, "clients": clients, "copy_bytes": du(root), "write_seconds": wrote}
        print(
            f"{task}: copy {root} ({mib(r['copy_bytes'])} MiB{f', written in {wrote:.0f} s' if wrote else ''})",
            flush=True,
        )
        if "load" in args.measure:
            for mode in [m for m in LOAD_MODES if m in args.load_modes]:
                r[mode] = measure_load(task, root, args.out, mode)
                print(f"  {mode} load {r[mode]['seconds']:.2f} s", flush=True)
        if "rounds" in args.measure:
            for engine in args.engines:
                r[engine] = round_seconds(task, engine, root, args.out, args.rounds)
                print(
                    f"  {engine}: {r[engine]['per_round']:.2f} s/round (round 1 {r[engine]['round1']:.1f} s)",
                    flush=True,
                )
    stamp = time.strftime("%Y%m%dT%H%M%S")
    (args.out / f"results-{stamp}.json").write_text(json.dumps({"argv": sys.argv, "results": results}, indent=1))
    print_table(results, args.engines if "rounds" in args.measure else [])
    print(f"results: {args.out / f'results-{stamp}.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
