"""Helpers of the deployment security tests: listening sockets of processes, Runtime API probes, intruders."""

from __future__ import annotations

import ipaddress
import os
import time
from collections.abc import Callable
from pathlib import Path

from server.deploy.federation import START_ATTEMPTS, Federation, start_state
from server.run import procs


def _ip(hex_addr: str) -> str:
    """An address of /proc/net/tcp{,6} (little-endian 32-bit words) as text; v4-mapped v6 as plain v4."""
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    addr = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
    return str(addr.ipv4_mapped or addr)


def listening_sockets(pids: set[int]) -> set[tuple[str, int]]:
    """(ip, port) of every TCP socket in LISTEN state held by one of ``pids``."""
    by_inode: dict[str, tuple[str, int]] = {}
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                addr, port = fields[1].split(":")
                by_inode[fields[9]] = (_ip(addr), int(port, 16))
    found = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in by_inode:
                found.add(by_inode[target[8:-1]])
    return found


def federation_sockets(fed: Federation) -> dict[str, set[tuple[str, int]]]:
    """Listening sockets per started process (name -> {(ip, port)}), children included."""
    table = procs.process_table()
    out = {}
    for proc in fed.processes():
        proc.snapshot(table)
        out[proc.name] = listening_sockets(proc.members(table))
    return out


def acquire_task(address: str, secret: bytes | None, root_certificates: str | None = None):
    """Call ``AcquireTask`` on a Runtime API, signed with ``secret`` (or not): what a local attacker would try."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor, SuperExecAuthHttpInterceptor
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.superexec.run_superexec import _SUPEREXEC_AUTH_METHODS

    interceptors = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
    if secret is not None:
        interceptors.append(
            SuperExecAuthHttpInterceptor(master_secret=secret, protected_methods=_SUPEREXEC_AUTH_METHODS)
        )
    client = RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=root_certificates is None,
        root_certificates=root_certificates,
        interceptors=interceptors,
    )
    try:
        return client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP, TaskType.SERVER_APP]))
    finally:
        client.close()


def runtime_port(proc: procs.ManagedProcess) -> int:
    """The ``--port`` (Runtime API) of a SuperNode command."""
    return int(proc.cmd[proc.cmd.index("--port") + 1])


def start_intruder(
    fed: Federation,
    name: str,
    security: list[str],
    node_config: str,
    home: Path,
    max_wait: float = 8.0,
    poll_interval: float | None = None,
) -> procs.ManagedProcess:
    """A SuperNode that is no member of ``fed`` (own log, own FLWR_HOME, short connection budget), polling
    every ``poll_interval`` s (default: the federation's)."""
    cmd = [*fed.supernode_command(node_config, security), "--max-wait-time", str(max_wait)]
    if poll_interval is not None:
        cmd[cmd.index("--poll-interval") + 1] = str(poll_interval)
    env = {**fed.env, "FLWR_HOME": str(home)}
    return _start_bound(lambda: procs.ManagedProcess(name, cmd, fed.log_dir / f"{name}.log", env, fed.workdir), cmd)


def _start_bound(make: Callable[[], procs.ManagedProcess], cmd: list[str]) -> procs.ManagedProcess:
    """Start the SuperNode ``make()`` builds and wait until it holds its Runtime API port or exits
    (``federation.start_state``); when another process took that port first, start it again on a fresh one."""
    for _ in range(START_ATTEMPTS):
        proc = make().start()
        deadline = time.monotonic() + 120  # a start-up that never ends is a failure, not a wait
        while (state := start_state(proc)) == "starting" and time.monotonic() < deadline:
            time.sleep(0.05)
        if state != "port-taken":
            return proc
        cmd[cmd.index("--port") + 1] = str(procs.free_port())
    return proc


def start_silent_node(fed: Federation, name: str, node_config: str, home: Path) -> procs.ManagedProcess:
    """A registered SuperNode that joins but never runs a ClientApp: Flower's stock ``flower-supernode`` with
    ``--isolation process`` and no SuperExec, so the messages it pulls are never answered."""
    cmd = [
        procs.executable("flower-supernode"),
        "--root-certificates",
        str(fed.ca_cert),
        "--auth-supernode-private-key",
        str(fed.node_key(name).private),
        "--superlink",
        fed.fleet_address,
        "--isolation",
        "process",
        "--host",
        "127.0.0.1",
        "--port",
        str(procs.free_port()),
        "--max-wait-time",
        "30",
        "--node-config",
        node_config,
    ]
    env = {**fed.env, "FLWR_HOME": str(home)}
    return _start_bound(lambda: procs.ManagedProcess(name, cmd, fed.log_dir / f"{name}.log", env, fed.workdir), cmd)


def answered_query(log: Path) -> bool:
    """Whether the SuperNode writing ``log`` has sent its answer to a partition query."""
    text = log.read_text() if log.exists() else ""
    return "Sending: query message" in text and "Sent successfully" in text.split("Sending: query message", 1)[1]


def open_gate_when_answered(logs: list[Path], gate: Path, timeout: float = 180.0) -> None:
    """Thread: create ``gate`` once every SuperNode writing one of ``logs`` has sent its answer to a partition
    query (so the ServerApp collects it by the next round at the latest), or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(answered_query(log) for log in logs):
        time.sleep(0.1)
    gate.touch()


def open_gate_when_logged(
    lines: list[str], text: str, gate: Path, timeout: float = 180.0, log_file: Path | None = None
) -> None:
    """Thread: create ``gate`` once one of the ServerApp's streamed ``lines`` or a line of ``log_file`` (its
    run.log, which holds the details the console leaves out) contains ``text``, or after ``timeout`` (the test's
    own checks then fail)."""

    def logged() -> bool:
        if any(text in line for line in list(lines)):
            return True
        return log_file is not None and log_file.exists() and text in log_file.read_text(errors="replace")

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not logged():
        time.sleep(0.1)
    gate.touch()
