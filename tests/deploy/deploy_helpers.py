"""Helpers of the deployment tests: tiny experiment overrides, CLI runs, run-dir readers, leftover checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
from warm_cli import shared, wants_warm

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_DEDUP_LOGS": "0",
    "PYTHONUNBUFFERED": "1",
}


# The simulation reference of a deployment test whose subject is not the Ray engine: the batched engine, clients one
# after another in the flower-simulation process (bitwise the Ray engine's final CNN for every strategy,
# tests/server/test_batched_engine.py), without Ray's start-up. test_same_global_model_as_simulation keeps Ray.
IN_PROCESS = ("engine=batched", "engine.workers=1")


def overrides(data: dict[str, Path], run_dir: Path, *extra: str) -> list[str]:
    """A tiny but complete experiment: 4 clients, 2 rounds, cyclic halves, CNN, 2 local steps, 1 torch thread;
    in-round progress lines every 0.2 s; no PNGs unless ``extra`` says ``plots=true``."""
    return [
        f"data.root={data['folder']}",
        f"data.cache_dir={data['cache']}",
        "num_clients=4",
        "num_rounds=2",
        "participation.fraction=0.5",
        "client.local_steps=2",
        "client.batch_size=16",
        "client.torch_threads=1",
        "eval_max_examples=40",
        "round_timeout=60",
        "progress_every=0.2",
        "plots=false",
        f"run_dir={run_dir}",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def compose(args: list[str]) -> dict[str, Any]:
    """The plain config ``flower-deploy <args>`` would run (Hydra's compose API; hydra.* overrides dropped)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from server.run import config as config_lib

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = hydra_compose(config_name="config", overrides=[a for a in args if not a.startswith("hydra.")])
    return config_lib.to_plain(cfg)


def run_cli(name: str, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run a console script of this environment (output merged into stdout); an ``engine=batched`` reference
    simulation runs in a fork of the warm process of tests/warm_cli.py, a deployment as a fresh process."""
    if wants_warm(name, args):
        return shared(ENV).run(name, args, ENV, cwd=ROOT, timeout=timeout, merge_output=True)
    return subprocess.run(
        [str(BIN / name), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        env=ENV,
        cwd=ROOT,
    )


def rows(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl rows."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def final_model(run_dir: Path) -> dict[str, np.ndarray]:
    with np.load(run_dir / "final_model.npz") as npz:
        return {k: npz[k] for k in npz.files}


def assert_same_model(a: Path, b: Path) -> None:
    """Bitwise equality of two runs' final models."""
    ma, mb = final_model(a), final_model(b)
    assert ma.keys() == mb.keys()
    for key in ma:
        assert ma[key].dtype == mb[key].dtype and np.array_equal(ma[key], mb[key]), key


def flower_processes(flwr_home: Path) -> dict[int, str]:
    """Live processes whose environment has ``FLWR_HOME=<flwr_home>`` (everything a federation started)."""
    marker = f"FLWR_HOME={flwr_home}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in env.split(b"\0") and cmd:
            found[int(entry)] = cmd
    return found


class LineReader:
    """Collect a Popen's stdout lines in a thread; wait for a substring with a timeout."""

    def __init__(self, popen: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._event = threading.Event()
        self._thread = threading.Thread(target=self._pump, args=(popen,), daemon=True)
        self._thread.start()

    def _pump(self, popen: subprocess.Popen[str]) -> None:
        assert popen.stdout is not None
        for line in popen.stdout:
            self.lines.append(line.rstrip("\n"))
            self._event.set()

    def wait_for(self, text: str, timeout: float) -> bool:
        deadline = threading.Event()
        timer = threading.Timer(timeout, deadline.set)
        timer.start()
        try:
            while not deadline.is_set():
                if any(text in line for line in self.lines):
                    return True
                self._event.wait(0.2)
                self._event.clear()
            return False
        finally:
            timer.cancel()

    def text(self) -> str:
        return "\n".join(self.lines)
