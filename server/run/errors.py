"""The error of an invalid configuration (exit status 2 with a one-line message naming the key), and of a run
whose files cannot be written (exit status 1)."""

import errno
import tempfile
from pathlib import Path


class ConfigError(ValueError):
    """An invalid configuration value; the message names the key."""


class RunStorageError(RuntimeError):
    """The run's files cannot be written (a full disk, a quota, a read-only file system): the run stops, what it
    wrote is kept and ``resume=true`` continues from its last checkpoint once there is room."""


class RunStopped(RuntimeError):
    """The run was stopped from outside (its stacked group was stopped): it is resumable, and status.json keeps
    saying ``running``, as for a killed run."""


# the errors of storage that is full or cannot be written (not of a missing or unreadable file): no space, a quota, a
# read-only file system, a file past the size the file system or the process allows
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


def first_line(err: BaseException, limit: int = 200) -> str:
    """The first line of ``err``'s message (at most ``limit`` characters), or its type's name when it has none."""
    lines = str(err).strip().splitlines()
    return lines[0][:limit] if lines else type(err).__name__


def make_dir(path: Path | str, name: str) -> Path:
    """``path`` as an absolute folder, created with its parents, that this process can write into: what a command
    checks before any work for a folder it writes later. A :class:`ConfigError` ``<name> <path>: cannot create it
    (<why>)`` or ``... is not writable (<why>)`` otherwise (``name``: the option or key, e.g. ``--out``)."""
    folder = Path(path).resolve()
    why = folder_problem(folder)
    if why is not None:
        what = "is not writable" if folder.is_dir() else "cannot create it"
        raise ConfigError(f"{name} {folder}: {what} ({why})")
    return folder


def folder_problem(folder: Path) -> str | None:
    """Why this process cannot create ``folder`` (with its parents) and write a file into it, or None. Tried, not
    read from permission bits, which root passes and which /proc or a read-only mount do not show."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        return err.strerror or type(err).__name__
    return None
