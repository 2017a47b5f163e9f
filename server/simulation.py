"""``flower-simulation``: a Hydra-configured experiment in Flower's simulation engine (Ray backend).

    flower-simulation strategy=fedcm model=resnet20 num_rounds=100 data.root=/data/cifar10-jpeg.tar.gz
    flower-simulation +experiment=fedavg_cnn backend.num_gpus=0.25      # paper preset, 4 clients per GPU
    flower-simulation -m seed=0,1,2,3,4                                    # five seeds, one run dir each

The config is validated before Ray starts; every simulated SuperNode owns one partition
(``partition-id`` = its index), and the ServerApp runs :func:`server.app.run_experiment`.
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

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
AUTO_CLIENTS_PER_GPU = 4


def backend_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Ray resources: per-ClientApp ``num_cpus``/``num_gpus`` and Ray's totals (``ray.init`` arguments).

    ``num_gpus: null`` means auto: 1/4 GPU per client when CUDA is visible (4 clients share a GPU), else 0.
    """
    b = cfg.get("backend", {})
    init: dict[str, Any] = {}
    if b.get("init_num_cpus") is not None:
        init["num_cpus"] = int(b["init_num_cpus"])
    if b.get("init_num_gpus") is not None:
        init["num_gpus"] = int(b["init_num_gpus"])
    num_gpus = b.get("num_gpus")
    if num_gpus is None:  # auto: share each visible GPU between AUTO_CLIENTS_PER_GPU clients
        num_gpus = 1.0 / AUTO_CLIENTS_PER_GPU if _cuda_available() else 0.0
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
    _check_gpus(cfg)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    from flwr.simulation import run_simulation

    from client.app import app as client_app
    from server.app import make_server_app

    result: dict[str, Any] = {}
    run_simulation(
        server_app=make_server_app(cfg, result),
        client_app=client_app,
        num_supernodes=int(cfg["num_clients"]),
        backend_name="ray",
        backend_config=backend_config(cfg),
    )
    if "error" in result:
        raise result["error"]
    if "run_dir" not in result:
        raise RuntimeError("the simulation ended without finishing the experiment (see the log above)")
    return result


def _check_gpus(cfg: dict[str, Any]) -> None:
    """Fail before Ray starts when clients ask for GPUs the machine does not have."""
    want = float(cfg.get("backend", {}).get("num_gpus") or 0.0)
    if want > 0:
        if not _cuda_available():
            raise config_lib.ConfigError(f"'backend.num_gpus'={want} but no CUDA device is visible")


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def _hydra_main(cfg: DictConfig) -> None:
    root = logging.getLogger()  # Flower logs to the console itself: keep Hydra's file handler only
    for handler in [h for h in root.handlers if type(h) is logging.StreamHandler]:
        root.removeHandler(handler)
    plain = config_lib.to_plain(cfg)
    plain["run_dir"] = str(Path(plain["run_dir"]).resolve())
    try:
        summary = simulate(plain)
    except config_lib.ConfigError as err:
        logging.getLogger("flower-simulation").error("invalid configuration: %s", err)
        print(f"flower-simulation: invalid configuration: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as err:
        from server.app import DivergenceError

        if isinstance(err, DivergenceError):
            print(f"flower-simulation: {err}", file=sys.stderr)
            if _is_multirun():  # the sweep goes on (its status.json says diverged); exit 3 after the last job
                DIVERGED_JOBS.append(plain["run_dir"])
                return
            raise SystemExit(3) from None
        raise
    print(f"flower-simulation: finished {summary['rounds']} rounds, accuracy {summary['accuracy']}, "
          f"results in {summary['run_dir']}")


DIVERGED_JOBS: list[str] = []  # run dirs of the diverged jobs of this multirun


def _is_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def main() -> None:
    """Console entry point. A multirun runs every job; it exits with 3 when any of them diverged."""
    _hydra_main()
    if DIVERGED_JOBS:
        print(f"flower-simulation: {len(DIVERGED_JOBS)} job(s) diverged: {', '.join(DIVERGED_JOBS)}", file=sys.stderr)
        raise SystemExit(3)
