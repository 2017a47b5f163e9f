"""The one table of algorithms: every name a config, a client message or a theory run may use, and what it means.

Two tables, read by the config validation, the strategy builder, the clients, the theory app and the engines:

- :data:`ALGORITHMS` (kept in :mod:`strategies.client_step`, which clients import alone): what a client is asked
  to run (the message's ``algorithm``): its local-step family and whether its clients keep state across rounds.
- :data:`STRATEGIES`: what ``strategy.name`` selects: the Flower strategy class, the algorithm its clients run, the
  ``strategy.*`` keys it reads with the check of each, and whether it takes a FedOpt server optimizer.

Adding an algorithm: its pure update in :mod:`strategies.math`, a strategy class (``strategies/flower.py``) or a local
step family (:mod:`strategies.client_step`) if it needs one, then one entry in each table here and a ``conf/strategy``
file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from strategies import math as fm
from strategies import schedules
from strategies.base import ServerOptStrategy
from strategies.client_step import ALGORITHMS
from strategies.flower import FedAvgM, FedCM, LocalUpdate, LocalUpdateDecay
from strategies.ghbm import GHBM, FedHBM, LocalGHBM

DECAY_KEYS = ("window", "patience", "cooldown", "min_delta", "client_decay", "server_decay", "min_lr")
SERVER_OPTIMIZER_KEYS = ("server_optimizer", "beta_1", "beta_2", "tau", "bias_correction")


def _one(check: Callable[..., Any], name: str = "momentum") -> Callable[..., Any]:
    """``check`` of the config value ``name`` that must be one number (the math's checks also take arrays)."""

    def checked(value: Any, *args: Any) -> None:
        check(fm.as_number(value, name), *args)

    return checked


def _theta(value: Any) -> None:
    fm.theta_weights(value, 1)


def _momentum(s: Mapping[str, Any], cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {"momentum": float(s["momentum"])}


def _ghbm(s: Mapping[str, Any], cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {"momentum": float(s["momentum"]), "tau": int(s["tau"])}


def _theta_and_steps(s: Mapping[str, Any], cfg: Mapping[str, Any]) -> dict[str, Any]:
    theta = s.get("theta", "fedavg")
    theta = theta if isinstance(theta, str) else [float(w) for w in theta]
    return {"theta": theta, "local_steps": int(cfg["client"].get("local_steps", 0))}


def _decay(s: Mapping[str, Any], cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {**_theta_and_steps(s, cfg), **{k: s[k] for k in DECAY_KEYS}}


@dataclass(frozen=True)
class Strategy:
    """What ``strategy.name`` selects.

    ``checks``: (key of ``strategy.*``, check raising ValueError) for the keys it requires; ``group_check``: a
    check over ``group_keys`` together (LocalUpdateDecay's plateau knobs); ``options``: the class's keyword
    arguments from the ``strategy`` section and the whole config.
    """

    name: str
    cls: type[ServerOptStrategy]
    algorithm: str
    options: Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, Any]]
    checks: tuple[tuple[str, Callable[[Any], Any]], ...] = ()
    group_keys: tuple[str, ...] = ()
    group_check: Callable[..., Any] | None = None
    server_optimizer: bool = False  # takes strategy.server_optimizer (FedOpt: Adam / Adagrad / Yogi)
    required: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "required", tuple(k for k, _ in self.checks) + self.group_keys)

    @property
    def server_lr_may_be_zero(self) -> bool:
        """Whether eta = 0 is allowed (the class says: FedCM divides its correction by eta)."""
        return self.cls.server_lr_may_be_zero

    @property
    def family(self) -> str:
        return ALGORITHMS[self.algorithm].family

    @property
    def stateful(self) -> bool:
        return ALGORITHMS[self.algorithm].stateful


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            "fedavgm", FedAvgM, "fedavgm", _momentum, (("momentum", _one(fm.check_momentum)),), server_optimizer=True
        ),
        Strategy("fedcm", FedCM, "fedcm", _momentum, (("momentum", _one(fm.check_momentum)),)),
        Strategy(
            "localupdate", LocalUpdate, "localupdate", _theta_and_steps, (("theta", _theta),), server_optimizer=True
        ),
        Strategy(
            "localupdate_decay",
            LocalUpdateDecay,
            "localupdate",
            _decay,
            (("theta", _theta),),
            group_keys=DECAY_KEYS,
            group_check=schedules.PlateauDecayConfig,
            server_optimizer=True,
        ),
        Strategy("ghbm", GHBM, "ghbm", _ghbm, (("momentum", _one(fm.check_ghbm_momentum)), ("tau", fm.check_tau))),
        Strategy("localghbm", LocalGHBM, "localghbm", _momentum, (("momentum", _one(fm.check_ghbm_momentum)),)),
        Strategy("fedhbm", FedHBM, "fedhbm", _momentum, (("momentum", _one(fm.check_ghbm_momentum)),)),
    )
}


def strategy(name: str) -> Strategy:
    """The registered strategy ``name`` (ValueError naming the choices otherwise)."""
    if name not in STRATEGIES:
        raise ValueError(f"must be one of {tuple(STRATEGIES)}, got {name!r}")
    return STRATEGIES[name]


def strategy_options(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of the configured strategy's class beyond those every strategy takes."""
    s = cfg["strategy"]
    spec = STRATEGIES[s["name"]]
    options = spec.options(s, cfg)
    if spec.server_optimizer:
        options.update({k: s[k] for k in SERVER_OPTIMIZER_KEYS if k in s})
    return options
