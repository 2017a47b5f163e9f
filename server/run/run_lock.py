"""A run directory is one run's: while a run goes on it holds an exclusive lock on ``<run_dir>/.lock`` (POSIX
``flock``, released by the kernel however the process ends, ``kill -9`` included, so a lock is never stale). A second
run of the same directory (the same command started twice, a sweep's driver run again while it still runs) would
interleave its metrics rows and checkpoints with the first's; it is refused with one line before it writes anything.
So is a fresh run (``resume=false``) of a directory that holds an earlier run's results, which it would erase, unless
``overwrite=true`` says so (:func:`check_fresh`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from logging import WARNING
from pathlib import Path

from flwr.common.logger import log

from server.run.errors import ConfigError

LOCK_FILE = ".lock"


class RunDirRefused(ConfigError):
    """The run directory is another run's: nothing of it may be written (its status.json included)."""


class RunDirInUse(RunDirRefused):
    """Another run holds the run directory now."""


class RunDirHoldsResults(RunDirRefused):
    """A fresh run would erase an earlier run's results."""


@contextlib.contextmanager
def run_dir_lock(run_dir: Path | str) -> Iterator[None]:
    """Hold ``run_dir``'s lock for the block; :class:`RunDirInUse` naming the holder when another run holds it. Where
    the file system has no locks, the block runs unlocked (a warning says so)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    path = Path(run_dir) / LOCK_FILE
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = (handle.read(200).strip().splitlines() or ["another process"])[0]  # what the holder wrote
            raise RunDirInUse(
                f"'run_dir': {Path(run_dir).resolve()} is in use by another run ({holder}); wait for it to end or "
                "choose another run_dir"
            ) from None
        except OSError as err:  # e.g. a network file system without locks
            log(WARNING, "run_dir %s cannot be locked (%s): a second run of it would not be refused", run_dir, err)
            yield
            return
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def check_free(run_dir: Path | str) -> None:
    """:class:`RunDirInUse` when another run holds ``run_dir`` now (a command's check before any work; the run itself
    then holds the lock with :func:`run_dir_lock`)."""
    with run_dir_lock(run_dir):
        pass


def check_fresh(run_dir: Path | str) -> None:
    """:class:`RunDirHoldsResults` when ``run_dir`` holds an earlier run's metrics (a fresh run rewrites them): the
    check of ``resume=false`` without ``overwrite=true``."""
    upto = earlier_results(run_dir)
    if upto:
        raise RunDirHoldsResults(
            f"'run_dir': {Path(run_dir).resolve()} holds an earlier run's results ({upto}); resume=true continues "
            "it, overwrite=true replaces it, or choose another run_dir"
        )


def earlier_results(run_dir: Path | str) -> str | None:
    """What earlier metrics ``run_dir`` holds ("metrics up to round N"; None: none); :class:`RunDirHoldsResults`
    when they cannot be read."""
    metrics = Path(run_dir) / "metrics.jsonl"
    try:
        lines = [line for line in metrics.read_text().splitlines() if line.strip()]
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        raise RunDirHoldsResults(f"'run_dir': {metrics} cannot be read ({err.strerror})") from None
    if not lines:
        return None
    try:
        return f"metrics up to round {int(json.loads(lines[-1])['round'])}"
    except (ValueError, KeyError, TypeError):
        return f"{len(lines)} metrics rows"
