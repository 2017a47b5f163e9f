"""Faster deployed rounds on Flower 1.39: the one module of the deployment that relies on Flower internals.

A stock Flower 1.39 deployment loses seconds per round in fixed waits (read in the installed source):

- ``flwr/supernode/start_client_internal.py``: the SuperNode's pull loop sleeps a fixed ``time.sleep(3)`` when
  the SuperLink has no message for it, and waits for its ClientApp's reply in ``time.sleep(0.5)`` steps;
- with ``--isolation subprocess`` the SuperNode's SuperExec polls for tasks every second and starts a fresh
  ``flwr-clientapp`` process per message, which imports torch and flwr again (1.5-4 s on 2 cores);
- a message becomes visible before its objects (the model) are uploaded, and whoever pulls it early retries the
  object pulls with a backoff of 1 s, 2 s, 4 s, ... (``supercore/inflatable/inflatable_utils.py``): a fast
  poller would hit that on most rounds;
- a SuperLink started with ``--database <file>`` (so that SuperNodes survive a SuperLink restart) also keeps
  every object (each model array, both ways) in that SQLite file, one transaction per object
  (``superlink/config_loader.py``, ``supercore/object_store/sql_object_store.py``): ~3 s per round here.

This module keeps Flower's files untouched and instead runs

- :func:`superlink_main` (``python -m server.deploy.flwr_fast superlink <flower-superlink args>``): Flower's own
  ``flower-superlink`` in this process, whose object store is always in memory (the LinkState, i.e. nodes,
  keys, runs and messages, still lives in the ``--database`` file; objects of messages in flight are lost in a
  SuperLink crash, and flower-deploy resumes the run from its checkpoint anyway), and whose Fleet handlers look
  up a running run's status at most every ``RUN_STATUS_TTL`` seconds (:class:`RunStatusCache`; with a database
  file Flower runs a status query and two clean-up UPDATEs for every object pushed or pulled);

- :func:`supernode_main` (``python -m server.deploy.flwr_fast supernode <flower-supernode args>``): Flower's own
  ``flower-supernode`` in this process, with the two sleeps of ``start_client_internal`` capped at
  ``--poll-interval`` seconds (the module's ``time`` is replaced by :class:`ShortSleepTime`), started with
  ``--isolation process`` and a SuperExec auth secret, plus one warm ClientApp worker as its child; the loop's
  ``_pull_and_store_message`` is wrapped to write one byte into a pipe to the worker whenever a message (and
  all its objects) has arrived;
- :func:`worker_main` (``python -m server.deploy.flwr_fast clientapp-worker``): a replacement for SuperExec that
  imports torch and flwr once, waits on that pipe (no idle polling; a slow fallback poll covers a lost byte),
  takes the ClientApp task from the SuperNode's Runtime API (``AcquireTask``, signed with the SuperExec auth
  secret) and runs it in a **fresh fork** (``run_clientapp``, exactly what ``flwr-clientapp`` runs), so every
  message still gets its own process, module globals and exit; a FAB is installed once per worker
  (:class:`InstallOnce`; Flower unzips and re-hashes it for every message).

:func:`patch_object_pulls` shortens that backoff (0.05 s doubling to 0.5 s; the total budget stays Flower's
``PULL_MAX_TIME``) in the SuperNode, in each ClientApp fork and, through ``server/run/app.py``, in the ServerApp.
The ServerApp's 3 s reply polling is cut with public Grid calls in :mod:`server.run.progress`, and the SuperLink's
SuperExec poll interval with Flower's public ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` (see server/deploy/federation.py).
:data:`INTERNALS` lists every internal used here; ``tests/deploy/test_flwr_fast_pins.py`` fails loudly when
one of them changes (another flwr version). docs/deploy.md explains the whole mechanism.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import os
import secrets
import select
import sys
import tempfile
import time
import traceback
from logging import INFO
from pathlib import Path
from types import ModuleType
from typing import Any

FLWR_VERSION = "1.39.0"  # the only version whose internals were read for this module
DEFAULT_POLL_INTERVAL = 0.5  # seconds between the SuperNode's pulls from the SuperLink when idle (Flower: 3)
LOCAL_WAIT = 0.02  # seconds between the SuperNode's checks of its own state for a reply (Flower: 0.5)
FALLBACK_POLL = 2.0  # seconds between the worker's task polls when the SuperNode signals nothing
PRELOAD = ("numpy", "torch", "flwr.app", "flwr.clientapp", "flwr.supernode.runtime.run_clientapp")
SUPERNODE_LOOP = "flwr.supernode.start_client_internal"
CLIENTAPP_RUNTIME = "flwr.supernode.runtime.run_clientapp"
SERVERAPP_GRID = "flwr.superlink.grid.http_grid"
SUPERLINK_CONFIG = "flwr.superlink.config_loader"
FLEET_HANDLERS = "flwr.server.superlink.fleet.message_handler.message_handler"
RUN_STATUS_TTL = 0.5  # seconds a running run is not looked up again by the Fleet handlers (Flower: 0)
PULL_BACKOFF = {"initial_backoff": 0.05, "backoff_cap": 0.5, "max_tries_per_object": None}  # Flower: 1, 10, 500
# (module, function) whose object pulls get PULL_BACKOFF: the SuperNode, the ClientApp, the ServerApp's grid
OBJECT_PULLS = ((SUPERNODE_LOOP, "pull_objects"), (CLIENTAPP_RUNTIME, "pull_and_inflate_object_from_tree"),
                (SERVERAPP_GRID, "pull_objects"))

# Flower internals this module relies on: (module, attribute). Pinned by tests/deploy/test_flwr_fast_pins.py.
INTERNALS = (
    (SUPERNODE_LOOP, "time"),  # the pull loop's `time.sleep(3)` and the reply wait's `time.sleep(0.5)`
    (SUPERNODE_LOOP, "_pull_and_store_message"),  # returns the run id once a message and its objects are stored
    *OBJECT_PULLS,  # called with Flower's default backoff (keyword arguments of PULL_BACKOFF)
    ("flwr.supernode.cli.flower_supernode", "flower_supernode"),
    ("flwr.supernode.runtime.run_clientapp", "run_clientapp"),
    (CLIENTAPP_RUNTIME, "install_from_fab"),  # called once per task as install_from_fab(fab.content, skip_prompt=True)
    (FLEET_HANDLERS, "check_abort"),  # module global, called by the Fleet handlers as check_abort(run_id, ..., state)
    ("flwr.supercore.runtime", "RuntimeHttpClient"),
    ("flwr.supercore.interceptors", "RuntimeVersionHttpInterceptor"),
    ("flwr.supercore.interceptors", "SuperExecAuthHttpInterceptor"),
    ("flwr.supercore.superexec.run_superexec", "_SUPEREXEC_AUTH_METHODS"),
    ("flwr.supercore.retry", "make_simple_http_retry_invoker"),
    ("flwr.supercore.app_utils", "start_parent_process_monitor"),
    ("flwr.supercore.constant", "TaskType"),
    ("flwr.proto.runtime_pb2", "AcquireTaskRequest"),
    ("flwr.common.logger", "update_console_handler"),  # timestamps in the SuperNode's and worker's log lines
    (SUPERLINK_CONFIG, "ObjectStoreFactory"),  # called as ObjectStoreFactory(database) for SQLite databases
    ("flwr.superlink.cli.flower_superlink", "flower_superlink"),
)


class ShortSleepTime:
    """Stand-in for the ``time`` module inside Flower's SuperNode loop: the idle wait between pulls from the
    SuperLink (``sleep(3)``) lasts at most ``cap``; the waits on the node's own in-memory state for the
    ClientApp's reply (``sleep(0.5)``, no network traffic) at most ``LOCAL_WAIT``."""

    def __init__(self, cap: float) -> None:
        self.cap = cap

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self.cap if seconds >= 1 else LOCAL_WAIT))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def patch_supernode_loop(poll_interval: float) -> ModuleType:
    """Cap the sleeps of Flower's SuperNode loop at ``poll_interval`` seconds; returns the patched module."""
    module = importlib.import_module(SUPERNODE_LOOP)
    if module.time is not time and not isinstance(module.time, ShortSleepTime):
        raise RuntimeError(f"{SUPERNODE_LOOP}.time is not the time module (flwr != {FLWR_VERSION}?)")
    module.time = ShortSleepTime(poll_interval)
    return module


class LoopWatch:
    """Wraps the SuperNode loop's ``_pull_and_store_message``: notes that the node joined (the loop runs only
    after the SuperLink accepted it) and writes one byte to ``notify_fd`` per stored message."""

    def __init__(self, notify_fd: int | None) -> None:
        self.notify_fd = notify_fd
        self.joined = False
        module = importlib.import_module(SUPERNODE_LOOP)
        self.original = module._pull_and_store_message
        module._pull_and_store_message = self.pull

    def pull(self, *args: Any, **kwargs: Any) -> Any:
        self.joined = True
        run_id = self.original(*args, **kwargs)
        if run_id is not None and self.notify_fd is not None:
            try:
                os.write(self.notify_fd, b"m")
            except (BlockingIOError, BrokenPipeError):  # full (the worker will acquire anyway) or worker gone
                pass
        return run_id


def patch_object_pulls(*names: str) -> None:
    """Give the object pulls of the named modules (default: all of :data:`OBJECT_PULLS`) a short backoff."""
    for module_name, attr in OBJECT_PULLS:
        if names and module_name not in names:
            continue
        module = importlib.import_module(module_name)
        original = getattr(module, attr)
        if not isinstance(original, functools.partial):
            setattr(module, attr, functools.partial(original, **PULL_BACKOFF))


# --------------------------------------------------------------------------- SuperLink launcher
def patch_object_store_in_memory() -> None:
    """Make the SuperLink build an in-memory object store whatever ``--database`` says (LinkState unchanged)."""
    module = importlib.import_module(SUPERLINK_CONFIG)
    factory = module.ObjectStoreFactory
    if getattr(factory, "in_memory", False):
        return
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME

    def in_memory_factory(database: str = FLWR_IN_MEMORY_DB_NAME) -> Any:
        return factory(FLWR_IN_MEMORY_DB_NAME)

    in_memory_factory.in_memory = True  # type: ignore[attr-defined]
    module.ObjectStoreFactory = in_memory_factory


class RunStatusCache:
    """Stand-in for ``check_abort`` in Flower's Fleet message handlers: a run found running is not looked up
    again for ``ttl`` seconds (Flower: a SQL status query plus two task-token clean-up UPDATEs per object)."""

    def __init__(self, check_abort: Any, ttl: float) -> None:
        self.check_abort, self.ttl = check_abort, ttl
        self.running: dict[tuple[int, tuple[str, ...], int], float] = {}  # key -> monotonic time of the check

    def __call__(self, run_id: int, abort_status_list: list[str], state: Any) -> str | None:
        key = (run_id, tuple(abort_status_list), id(state))
        checked = self.running.get(key)
        if checked is not None and time.monotonic() - checked < self.ttl:
            return None
        message = self.check_abort(run_id, abort_status_list, state)
        if message is None:
            self.running[key] = time.monotonic()
        else:
            self.running.pop(key, None)
        return message


def patch_fleet_run_checks(ttl: float = RUN_STATUS_TTL) -> None:
    """Make Flower's Fleet handlers check a running run's status at most every ``ttl`` seconds."""
    module = importlib.import_module(FLEET_HANDLERS)
    if not isinstance(module.check_abort, RunStatusCache):
        module.check_abort = RunStatusCache(module.check_abort, ttl)


def superlink_main(argv: list[str]) -> None:
    """Run ``flower-superlink`` in this process with an in-memory object store (see the module doc)."""
    patch_object_store_in_memory()
    patch_fleet_run_checks()
    from flwr.superlink.cli.flower_superlink import flower_superlink

    sys.argv = ["flower-superlink", *argv]
    flower_superlink()


# --------------------------------------------------------------------------- SuperNode launcher
def _supernode_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m server.deploy.flwr_fast supernode",
        description="flower-supernode with short polling and a warm ClientApp worker; every other argument "
                    "is passed to flower-supernode unchanged")
    parser.add_argument("--poll-interval", type=float, default=DEFAULT_POLL_INTERVAL,
                        help="seconds between pulls when idle (Flower: 3)")
    parser.add_argument("--superexec-auth-secret-file", default=None,
                        help="shared secret of the SuperNode's Runtime API and the worker (default: a fresh one)")
    parser.add_argument("--host", default="127.0.0.1", help="Runtime API host (keep it on loopback)")
    parser.add_argument("--port", type=int, default=9094, help="Runtime API port (distinct per SuperNode)")
    parser.add_argument("--isolation", default="process", choices=("process", "subprocess"),
                        help="'subprocess' = Flower's own SuperExec and one flwr-clientapp per message")
    return parser


def supernode_main(argv: list[str]) -> None:
    """Run ``flower-supernode`` in this process, with capped sleeps and (by default) a warm ClientApp worker."""
    args, flower_args = _supernode_parser().parse_known_args(argv)
    if args.poll_interval <= 0:
        raise SystemExit("--poll-interval must be > 0")
    flower_args += ["--host", args.host, "--port", str(args.port), "--isolation", args.isolation]
    worker, notify_w = None, None
    with tempfile.TemporaryDirectory(prefix="flwr-fast-") as tmp:
        if args.isolation == "process":
            secret_file = args.superexec_auth_secret_file or write_secret(Path(tmp) / "superexec.secret")
            flower_args += ["--superexec-auth-secret-file", str(secret_file)]
            notify_r, notify_w = os.pipe()
            os.set_blocking(notify_w, False)
            worker = _start_worker(f"{args.host}:{args.port}", str(secret_file), notify_r, Path(tmp) / "fabs")
            os.close(notify_r)
        _timestamped_logs()
        watch = LoopWatch(notify_w)
        patch_supernode_loop(args.poll_interval)
        patch_object_pulls(SUPERNODE_LOOP)
        from flwr.supernode.cli.flower_supernode import flower_supernode

        sys.argv = ["flower-supernode", *flower_args]
        try:
            flower_supernode()
        except SystemExit as exit_:
            if exit_.code not in (0, None) and not watch.joined:
                print(join_failure_hint(flower_args), file=sys.stderr, flush=True)
            raise
        finally:
            if worker is not None and worker.poll() is None:
                worker.terminate()


def join_failure_hint(flower_args: list[str]) -> str:
    """One line on why a SuperNode may not have joined, for the flags it was started with."""
    def value(flag: str) -> str | None:
        return flower_args[flower_args.index(flag) + 1] if flag in flower_args else None

    causes = []
    if "--insecure" in flower_args:
        causes.append("it connected without TLS (--insecure): a TLS SuperLink refuses that; pass "
                      "--root-certificates <the SuperLink's CA>")
    else:
        ca = value("--root-certificates") or "(system CAs)"
        causes.append(f"it verified the SuperLink against --root-certificates {ca}: that must be the CA that signed "
                      "the SuperLink's certificate (a plain SuperLink needs --insecure)")
    if value("--auth-supernode-private-key"):
        causes.append("with SuperNode authentication its public key must be registered (flwr supernode register)")
    causes.append("check the address and the firewall")
    return (f"flower-supernode: did not join the SuperLink at {value('--superlink')} (Flower's reason above; "
            f"exit code 1, retries bounded by --max-retries/--max-wait-time): " + "; ".join(causes) + ".")


def _timestamped_logs() -> None:
    from flwr.common.logger import update_console_handler

    update_console_handler(timestamps=True)


def write_secret(path: Path) -> Path:
    """A fresh random SuperExec auth secret in ``path`` (mode 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def _start_worker(runtime_address: str, secret_file: str, notify_fd: int, fab_marker_dir: Path):
    import subprocess

    fab_marker_dir.mkdir(mode=0o700)
    cmd = [sys.executable, "-m", "server.deploy.flwr_fast", "clientapp-worker",
           "--runtime-api-address", runtime_address,
           "--superexec-auth-secret-file", secret_file, "--parent-pid", str(os.getpid()),
           "--notify-fd", str(notify_fd), "--fab-marker-dir", str(fab_marker_dir)]
    return subprocess.Popen(cmd, pass_fds=(notify_fd,))


# --------------------------------------------------------------------------- warm ClientApp worker
class InstallOnce:
    """Stand-in for ``install_from_fab`` in Flower's ClientApp runtime (inherited by the worker's forks): a FAB
    whose SHA-256 a previous task of this worker installed is not unzipped and hash-checked again (Flower: every
    task, ~0.15 s on 2 cores). Flower itself never re-checks an installed app directory either."""

    def __init__(self, install: Any, marker_dir: Path) -> None:
        self.install, self.marker_dir = install, marker_dir

    def __call__(self, fab_file: Any, install_dir: Path | None = None, skip_prompt: bool = False) -> Path:
        if not isinstance(fab_file, bytes) or install_dir is not None:
            return self.install(fab_file, install_dir, skip_prompt)
        marker = self.marker_dir / hashlib.sha256(fab_file).hexdigest()
        try:
            installed = Path(marker.read_text())
            if installed.is_dir():
                return installed
        except OSError:
            pass
        installed = self.install(fab_file, install_dir, skip_prompt)
        tmp = marker.with_suffix(f".{os.getpid()}")
        tmp.write_text(str(installed))
        os.replace(tmp, marker)  # a concurrent fork sees the whole path or nothing
        return installed


def patch_fab_install(marker_dir: Path) -> None:
    """Install each FAB once per worker (see :class:`InstallOnce`)."""
    module = importlib.import_module(CLIENTAPP_RUNTIME)
    if not isinstance(module.install_from_fab, InstallOnce):
        module.install_from_fab = InstallOnce(module.install_from_fab, marker_dir)


def _worker_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m server.deploy.flwr_fast clientapp-worker",
                                     description="Warm ClientApp worker: one fork per ClientApp task")
    parser.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API (HOST:PORT)")
    parser.add_argument("--superexec-auth-secret-file", required=True)
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    parser.add_argument("--notify-fd", type=int, default=None,
                        help="pipe that receives a byte per arrived message (without it: poll)")
    parser.add_argument("--fab-marker-dir", default=None,
                        help="directory (removed by the SuperNode) that records the FABs installed by this worker")
    parser.add_argument("--fallback-poll", type=float, default=FALLBACK_POLL,
                        help="seconds between task polls when no byte arrives (or the poll interval without a pipe)")
    return parser


def worker_main(argv: list[str]) -> None:
    """Import the heavy modules once, then run every ClientApp task of the SuperNode in a fresh fork."""
    args = _worker_parser().parse_args(argv)
    for name in PRELOAD:
        importlib.import_module(name)
    _timestamped_logs()
    patch_object_pulls(CLIENTAPP_RUNTIME)  # inherited by every fork
    if args.fab_marker_dir is not None:
        patch_fab_install(Path(args.fab_marker_dir))  # inherited too
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.app_utils import start_parent_process_monitor
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor, SuperExecAuthHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.superexec.run_superexec import _SUPEREXEC_AUTH_METHODS

    if args.parent_pid is not None:
        start_parent_process_monitor(args.parent_pid)
    secret = Path(args.superexec_auth_secret_file).read_bytes()
    client = RuntimeHttpClient.from_server_address(
        server_address=args.runtime_api_address, insecure=True, root_certificates=None,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec"),
                      SuperExecAuthHttpInterceptor(master_secret=secret, protected_methods=_SUPEREXEC_AUTH_METHODS)],
        retry_invoker=make_simple_http_retry_invoker())
    request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
    children: dict[int, float] = {}  # pid -> start time
    signaled, next_poll = True, 0.0
    try:
        while True:
            _reap(children)
            if signaled or time.monotonic() >= next_poll:
                while (res := client.AcquireTask(request)).HasField("task") and res.token:
                    children[_fork_task(args.runtime_api_address, res.token)] = time.monotonic()
                next_poll = time.monotonic() + args.fallback_poll
            timeout = 0.1 if children else max(0.0, next_poll - time.monotonic())  # 0.1 s: reap on time
            signaled = _wait_for_message(args.notify_fd, timeout)
            if signaled is None:
                break  # the SuperNode closed the pipe: it is gone
    except KeyboardInterrupt:  # the parent monitor raises SIGINT when the SuperNode is gone
        pass
    finally:
        client.close()


def _wait_for_message(fd: int | None, timeout: float) -> bool | None:
    """Block until the SuperNode signals a message (True) or ``timeout`` passes (False); None: the pipe closed."""
    if fd is None:
        time.sleep(timeout)
        return False
    readable, _, _ = select.select([fd], [], [], timeout)
    if not readable:
        return False
    return True if os.read(fd, 4096) else None


def _reap(children: dict[int, float]) -> None:
    """Collect finished task processes and log their exit status and duration."""
    from flwr.common.logger import log

    for pid, started in list(children.items()):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            del children[pid]
            log(INFO, "ClientApp task process %d exited with %d after %.2f s", pid, os.waitstatus_to_exitcode(status),
                time.monotonic() - started)


def _fork_task(runtime_address: str, token: str) -> int:
    """Run one ClientApp task in a fresh child process (what ``flwr-clientapp --token`` runs); returns its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        for name in [m for m in sys.modules if m == "server" or m.startswith("server.")]:
            del sys.modules[name]  # the ClientApp's own modules come from the run's FAB, never from this worker
        from flwr.supernode.runtime.run_clientapp import run_clientapp

        run_clientapp(runtime_api_address=runtime_address, token=token, insecure=True, certificates=None,
                      parent_pid=os.getppid(), runtime_dependency_install=False)
        code = 0
    except SystemExit as exit_:  # run_clientapp ends with flwr_exit -> sys.exit
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # noqa: BLE001 - a child must never return into the worker loop
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    """``python -m server.deploy.flwr_fast {supernode|clientapp-worker} ...``."""
    commands = {"superlink": superlink_main, "supernode": supernode_main, "clientapp-worker": worker_main}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        raise SystemExit(f"usage: python -m server.deploy.flwr_fast {{{'|'.join(commands)}}} [args]")
    commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
