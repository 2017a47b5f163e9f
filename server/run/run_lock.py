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
# what a run writes in its directory: these files, and these folders (its checkpoint's; the stateful clients' state)
RUN_FILES = (LOCK_FILE, "config.json", "status.json", "run.log", "metrics.csv", "metrics.jsonl", "partition.csv")
RUN_FILES += ("partition.json", "summary.json", "final_model.npz", "final_model_avg.npz")
RUN_FILES += ("accuracy.png", "loss.png", "lr.png", "norm.png", "gap.png", "partition.png")
RUN_FOLDERS = ("checkpoint", ".checkpoint.tmp", ".checkpoint.old", "client_state")


class RunDirRefused(ConfigError):
    """The run directory is another run's, or cannot hold this run's files: nothing of it may be written (its
    status.json included)."""


class RunDirInUse(RunDirRefused):
    """Another run holds the run directory now."""


class RunDirHoldsResults(RunDirRefused):
    """A fresh run would erase an earlier run's results."""


class RunDirShared(RunDirRefused):
    """Another job of the same multirun writes the same run directory."""


class RunDirUnfit(RunDirRefused):
    """An entry of the run directory is not what the run writes under its name (:func:`check_layout`)."""


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


def check_layout(run_dir: Path | str, folders: tuple[str, ...] = ()) -> None:
    """:class:`RunDirUnfit` naming the first entry of ``run_dir`` that is not what the run writes
    under its name (a folder where a file of :data:`RUN_FILES` goes, a file where a folder of :data:`RUN_FOLDERS`
    or of a command's ``folders`` goes): the run would stop there with a stack trace, at its start or hours later."""
    root = Path(run_dir)
    for names, kind, is_kind in ((RUN_FILES, "file", Path.is_file), (RUN_FOLDERS + folders, "folder", Path.is_dir)):
        for name in names:
            path = root / name
            if (path.exists() or path.is_symlink()) and not is_kind(path):
                raise RunDirUnfit(
                    f"'run_dir': {path.resolve() if path.exists() else path} is not a {kind}, and the run writes "
                    f"its {name} there: move it away or choose another run_dir"
                )


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
