"""The Hydra Launcher behind ``flower-simulation -m ... hydra/launcher=stacked`` (found by Hydra in the
``hydra_plugins`` namespace, as its own joblib and Ray launchers are).

It composes every job's config and writes each job's directory as Hydra's basic launcher does (``.hydra/``,
``cli.log``), then runs the jobs with :func:`server.stacked.launch.run_jobs`: the jobs that share a shape as one
program, each with the run directory a lone run writes.

    flower-simulation -m hydra/launcher=stacked engine=batched model=logreg seed=0,1,2,3,4 strategy=fedavgm,fedcm
    flower-simulation -m hydra/launcher=stacked hydra.launcher.max_jobs=8 ...   # at most 8 jobs in one program
    flower-simulation -m hydra/launcher=stacked hydra.launcher.require_stacked=true ...  # exit 2 if any job can't
    flower-simulation -m hydra/launcher=stacked hydra.launcher.share_chunks=true ...  # jobs share chunks on a CPU too
    flower-simulation -m hydra/launcher=stacked hydra.launcher.processes=2 ...  # 2 programs side by side
"""

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from server.stacked import LAUNCHER_OPTIONS

log = logging.getLogger(__name__)
OPTIONS = LAUNCHER_OPTIONS


@dataclass
class StackedLauncherConf:
    _target_: str = "hydra_plugins.fedmomentum_stacked_launcher.stacked_launcher.StackedLauncher"
    require_stacked: bool = False  # exit 2 (before any job runs) when a job cannot join a group
    max_jobs: Optional[int] = None  # noqa: UP045 (OmegaConf reads it) the most jobs in one program; null: a group
    # clients of different jobs in one chunk; null: on an accelerator, not on a CPU (a chunk per job)
    share_chunks: Optional[bool] = None  # noqa: UP045
    processes: int = 1  # each group split into this many programs, run side by side in worker processes


ConfigStore.instance().store(group="hydra/launcher", name="stacked", node=StackedLauncherConf, provider="fedmomentum")


class StackedLauncher(Launcher):
    def __init__(
        self,
        require_stacked: bool = False,
        max_jobs: int | None = None,
        share_chunks: bool | None = None,
        processes: int = 1,
    ) -> None:
        super().__init__()
        if share_chunks is not None and not isinstance(share_chunks, bool):
            print(f"flower-simulation: hydra.launcher.share_chunks must be true, false or null, got {share_chunks!r}",
                  file=sys.stderr)  # fmt: skip
            raise SystemExit(2)
        self.share_chunks = share_chunks
        if max_jobs is not None and (isinstance(max_jobs, bool) or not isinstance(max_jobs, int) or max_jobs < 1):
            print(f"flower-simulation: hydra.launcher.max_jobs must be an integer >= 1, got {max_jobs!r}",
                  file=sys.stderr)  # fmt: skip
            raise SystemExit(2)
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            print(f"flower-simulation: hydra.launcher.processes must be an integer >= 1, got {processes!r}",
                  file=sys.stderr)  # fmt: skip
            raise SystemExit(2)
        self.require_stacked, self.max_jobs, self.processes = bool(require_stacked), max_jobs, processes
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from server.run import cli
        from server.run.console import idle_note
        from server.run.stop import exit_on_signals
        from server.stacked.launch import NotStackable, run_jobs

        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info(f"Composing {len(job_overrides)} jobs for the stacked launcher")
        returns: list[JobReturn] = []
        for idx, overrides in enumerate(job_overrides, initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = idx
                sweep_config.hydra.job.num = idx
            returns.append(
                run_job(
                    hydra_context=self.hydra_context,
                    task_function=cli.prepare_job,
                    config=sweep_config,
                    job_dir_key="hydra.sweep.dir",
                    job_subdir_key="hydra.sweep.subdir",
                )
            )
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        cli.console_to_flower()
        valid = [i for i, r in enumerate(returns) if r.status == JobStatus.COMPLETED and r.return_value is not None]
        cfgs = [returns[i].return_value for i in valid]
        stopped = f"results so far are in {self.config.hydra.sweep.dir} (resume=true continues each job)"
        try:
            with exit_on_signals(stopped):
                outcomes = run_jobs(cfgs, self.max_jobs, self.require_stacked, self.share_chunks, self.processes)
        except NotStackable as err:
            print(f"flower-simulation: {err} (hydra.launcher.require_stacked=true)", file=sys.stderr)
            raise SystemExit(2) from None
        for i, outcome in zip(valid, outcomes):
            cli.record_outcome(outcome.run_dir, outcome.status, outcome.message)
            if outcome.status == "finished":
                summary = outcome.summary
                print(f"flower-simulation: finished {summary['rounds']} rounds, accuracy {summary['accuracy']}, "
                      f"results in {summary['run_dir']}{idle_note(summary)}")  # fmt: skip
            returns[i].return_value = outcome.summary or None
            if outcome.status == "error":
                returns[i].status = JobStatus.FAILED
                returns[i]._return_value = RuntimeError(outcome.message)
        return returns
