"""Ray helpers of the tests and tools: a private Ray temp dir, free ports, the processes of one run, `ray start` nodes.

Everything Ray-related a test starts carries the test's private temp dir (``RAY_TMPDIR``, ``--temp-dir``) in
its command line or environment, so the test can find, and must leave behind, no process of its own and
never touches ``/tmp/ray`` or another user's cluster. Paths stay short (``/tmp/rs-XXXX``): Ray's socket
paths must fit in 107 characters.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def private_ray_tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))


def free_port() -> int:
    """A free port below the ephemeral range (server/run/procs.py: no outgoing connection can take it first)."""
    from server.run.procs import free_port as below_ephemeral

    return below_ephemeral()


def ray_env(ray_tmp: Path, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "RAY_TMPDIR": str(ray_tmp),
        "FLWR_TELEMETRY_ENABLED": "0",
        "PYTHONUNBUFFERED": "1",
        "RAY_DEDUP_LOGS": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        **extra,
    }
    env.pop("RAY_ADDRESS", None)
    return env


def processes_with(marker: str) -> list[int]:
    """Pids whose command line or environment contains ``marker`` (Ray workers rename their command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in blob:
            found.append(int(entry.name))
    return found


def wait_gone(marker: str, timeout: float = 120.0) -> list[int]:
    """Wait until no process carries ``marker`` (a private Ray temp dir) in its command line; the ones left after
    ``timeout``. A leaked process never exits; Ray's own processes finish exiting some seconds after the driver,
    and once took more than 20 s (the bound this had) with three test workers on 2 cores: 120 s tells the two
    apart without luck."""
    deadline = time.time() + timeout
    while (left := processes_with(marker)) and time.time() < deadline:
        time.sleep(0.2)
    return left


def kill_all_with(marker: str) -> None:
    for pid in processes_with(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class RayNodes:
    """``ray start`` nodes sharing one private temp dir; :meth:`stop` ends every process they started."""

    def __init__(self, ray_tmp: Path) -> None:
        self.ray_tmp = ray_tmp
        self.groups: list[int] = []
        self.address = ""

    def start(self, *args: str, timeout: float = 180, env: dict[str, str] | None = None) -> None:
        cmd = [
            str(BIN / "ray"),
            "start",
            f"--temp-dir={self.ray_tmp / 'ray'}",
            "--num-gpus=0",
            "--node-ip-address=127.0.0.1",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            "--disable-usage-stats",
            *args,
        ]
        # its own session: the daemons it leaves keep this process group, which stop() kills
        proc = subprocess.Popen(
            cmd,
            env=ray_env(self.ray_tmp, **(env or {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.groups.append(proc.pid)
        out, _ = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start failed:\n{out[-3000:]}")

    def start_head(self, num_cpus: int = 1) -> str:
        port = free_port()
        self.start(
            "--head",
            f"--port={port}",
            f"--num-cpus={num_cpus}",
            "--include-dashboard=false",
            f"--dashboard-port={free_port()}",
            f"--ray-client-server-port={free_port()}",
        )
        self.address = f"127.0.0.1:{port}"
        return self.address

    def add_worker(self, num_cpus: int = 1, env: dict[str, str] | None = None) -> None:
        self.start(f"--address={self.address}", f"--num-cpus={num_cpus}", env=env)

    def stop(self) -> list[int]:
        """SIGTERM then SIGKILL every process group and every process of this temp dir; the survivors."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for group in self.groups:
                try:
                    os.killpg(group, sig)
                except OSError:
                    pass
            if not wait_gone(str(self.ray_tmp), timeout=3 if sig == signal.SIGTERM else 10):
                break
        kill_all_with(str(self.ray_tmp))
        left = wait_gone(str(self.ray_tmp), timeout=10)
        shutil.rmtree(self.ray_tmp, ignore_errors=True)
        return left
