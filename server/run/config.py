"""Experiment configuration: the validated :class:`RunConfig` every engine and the round loop take.

Hydra composes ``conf/``; :func:`~server.run.hydra_config.to_plain` resolves it into a JSON-able dict and
:func:`~server.run.validation.validate` rejects bad input with a message naming the key, before Ray or any
Flower process starts: once, where the config enters (:meth:`RunConfig.from_dict`). The same dict travels to a
deployed ServerApp base64-encoded in the run config key ``config-b64`` (:mod:`server.run.transport`), whose
decode is where it enters there. The names below are re-exported for scripts: each lives in the module named.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server.run.errors import ConfigError, make_dir
from server.run.hydra_config import CONF_DIR, to_plain
from server.run.messages import client_config
from server.run.transport import decode, encode
from server.run.validation import engine_name, validate

__all__ = [
    "CONF_DIR",
    "ConfigError",
    "RunConfig",
    "client_config",
    "decode",
    "encode",
    "engine_name",
    "make_run_dir",
    "to_plain",
    "validate",
]


@dataclass(frozen=True)
class RunConfig:
    """A validated experiment config: the plain dict (``values``, what config.json and checkpoints hold) and the
    typed settings the round loop reads. Build it with :meth:`from_dict`, which validates; nothing downstream
    validates again."""

    values: dict[str, Any] = field(repr=False)
    run_dir: Path | None  # None: a config without run_dir (the caller names the directory)
    num_rounds: int
    eval_every: int
    checkpoint_every: int
    resume: bool
    plots: bool
    engine: str

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any], check_paths: bool = True) -> RunConfig:
        """Validate ``cfg`` (a plain dict, changed in place: absolute paths, resolved defaults) and wrap it.
        ``check_paths=False``: see :func:`~server.run.validation.validate`."""
        if not isinstance(cfg, Mapping):  # a script's mistake: one line, as any invalid configuration
            raise ConfigError(f"a run's configuration is a mapping of keys to values, got {type(cfg).__name__}")
        values = validate(cfg if isinstance(cfg, dict) else dict(cfg), check_paths)
        return cls(
            values=values,
            run_dir=Path(values["run_dir"]).resolve() if values.get("run_dir") else None,
            num_rounds=int(values["num_rounds"]),
            eval_every=int(values["eval_every"]),
            checkpoint_every=int(values["checkpoint_every"]),
            resume=bool(values.get("resume")),
            plots=bool(values["plots"]),
            engine=engine_name(values),
        )

    @property
    def round_timeout(self) -> float:
        """``round_timeout``: seconds a round waits for its replies."""
        return float(self.values["round_timeout"])

    @classmethod
    def of(cls, cfg: RunConfig | Mapping[str, Any]) -> RunConfig:
        """``cfg`` itself when it is a RunConfig, else :meth:`from_dict` of it (a script's or a test's plain dict)."""
        return cfg if isinstance(cfg, RunConfig) else cls.from_dict(cfg)


def make_run_dir(value: Any) -> str:
    """``run_dir`` as an absolute path, created; a :class:`ConfigError` when it cannot be created or written, a
    :class:`~server.run.run_lock.RunDirInUse` when another run holds it (a command's checks before any work)."""
    from server.run.run_lock import check_free, check_layout

    path = make_dir(str(value), "'run_dir'")
    check_layout(path)  # its lock file among the rest
    check_free(path)
    return str(path)
