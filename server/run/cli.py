"""``flower-simulation``: a Hydra-configured experiment on one of the in-process engines (``engine=``).

    flower-simulation strategy=fedcm model=resnet20 num_rounds=100 data.root=/data/cifar10-jpeg.tar.gz
    flower-simulation +experiment=fedavg_cnn backend.num_gpus=0.25      # paper preset, 4 clients per GPU
    flower-simulation -m seed=0,1,2,3,4                                    # five seeds, one run dir each
    flower-simulation engine=batched model=logreg num_rounds=10000        # the batched engine (server/batched)

``engine=ray`` (default) runs Flower's Ray simulation (:mod:`server.ray.engine`), ``engine=batched`` computes a
round's clients together in this process (:mod:`server.batched.engine`). Both run the same ServerApp round loop
(:func:`server.run.app.run_experiment`); SIGINT/SIGTERM end the run in any phase (:mod:`server.run.stop`).
Exit codes: 2 invalid configuration or data (Hydra's own errors too: :mod:`server.run.hydra_errors`), 3 diverged,
1 no node answered or the run's files cannot be written, 130/143 a signal. ``--help`` prints
``conf/hydra/help/flower_simulation.yaml`` (:mod:`server.run.help`); what the console and the logs show:
:mod:`server.run.console`.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from server.run import config as config_lib
from server.run import console, hydra_errors
from server.run import help as cli_help
from server.run.config import CONF_DIR, RunConfig
from server.run.hydra_config import save_job_record
from server.run.stop import exit_on_signals

cli_help.register()  # the resolvers of the --help template, before Hydra composes


def simulate(cfg: RunConfig | dict[str, Any]) -> dict[str, Any]:
    """Validate ``cfg`` (the one validation of a simulated run; a RunConfig is validated already), then run it on its
    engine; returns the summary."""
    run_cfg = RunConfig.of(cfg)
    if run_cfg.engine == "batched":
        from server.batched.engine import simulate as run_engine
    else:
        from server.ray.engine import simulate as run_engine
    return run_engine(run_cfg)


def console_to_flower() -> None:
    """Remove Hydra's console handler of the root logger: Flower logs to the console itself (cli.log stays)."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if type(h) is logging.StreamHandler]:
        root.removeHandler(handler)


def prepare(cfg: DictConfig) -> dict[str, Any]:
    """The job's plain config with an absolute ``run_dir``, created (a ConfigError when it cannot be); Hydra's console
    handler removed (Flower logs to the console itself) and its job log (cli.log) filtered to the console's lines."""
    console_to_flower()
    console.quiet_job_log(bool(cfg.get("verbose", False)))
    plain = config_lib.to_plain(cfg)
    plain["run_dir"] = config_lib.make_run_dir(plain["run_dir"])
    if _is_multirun():
        _claim_for_sweep(plain["run_dir"])
    return plain


def _claim_for_sweep(run_dir: str) -> None:
    """:class:`RunDirShared` when an earlier job of this multirun has ``run_dir`` too (``hydra.sweep.subdir`` without
    ``hydra.job.num`` or the swept values): the second job would be refused as holding "an earlier run's results", or
    with ``overwrite=true`` replace the first job's."""
    from hydra.core.hydra_config import HydraConfig

    from server.run.run_lock import RunDirShared

    num = HydraConfig.get().job.num
    first = SWEEP_RUN_DIRS.setdefault(run_dir, num)
    if first != num:
        raise RunDirShared(
            f"'run_dir': {run_dir} is job {first}'s run_dir too: every job of a multirun needs its own (a "
            "hydra.sweep.subdir with ${hydra.job.num}, as the default ${hydra.job.num}_seed${seed})"
        )


def record_outcome(run_dir: str, status: str, message: str = "") -> None:
    """Note a multirun job that diverged, failed or was invalid (for the exit code after the last job) and say so."""
    jobs = {"diverged": DIVERGED_JOBS, "failed": FAILED_JOBS, "invalid": INVALID_JOBS}.get(status)
    if jobs is not None:
        print(f"flower-simulation: {message}", file=sys.stderr)
        jobs.append(run_dir)


def prepare_job(cfg: DictConfig) -> RunConfig | None:
    """A multirun job's validated config (the stacked launcher's task); None, with the reason in its run dir's
    status.json and one line on stderr, when it is invalid: the other jobs still run."""
    run_dir = None
    try:
        plain = prepare(cfg)
        run_dir = plain["run_dir"]
        run_cfg = RunConfig.from_dict(plain)
    except config_lib.ConfigError as err:
        invalid_job(run_dir, err, cfg)
        return None
    save_job_record(cfg)
    return run_cfg


def invalid_job(run_dir: str | None, err: config_lib.ConfigError, task_cfg: DictConfig) -> None:
    """A multirun job that is invalid: the reason in its run dir's status.json (and its Hydra record, so that a
    report lists it) and one line on stderr; the other jobs still run and the command exits 2 after the last
    (``run_dir`` None: the config did not resolve, so the job's own directory, ``run_dir``'s default)."""
    from hydra.core.hydra_config import HydraConfig

    from server.run.app import write_status, written_round
    from server.run.run_lock import RunDirRefused

    run_dir = run_dir or str(Path(HydraConfig.get().runtime.output_dir).resolve())
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    if not isinstance(err, RunDirRefused):  # another run's status.json and Hydra record are that run's
        write_status(Path(run_dir), "failed", written_round(Path(run_dir)), f"invalid configuration: {err}")
        save_job_record(task_cfg)
    print(f"flower-simulation: {run_dir}: invalid configuration: {err}", file=sys.stderr)
    INVALID_JOBS.append(run_dir)


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def _hydra_main(cfg: DictConfig) -> None:
    started = COMMAND_START.pop() if COMMAND_START else time.monotonic()
    plain: dict[str, Any] = {}
    try:
        plain = prepare(cfg)
        stopped = f"results so far are in {plain['run_dir']} (resume=true continues from the last checkpoint)"
        with exit_on_signals(stopped):
            run_cfg = RunConfig.from_dict(plain)  # the one validation of the run
            save_job_record(cfg)
            summary = simulate(run_cfg)
    except config_lib.ConfigError as err:
        logging.getLogger("flower-simulation").error("invalid configuration: %s", err)
        if _is_multirun():  # the sweep goes on; exit 2 after the last job
            invalid_job(plain.get("run_dir"), err, cfg)
            return
        print(f"flower-simulation: invalid configuration: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as err:
        from server.run.app import DivergenceError
        from server.run.errors import RunStorageError
        from strategies.client_manager import NoNodesError

        if isinstance(err, (DivergenceError, NoNodesError, RunStorageError)):
            failed = not isinstance(err, DivergenceError)
            if _is_multirun():  # the sweep goes on (status.json says why); exit 3 or 1 after the last job
                record_outcome(plain["run_dir"], "failed" if failed else "diverged", str(err))
                return
            print(f"flower-simulation: {err}", file=sys.stderr)
            raise SystemExit(1 if failed else 3) from None
        raise
    print(console.summary_line("flower-simulation", plain, summary, time.monotonic() - started), flush=True)


COMMAND_START: list[float] = []  # the first job's wall time counts from the command's start (set by main)
DIVERGED_JOBS: list[str] = []  # run dirs of the diverged jobs of this multirun
FAILED_JOBS: list[str] = []  # run dirs of the jobs no node answered (e.g. Ray actors that failed to start)
INVALID_JOBS: list[str] = []  # run dirs of the multirun's jobs whose config is invalid
SWEEP_RUN_DIRS: dict[str, int] = {}  # run_dir -> the multirun job that has it


def _is_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def main() -> None:
    """Console entry point. A multirun runs every job; it exits with 2 when any of them had an invalid config,
    else with 1 when any failed (no node answered), else with 3 when any diverged."""
    _check_launcher_options(sys.argv[1:])
    COMMAND_START[:] = [time.monotonic() - console.process_age()]
    with hydra_errors.composition_errors("flower-simulation"):
        _hydra_main()
    if INVALID_JOBS:
        print(f"flower-simulation: {len(INVALID_JOBS)} job(s) invalid: {', '.join(INVALID_JOBS)}", file=sys.stderr)
    if FAILED_JOBS:
        print(f"flower-simulation: {len(FAILED_JOBS)} job(s) failed: {', '.join(FAILED_JOBS)}", file=sys.stderr)
    if DIVERGED_JOBS:
        print(f"flower-simulation: {len(DIVERGED_JOBS)} job(s) diverged: {', '.join(DIVERGED_JOBS)}", file=sys.stderr)
    if INVALID_JOBS or FAILED_JOBS or DIVERGED_JOBS:
        raise SystemExit(2 if INVALID_JOBS else 1 if FAILED_JOBS else 3)


def _check_launcher_options(args: list[str]) -> None:
    """``hydra.launcher.<option>`` of the stacked launcher that it does not have: one line, exit 2."""
    if "hydra/launcher=stacked" not in args:
        return
    from server.stacked import LAUNCHER_OPTIONS as OPTIONS

    booleans = {"require_stacked": ("true", "false"), "share_chunks": ("true", "false", "null")}
    for arg in args:
        key, _, value = arg.partition("=")
        key = key.lstrip("+~")
        if not key.startswith("hydra.launcher."):
            continue
        option = key.removeprefix("hydra.launcher.")
        if option not in OPTIONS:
            print(f"flower-simulation: the stacked launcher has no option {key!r} (options: {', '.join(OPTIONS)})",
                  file=sys.stderr)  # fmt: skip
            raise SystemExit(2)
        if option in booleans and value.lower() not in booleans[option]:
            print(f"flower-simulation: {key} must be {' or '.join(booleans[option])}, got {value!r}", file=sys.stderr)
            raise SystemExit(2)
        if option == "processes" and not (value.isdigit() and int(value) >= 1):
            print(f"flower-simulation: {key} must be an integer >= 1, got {value!r}", file=sys.stderr)
            raise SystemExit(2)


if __name__ == "__main__":  # python -m server.run.cli: the project on PYTHONPATH without installing it
    main()
