"""``flower-simulation``: a Hydra-configured experiment in Flower's simulation engine (Ray backend).

    flower-simulation strategy=fedcm model=resnet20 num_rounds=100 data.root=/data/cifar10-jpeg.tar.gz
    flower-simulation +experiment=fedavg_cnn backend.num_gpus=0.25      # paper preset, 4 clients per GPU
    flower-simulation -m seed=0,1,2,3,4                                    # five seeds, one run dir each
    flower-simulation backend.address=auto                                 # on the Ray cluster of `ray start`

The config and the data are checked before Ray starts; every simulated SuperNode owns one partition
(``partition-id`` = its index), and the ServerApp runs :func:`server.app.run_experiment`. Which Ray is used
(a fresh local one unless ``backend.address`` names a cluster) is decided in :mod:`server.ray_cluster`;
SIGINT/SIGTERM end the run in any phase (:mod:`server.stop`).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from server import config as config_lib
from server import quiet, ray_cluster
from server.stop import exit_on_signals

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
AUTO_CLIENTS_PER_GPU = 4


def backend_config(cfg: dict[str, Any], address: str | None = None, gpus_visible: bool | None = None
                   ) -> dict[str, Any]:
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


def simulate(cfg: dict[str, Any]) -> dict[str, Any]:
    """Validate, then run ``cfg`` in Flower's Ray simulation; returns the run summary."""
    cfg = config_lib.validate(cfg)
    quiet.install()
    _prepare_data(cfg)
    address = ray_cluster.resolve_address(cfg.get("backend", {}).get("address"))
    if address is None:
        _check_local_resources(cfg)
        backend = backend_config(cfg)
    else:
        cluster = ray_cluster.inspect_cluster(
            address, cfg, lambda gpus_visible: backend_config(cfg, address, gpus_visible)["client_resources"])
        backend = backend_config(cfg, address, gpus_visible=cluster.num_gpus > 0)
        _log(cluster.describe())
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    from flwr.simulation import run_simulation

    from client.app import app as client_app
    from server import ray_gil
    from server.app import make_server_app

    ray_gil.install()  # a signal during ray.init must not leave the GIL held for 30 s (server/ray_gil.py)

    result: dict[str, Any] = {}
    run_simulation(
        server_app=make_server_app(cfg, result),
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


def _prepare_data(cfg: dict[str, Any]) -> None:
    """Download torchvision's CIFAR-10 now, once, if asked to (not in every client at the same time)."""
    d = cfg["data"]
    if d["name"] != "cifar10" or not d.get("download"):
        return
    from client import datacheck

    try:
        datacheck.download_cifar10(d["root"])
    except datacheck.DataSourceError as err:
        raise config_lib.ConfigError(f"'data.download': {err} (offline? point data.root at an ImageFolder tree "
                                     "or .tar.gz of CIFAR-10 with data=cifar10_folder)") from None
    config_lib.validate(cfg)  # now the counts are known: num_clients against the examples


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
        raise config_lib.ConfigError(f"'backend.num_cpus'={b.get('num_cpus')} is more than the {cpus} CPUs Ray "
                                     "gets here (backend.init_num_cpus or all cores)")


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def _hydra_main(cfg: DictConfig) -> None:
    root = logging.getLogger()  # Flower logs to the console itself: keep Hydra's file handler only
    for handler in [h for h in root.handlers if type(h) is logging.StreamHandler]:
        root.removeHandler(handler)
    plain = config_lib.to_plain(cfg)
    plain["run_dir"] = str(Path(plain["run_dir"]).resolve())
    stopped = f"results so far are in {plain['run_dir']} (resume=true continues from the last checkpoint)"
    try:
        with exit_on_signals(stopped):
            summary = simulate(plain)
    except config_lib.ConfigError as err:
        logging.getLogger("flower-simulation").error("invalid configuration: %s", err)
        print(f"flower-simulation: invalid configuration: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as err:
        from server.app import DivergenceError
        from strategies.client_manager import NoNodesError

        if isinstance(err, (DivergenceError, NoNodesError)):
            print(f"flower-simulation: {err}", file=sys.stderr)
            failed = isinstance(err, NoNodesError)
            if _is_multirun():  # the sweep goes on (status.json says why); exit 3 or 1 after the last job
                (FAILED_JOBS if failed else DIVERGED_JOBS).append(plain["run_dir"])
                return
            raise SystemExit(1 if failed else 3) from None
        raise
    print(f"flower-simulation: finished {summary['rounds']} rounds, accuracy {summary['accuracy']}, "
          f"results in {summary['run_dir']}")


DIVERGED_JOBS: list[str] = []  # run dirs of the diverged jobs of this multirun
FAILED_JOBS: list[str] = []  # run dirs of the jobs no node answered (e.g. Ray actors that failed to start)


def _is_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def main() -> None:
    """Console entry point. A multirun runs every job; it exits with 1 when any of them failed (no node
    answered), else with 3 when any of them diverged."""
    _hydra_main()
    if FAILED_JOBS:
        print(f"flower-simulation: {len(FAILED_JOBS)} job(s) failed: {', '.join(FAILED_JOBS)}", file=sys.stderr)
    if DIVERGED_JOBS:
        print(f"flower-simulation: {len(DIVERGED_JOBS)} job(s) diverged: {', '.join(DIVERGED_JOBS)}", file=sys.stderr)
    if FAILED_JOBS or DIVERGED_JOBS:
        raise SystemExit(1 if FAILED_JOBS else 3)
