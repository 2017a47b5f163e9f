"""Faster deployed rounds on Flower 1.39: launchers of Flower's SuperLink and SuperNode with short waits.

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

This module keeps Flower's files untouched and instead runs (the patches of Flower's internals themselves live in
:mod:`server.internals`: ``flower_superlink``, ``flower_supernode``, ``flower_clientapp``, ``flower_object_pulls``)

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

:func:`~server.internals.flower_object_pulls.patch_object_pulls` shortens that backoff (0.05 s doubling to 0.5 s;
the total budget stays Flower's ``PULL_MAX_TIME``) in the SuperNode, in each ClientApp fork and, through
``server/deploy/server_app.py``, in the ServerApp.
The ServerApp's 3 s reply polling is cut with public Grid calls in :mod:`server.run.progress`, and the SuperLink's
SuperExec poll interval with Flower's public ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` (see server/deploy/federation.py).
:data:`server.internals.pins.PINS` lists every internal used; ``tests/server/test_internals_pins.py`` fails loudly
when one of them changes (another flwr version). docs/deploy.md explains the whole mechanism.
"""

from __future__ import annotations

import argparse
import os
import secrets
import select
import sys
import tempfile
import time
import traceback
from logging import INFO
from pathlib import Path

from server.internals.flower_clientapp import (
    RuntimeTaskClient,
    patch_fab_install,
    preload,
    run_clientapp_task,
    start_parent_monitor,
)
from server.internals.flower_object_pulls import CLIENTAPP_RUNTIME, SUPERNODE_LOOP, patch_object_pulls
from server.internals.flower_superlink import run_flower_superlink
from server.internals.flower_supernode import LoopWatch, patch_supernode_loop, run_flower_supernode, timestamped_logs

DEFAULT_POLL_INTERVAL = 0.5  # seconds between the SuperNode's pulls from the SuperLink when idle (Flower: 3)
FALLBACK_POLL = 2.0  # seconds between the worker's task polls when the SuperNode signals nothing


# --------------------------------------------------------------------------- SuperLink launcher
def superlink_main(argv: list[str]) -> None:
    """Run ``flower-superlink`` in this process with an in-memory object store (see the module doc)."""
    run_flower_superlink(argv)


# --------------------------------------------------------------------------- SuperNode launcher
def _supernode_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m server.deploy.flwr_fast supernode",
        description="flower-supernode with short polling and a warm ClientApp worker; every other argument "
        "is passed to flower-supernode unchanged",
    )
    parser.add_argument(
        "--poll-interval", type=float, default=DEFAULT_POLL_INTERVAL, help="seconds between pulls when idle (Flower: 3)"
    )
    parser.add_argument(
        "--superexec-auth-secret-file",
        default=None,
        help="shared secret of the SuperNode's Runtime API and the worker (default: a fresh one)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="Runtime API host (keep it on loopback)")
    parser.add_argument("--port", type=int, default=9094, help="Runtime API port (distinct per SuperNode)")
    parser.add_argument(
        "--isolation",
        default="process",
        choices=("process", "subprocess"),
        help="'subprocess' = Flower's own SuperExec and one flwr-clientapp per message",
    )
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
        timestamped_logs()
        watch = LoopWatch(notify_w)
        patch_supernode_loop(args.poll_interval)
        patch_object_pulls(SUPERNODE_LOOP)
        try:
            run_flower_supernode(flower_args)
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
        causes.append(
            "it connected without TLS (--insecure): a TLS SuperLink refuses that; pass "
            "--root-certificates <the SuperLink's CA>"
        )
    else:
        ca = value("--root-certificates") or "(system CAs)"
        causes.append(
            f"it verified the SuperLink against --root-certificates {ca}: that must be the CA that signed "
            "the SuperLink's certificate (a plain SuperLink needs --insecure)"
        )
    if value("--auth-supernode-private-key"):
        causes.append("with SuperNode authentication its public key must be registered (flwr supernode register)")
    causes.append("check the address and the firewall")
    return (
        f"flower-supernode: did not join the SuperLink at {value('--superlink')} (Flower's reason above; "
        f"exit code 1, retries bounded by --max-retries/--max-wait-time): " + "; ".join(causes) + "."
    )


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
    cmd = [
        sys.executable,
        "-m",
        "server.deploy.flwr_fast",
        "clientapp-worker",
        "--runtime-api-address",
        runtime_address,
        "--superexec-auth-secret-file",
        secret_file,
        "--parent-pid",
        str(os.getpid()),
        "--notify-fd",
        str(notify_fd),
        "--fab-marker-dir",
        str(fab_marker_dir),
    ]
    return subprocess.Popen(cmd, pass_fds=(notify_fd,))


# --------------------------------------------------------------------------- warm ClientApp worker
def _worker_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m server.deploy.flwr_fast clientapp-worker",
        description="Warm ClientApp worker: one fork per ClientApp task",
    )
    parser.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API (HOST:PORT)")
    parser.add_argument("--superexec-auth-secret-file", required=True)
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    parser.add_argument(
        "--notify-fd", type=int, default=None, help="pipe that receives a byte per arrived message (without it: poll)"
    )
    parser.add_argument(
        "--fab-marker-dir",
        default=None,
        help="directory (removed by the SuperNode) that records the FABs installed by this worker",
    )
    parser.add_argument(
        "--fallback-poll",
        type=float,
        default=FALLBACK_POLL,
        help="seconds between task polls when no byte arrives (or the poll interval without a pipe)",
    )
    return parser


def worker_main(argv: list[str]) -> None:
    """Import the heavy modules once, then run every ClientApp task of the SuperNode in a fresh fork."""
    args = _worker_parser().parse_args(argv)
    preload()
    timestamped_logs()
    patch_object_pulls(CLIENTAPP_RUNTIME)  # inherited by every fork
    if args.fab_marker_dir is not None:
        patch_fab_install(Path(args.fab_marker_dir))  # inherited too
    if args.parent_pid is not None:
        start_parent_monitor(args.parent_pid)
    client = RuntimeTaskClient(args.runtime_api_address, Path(args.superexec_auth_secret_file).read_bytes())
    children: dict[int, float] = {}  # pid -> start time
    signaled, next_poll = True, 0.0
    try:
        while True:
            _reap(children)
            if signaled or time.monotonic() >= next_poll:
                while (token := client.acquire()) is not None:
                    children[_fork_task(args.runtime_api_address, token)] = time.monotonic()
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
            log(
                INFO,
                "ClientApp task process %d exited with %d after %.2f s",
                pid,
                os.waitstatus_to_exitcode(status),
                time.monotonic() - started,
            )


def _fork_task(runtime_address: str, token: str) -> int:
    """Run one ClientApp task in a fresh child process (what ``flwr-clientapp --token`` runs); returns its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        for name in [m for m in sys.modules if m == "server" or m.startswith("server.")]:
            del sys.modules[name]  # the ClientApp's own modules come from the run's FAB, never from this worker
        run_clientapp_task(runtime_address, token)
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
