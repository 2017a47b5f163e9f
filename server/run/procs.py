"""OS process bookkeeping for the deployment: start, watch and stop Flower processes by PID.

Every process is started in its own session (``start_new_session``), so its process group holds the
process and the children it does not detach (a SuperNode's SuperExec and ``flwr-clientapp`` processes).
The SuperLink detaches its SuperExec (and with it every ``flwr-serverapp``) into a new session, so each
:class:`ManagedProcess` also remembers the process groups of the descendants it has seen
(:meth:`ManagedProcess.snapshot`). Stopping signals exactly those PIDs: nothing is matched by name.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

FLOWER_MARKERS = ("flower-", "flwr")  # a PID is signalled only while its command line still looks like Flower's


PORT_TAKEN = re.compile(r"already in use", re.IGNORECASE)  # Flower's gRPC and uvicorn's words for a lost port
_handed_out: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for ``bind(0)`` and for the source port of every outgoing connection."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, below the kernel's ephemeral range where that leaves room.

    A port from ``bind(0)`` lies in the ephemeral range, where any process's next outgoing connection (Ray,
    gRPC, another federation on the same host) may take it before our server binds it: "address already in use"
    by chance. Below the range only servers that bind a port by its number compete. The same port is never
    handed out twice by one process. Callers still check that the bind succeeded (``PORT_TAKEN``) and retry.
    """
    low = ephemeral_range()[0]
    if low > 20000 + 1000:
        rng = random.SystemRandom()
        for _ in range(200):
            port = rng.randrange(20000, low)
            if port not in _handed_out and _bindable(host, port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def executable(name: str) -> str:
    """Path of a console script of this interpreter's environment (``flwr``, ``flower-superlink``, ...)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, pgid) of a live, non-zombie ``pid``; None otherwise."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may contain spaces and parentheses
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[2])


def process_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, pgid) of every live process."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            table[int(entry)] = st
    return table


def cmdline(pid: int) -> str:
    """The command line of ``pid`` ('' when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _is_flower(pid: int) -> bool:
    """True for a Flower command line, and for an empty one: an exiting process has released its memory
    (and cmdline) before it becomes a zombie, and still counts as alive."""
    line = cmdline(pid)
    return not line or any(marker in line for marker in FLOWER_MARKERS)


class ManagedProcess:
    """One started command (SuperLink, SuperNode, ``flwr run``) with its log file and process groups."""

    def __init__(self, name: str, cmd: list[str], log_path: Path, env: Mapping[str, str], cwd: Path) -> None:
        self.name, self.cmd, self.log_path, self.env, self.cwd = name, cmd, log_path, dict(env), cwd
        self.popen: subprocess.Popen[bytes] | None = None
        self.pgids: set[int] = set()
        self.pids: set[int] = set()
        self.log_start = 0  # offset in the log where the last start's output begins

    def start(self) -> ManagedProcess:
        """Start the command in a new session; stdout and stderr go to ``log_path`` (appended)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n$ {' '.join(self.cmd)}\n".encode())
            log.flush()
            self.log_start = log.tell()
            self.popen = subprocess.Popen(
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        self.pgids.add(self.popen.pid)
        self.pids.add(self.popen.pid)
        return self

    @property
    def pid(self) -> int:
        """PID of the started command."""
        if self.popen is None:
            raise RuntimeError(f"{self.name} was not started")
        return self.popen.pid

    def alive(self) -> bool:
        """True while the command itself runs."""
        return self.popen is not None and self.popen.poll() is None

    def returncode(self) -> int | None:
        """Exit status once the command has ended."""
        return None if self.popen is None else self.popen.poll()

    def snapshot(self, table: Mapping[int, tuple[int, int]] | None = None) -> None:
        """Remember the PIDs and process groups of the current descendants (children may detach)."""
        if self.popen is None:
            return
        table = process_table() if table is None else table
        frontier = [pid for pid in self.pids if pid in table]
        while frontier:
            parent = frontier.pop()
            for pid, (ppid, pgid) in table.items():
                if ppid == parent and pid not in self.pids:
                    self.pids.add(pid)
                    self.pgids.add(pgid)
                    frontier.append(pid)

    def members(self, table: Mapping[int, tuple[int, int]] | None = None) -> set[int]:
        """Live PIDs that belong to this process: its tree as seen so far and its process groups."""
        table = process_table() if table is None else table
        return {pid for pid, (_, pgid) in table.items() if (pid in self.pids or pgid in self.pgids) and _is_flower(pid)}

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the command and to every member (after a fresh snapshot)."""
        table = process_table()
        self.snapshot(table)
        for pid in sorted(self.members(table)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 15.0) -> bool:
        """SIGTERM every member, then SIGKILL what is left after ``timeout``; True when all are gone."""
        if self.popen is None:
            return True
        self.signal(signal.SIGTERM)
        if wait_gone([self], timeout):
            return True
        self.signal(signal.SIGKILL)
        return wait_gone([self], 5.0)

    def kill(self) -> None:
        """SIGKILL the command and its members at once (a crash), and reap the command."""
        self.signal(signal.SIGKILL)
        if self.popen is not None:
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def output(self) -> str:
        """What the command wrote to its log since its last start."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.log_start)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def wait_gone(processes: Iterable[ManagedProcess], timeout: float) -> bool:
    """Reap the commands and wait until no member of ``processes`` is alive; True on success."""
    processes = list(processes)
    deadline = time.monotonic() + timeout
    while True:
        running = [proc for proc in processes if proc.popen is not None and proc.popen.poll() is None]
        table = process_table()
        if not running and not any(proc.members(table) for proc in processes):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def stop_all(processes: Iterable[ManagedProcess], timeout: float) -> bool:
    """SIGTERM every process at once, wait up to ``timeout`` s for all of them, then stop what is left (SIGTERM,
    SIGKILL after 1 s); True when all are gone."""
    processes = list(processes)
    for proc in processes:
        proc.signal(signal.SIGTERM)
    if wait_gone(processes, timeout):
        return True
    return all([proc.stop(1.0) for proc in processes])


def leftovers(processes: Iterable[ManagedProcess]) -> dict[int, str]:
    """pid -> command line of members still alive (tests assert this is empty)."""
    table = process_table()
    return {pid: cmdline(pid) for proc in processes for pid in proc.members(table)}
