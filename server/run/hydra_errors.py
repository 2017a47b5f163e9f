"""Hydra's own errors of composing a command's config as one line and exit status 2, as every other invalid
configuration: an override of a key the config does not have, a config group option that does not exist, an
override that does not parse; and an output folder Hydra cannot create or write. ``HYDRA_FULL_ERROR=1`` keeps
Hydra's own report (with its stack trace)."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import sysconfig
from collections.abc import Iterator
from types import TracebackType

import hydra
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException

from server.run.errors import first_line

FULL_ERROR = "HYDRA_FULL_ERROR"  # Hydra prints its errors itself unless this is "1"; with it, they reach the caller
COMPOSE_ERRORS = (ConfigCompositionException, OverrideParseException)


def describe(err: BaseException) -> str:
    """Hydra's message of a composition error in one line: the options of a missing config group option, the key
    an override names that the config does not have (any other error: its first line)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    if isinstance(err, MissingConfigException):
        head = re.sub(r"^In '[^']*': ", "", lines[0])
        return f"{head} (options: {', '.join(err.options)})" if err.options else head
    if isinstance(err, OverrideParseException):
        return f"cannot parse the override {err.override!r}: {lines[0]}"
    if not isinstance(err, ConfigCompositionException):
        return lines[0]
    cause = err.__cause__
    if isinstance(cause, OmegaConfBaseException) and "not in struct" in str(cause) and getattr(cause, "full_key", None):
        return f"{' '.join(lines)} (the config has no key {cause.full_key!r})"
    if cause is not None and str(cause).strip():
        return f"{' '.join(lines)} ({first_line(cause)})"
    return " ".join(lines)


def _raised_by_hydra(err: BaseException) -> bool:
    """Whether the innermost frame of ``err`` outside the standard library is Hydra's own (creating the output
    folder and its job log before the command's task runs)."""
    stdlib, package = sysconfig.get_paths()["stdlib"], os.path.dirname(hydra.__file__)
    frames = [tb.tb_frame.f_code.co_filename for tb in _tracebacks(err)]
    own = [f for f in frames if not f.startswith(stdlib)]
    return bool(own) and own[-1].startswith(package + os.sep)


def _tracebacks(err: BaseException) -> Iterator[TracebackType]:
    tb = err.__traceback__
    while tb is not None:
        yield tb
        tb = tb.tb_next


@contextlib.contextmanager
def composition_errors(prog: str) -> Iterator[None]:
    """Run a ``hydra.main`` function: a composition error is one line ``<prog>: invalid configuration: ...`` on
    stderr and exit 2, and so is an output folder Hydra cannot write (``hydra.run.dir``); any other error keeps its
    stack trace."""
    if os.environ.get(FULL_ERROR) == "1":
        yield
        return
    os.environ[FULL_ERROR] = "1"
    try:
        yield
    except COMPOSE_ERRORS as err:
        print(f"{prog}: invalid configuration: {describe(err)}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as err:
        if not _raised_by_hydra(err):  # the command's own work: its stack trace
            raise
        why = err.strerror or type(err).__name__
        print(f"{prog}: cannot write Hydra's output folder: {err.filename} ({why}); set hydra.run.dir (hydra.sweep.dir "
              "with -m) to a folder this user can write", file=sys.stderr)  # fmt: skip
        raise SystemExit(2) from None
    finally:
        os.environ.pop(FULL_ERROR, None)
