"""Run the project's console scripts in a fork of a warm process: the tests' CLI runs without re-importing torch.

Every ``flower-simulation`` call of a test starts a Python that imports torch, Flower and Hydra again before its
first line of work (~3 CPU-s on 2 cores; ~60 such runs per suite). :class:`WarmCLI` starts one server process per
pytest worker that imports those once and never computes; each call is then a **fresh fork** of it that runs the
console script's own entry point (the ``module:function`` pip's wrapper calls, read from the installed entry points)
with the call's argv, environment, working directory and output files, and exits with its exit code — the
pattern of flower-deploy's warm ClientApp worker (server/deploy/flwr_fast.py). A call's process is still its own:
module globals, Hydra, logging and exit are its own, and a timeout kills its whole process group.

What it does not reproduce is the interpreter's own start-up (``PYTHON*`` variables are read at the server's
start; the hash seed is the server's). Tests whose subject is the console script as a process (signals, exit
codes before any import, Ray, deployments) start it with ``subprocess`` as before; tests/simcli.py's
``run_cli`` uses this only for ``engine=batched`` runs and the report/optimum/plot CLIs.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from importlib.metadata import entry_points
from pathlib import Path

# imported by the server before it forks: everything an engine=batched run, a report, f* and a plot load
WARM_MODULES = (
    "torch",
    "numpy",
    "hydra",
    "omegaconf",
    "flwr.serverapp",
    "flwr.clientapp",
    "flwr.app",
    "matplotlib.pyplot",
    "scipy.stats",
    "server.run.cli",
    "server.run.app",
    "server.batched.engine",
    "server.report.sweep",
    "server.report.metrics",
    "server.report.run_plots",
    "server.convex.cli",
    "client.app",
)


def entry_point(name: str) -> str:
    """``module:function`` of the installed console script ``name`` (a ``module:function`` is itself)."""
    if ":" in name:
        return name
    found = [ep.value for ep in entry_points(group="console_scripts") if ep.name == name]
    if not found:
        raise ValueError(f"no console script {name!r} installed")
    return found[0]


class WarmCLI:
    """A warm server process; :meth:`run` is ``subprocess.run([name, *args], ...)`` through one fork of it."""

    def __init__(self, env: dict[str, str], scratch: Path) -> None:
        self.scratch = scratch
        self.calls = 0
        code = f"import sys; sys.path.append({str(Path(__file__).parent)!r}); import warm_cli; warm_cli.serve()"
        self.server = subprocess.Popen(
            [sys.executable, "-u", "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self._selector = selectors.DefaultSelector()
        assert self.server.stdout is not None
        self._selector.register(self.server.stdout, selectors.EVENT_READ)
        ready = self._reply(600)  # the imports
        assert ready == {"ready": True}, ready

    def _reply(self, timeout: float | None) -> dict | None:
        assert self.server.stdout is not None
        if not self._selector.select(timeout):
            return None
        line = self.server.stdout.readline()
        if not line:
            raise RuntimeError(f"warm CLI server ended (exit {self.server.poll()})")
        return json.loads(line)

    def run(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        cwd: str | Path | None = None,
        timeout: float | None = None,
        merge_output: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run console script ``name`` with ``args``; stdout and stderr captured (merged into stdout when
        ``merge_output``); raises ``subprocess.TimeoutExpired`` after killing the call's process group."""
        self.calls += 1
        out = self.scratch / f"call-{self.calls}.out"
        err = out if merge_output else self.scratch / f"call-{self.calls}.err"
        request = {
            "entry": entry_point(name),
            "argv": [name, *map(str, args)],
            "env": env,
            "cwd": str(cwd or os.getcwd()),
            "out": str(out),
            "err": str(err),
        }
        assert self.server.stdin is not None
        self.server.stdin.write(json.dumps(request) + "\n")
        self.server.stdin.flush()
        started = self._reply(60)
        assert started is not None and "pid" in started, started
        done = self._reply(timeout)
        if done is None:
            os.killpg(started["pid"], signal.SIGKILL)
            self._reply(60)
            raise subprocess.TimeoutExpired([name, *args], timeout or 0, out.read_text())
        stderr = None if merge_output else err.read_text()
        return subprocess.CompletedProcess([name, *args], done["rc"], out.read_text(), stderr)

    def close(self) -> None:
        if self.server.stdin is not None:
            self.server.stdin.close()
        self.server.wait(30)


_SHARED: WarmCLI | None = None


def shared(env: dict[str, str]) -> WarmCLI:
    """This test process's server (started on first use with ``env``, closed at exit)."""
    global _SHARED
    if _SHARED is None or _SHARED.server.poll() is not None:
        _SHARED = WarmCLI(env, Path(tempfile.mkdtemp(prefix="warm-cli-")))
        atexit.register(_SHARED.close)
    return _SHARED


def wants_warm(name: str, args: list[str]) -> bool:
    """Whether a test's call of console script ``name`` runs through the warm server: ``engine=batched``
    simulations and the report, optimum and plot CLIs (no Ray, no deployment, no signal handling under test)."""
    if name == "flower-simulation":
        return "engine=batched" in map(str, args)
    return name in ("flower-report", "flower-optimum", "flower-plot")


def probe() -> None:
    """An entry point for tests/server/test_warm_cli.py: prints the call's cwd, argv and ``WARM_CLI_PROBE``, a line
    on stderr, and exits with ``argv[1]``."""
    print(json.dumps({"cwd": os.getcwd(), "argv": sys.argv, "probe": os.environ.get("WARM_CLI_PROBE")}))
    print("probe on stderr", file=sys.stderr)
    raise SystemExit(int(sys.argv[1]))


def _exit_code(code: object) -> int:
    """The exit status of ``SystemExit(code)``, as the interpreter computes it (a message is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _child(request: dict) -> None:
    """In the fork: the call's output files, environment, cwd and argv; run the entry point; exit like Python."""
    os.setsid()
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = (
        out
        if request["err"] == request["out"]
        else os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    )
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's stdin until it exits
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = list(request["argv"])
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the handlers a fresh interpreter starts with
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    status = 1
    try:
        module, _, attr = request["entry"].partition(":")
        function = __import__(module, fromlist=[attr])
        for part in attr.split("."):
            function = getattr(function, part)
        function()
        status = 0
    except SystemExit as end:
        status = _exit_code(end.code)
    except BaseException:  # noqa: BLE001 - printed as the interpreter would, exit status 1
        traceback.print_exc()
    try:  # the interpreter's own shutdown: non-daemon threads, then atexit handlers
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)


def serve() -> None:
    """The server: import the warm modules, say ready, then one fork per request line; reply its pid and status."""
    import importlib

    for module in WARM_MODULES:
        importlib.import_module(module)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
