"""Hydra's side of the configuration: where ``conf/`` lies, and its composed config as plain Python containers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from server.run.errors import ConfigError, first_line

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"  # the Hydra config groups


MISSING = object()  # what config_value gives for a key a config does not hold


def config_value(config: Any, dotted: str) -> Any:
    """The value at a dotted key of a plain config ("strategy.client_lr"; a group's name gives its node), else
    :data:`MISSING`."""
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def to_plain(cfg: Any) -> dict[str, Any]:
    """Resolve a Hydra DictConfig (or pass a dict through) into plain Python containers; a value that cannot be
    resolved (an interpolation of a key that does not exist, ...) is a :class:`ConfigError` naming its key."""
    try:
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException
    except ImportError:  # pragma: no cover - omegaconf comes with hydra-core
        return json.loads(json.dumps(cfg))
    if not OmegaConf.is_config(cfg):
        return json.loads(json.dumps(cfg))
    try:
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None)
        raise ConfigError(f"{key}: {first_line(err)}" if key else first_line(err)) from None


JOB_RECORD = ".hydra"  # where a job's Hydra record lies in its output folder (Hydra's default output_subdir)


def save_job_record(task_cfg: Any) -> None:
    """A job's Hydra record in its output folder: ``.hydra/config.yaml`` (``task_cfg``, the config the job was given),
    ``hydra.yaml`` and ``overrides.yaml``, the files Hydra's ``run_job`` writes when ``hydra.output_subdir`` is set.

    ``conf/config.yaml`` sets it to null and the commands call this once the job's directory is known to be its own:
    Hydra wrote them before any check, so a job refused as another run's (in use, holding results, another run's
    checkpoint) replaced that run's record, and ``flower-report`` labelled its results with the refused overrides."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hydra_cfg = HydraConfig.instance().cfg  # {"hydra": ...}, set by Hydra for the job being run
    folder = Path(str(hydra_cfg.hydra.runtime.output_dir)) / JOB_RECORD
    folder.mkdir(parents=True, exist_ok=True)
    parts = {"config.yaml": task_cfg, "hydra.yaml": hydra_cfg, "overrides.yaml": hydra_cfg.hydra.overrides.task}
    for name, part in parts.items():
        (folder / name).write_text(OmegaConf.to_yaml(part), encoding="utf-8")
