"""A Flower 1.39 deployment driven from Python: SuperLink, SuperNodes and ``flwr run`` as OS processes.

:class:`Federation` starts a SuperLink (Fleet API over gRPC, Control/Runtime API over HTTP(S)) and
SuperNodes, each owning one data partition (``--node-config "partition-id=i num-partitions=N"``), writes the
CLI connection into a private ``$FLWR_HOME/config.toml`` and submits runs with ``flwr run --stream``.
With ``spawn=False`` it only writes the connection of an existing SuperLink. Every process it starts is
stopped by PID in :meth:`Federation.stop` (see :mod:`server.run.procs`). Facts about the Flower processes are in
docs/deploy.md.

Security: the SuperLink's Control and Runtime HTTP API (one port) always binds 127.0.0.1 (Flower 1.39's Control
API authenticates no one); only the Fleet API follows ``host``. The SuperLink runs with ``--isolation process``
and its SuperExec (started here) signs its task requests with a per-federation SuperExec auth secret; so do the
SuperNodes' ClientApp workers (``fast``, :mod:`server.deploy.flwr_fast`). SuperNodes give up after
``supernode_max_wait`` seconds without a SuperLink instead of retrying forever.
"""

from __future__ import annotations

import os
import queue
import re
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from client import threads
from server.deploy import flwr_fast, tls
from server.internals.flower_control import ControlClient, ControlError
from server.run import procs

CONNECTION = "fedmomentum"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
RUN_ID = re.compile(r"Successfully started run (\d+)")
LOOPBACK = "127.0.0.1"  # the Control/Runtime APIs never leave it
BASE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "PYTHONUNBUFFERED": "1",
}
FAST_ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.5"}  # Flower's public knob (default 1 s)
NODE_BOUND = "Uvicorn running on"  # a SuperNode's log line once its Runtime API holds its port
START_ATTEMPTS = 3  # starts of a process whose free port another process took first


def start_state(proc: procs.ManagedProcess) -> str:
    """Where a started SuperNode is: ``"bound"`` once its log says ``NODE_BOUND``, ``"starting"`` while it runs
    without, else ``"port-taken"`` (another process took its free port first) or ``"exited"``."""
    alive = proc.alive()  # first: the output of a process already gone is complete
    output = proc.output()
    if NODE_BOUND in output:
        return "bound"
    if alive:
        return "starting"
    return "port-taken" if procs.PORT_TAKEN.search(output) else "exited"


class DeployError(RuntimeError):
    """A process of the federation failed (the message names it and quotes its log)."""


@dataclass
class FederationOptions:
    """Where and how the federation runs (``conf/deploy/local.yaml`` documents each key)."""

    host: str = LOOPBACK  # bind address of the spawned SuperLink's Fleet API (Control/Runtime: always loopback)
    address: str = LOOPBACK  # address SuperNodes use to reach the Fleet API
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
    fast: bool = True  # short polling + warm ClientApp workers (server.deploy.flwr_fast); False = stock Flower
    poll_interval: float = 0.5  # seconds between a SuperNode's idle pulls with ``fast`` (Flower: 3)
    supernode_max_wait: float = 60.0  # SuperNodes exit after this many seconds without reaching the SuperLink
    torch_threads: int = 0  # node_config torch-threads of spawned SuperNodes (client/threads.py); 0 = not given


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
        self.on_notice: Callable[[str], None] = lambda line: print(line, file=sys.stderr)  # retries, for the user
        self._control: ControlClient | None = None  # the Control API, from this process (flower_control)
        self._control_lock = threading.Lock()
        self._pick_superlink_ports()
        self.tls_files = tls.make_tls(self.workdir / "tls", opts.cert_hosts) if self.spawn and opts.tls else None
        self.ca_cert = str(self.tls_files.ca_cert) if self.tls_files else opts.root_certificates
        self.superlink: procs.ManagedProcess | None = None
        self.superexec: procs.ManagedProcess | None = None  # the SuperLink's (runs the ServerApp)
        self.supernodes: dict[int, procs.ManagedProcess] = {}
        self.num_partitions, self.data_root = 0, None  # of the last started SuperNode
        self.node_keys: dict[str, tls.NodeKey] = {}
        self.extra_node_config: dict[int, dict[str, str]] = {}
        self.cli: list[procs.ManagedProcess] = []
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # flower-superexec etc.
        pythonpath = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        self.env = {
            **os.environ,
            **BASE_ENV,
            **(FAST_ENV if opts.fast else {}),
            "FLWR_HOME": str(self.flwr_home),
            "PATH": path,
            "PYTHONPATH": pythonpath,
        }  # `-m server.deploy.flwr_fast` is this code
        self.secret_file = flwr_fast.write_secret(self.workdir / "secrets" / "superexec.secret") if self.spawn else None
        self.database = self.workdir / "superlink-state.db"
        if self.spawn:  # a new federation starts from an empty state (stale nodes would look online)
            self.database.unlink(missing_ok=True)
        self._write_connection()

    # ----------------------------------------------------------------------- SuperLink
    def _pick_superlink_ports(self) -> None:
        """The configured ports, or free ones (:func:`server.run.procs.free_port`) where 0."""
        opts = self.options
        self.fleet_port = opts.fleet_port or procs.free_port(opts.host)
        self.control_port = opts.control_port or procs.free_port(LOOPBACK)
        self.control_address = opts.superlink or f"{LOOPBACK}:{self.control_port}"
        self._close_control()
        self.fleet_address = f"{opts.address}:{self.fleet_port}"

    def _write_connection(self) -> None:
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        security = f'root-certificates = "{self.ca_cert}"' if self.ca_cert else "insecure = true"
        text = (
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "{self.control_address}"\n{security}\n'
        )
        (self.flwr_home / "config.toml").write_text(text)

    def _security_flags(self) -> list[str]:
        if self.tls_files is None:
            return ["--insecure"]
        t = self.tls_files
        return [
            "--ssl-ca-certfile",
            str(t.ca_cert),
            "--ssl-certfile",
            str(t.server_cert),
            "--ssl-keyfile",
            str(t.server_key),
        ]

    def start_superlink(self) -> procs.ManagedProcess:
        """Start (or restart) the SuperLink and wait until its HTTP API answers ``/health``."""
        if not self.spawn:
            raise RuntimeError("this federation uses an existing SuperLink")
        old, old_exec = self.superlink, self.superexec
        if old is not None:  # orphans of a crashed SuperLink (SuperExec, ServerApp) must not write on
            for proc in (old, old_exec):
                if proc is not None:
                    proc.kill()
            procs.wait_gone([p for p in (old, old_exec) if p is not None], self.options.stop_timeout)
        for attempt in range(1, START_ATTEMPTS + 1):
            self.superlink = _restarted(
                procs.ManagedProcess(
                    "superlink", self._superlink_command(), self.log_dir / "superlink.log", self.env, self.workdir
                ).start(),
                old,
            )
            try:
                self.wait_superlink()
                break
            except DeployError:
                # a first start whose free port another process took meanwhile: fresh ports (a restart must
                # keep its ports: the SuperNodes know them)
                automatic = not (self.options.fleet_port or self.options.control_port)
                if (
                    old is not None
                    or not automatic
                    or attempt == START_ATTEMPTS
                    or self.superlink.alive()
                    or not procs.PORT_TAKEN.search(self.superlink.output())
                ):
                    raise
                self.on_notice(
                    f"flower-deploy: the SuperLink's port was taken before it could bind it; starting "
                    f"it again on other free ports (attempt {attempt + 1} of {START_ATTEMPTS})"
                )
                self._pick_superlink_ports()
                self._write_connection()
        self.superexec = _restarted(self._start_superexec(), old_exec)
        return self.superlink

    def _superlink_command(self) -> list[str]:
        launcher = (
            [sys.executable, "-m", "server.deploy.flwr_fast", "superlink"]
            if self.options.fast
            else [procs.executable("flower-superlink")]
        )  # fast: objects in memory, state in the database file
        cmd = [
            *launcher,
            *self._security_flags(),
            "--fleet-api-address",
            f"{self.options.host}:{self.fleet_port}",
            "--host",
            LOOPBACK,
            "--port",
            str(self.control_port),
            "--disable-runtime-dependency-installation",
            "--isolation",
            "process",
            "--superexec-auth-secret-file",
            str(self.secret_file),
        ]
        if self.options.auth:
            cmd.append("--enable-supernode-auth")
        if self.options.database:
            cmd += ["--database", str(self.database)]
        return cmd

    def _start_superexec(self) -> procs.ManagedProcess:
        """The SuperLink's SuperExec (``--isolation process``): launches the ServerApp, signs with the secret."""
        assert self.superlink is not None
        security = ["--root-certificates", self.ca_cert] if self.ca_cert else ["--insecure"]
        cmd = [
            procs.executable("flower-superexec"),
            "--runtime-api-address",
            f"{LOOPBACK}:{self.control_port}",
            *security,
            "--superexec-auth-secret-file",
            str(self.secret_file),
            "--parent-pid",
            str(self.superlink.pid),
        ]
        return procs.ManagedProcess("superexec", cmd, self.log_dir / "superexec.log", self.env, self.workdir).start()

    def wait_superlink(self, timeout: float | None = None) -> None:
        """Poll ``GET /health`` of the Control API until it returns 200."""
        deadline = time.monotonic() + (timeout or self.options.startup_timeout)
        scheme = "https" if self.ca_cert else "http"
        context = ssl.create_default_context(cafile=self.ca_cert) if self.ca_cert else None
        url = f"{scheme}://{self.control_address}/health"
        while time.monotonic() < deadline:
            if self.superlink is not None and not self.superlink.alive():
                raise DeployError(f"SuperLink exited with code {self.superlink.returncode()}:\n{self.superlink.tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2, context=context) as response:
                    if response.status == 200:
                        if self.superlink is not None:
                            self.superlink.snapshot()
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise DeployError(f"SuperLink at {url} not healthy after {timeout or self.options.startup_timeout:.0f} s")

    # ----------------------------------------------------------------------- SuperNodes
    def supernode_command(self, node_config: str, security: list[str]) -> list[str]:
        """The SuperNode command line: Flower's ``flower-supernode``, or its fast launcher
        (:mod:`server.deploy.flwr_fast`).

        ``security`` holds the TLS/auth flags; the Runtime API stays on 127.0.0.1 on a free port.
        """
        common = [
            *security,
            "--superlink",
            self.fleet_address,
            "--max-wait-time",
            str(self.options.supernode_max_wait),
            "--host",
            LOOPBACK,
            "--port",
            str(procs.free_port()),
            "--node-config",
            node_config,
        ]
        if not self.options.fast:
            return [procs.executable("flower-supernode"), *common]
        return [
            sys.executable,
            "-m",
            "server.deploy.flwr_fast",
            "supernode",
            "--poll-interval",
            str(self.options.poll_interval),
            "--superexec-auth-secret-file",
            str(self.secret_file),
            *common,
        ]

    def start_supernode(
        self,
        partition_id: int,
        num_partitions: int,
        data_root: str | None = None,
        extra_node_config: dict[str, str] | None = None,
    ) -> None:
        """Start the SuperNode of ``partition_id`` (restart it when it exists; same key, same node ID) and wait
        until it holds its Runtime API port (:meth:`confirm_supernodes`).

        ``extra_node_config`` adds ``key="value"`` pairs to its ``--node-config`` (kept for restarts).
        """
        self._launch_supernode(partition_id, num_partitions, data_root, extra_node_config)
        self.confirm_supernodes([partition_id])

    def _launch_supernode(
        self,
        partition_id: int,
        num_partitions: int,
        data_root: str | None = None,
        extra_node_config: dict[str, str] | None = None,
    ) -> None:
        self.num_partitions, self.data_root = num_partitions, data_root
        if extra_node_config is not None:
            self.extra_node_config[partition_id] = dict(extra_node_config)
        node_config = f"partition-id={partition_id} num-partitions={num_partitions}"
        if data_root:
            node_config += f' data-root="{data_root}"'
        if self.options.torch_threads:
            node_config += f" {threads.NODE_KEY}={int(self.options.torch_threads)}"
        for key, value in self.extra_node_config.get(partition_id, {}).items():
            node_config += f' {key}="{value}"'
        security = ["--root-certificates", self.ca_cert] if self.ca_cert else ["--insecure"]
        if self.options.auth:
            security += ["--auth-supernode-private-key", str(self.node_key(f"node{partition_id}").private)]
        old = self.supernodes.get(partition_id)
        if old is not None and old.alive():
            raise RuntimeError(f"SuperNode {partition_id} is still running")
        proc = procs.ManagedProcess(
            f"supernode-{partition_id}",
            self.supernode_command(node_config, security),
            self.log_dir / f"supernode-{partition_id}.log",
            self.env,
            self.workdir,
        ).start()
        self.supernodes[partition_id] = _restarted(proc, old)

    def restart_supernodes(self, partitions: Iterable[int]) -> None:
        """Start the (stopped) SuperNodes of ``partitions`` again, all at once, with their last node config."""
        partitions = list(partitions)
        for partition_id in partitions:
            self._launch_supernode(partition_id, self.num_partitions, self.data_root)
        self.confirm_supernodes(partitions)

    def confirm_supernodes(self, partitions: Iterable[int]) -> None:
        """Wait until each SuperNode of ``partitions`` holds its Runtime API port (its log says
        ``NODE_BOUND``). One that exits because another process took that free port first starts again on
        another (up to ``START_ATTEMPTS`` starts); one that exits for any other reason is a :class:`DeployError`
        quoting its log, before any run is submitted."""
        pending = {p: 1 for p in partitions}
        deadline = time.monotonic() + self.options.startup_timeout
        while pending:
            for partition, attempt in list(pending.items()):
                proc = self.supernodes[partition]
                state = start_state(proc)
                if state == "bound":
                    del pending[partition]
                elif state != "starting":
                    if state == "exited" or attempt == START_ATTEMPTS:
                        raise DeployError(
                            f"{proc.name} exited with code {proc.returncode()} while starting:\n{proc.tail()}"
                        )
                    self.on_notice(
                        f"flower-deploy: {proc.name}'s port was taken before it could bind it; starting "
                        f"it again on another free port (attempt {attempt + 1} of {START_ATTEMPTS})"
                    )
                    self._launch_supernode(partition, self.num_partitions, self.data_root)
                    pending[partition] = attempt + 1
            if pending and time.monotonic() > deadline:
                raise DeployError(
                    f"SuperNodes {sorted(pending)} did not start within "
                    f"{self.options.startup_timeout:.0f} s (deploy.startup_timeout)"
                )
            if pending:
                time.sleep(0.05)

    def node_key(self, name: str) -> tls.NodeKey:
        """The key pair ``keys/<name>``, made and registered with the SuperLink (what ``flwr supernode register``
        sends) on first use."""
        if name not in self.node_keys:
            key = tls.make_node_key(self.workdir / "keys", name)
            try:
                self.control().register_node(key.public)
            except ControlError as exc:
                raise DeployError(f"registering the key of {name} failed: {exc}") from exc
            self.node_keys[name] = key
        return self.node_keys[name]

    def register_keys_again(self) -> None:
        """Register every key of :meth:`node_key` again (a restarted SuperLink whose state was in memory); a
        refusal (e.g. the key is still known) is not an error."""
        for name, key in self.node_keys.items():
            try:
                self.control().register_node(key.public)
            except ControlError as exc:
                self.on_notice(f"flower-deploy: registering the key of {name} again: {exc}")

    def start_supernodes(self, count: int, num_partitions: int, data_root: str | None = None) -> None:
        """SuperNodes for partitions 0..count-1, started together; returns once each holds its port."""
        for i in range(count):
            self._launch_supernode(i, num_partitions, data_root)
        self.confirm_supernodes(range(count))

    def node_ids(self) -> list[int]:
        """IDs of the SuperNodes the SuperLink lists as online (what ``flwr supernode list`` shows; none while
        the SuperLink does not answer)."""
        try:
            return self.control().online_node_ids()
        except ControlError:
            return []

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
            time.sleep(0.2)  # one in-process Control API call per look (a few ms of SuperLink time)

    # ----------------------------------------------------------------------- Control API and CLI
    def control(self) -> ControlClient:
        """This federation's Control API client (made on first use, closed by :meth:`stop`)."""
        with self._control_lock:
            if self._control is None:
                self._control = ControlClient(self.control_address, self.ca_cert)
            return self._control

    def _close_control(self) -> None:
        with self._control_lock:
            if self._control is not None:
                self._control.close()
                self._control = None

    def flwr(self, *args: str, check: bool = True, timeout: float = 60.0) -> str:
        """Run a ``flwr`` CLI command against this federation; returns stdout."""
        res = subprocess.run(
            [procs.executable("flwr"), *args],
            env=self.env,
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and res.returncode != 0:
            raise DeployError(f"flwr {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
        return res.stdout

    def run_status(self, run_id: int) -> str:
        """Status of a run as ``flwr ls`` reports it ('' when unknown or the SuperLink does not answer)."""
        try:
            return self.control().run_status(run_id)
        except ControlError:
            return ""

    def submit(
        self, run_config: dict[str, str], on_line: Callable[[str], None] = print, timeout: float | None = None
    ) -> RunResult:
        """``flwr run <app> --stream -c ...``: stream the run's log lines to ``on_line`` until it ends.

        Returns early (status "superlink-lost") when the spawned SuperLink dies, or "timeout".
        """
        overrides = " ".join(f'{k}="{v}"' for k, v in run_config.items())  # values must not contain quotes
        cmd = [procs.executable("flwr"), "run", str(self.app_dir), CONNECTION, "--stream", "-c", overrides]
        proc = procs.ManagedProcess("flwr-run", cmd, self.log_dir / "flwr-run.log", self.env, self.workdir)
        proc.log_path.parent.mkdir(parents=True, exist_ok=True)  # nothing spawned here may have made it
        self.cli.append(proc)
        t0 = time.monotonic()
        proc.popen = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            cwd=self.workdir,
            start_new_session=True,
            text=True,
            bufsize=1,
        )
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
        started = [p for p in [*self.supernodes.values(), self.superlink, self.superexec, *self.cli] if p is not None]
        return [p for p in started if p.popen is not None]

    def stop(self) -> dict[int, str]:
        """Stop the CLI, the SuperNodes, then the SuperLink with its SuperExec, by PID; returns leftovers (pid ->
        cmdline)."""
        for proc in self.cli:
            proc.stop(5.0)
        procs.stop_all(self.supernodes.values(), self.options.stop_timeout)  # first: they say goodbye to the link
        self._close_control()  # before the SuperLink: its graceful shutdown waits for open connections to close
        procs.stop_all([p for p in (self.superexec, self.superlink) if p is not None], self.options.stop_timeout)
        return procs.leftovers(self.processes())

    def __enter__(self) -> Federation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _restarted(proc: procs.ManagedProcess, old: procs.ManagedProcess | None) -> procs.ManagedProcess:
    """``proc`` replacing ``old``: it also owns the old tree's PIDs and groups (a killed process may leave
    children behind, and stopping must still reach them)."""
    if old is not None:
        proc.pids |= old.pids
        proc.pgids |= old.pgids
    return proc


def _pump(popen: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert popen.stdout is not None
    for line in popen.stdout:
        lines.put(line.rstrip("\n"))
    lines.put(None)
