"""A Flower 1.39 deployment driven from Python: SuperLink, SuperNodes and ``flwr run`` as OS processes.

:class:`Federation` starts a SuperLink (Fleet API over gRPC, Control/Runtime API over HTTP(S)) and
SuperNodes, each owning one data partition (``--node-config "partition-id=i num-partitions=N"``), writes the
CLI connection into a private ``$FLWR_HOME/config.toml`` and submits runs with ``flwr run --stream``.
With ``spawn=False`` it only writes the connection of an existing SuperLink. Every process it starts is
stopped by PID in :meth:`Federation.stop` (see :mod:`server.procs`). Facts about the Flower processes are in
``/work/shared/notes/flower-1.39.md`` and docs/deploy.md.
"""

from __future__ import annotations

import json
import os
import queue
import re
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from server import procs, tls

CONNECTION = "fedmomentum"
RUN_ID = re.compile(r"Successfully started run (\d+)")
BASE_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "PYTHONUNBUFFERED": "1"}


class DeployError(RuntimeError):
    """A process of the federation failed (the message names it and quotes its log)."""


@dataclass
class FederationOptions:
    """Where and how the federation runs (``conf/deploy/local.yaml`` documents each key)."""

    host: str = "127.0.0.1"  # bind address of the spawned SuperLink
    address: str = "127.0.0.1"  # address SuperNodes and the CLI use to reach it
    fleet_port: int = 0  # 0 = a free port
    control_port: int = 0
    superlink: str | None = None  # HOST:PORT of an existing SuperLink's Control API (nothing is spawned)
    root_certificates: str | None = None  # CA of an existing TLS SuperLink
    tls: bool = False
    auth: bool = False
    cert_hosts: list[str] = field(default_factory=list)
    database: bool = True  # keep the SuperLink state in a file (survives a SuperLink restart)
    startup_timeout: float = 60.0
    stop_timeout: float = 15.0


@dataclass
class RunResult:
    """Outcome of one submitted run."""

    run_id: int | None
    status: str  # "finished:completed", "finished:failed", ..., or "superlink-lost" / "timeout" / "cli-failed"
    returncode: int | None
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "finished:completed"


class Federation:
    """SuperLink + SuperNodes on this host (or a connection to an existing SuperLink)."""

    def __init__(self, workdir: str | Path, app_dir: str | Path, options: FederationOptions | None = None) -> None:
        self.options = opts = options or FederationOptions()
        self.workdir = Path(workdir).resolve()
        self.app_dir = Path(app_dir).resolve()
        self.flwr_home = self.workdir / "flwr_home"
        self.log_dir = self.workdir / "logs"
        self.spawn = opts.superlink is None
        if opts.auth and not (opts.tls or opts.root_certificates):
            raise ValueError("SuperNode authentication needs TLS (deploy.tls=true)")
        self.fleet_port = opts.fleet_port or procs.free_port(opts.host)
        self.control_port = opts.control_port or procs.free_port(opts.host)
        self.control_address = opts.superlink or f"{opts.address}:{self.control_port}"
        self.fleet_address = f"{opts.address}:{self.fleet_port}"
        self.tls_files = tls.make_tls(self.workdir / "tls", opts.cert_hosts) if self.spawn and opts.tls else None
        self.ca_cert = str(self.tls_files.ca_cert) if self.tls_files else opts.root_certificates
        self.superlink: procs.ManagedProcess | None = None
        self.supernodes: dict[int, procs.ManagedProcess] = {}
        self.num_partitions, self.data_root = 0, None  # of the last started SuperNode
        self.node_keys: dict[int, tls.NodeKey] = {}
        self.cli: list[procs.ManagedProcess] = []
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # flower-superexec etc.
        self.env = {**os.environ, **BASE_ENV, "FLWR_HOME": str(self.flwr_home), "PATH": path}
        self.database = self.workdir / "superlink-state.db"
        if self.spawn:  # a new federation starts from an empty state (stale nodes would look online)
            self.database.unlink(missing_ok=True)
        self._write_connection()

    # ----------------------------------------------------------------------- SuperLink
    def _write_connection(self) -> None:
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        security = f'root-certificates = "{self.ca_cert}"' if self.ca_cert else "insecure = true"
        text = f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n' \
               f'address = "{self.control_address}"\n{security}\n'
        (self.flwr_home / "config.toml").write_text(text)

    def _security_flags(self) -> list[str]:
        if self.tls_files is None:
            return ["--insecure"]
        t = self.tls_files
        return ["--ssl-ca-certfile", str(t.ca_cert), "--ssl-certfile", str(t.server_cert),
                "--ssl-keyfile", str(t.server_key)]

    def start_superlink(self) -> procs.ManagedProcess:
        """Start (or restart) the SuperLink and wait until its HTTP API answers ``/health``."""
        if not self.spawn:
            raise RuntimeError("this federation uses an existing SuperLink")
        cmd = [procs.executable("flower-superlink"), *self._security_flags(),
               "--fleet-api-address", f"{self.options.host}:{self.fleet_port}",
               "--host", self.options.host, "--port", str(self.control_port),
               "--disable-runtime-dependency-installation"]
        if self.options.auth:
            cmd.append("--enable-supernode-auth")
        if self.options.database:
            cmd += ["--database", str(self.database)]
        old = self.superlink
        if old is not None:  # orphans of a crashed SuperLink (SuperExec, ServerApp) must not write on
            old.kill()
            procs.wait_gone([old], self.options.stop_timeout)
        self.superlink = procs.ManagedProcess("superlink", cmd, self.log_dir / "superlink.log", self.env,
                                              self.workdir).start()
        if old is not None:  # keep the old tree's groups: a killed SuperLink may leave children behind
            self.superlink.pids |= old.pids
            self.superlink.pgids |= old.pgids
        self.wait_superlink()
        return self.superlink

    def wait_superlink(self, timeout: float | None = None) -> None:
        """Poll ``GET /health`` of the Control API until it returns 200."""
        deadline = time.monotonic() + (timeout or self.options.startup_timeout)
        scheme = "https" if self.ca_cert else "http"
        context = ssl.create_default_context(cafile=self.ca_cert) if self.ca_cert else None
        url = f"{scheme}://{self.control_address}/health"
        while time.monotonic() < deadline:
            if self.superlink is not None and not self.superlink.alive():
                raise DeployError(f"SuperLink exited with code {self.superlink.returncode()}:\n"
                                  f"{self.superlink.tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2, context=context) as response:
                    if response.status == 200:
                        if self.superlink is not None:
                            time.sleep(0.5)  # let it detach its SuperExec, then remember that tree
                            self.superlink.snapshot()
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise DeployError(f"SuperLink at {url} not healthy after {timeout or self.options.startup_timeout:.0f} s")

    # ----------------------------------------------------------------------- SuperNodes
    def start_supernode(self, partition_id: int, num_partitions: int, data_root: str | None = None) -> None:
        """Start the SuperNode of ``partition_id`` (restart it when it exists; same key, same node ID)."""
        self.num_partitions, self.data_root = num_partitions, data_root
        node_config = f"partition-id={partition_id} num-partitions={num_partitions}"
        if data_root:
            node_config += f' data-root="{data_root}"'
        security = ["--root-certificates", self.ca_cert] if self.ca_cert else ["--insecure"]
        if self.options.auth:
            if partition_id not in self.node_keys:
                key = tls.make_node_key(self.workdir / "keys", f"node{partition_id}")
                self.flwr("supernode", "register", str(key.public), CONNECTION)
                self.node_keys[partition_id] = key
            security += ["--auth-supernode-private-key", str(self.node_keys[partition_id].private)]
        cmd = [procs.executable("flower-supernode"), *security, "--superlink", self.fleet_address,
               "--port", str(procs.free_port()), "--node-config", node_config]
        old = self.supernodes.get(partition_id)
        if old is not None and old.alive():
            raise RuntimeError(f"SuperNode {partition_id} is still running")
        proc = procs.ManagedProcess(f"supernode-{partition_id}", cmd, self.log_dir / f"supernode-{partition_id}.log",
                                    self.env, self.workdir).start()
        if old is not None:
            proc.pids |= old.pids
            proc.pgids |= old.pgids
        self.supernodes[partition_id] = proc

    def start_supernodes(self, count: int, num_partitions: int, data_root: str | None = None) -> None:
        """SuperNodes for partitions 0..count-1."""
        for i in range(count):
            self.start_supernode(i, num_partitions, data_root)

    def node_ids(self) -> list[int]:
        """IDs of the SuperNodes the SuperLink lists as online (``flwr supernode list``)."""
        out = self.flwr("supernode", "list", CONNECTION, "--format", "json", check=False)
        try:
            nodes = json.loads(out).get("nodes", [])
        except json.JSONDecodeError:
            return []
        return [int(n["node-id"]) for n in nodes if n.get("status") == "online"]

    def wait_nodes(self, count: int, timeout: float | None = None) -> list[int]:
        """Wait until ``count`` SuperNodes are online; raise when a spawned one exits meanwhile."""
        deadline = time.monotonic() + (timeout or self.options.startup_timeout)
        while True:
            ids = self.node_ids()
            if len(ids) >= count:
                return ids
            for proc in self.supernodes.values():
                if proc.returncode() not in (None, 0):
                    raise DeployError(f"{proc.name} exited with code {proc.returncode()}:\n{proc.tail()}")
            if time.monotonic() > deadline:
                raise DeployError(f"only {len(ids)} of {count} SuperNodes online after the timeout")
            time.sleep(1.0)

    # ----------------------------------------------------------------------- CLI
    def flwr(self, *args: str, check: bool = True, timeout: float = 60.0) -> str:
        """Run a ``flwr`` CLI command against this federation; returns stdout."""
        res = subprocess.run([procs.executable("flwr"), *args], env=self.env, cwd=self.workdir, capture_output=True,
                             text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise DeployError(f"flwr {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
        return res.stdout

    def run_status(self, run_id: int) -> str:
        """Status of a run as ``flwr ls`` reports it ('' when unknown)."""
        out = self.flwr("ls", CONNECTION, "--run-id", str(run_id), "--format", "json", check=False)
        try:
            runs = json.loads(out).get("runs", [])
        except json.JSONDecodeError:
            return ""
        return str(runs[0]["status"]) if runs else ""

    def submit(self, run_config: dict[str, str], on_line: Callable[[str], None] = print,
               timeout: float | None = None) -> RunResult:
        """``flwr run <app> --stream -c ...``: stream the run's log lines to ``on_line`` until it ends.

        Returns early (status "superlink-lost") when the spawned SuperLink dies, or "timeout".
        """
        overrides = " ".join(f'{k}="{v}"' for k, v in run_config.items())  # values must not contain quotes
        cmd = [procs.executable("flwr"), "run", str(self.app_dir), CONNECTION, "--stream", "-c", overrides]
        proc = procs.ManagedProcess("flwr-run", cmd, self.log_dir / "flwr-run.log", self.env, self.workdir)
        self.cli.append(proc)
        t0 = time.monotonic()
        proc.popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=self.env, cwd=self.workdir, start_new_session=True, text=True, bufsize=1)
        proc.pids.add(proc.pid)
        proc.pgids.add(proc.pid)
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(proc.popen, lines), daemon=True).start()
        run_id, status = None, ""
        with open(proc.log_path, "a") as log:
            while True:
                try:
                    line = lines.get(timeout=0.5)
                except queue.Empty:
                    line = ""
                if line is None:  # the CLI ended
                    break
                if line:
                    log.write(line + "\n")
                    log.flush()
                    run_id = run_id or (int(m.group(1)) if (m := RUN_ID.search(line)) else None)
                    on_line(line)
                if self.superlink is not None and not self.superlink.alive():
                    status = "superlink-lost"
                elif timeout and time.monotonic() - t0 > timeout:
                    status = "timeout"
                if status:
                    proc.stop(5.0)
                    break
        returncode = proc.popen.wait(timeout=10)
        if not status:
            status = (self.run_status(run_id) if run_id is not None else "") or "cli-failed"
        return RunResult(run_id, status, returncode, time.monotonic() - t0)

    def stop_run(self, run_id: int) -> None:
        """``flwr stop``: ask the SuperLink to stop a run (used on Ctrl-C with an existing federation)."""
        self.flwr("stop", str(run_id), CONNECTION, check=False, timeout=30)

    # ----------------------------------------------------------------------- teardown
    def processes(self) -> list[procs.ManagedProcess]:
        """Every process this federation started (including stopped ones)."""
        started = [p for p in [*self.supernodes.values(), self.superlink, *self.cli] if p is not None]
        return [p for p in started if p.popen is not None]

    def stop(self) -> dict[int, str]:
        """Stop the CLI, the SuperNodes, then the SuperLink, by PID; returns leftovers (pid -> cmdline)."""
        for proc in self.cli:
            proc.stop(5.0)
        nodes = list(self.supernodes.values())
        for proc in nodes:
            proc.signal(15)
        procs.wait_gone(nodes, self.options.stop_timeout)
        for proc in nodes:
            proc.stop(1.0)
        if self.superlink is not None:
            self.superlink.stop(self.options.stop_timeout)
        return procs.leftovers(self.processes())

    def __enter__(self) -> Federation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _pump(popen: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert popen.stdout is not None
    for line in popen.stdout:
        lines.put(line.rstrip("\n"))
    lines.put(None)
