"""Atomic checkpoints of a run: strategy state (model, previous model, decay state), round, RNG states; and the
resume from one (:func:`resume`)."""

from __future__ import annotations

import json
import os
import random
import shutil
from logging import INFO, WARNING
from pathlib import Path
from typing import Any
from zipfile import BadZipFile

import numpy as np
import torch
from flwr.common.logger import log

from server.run.errors import ConfigError, RunStorageError, first_line
from server.run.hydra_config import MISSING, config_value
from server.run.run_lock import RunDirRefused, earlier_results
from server.run.window import ModelWindow, split_arrays

CHECKPOINT = "checkpoint"


def save(
    run_dir: Path,
    server_round: int,
    strategy_meta: dict[str, Any],
    arrays: dict[str, np.ndarray],
    config: dict[str, Any],
    window: list[int] | None = None,
) -> Path:
    """Write <run_dir>/checkpoint atomically (a temporary folder renamed over the old one); ``window``: the rounds
    of the model window whose arrays ``arrays`` holds too (``eval_average``, server/run/window.py)."""
    final = run_dir / CHECKPOINT
    tmp = run_dir / f".{CHECKPOINT}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {
        "round": server_round,
        "strategy": strategy_meta,
        "config": config,
        "window": window or [],
        "rng": {
            "python": _jsonable(random.getstate()),
            "numpy": _jsonable(np.random.get_state()),
            "torch": torch.get_rng_state().tolist(),
        },
    }
    try:
        np.savez(tmp / "arrays.npz", **arrays)
        (tmp / "state.json").write_text(json.dumps(state))
    except OSError:  # e.g. a full disk: the last complete checkpoint stays, this one's parts go (room freed)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = run_dir / f".{CHECKPOINT}.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def discard(run_dir: Path) -> None:
    """Remove an earlier run's checkpoint (a fresh start: a later ``resume=true`` must not continue that run)."""
    for name in (CHECKPOINT, f".{CHECKPOINT}.tmp", f".{CHECKPOINT}.old"):
        shutil.rmtree(run_dir / name, ignore_errors=True)


def _folder(run_dir: Path) -> Path | None:
    """The folder of the run's checkpoint (``.checkpoint.old`` after a crash between the two renames of save());
    None when there is none."""
    for folder in (run_dir / CHECKPOINT, run_dir / f".{CHECKPOINT}.old"):
        if (folder / "state.json").exists():
            return folder
    return None


def saved_round(run_dir: Path) -> int | None:
    """The round of the run's checkpoint (None: none, or one that cannot be read)."""
    folder = _folder(run_dir)
    try:
        last = json.loads((folder / "state.json").read_text())["round"] if folder else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return last if isinstance(last, int) else None


def storage_failure(run_dir: Path, err: OSError) -> tuple[RunStorageError, int]:
    """The error of a run stopped because ``err`` (a full disk, ...) kept it from writing, naming what it kept, and
    the last round its metrics hold (0: none)."""
    from server.report.metrics import parse_metrics

    rows = parse_metrics(run_dir / "metrics.jsonl")[0]
    last = rows[-1]["round"] if rows else 0
    saved = saved_round(run_dir)
    kept = f"its checkpoint after round {saved}" if saved is not None else "no checkpoint yet"
    what = err.filename or f"the run's files in {run_dir}"  # a cache elsewhere names its file
    written = f"the run's metrics up to round {last} and {kept} are kept" if rows else "nothing was written yet"
    return RunStorageError(
        f"cannot write {what} ({err.strerror}); {written}: make room, then resume=true continues"
    ), last


def load(run_dir: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """(state, arrays) of the run's checkpoint, restoring the RNG states; None when there is none."""
    path = _folder(run_dir)
    if path is None:
        return None
    state = json.loads((path / "state.json").read_text())
    with np.load(path / "arrays.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    rng = state["rng"]
    random.setstate(_tuples(rng["python"]))
    np_state = rng["numpy"]
    np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), *np_state[2:]))
    torch.set_rng_state(torch.tensor(rng["torch"], dtype=torch.uint8))
    return state, arrays


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


# what makes a run's trajectory: a resumed run must have the checkpoint's values (its other keys, e.g. num_rounds,
# the evaluation schedule, the engine or where the data lies, may change)
RESUME_KEYS = (
    "strategy",
    "model",
    "num_clients",
    "seed",
    "participation.mode",
    "participation.fraction",
    "participation.groups",
    "client.batch_size",
    "client.local_steps",
    "client.local_epochs",
    "client.weight_decay",
    "client.augment",
    "data.name",
    "data.alpha",
)
# strategy keys added after runs were checkpointed, with the value those runs had (a checkpoint without them resumes)
LATER_STRATEGY_KEYS = {"client_lr_schedule": "constant", "client_schedule_param": 1.0, "weighting": "examples"}


class ResumeRefused(RunDirRefused):
    """The checkpoint is of another run (or of one past this run's end): nothing of the run directory is written."""


def resume_mismatch(saved: dict[str, Any], cfg: dict[str, Any]) -> str | None:
    """The first key of RESUME_KEYS whose value differs between a checkpoint's config and this run's (None: none).
    A dotted key that a checkpoint's config does not hold (written before the key was compared) is not compared."""
    for key in RESUME_KEYS:
        old, new = config_value(saved, key), config_value(cfg, key)
        if "." in key and old is MISSING:
            continue
        if key == "strategy" and isinstance(old, dict) and isinstance(new, dict):
            old, new = {**LATER_STRATEGY_KEYS, **old}, {**LATER_STRATEGY_KEYS, **new}
        if (None if old is MISSING else old) != (None if new is MISSING else new):
            return key
    return None


def check_resumable(cfg: dict[str, Any], run_dir: Path) -> None:
    """Before any work of a ``resume=true`` run: :class:`ResumeRefused` when ``run_dir``'s checkpoint is of a run
    whose RESUME_KEYS differ or that is past ``num_rounds``, a :class:`ConfigError` when its state cannot be read;
    without a checkpoint, :func:`_check_uncheckpointed`."""
    folder = _folder(run_dir)
    if folder is None:
        _check_uncheckpointed(cfg, run_dir)
        return
    try:
        state = json.loads((folder / "state.json").read_text())
        refusal(state, cfg)
    except ConfigError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise _unreadable(run_dir, err) from None


def refusal(state: dict[str, Any], cfg: dict[str, Any]) -> None:
    """:class:`ResumeRefused` when the checkpoint ``state`` does not continue into the run ``cfg``."""
    last = state["round"]
    if isinstance(last, bool) or not isinstance(last, int) or last < 0:
        raise ValueError(f"round {last!r}")
    differs = difference(state["config"], cfg)
    if differs:
        raise ResumeRefused(f"cannot resume: '{differs[0]}' differs from the checkpoint's run ({differs[1]})")
    if last > int(cfg["num_rounds"]):
        raise ResumeRefused(
            f"cannot resume: the checkpoint is after round {last}, past num_rounds={cfg['num_rounds']} "
            f"(give num_rounds >= {last} to continue it)"
        )


def difference(saved: dict[str, Any], cfg: dict[str, Any]) -> tuple[str, str] | None:
    """The first RESUME_KEYS entry in which ``cfg`` differs from ``saved`` (a dict-valued key: its differing entry,
    its name first) and both values: ("strategy.client_lr", "0.05 there, 0.1 here"); None when none does."""
    differs = resume_mismatch(saved, cfg)
    if not differs:
        return None
    old, new = config_value(saved, differs), config_value(cfg, differs)
    if isinstance(old, dict) and isinstance(new, dict):  # name the entry (strategy.client_lr, model.name)
        if differs == "strategy":
            old, new = {**LATER_STRATEGY_KEYS, **old}, {**LATER_STRATEGY_KEYS, **new}
        keys = sorted({*old, *new}, key=lambda k: (k != "name", k))
        entry = next(k for k in keys if old.get(k, MISSING) != new.get(k, MISSING))
        differs, old, new = f"{differs}.{entry}", old.get(entry, MISSING), new.get(entry, MISSING)
    return differs, f"{_shown(old)} there, {_shown(new)} here"


def _check_uncheckpointed(cfg: dict[str, Any], run_dir: Path) -> None:
    """A run directory with an earlier run's metrics but no checkpoint (killed before its first one) restarts from
    round 1 and rewrites them: :class:`ResumeRefused` unless its ``config.json`` is of this run (then the rows are
    computed again, the same)."""
    earlier = earlier_results(run_dir)
    if not earlier:
        return  # nothing to lose
    try:
        saved = json.loads((run_dir / "config.json").read_text())
        if not isinstance(saved, dict):
            raise ValueError("not a mapping")
        differs = difference(saved, cfg)
        what = differs and f"'{differs[0]}' differs from its config.json ({differs[1]})"
    except (OSError, ValueError) as err:
        what = f"its config.json cannot be read ({type(err).__name__}: {first_line(err)})"
    if what:
        raise ResumeRefused(
            f"cannot resume: {run_dir} has no checkpoint but an earlier run's results ({earlier}), and {what}; "
            "resume=false overwrite=true replaces them, or choose another run_dir"
        )


def check_shapes(arrays: dict[str, np.ndarray], cfg: dict[str, Any]) -> None:
    """ValueError unless the checkpoint's model holds the configured model's tensors and every state array of one
    (``<part>/<tensor>``: model, previous model, GHBM history, server moments, model window) has its shape: a
    checkpoint changed or copied from elsewhere was a stack trace in the round after the resume."""
    from server.run.strategy_factory import initial_model

    with torch.random.fork_rng():  # the checkpoint's RNG states are restored already: keep them
        shapes = {k: tuple(a.shape) for k, a in initial_model(cfg).items()}
    held = {name.split("/", 1)[1] for name in arrays if name.startswith("model/")}
    missing, extra = sorted(set(shapes) - held), sorted(held - set(shapes))
    if missing or extra:
        raise ValueError(
            f"the configured model's {missing[0]} is not in it"
            if missing
            else f"its model/{extra[0]} is no tensor of the configured model"
        )
    for name, array in arrays.items():
        key = name.rsplit("/", 1)[-1]
        if key in shapes and tuple(array.shape) != shapes[key]:
            raise ValueError(f"{name} has shape {tuple(array.shape)}, the model's {key} {shapes[key]}")


def _shown(value: Any) -> str:
    text = "unset" if value is MISSING else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unreadable(run_dir: Path, err: BaseException) -> ConfigError:
    return ConfigError(
        f"cannot resume: the checkpoint in {run_dir / CHECKPOINT} cannot be read ({type(err).__name__}: "
        f"{first_line(err)}); move it away to start afresh"
    )


def resume(cfg: dict[str, Any], run_dir: Path, strategy: Any, window: ModelWindow) -> int:
    """Load the checkpoint into the strategy and the model window; the last completed round (0 when starting
    fresh). A checkpoint that cannot be read or does not fit this run is a :class:`ConfigError` (one line)."""
    if not cfg.get("resume"):
        return 0
    try:
        return _resume(cfg, run_dir, strategy, window)
    except ConfigError:
        raise
    except (OSError, EOFError, ValueError, KeyError, IndexError, TypeError, AttributeError, BadZipFile) as err:
        raise _unreadable(run_dir, err) from None


def _resume(cfg: dict[str, Any], run_dir: Path, strategy: Any, window: ModelWindow) -> int:
    loaded = load(run_dir)
    if loaded is None:
        log(WARNING, "resume=true but %s has no checkpoint: starting from round 1", run_dir)
        return 0
    state, arrays = loaded
    refusal(state, cfg)
    check_shapes(arrays, cfg)
    strategy_arrays, window_arrays = split_arrays(arrays)
    strategy.load_state_dict(state["strategy"], strategy_arrays)
    window.load(state.get("window", []), window_arrays)
    try:
        window.check(strategy.model_record())
    except ValueError as err:
        raise ConfigError(f"cannot resume: {err}") from None
    if window.size and not window.full() and int(state["round"]) >= window.size:
        held = (
            f"the models of rounds {window.rounds} only"
            if window.rounds
            else "no model window (a run started without eval_average)"
        )
        log(
            WARNING,
            "eval_average=%d: the checkpoint holds %s; the averaged columns start once %d consecutive rounds are in",
            window.size,
            held,
            window.size,
        )
    log(INFO, "Resuming %s after round %d", run_dir, state["round"])
    return int(state["round"])
