"""Flower's ClientApp runtime driven by a warm worker instead of SuperExec (flwr 1.39 internals).

With ``--isolation process`` a SuperNode leaves starting ClientApp processes to someone else. The warm worker of
``server.deploy.flwr_fast`` takes the ClientApp tasks from the SuperNode's Runtime API as SuperExec does
(:class:`RuntimeTaskClient`: ``AcquireTask``, signed with the SuperExec auth secret) and runs each in a fresh fork
with :func:`run_clientapp_task` (``run_clientapp``, exactly what ``flwr-clientapp`` runs). A FAB is installed
once per worker (:class:`InstallOnce`; Flower unzips and re-hashes it for every message).
"""

from __future__ import annotations

import hashlib
import importlib
import os
from pathlib import Path
from typing import Any

from server.internals.flower_object_pulls import CLIENTAPP_RUNTIME

PRELOAD = ("numpy", "torch", "flwr.app", "flwr.clientapp", CLIENTAPP_RUNTIME)  # imported once by the worker


def preload() -> None:
    """Import what every ClientApp task needs, so that each fork starts warm."""
    for name in PRELOAD:
        importlib.import_module(name)


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


class RuntimeTaskClient:
    """SuperExec's side of a SuperNode's Runtime API (``address`` = HOST:PORT, plain HTTP on loopback): acquires
    ClientApp tasks, authenticated with the SuperExec auth secret ``secret``."""

    def __init__(self, address: str, secret: bytes) -> None:
        from flwr.proto.runtime_pb2 import AcquireTaskRequest
        from flwr.supercore.constant import TaskType
        from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor, SuperExecAuthHttpInterceptor
        from flwr.supercore.retry import make_simple_http_retry_invoker
        from flwr.supercore.runtime import RuntimeHttpClient
        from flwr.supercore.superexec.run_superexec import _SUPEREXEC_AUTH_METHODS

        self._client = RuntimeHttpClient.from_server_address(
            server_address=address,
            insecure=True,
            root_certificates=None,
            interceptors=[
                RuntimeVersionHttpInterceptor(component_name="SuperExec"),
                SuperExecAuthHttpInterceptor(master_secret=secret, protected_methods=_SUPEREXEC_AUTH_METHODS),
            ],
            retry_invoker=make_simple_http_retry_invoker(),
        )
        self._request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])

    def acquire(self) -> str | None:
        """The token of the next waiting ClientApp task, or None when none waits."""
        res = self._client.AcquireTask(self._request)
        return res.token if res.HasField("task") and res.token else None

    def close(self) -> None:
        self._client.close()


def start_parent_monitor(parent_pid: int) -> None:
    """Flower's parent-process monitor: SIGINT to this process once ``parent_pid`` is gone."""
    from flwr.supercore.app_utils import start_parent_process_monitor

    start_parent_process_monitor(parent_pid)


def run_clientapp_task(runtime_address: str, token: str) -> None:
    """Run the ClientApp task ``token`` in this process, as ``flwr-clientapp --token`` does. It ends with Flower's
    ``flwr_exit`` (``SystemExit``)."""
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    run_clientapp(
        runtime_api_address=runtime_address,
        token=token,
        insecure=True,
        certificates=None,
        parent_pid=os.getppid(),
        runtime_dependency_install=False,
    )
