"""The batched engine (``engine=batched``): the ServerApp round loop on a :class:`~server.batched.grid.BatchedGrid`
in this process — no Ray, no actors, no message serialisation; the same strategies, replies, validation,
metrics, checkpoints and resume as every other engine.

    flower-simulation engine=batched model=logreg client.augment=false num_rounds=10000 eval_every=10
    flower-simulation engine=batched engine.chunk_size=20 model=resnet20     # at most 20 clients stacked at once

``engine.chunk_size=auto`` stacks as many clients as fit :data:`MEMORY_FRACTION` of the device's free memory
(estimated per client from the model's parameters and one batch of activations).
"""

from __future__ import annotations

import json
import os
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import torch
from flwr.common.logger import log

from client.environment import DEVICE_ENV
from client.models import build_model
from client.train import get_device
from server.batched.grid import BatchedGrid
from server.batched.workers import WorkerPool, available_cores
from server.run import quiet
from server.run.app import run_experiment
from server.run.config import RunConfig
from server.run.data import prepare_data

MEMORY_FRACTION = 0.25  # of the free memory that auto chunks may take
STACKED_CPU_THREADS = 1  # stacked steps on CPU are many small ops: one thread (docs/benchmarks.md "Engines")
COPIES_PER_PARAMETER = 8  # stacked params, grads, step temporaries, FedCM/GHBM term, q, outputs


def device_of(cfg: dict[str, Any]) -> torch.device:
    """``engine.device``: auto = CUDA when visible, else CPU."""
    choice = cfg["engine"].get("device", "auto")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


def free_memory(device: torch.device) -> int:
    """Free bytes on ``device`` (CPU: MemAvailable of /proc/meminfo, else 4 GiB)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


def bytes_per_client(model_name: str, batch_size: int) -> int:
    """Estimated memory of one stacked client: parameter copies plus one batch of activations kept for the
    backward pass (measured with forward hooks on a 32x32 input), float32."""
    model = build_model(model_name)
    sizes: list[int] = []
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: sizes.append(out.numel()))
        for m in model.modules()
        if not list(m.children())
    ]
    try:
        with torch.no_grad():
            model(torch.zeros(1, 3, 32, 32))
    except (RuntimeError, ValueError, IndexError):  # another input (paper 2's tasks): activations unknown here
        sizes = []
        log(
            WARNING,
            "engine.chunk_size=auto: %s does not take 3x32x32 images, so the estimate counts its "
            "parameters only (set engine.chunk_size if stacked rounds run out of memory)",
            model_name,
        )
    finally:
        for hook in hooks:
            hook.remove()
    params = sum(p.numel() for p in model.parameters())
    return 4 * (COPIES_PER_PARAMETER * params + 3 * batch_size * sum(sizes))


def chunk_size(cfg: dict[str, Any], device: torch.device) -> int:
    """``engine.chunk_size``, or for auto the most clients whose stacked round fits the memory budget."""
    value = cfg["engine"].get("chunk_size", "auto")
    if value != "auto":
        return int(value)
    per_client = bytes_per_client(cfg["model"]["name"], int(cfg["client"]["batch_size"]))
    return max(1, int(MEMORY_FRACTION * free_memory(device)) // per_client)


def make_grid(cfg: dict[str, Any]) -> BatchedGrid:
    """The run's BatchedGrid from ``engine.*`` (``vectorize`` auto → decided per model and device)."""
    e, device = cfg["engine"], device_of(cfg)
    vectorize = e.get("vectorize", "auto")
    grid = BatchedGrid(
        int(cfg["num_clients"]),
        vectorize=None if vectorize == "auto" else bool(vectorize),
        chunk_size=chunk_size(cfg, device),
        device=device,
        report_every=float(cfg.get("progress_every", 10)),
    )
    workers = e.get("workers", "auto")
    if workers == "auto":
        workers = available_cores() if device.type == "cpu" else 1
    if int(workers) > 1 and not grid.stacks(build_model(cfg["model"]["name"])):
        grid.workers = WorkerPool(int(workers))
    return grid


def simulate(cfg: RunConfig | dict[str, Any]) -> dict[str, Any]:
    """Run ``cfg`` on the batched engine (a plain dict is validated first); returns the run summary."""
    run_cfg = RunConfig.of(cfg)
    cfg = run_cfg.values
    quiet.install()
    prepare_data(cfg)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    previous = os.environ.get(DEVICE_ENV)
    os.environ[DEVICE_ENV] = device_of(cfg).type  # the ClientApp's code, the evaluator and the workers follow it
    get_device.cache_clear()
    grid = make_grid(cfg)
    stacked = grid.stacks(build_model(cfg["model"]["name"]))
    threads = int(cfg["client"].get("torch_threads", 0)) or (STACKED_CPU_THREADS if stacked else 0)
    if threads and grid.device.type == "cpu":
        torch.set_num_threads(threads)
    if stacked:
        how = f"stacked clients (vmap), chunks of at most {grid.chunk_size}"
    else:
        how = "one client after another" + (f" in {grid.workers.size} worker processes" if grid.workers else "")
    log(INFO, "Batched engine: %d nodes on %s, %s", len(grid.contexts), grid.device, how)
    if grid.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(grid.device)
    try:
        summary = run_experiment(grid, run_cfg, cfg["run_dir"])
    finally:
        grid.close()
        if previous is None:
            os.environ.pop(DEVICE_ENV, None)
        else:
            os.environ[DEVICE_ENV] = previous
        get_device.cache_clear()
    if grid.device.type == "cuda":  # checks/gpu_check.py reads it
        summary["peak_cuda_memory_mib"] = torch.cuda.max_memory_allocated(grid.device) / 2**20
        (Path(cfg["run_dir"]) / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
