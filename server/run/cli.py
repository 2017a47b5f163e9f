"""``flower-simulation``: a Hydra-configured experiment on one of the in-process engines (``engine=``).

    flower-simulation strategy=fedcm model=resnet20 num_rounds=100 data.root=/data/cifar10-jpeg.tar.gz
    flower-simulation +experiment=fedavg_cnn backend.num_gpus=0.25      # paper preset, 4 clients per GPU
    flower-simulation -m seed=0,1,2,3,4                                    # five seeds, one run dir each
    flower-simulation engine=batched model=logreg num_rounds=10000        # the batched engine (server/batched)

``engine=ray`` (default) runs Flower's Ray simulation (:mod:`server.ray.engine`), ``engine=batched`` computes a
round's clients together in this process (:mod:`server.batched.engine`). Both run the same ServerApp round loop
(:func:`server.run.app.run_experiment`); SIGINT/SIGTERM end the run in any phase (:mod:`server.run.stop`).
Exit codes: 2 invalid configuration or data, 3 diverged, 1 no node answered, 130/143 a signal.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from server.run import config as config_lib
from server.run.config import CONF_DIR
from server.run.stop import exit_on_signals


def simulate(cfg: dict[str, Any]) -> dict[str, Any]:
    """Validate ``cfg``, then run it on its engine; returns the run summary."""
    cfg = config_lib.validate(cfg)
    if config_lib.engine_name(cfg) == "batched":
        from server.batched.engine import simulate as run_engine
    else:
        from server.ray.engine import simulate as run_engine
    return run_engine(cfg)


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
        from server.run.app import DivergenceError
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


if __name__ == "__main__":  # python -m server.run.cli: the project on PYTHONPATH without installing it
    main()
