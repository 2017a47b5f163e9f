"""Validation of an experiment config before any work: every key an experiment reads, checked once where the
config enters (``flower-simulation``, ``flower-deploy``, a deployed ServerApp), with a one-line
:class:`~server.run.errors.ConfigError` naming the key."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from client.partition import parse_alpha
from client.tasks import MODEL_OUTPUTS, NATURAL_DATASETS, TASK_MODEL
from server.convex.checks import CONVEX_MODELS
from server.run import run_lock
from server.run.errors import ConfigError
from strategies import math as fm
from strategies import registry, schedules
from strategies.participation import make_schedule

STRATEGIES = tuple(registry.STRATEGIES)
MODELS = ("cnn", "resnet20", "logreg", *MODEL_OUTPUTS)
ENGINES = ("ray", "batched")
DATASETS = ("cifar10", "cifar10_folder", *NATURAL_DATASETS)
TOY_DATASETS = ()


def _require(cfg: Mapping[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise ConfigError(f"missing config key '{dotted}'")
        node = node[part]
    return node


INT64_MAX = 2**63 - 1  # Flower's records carry integers as int64


def _positive_int(cfg: Mapping[str, Any], key: str, minimum: int = 1) -> int:
    value = _require(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"'{key}' must be an integer >= {minimum}, got {value!r}")
    return value


def _number(value: Any, key: str) -> float:
    """``value`` as one float (the math's checks also take arrays of them), or a :class:`ConfigError` naming
    ``key``."""
    try:
        return fm.as_number(value, f"'{key}'")
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _check(key: str, check: Any, *args: Any) -> None:
    try:
        check(*args)
    except (TypeError, ValueError) as err:  # TypeError: float() of a list or a mapping
        raise ConfigError(f"'{key}': {err}") from None


def _validate_eval_tail_at(cfg: dict[str, Any]) -> None:
    """``eval_tail_at``: a list of rounds 1..num_rounds (earlier horizons whose last eval_tail rounds are evaluated)."""
    horizons = cfg.get("eval_tail_at")
    if horizons is None:
        return
    if not isinstance(horizons, list | tuple):
        raise ConfigError(f"'eval_tail_at' must be a list of rounds, e.g. [5000], got {horizons!r}")
    for t in horizons:
        if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= cfg["num_rounds"]:
            raise ConfigError(f"'eval_tail_at' holds rounds in 1..num_rounds ({cfg['num_rounds']}), got {t!r}")


def _validate_environment() -> None:
    """``$FEDMOMENTUM_TF32`` and ``$FEDMOMENTUM_DEVICE`` (client/environment.py), read by every client process."""
    from client.environment import check_environment

    try:
        check_environment()
    except ValueError as err:
        raise ConfigError(str(err)) from None


def validate(cfg: dict[str, Any], check_paths: bool = True) -> dict[str, Any]:
    """Check every key an experiment reads; absolutise paths in place. Returns ``cfg``.

    ``check_paths=False`` skips the existence check of ``data.root`` (a host that only submits a run to a
    remote SuperLink need not hold the data; the ServerApp validates again where it runs).
    """
    _validate_environment()
    _positive_int(cfg, "num_rounds")
    natural = _validate_natural(cfg, check_paths)
    num_clients = _positive_int(cfg, "num_clients")
    if _positive_int(cfg, "seed", 0) > INT64_MAX:
        raise ConfigError(f"'seed' must be at most {INT64_MAX} (a 64-bit integer in every message), got {cfg['seed']}")
    _positive_int(cfg, "eval_every")
    if "eval_tail" in cfg:
        _positive_int(cfg, "eval_tail", 0)
    _validate_eval_tail_at(cfg)
    if "eval_average" in cfg and _positive_int(cfg, "eval_average", 0) > cfg["num_rounds"]:
        raise ConfigError(
            f"'eval_average' averages the last k <= num_rounds ({cfg['num_rounds']}) server models, "
            f"got {cfg['eval_average']!r}"
        )
    _positive_int(cfg, "checkpoint_every")
    _positive_int(cfg, "eval_max_examples", 0)
    progress = cfg.get("progress_every", 10)
    if isinstance(progress, bool) or not isinstance(progress, int | float) or not 0 < progress < math.inf:
        raise ConfigError(f"'progress_every' must be a number of seconds > 0, got {progress!r}")
    if not isinstance(cfg.setdefault("plots", True), bool):
        raise ConfigError(f"'plots' must be true or false, got {cfg['plots']!r}")
    if not isinstance(cfg.setdefault("verbose", False), bool):
        raise ConfigError(f"'verbose' must be true or false, got {cfg['verbose']!r}")
    if not isinstance(cfg.setdefault("resume", False), bool):
        raise ConfigError(f"'resume' must be true or false, got {cfg['resume']!r}")
    if not isinstance(cfg.setdefault("overwrite", False), bool):
        raise ConfigError(f"'overwrite' must be true or false, got {cfg['overwrite']!r}")
    if cfg["resume"] and cfg["overwrite"]:
        raise ConfigError(
            "'resume' and 'overwrite' are both true: resume=true continues the run in run_dir, overwrite=true "
            "replaces it; choose one"
        )
    if check_paths and cfg.get("run_dir"):
        run_lock.check_layout(cfg["run_dir"])  # a folder where the run writes a file, ...
    if check_paths and not (cfg["resume"] or cfg["overwrite"]) and cfg.get("run_dir"):
        run_lock.check_fresh(cfg["run_dir"])  # a fresh run would erase an earlier run's results
    if "round_timeout" in cfg and not _number(cfg["round_timeout"], "round_timeout") > 0:
        raise ConfigError(f"'round_timeout' must be a number > 0 (seconds), got {cfg['round_timeout']!r}")
    _validate_eval_train(cfg)
    s = _require(cfg, "strategy")
    name = _require(cfg, "strategy.name")
    if name not in STRATEGIES:
        raise ConfigError(f"'strategy.name' must be one of {STRATEGIES}, got {name!r}")
    spec = registry.STRATEGIES[name]
    server_lr = _number(_require(cfg, "strategy.server_lr"), "strategy.server_lr")
    _check("strategy.server_lr", fm.check_lr, server_lr, "server_lr", spec.server_lr_may_be_zero)
    _check(
        "strategy.client_lr",
        fm.check_lr,
        _number(_require(cfg, "strategy.client_lr"), "strategy.client_lr"),
        "client_lr",
    )
    for key, check in spec.checks:
        _check(f"strategy.{key}", check, _require(cfg, f"strategy.{key}"))
    _validate_client_state_dir(cfg)
    _check(
        "strategy.server_lr_schedule",
        schedules.check_schedule,
        s.get("server_lr_schedule", "constant"),
        s.get("schedule_param", 1.0),
    )
    _check(
        "strategy.client_lr_schedule",
        schedules.check_schedule,
        s.get("client_lr_schedule", "constant"),
        s.get("client_schedule_param", 1.0),
        "client_lr_schedule",
    )
    _check("strategy.weighting", fm.client_weights, [], s.get("weighting", "examples"))
    _validate_server_optimizer(cfg)
    if spec.group_check is not None:
        _check("strategy", spec.group_check, *[_require(cfg, f"strategy.{k}") for k in spec.group_keys])
    model = _require(cfg, "model.name")
    if model not in MODELS:
        raise ConfigError(f"'model.name' must be one of {MODELS}, got {model!r}")
    p = _require(cfg, "participation")
    _check(
        "participation.groups" if p.get("groups") is not None else "participation.fraction",
        make_schedule,
        _require(cfg, "participation.mode"),
        num_clients,
        _number(_require(cfg, "participation.fraction"), "participation.fraction"),
        cfg["seed"],
        p.get("groups"),
    )
    if _number(p.get("wait_timeout", 0), "participation.wait_timeout") < 0:
        raise ConfigError(f"'participation.wait_timeout' must be >= 0, got {p.get('wait_timeout')!r}")
    query_timeout = p.get("query_timeout", 30)
    if isinstance(query_timeout, bool) or not isinstance(query_timeout, int | float) or not query_timeout > 0:
        raise ConfigError(f"'participation.query_timeout' must be a number > 0 (seconds), got {query_timeout!r}")
    c = _require(cfg, "client")
    _positive_int(cfg, "client.batch_size")
    local_steps = _positive_int(cfg, "client.local_steps", 0)
    _positive_int(cfg, "client.local_epochs", 0 if local_steps > 0 else 1)
    if isinstance(cfg["strategy"].get("theta"), list):  # the list's K won over client.local_steps, silently
        _check("strategy.theta", fm.check_theta_steps, cfg["strategy"]["theta"], local_steps)
    _check(
        "client.weight_decay", fm.check_lr, _number(c.get("weight_decay", 0.0), "client.weight_decay"), "weight_decay"
    )
    if "loss_before_batches" in c:
        _positive_int(cfg, "client.loss_before_batches", -1)
    if "torch_threads" in c:
        _positive_int(cfg, "client.torch_threads", 0)
    if not isinstance(c.get("augment", True), bool):
        raise ConfigError(f"'client.augment' must be true or false, got {c['augment']!r}")
    _validate_trust(cfg)
    if not natural:
        _validate_data(cfg, check_paths)
    _validate_backend(cfg.get("backend", {}))
    _validate_engine(cfg)
    if check_paths and cfg["resume"] and cfg.get("run_dir"):
        from server.run.checkpoint import check_resumable  # imports torch: only for a resumed run

        check_resumable(cfg, Path(cfg["run_dir"]))  # a checkpoint of another run: refused before any work
    return cfg


def engine_name(cfg: Mapping[str, Any]) -> str:
    """``engine.name`` (``ray`` when the config has no engine group)."""
    return str((cfg.get("engine") or {}).get("name", "ray"))


def _validate_engine(cfg: Mapping[str, Any]) -> None:
    """``engine.name`` ∈ ENGINES; the batched engine's ``chunk_size`` and ``workers`` (auto | int ≥ 1),
    ``vectorize`` (auto | true | false) and ``device`` (auto | cpu | cuda); it runs on this host: no Ray cluster."""
    name = engine_name(cfg)
    if name not in ENGINES:
        raise ConfigError(f"'engine.name' must be one of {ENGINES}, got {name!r}")
    if name != "batched":
        return
    e = cfg["engine"]
    chunk = e.get("chunk_size", "auto")
    if chunk != "auto" and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ConfigError(f"'engine.chunk_size' must be auto or an integer >= 1, got {chunk!r}")
    workers = e.get("workers", "auto")
    if workers != "auto" and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"'engine.workers' must be auto or an integer >= 1, got {workers!r}")
    if e.get("vectorize", "auto") not in ("auto", True, False):
        raise ConfigError(f"'engine.vectorize' must be auto, true or false, got {e.get('vectorize')!r}")
    if e.get("device", "auto") not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"'engine.device' must be auto, cpu or cuda, got {e.get('device')!r}")
    if e.get("device") == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("'engine.device' is cuda but no CUDA device is visible")
    address = (cfg.get("backend") or {}).get("address")
    if address not in (None, "local"):
        raise ConfigError(
            f"'backend.address'={address!r} names a Ray cluster, but engine=batched runs every client "
            "in this process: use engine=ray for a cluster"
        )


def _validate_backend(b: Mapping[str, Any]) -> None:
    if _number(b.get("num_cpus", 1), "backend.num_cpus") <= 0:
        raise ConfigError(f"'backend.num_cpus' must be positive, got {b.get('num_cpus')!r}")
    if b.get("num_gpus") is not None and _number(b["num_gpus"], "backend.num_gpus") < 0:
        raise ConfigError(f"'backend.num_gpus' must be >= 0 or null (auto), got {b['num_gpus']!r}")
    for key, least, unset in (("init_num_cpus", 1, "all cores"), ("init_num_gpus", 0, "all GPUs")):
        if b.get(key) is not None and _number(b[key], f"backend.{key}") < least:
            raise ConfigError(f"'backend.{key}' must be >= {least} or null ({unset}), got {b[key]!r}")
    address = b.get("address")
    if address is None or address == "local":
        return
    if not isinstance(address, str) or not (address == "auto" or _host_port(address)):
        raise ConfigError(
            f"'backend.address' must be null (a fresh local Ray), 'auto' or HOST:PORT of a Ray "
            f"cluster's head, got {address!r}"
        )
    for key in ("init_num_cpus", "init_num_gpus"):
        if b.get(key) is not None:
            raise ConfigError(
                f"'backend.{key}' must be null with 'backend.address': a cluster's nodes declare "
                "their CPUs and GPUs at `ray start`"
            )


def _host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def _validate_server_optimizer(cfg: dict[str, Any]) -> None:
    """``strategy.server_optimizer`` and its knobs (FedAvgM with momentum 0, LocalUpdate, LocalUpdateDecay)."""
    s = cfg["strategy"]
    optimizer = s.get("server_optimizer", "sgd")
    if not registry.STRATEGIES[s["name"]].server_optimizer:
        if optimizer != "sgd":
            raise ConfigError(f"'strategy.server_optimizer': {s['name']} supports only sgd, got {optimizer!r}")
        return
    if not isinstance(s.get("bias_correction", True), bool):
        raise ConfigError(f"'strategy.bias_correction' must be true or false, got {s['bias_correction']!r}")
    try:
        fm.server_optimizer_config(
            optimizer,
            s.get("beta_1"),
            s.get("beta_2"),
            s.get("tau"),
            s.get("bias_correction", True),
            float(s.get("momentum", 0.0)),
            prefix="strategy.",
        )
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err)) from None


def _validate_eval_train(cfg: dict[str, Any]) -> None:
    """``eval_train``: bool (population loss f(x), paper 2 Eq. 2); ``eval_train_max_examples``: int >= 0."""
    if not isinstance(cfg.setdefault("eval_train", False), bool):
        raise ConfigError(f"'eval_train' must be true or false, got {cfg['eval_train']!r}")
    cfg.setdefault("eval_train_max_examples", 0)
    _positive_int(cfg, "eval_train_max_examples", 0)
    _validate_eval_gap(cfg)


def _validate_eval_gap(cfg: dict[str, Any]) -> None:
    """``eval_gap``: bool, the ``pop_gap`` column f(x^t) − f* (docs/convex.md); it needs ``eval_train=true`` and a
    convex model; ``eval_fstar``: null (f* solved through the cache) or a finite number, only with ``eval_gap``."""
    gap, fstar = cfg.setdefault("eval_gap", False), cfg.setdefault("eval_fstar", None)
    if not isinstance(gap, bool):
        raise ConfigError(f"'eval_gap' must be true or false, got {gap!r}")
    bad_fstar = isinstance(fstar, bool) or not isinstance(fstar, int | float) or not math.isfinite(fstar)
    if fstar is not None and bad_fstar:
        raise ConfigError(f"'eval_fstar' must be null or a finite number, got {fstar!r}")
    if not gap:
        if fstar is not None:
            raise ConfigError("'eval_fstar' is set but eval_gap=false: nothing would use it")
        return
    model = (cfg.get("model") or {}).get("name")
    if model not in CONVEX_MODELS:
        raise ConfigError(
            f"'eval_gap': model.name={model} is not convex; pop_gap = f(x) - f* needs model={CONVEX_MODELS[0]}"
        )
    if not cfg["eval_train"]:
        raise ConfigError("'eval_gap' needs eval_train=true (pop_gap is evaluated with the population loss)")


def _validate_client_state_dir(cfg: dict[str, Any]) -> None:
    """The stateful clients' ``client.state_dir`` (null: <run_dir>/client_state)."""
    state_dir = cfg.get("client", {}).get("state_dir")
    if state_dir is not None:
        if not isinstance(state_dir, str) or not state_dir:
            raise ConfigError(f"'client.state_dir' must be a path or null, got {state_dir!r}")
        cfg["client"]["state_dir"] = os.path.abspath(os.path.expanduser(state_dir))


def _validate_trust(cfg: dict[str, Any]) -> None:
    """``trust.max_update_norm``: null or > 0; ``trust.max_num_examples``: null, "auto" or > 0."""
    trust = cfg.setdefault("trust", {})
    if not isinstance(trust, dict):
        raise ConfigError(f"'trust' must be a mapping, got {trust!r}")
    for key in ("max_update_norm", "max_num_examples"):
        value = trust.setdefault(key, "auto" if key == "max_num_examples" else None)
        if value is None or (key == "max_num_examples" and value == "auto"):
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise ConfigError(
                f"'trust.{key}' must be a positive number or null"
                f"{' or auto' if key == 'max_num_examples' else ''}, got {value!r}"
            )


def _validate_data(cfg: dict[str, Any], check_paths: bool) -> None:
    data = _require(cfg, "data")
    name = _require(cfg, "data.name")
    if name not in DATASETS:
        raise ConfigError(f"'data.name' must be one of {DATASETS}, got {name!r}")
    _check("data.alpha", parse_alpha, _require(cfg, "data.alpha"))
    if _require(cfg, "data.root") is None:
        raise ConfigError(
            "'data.root' is required: a CIFAR-10 ImageFolder tree or .tar.gz of one (train/<class>/*, "
            "test/<class>/*), or set $FEDMOMENTUM_DATA; data=cifar10 fetches CIFAR-10 through torchvision instead"
        )
    root = os.path.abspath(os.path.expanduser(str(_require(cfg, "data.root"))))
    data["root"] = root
    if data.get("cache_dir"):
        data["cache_dir"] = os.path.abspath(os.path.expanduser(str(data["cache_dir"])))
    if not check_paths:
        return
    from client import datacheck  # cheap: names and headers only, or the decode cache's meta.json

    try:
        datacheck.check_cache_dir(data.get("cache_dir"))
    except datacheck.DataSourceError as err:
        raise ConfigError(f"'data.cache_dir': {err}") from None
    try:
        summary = datacheck.check_source(name, root, data.get("cache_dir"), bool(data.get("download")))
    except datacheck.DataSourceError as err:
        raise ConfigError(f"'data.root': {err}") from None
    if summary is not None and summary.num_train < int(cfg["num_clients"]):
        raise ConfigError(
            f"'num_clients' = {cfg['num_clients']} is more than the {summary.num_train} training "
            f"examples of data.root {root}: every client needs at least one"
        )


def _validate_natural(cfg: dict[str, Any], check_paths: bool) -> bool:
    """Paper 2's tasks (``client/datasets``): source, model, ``num_clients`` ("all" = every natural client)
    and ``participation.clients_per_round`` M (sets the fraction to M / num_clients). False for CIFAR-10."""
    name = _require(cfg, "data.name")
    if name not in DATASETS:
        raise ConfigError(f"'data.name' must be one of {DATASETS}, got {name!r}")
    if name not in NATURAL_DATASETS:
        if cfg.get("num_clients") == "all":
            raise ConfigError(f"'num_clients': 'all' needs a naturally partitioned data.name {NATURAL_DATASETS}")
        model = _require(cfg, "model.name")
        if model in MODEL_OUTPUTS:  # a task model's outputs are its task's (classes, characters, words)
            task = next(k for k, v in TASK_MODEL.items() if v == model)
            image_models = tuple(m for m in MODELS if m not in MODEL_OUTPUTS)
            raise ConfigError(
                f"'model.name': model={model} is the model of data={task}; data={name} is trained with one of "
                f"{image_models}"
            )
        return False
    data, model = cfg["data"], _require(cfg, "model.name")
    if model != TASK_MODEL[name]:
        raise ConfigError(f"'model.name': data {name} is trained with model={TASK_MODEL[name]}, got {model!r}")
    for key in ("root", "cache_dir"):
        if data.get(key):
            data[key] = os.path.abspath(os.path.expanduser(str(data[key])))
    summary = None
    if check_paths:
        from client import datacheck, datasets

        try:
            summary = datasets.check_task(name, data.get("root"), data.get("cache_dir"), bool(data.get("download")))
        except datacheck.DataSourceError as err:
            raise ConfigError(f"'{'data.root' if data.get('root') else 'data.download'}': {err}") from None
        if cfg.get("num_clients") == "all":
            cfg["num_clients"] = summary.num_partitions
    elif cfg.get("num_clients") == "all":
        raise ConfigError("'num_clients': 'all' needs the data on this host (give the number of clients)")
    num_clients = _positive_int(cfg, "num_clients")
    if summary is not None and num_clients > summary.num_partitions:
        raise ConfigError(
            f"'num_clients' = {num_clients} is more than the {summary.num_partitions} natural clients of {name}"
        )
    m = cfg.get("participation", {}).get("clients_per_round")
    if m is not None:
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= num_clients:
            raise ConfigError(f"'participation.clients_per_round' must be an integer in [1, {num_clients}], got {m!r}")
        cfg["participation"]["fraction"] = m / num_clients
    trust = cfg.setdefault("trust", {})
    if summary is not None and trust.get("max_num_examples", "auto") == "auto":
        trust["max_num_examples"] = int(summary.sizes[:num_clients].max())  # the largest selected client
    return True


def validate_data(cfg: dict[str, Any]) -> None:
    """The checks of ``data.*`` against the data on this host (again once a download has fetched it)."""
    _validate_data(cfg, True)
