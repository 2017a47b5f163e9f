"""The Ray engine (``engine=ray``, the default of ``flower-simulation``): Flower's simulation, one ClientApp actor
per CPU (or GPU share).

    flower-simulation +experiment=fedavg_cnn backend.num_gpus=0.25      # paper preset, 4 clients per GPU
    flower-simulation backend.address=auto                                 # on the Ray cluster of `ray start`

The config and the data are checked before Ray starts; every simulated SuperNode owns one partition
(``partition-id`` = its index), and the ServerApp runs :func:`server.run.app.run_experiment`. Which Ray is used
(a fresh local one unless ``backend.address`` names a cluster) is decided in :mod:`server.ray.cluster`;
SIGINT/SIGTERM end the run in any phase (:mod:`server.run.stop`), and no process of a local Ray outlives the
run (:mod:`server.ray.leftovers`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from server.ray import cluster as ray_cluster
from server.ray import leftovers as ray_leftovers
from server.run import config as config_lib
from server.run import quiet
from server.run.config import CONF_DIR, RunConfig  # noqa: F401 - CONF_DIR re-exported for tests and scripts
from server.run.data import prepare_data, server_dataset

AUTO_CLIENTS_PER_GPU = 4


def backend_config(cfg: dict[str, Any], address: str | None = None, gpus_visible: bool | None = None) -> dict[str, Any]:
    """Ray resources: per-ClientApp ``num_cpus``/``num_gpus`` and ``ray.init`` arguments.

    ``address`` is a resolved cluster address (None: ``"local"``, a fresh local Ray whatever ``RAY_ADDRESS``
    or a ``ray start`` left behind). ``num_gpus: null`` means auto: 1/4 GPU per client when GPUs are visible
    (``gpus_visible``; by default: CUDA on this machine), else 0.
    """
    b = cfg.get("backend", {})
    init: dict[str, Any] = {"address": address or "local"}
    if b.get("init_num_cpus") is not None:
        init["num_cpus"] = int(b["init_num_cpus"])
    if b.get("init_num_gpus") is not None:
        init["num_gpus"] = int(b["init_num_gpus"])
    num_gpus = b.get("num_gpus")
    if num_gpus is None:  # auto: share each visible GPU between AUTO_CLIENTS_PER_GPU clients
        visible = _cuda_available() if gpus_visible is None else gpus_visible
        num_gpus = 1.0 / AUTO_CLIENTS_PER_GPU if visible else 0.0
    return {
        "client_resources": {"num_cpus": float(b.get("num_cpus", 1)), "num_gpus": float(num_gpus)},
        "init_args": init,
    }


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def simulate(cfg: RunConfig | dict[str, Any]) -> dict[str, Any]:
    """Run ``cfg`` in Flower's Ray simulation (a plain dict is validated first); returns the run summary."""
    run_cfg = RunConfig.of(cfg)
    cfg = run_cfg.values
    quiet.install()
    prepare_data(cfg)
    server_dataset(cfg)  # decoded once here, before Ray starts: a bad image is one line, not N actors' crash
    address = ray_cluster.resolve_address(cfg.get("backend", {}).get("address"))
    if address is None:
        _check_local_resources(cfg)
        backend = backend_config(cfg)
    else:
        cluster = ray_cluster.inspect_cluster(
            address, cfg, lambda gpus_visible: backend_config(cfg, address, gpus_visible)["client_resources"]
        )
        backend = backend_config(cfg, address, gpus_visible=cluster.num_gpus > 0)
        _log(cluster.describe())
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    from flwr.simulation import run_simulation

    from client.app import app as client_app
    from server.internals import flower_link_state as ray_linkstate
    from server.internals import ray_port_wait as ray_gil
    from server.run.app import make_server_app

    ray_gil.install()  # a signal during ray.init must not leave the GIL held for 30 s (internals.ray_port_wait)
    ray_linkstate.install()  # a node's messages found without scanning every node's (internals.flower_link_state)

    result: dict[str, Any] = {}
    # a local Ray's processes end with the run, whatever their interpreters still do (server/ray/leftovers.py)
    owned = ray_leftovers.owned_processes(log=_log) if address is None else contextlib.nullcontext()
    with owned:
        run_simulation(
            server_app=make_server_app(run_cfg, result),
            client_app=client_app,
            num_supernodes=int(cfg["num_clients"]),
            backend_name="ray",
            backend_config=backend,
        )
    if "error" in result:
        raise result["error"]
    if "run_dir" not in result:
        raise RuntimeError("the simulation ended without finishing the experiment (see the log above)")
    return result


def _log(text: str) -> None:
    from flwr.common.logger import log

    log(logging.INFO, text)


def _check_local_resources(cfg: dict[str, Any]) -> None:
    """Fail before Ray starts when one client asks for more than this machine (or init_num_*) offers:
    Flower would otherwise build an empty actor pool and wait out every round's timeout."""
    b = cfg.get("backend", {})
    want_gpus = float(b.get("num_gpus") or 0.0)
    if want_gpus > 0 and not _cuda_available():
        raise config_lib.ConfigError(f"'backend.num_gpus'={want_gpus} but no CUDA device is visible")
    if want_gpus > 0 and b.get("init_num_gpus") is not None and want_gpus > int(b["init_num_gpus"]):
        raise config_lib.ConfigError(f"'backend.num_gpus'={want_gpus} is more than backend.init_num_gpus")
    cpus = int(b["init_num_cpus"]) if b.get("init_num_cpus") is not None else (os.cpu_count() or 1)
    if float(b.get("num_cpus", 1)) > cpus:
        raise config_lib.ConfigError(
            f"'backend.num_cpus'={b.get('num_cpus')} is more than the {cpus} CPUs Ray "
            "gets here (backend.init_num_cpus or all cores)"
        )
