"""One local step of each client-step family, written once for every caller: the one-client loop
(client/train.py), the stacked clients (client/stacked.py) and the theory app (theory/flower_app.py).

A family is the form of theta_{k+1} given theta_k, the gradient g and the round's per-client array ("extra"):

- ``sgd``: theta - eta_l g (paper 1 Eq. 91; FedAvg/FedAvgM);
- ``localupdate``: the same SGD step, with q accumulated apart (:func:`strategies.math.localupdate_accumulate`);
- ``fedcm``: theta - eta_l ((1 - beta) g + c), c = FedCM's server correction (paper 1 Eq. 101);
- ``ghbm``: theta - eta_l g - (beta / J) m, m the round's momentum (GHBM, LocalGHBM);
- ``fedhbm``: the GHBM step with m = C (a_i - theta_k), a_i the client's anchor (FedHBM).

Which array each family's clients receive is :data:`EXTRA_OF_FAMILY`; a client without one takes a zero term (FedCM's
first round, a client's first GHBM-family participation). ``sgd``, ``fedcm`` and ``ghbm`` share one form, theta - a g
+ c with a and c fixed in the round (:func:`strategies.math.affine_local_step`), so stacked clients of the three may
take their steps together (:data:`AFFINE_FAMILIES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strategies.math import fedcm_local_step, fedhbm_momentum, ghbm_local_step, sgd_step

FAMILIES = ("sgd", "localupdate", "fedcm", "ghbm", "fedhbm")
EXTRA_OF_FAMILY = {"fedcm": "correction", "ghbm": "momentum_term", "fedhbm": "anchor"}
# theta - a g + c with a per-client a and a c fixed in the round (strategies.math.affine_local_step): clients of these
# families may take their steps together
AFFINE_FAMILIES = ("sgd", "fedcm", "ghbm")


@dataclass(frozen=True)
class Algorithm:
    """A client-side algorithm: ``family`` names its local step (:data:`strategies.client_step.FAMILIES`)."""

    name: str
    family: str
    stateful: bool = False  # clients keep node-local state across rounds (strategies/client_state.py)

    @property
    def step_form(self) -> str:
        """The step form: affine for the families of :data:`AFFINE_FAMILIES` (their clients may share a stacked
        step), else the algorithm's own name."""
        return "affine" if self.family in AFFINE_FAMILIES else self.name

    @property
    def replies_q(self) -> bool:
        """Whether the client replies with LocalUpdate's q = sum_k Theta_k g_k instead of its local model."""
        return self.family == "localupdate"


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("fedavgm", "sgd"),
        Algorithm("fedcm", "fedcm"),
        Algorithm("localupdate", "localupdate"),
        Algorithm("ghbm", "ghbm"),
        Algorithm("localghbm", "ghbm", stateful=True),
        Algorithm("fedhbm", "fedhbm", stateful=True),
    )
}


def algorithm(name: str) -> Algorithm:
    """The registered client algorithm ``name`` (ValueError naming the choices otherwise)."""
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {tuple(ALGORITHMS)}, got {name!r}")
    return ALGORITHMS[name]


def extra_name(family: str) -> str | None:
    """The name of the per-client array a ``family`` step reads (None: it reads none)."""
    return EXTRA_OF_FAMILY.get(family)


def local_step(
    family: str,
    param: Any,
    grad: Any,
    lr: Any,
    momentum: Any = 0.0,
    extra: Any = None,
    local_steps: Any = 1,
    participation: Any = 1.0,
) -> Any:
    """theta_{k+1} of one parameter under ``family`` (see the module docstring); ``extra`` None is a zero term.

    Works on numpy arrays, torch tensors and stacked (client, ...) tensors with per-client ``lr`` / ``momentum`` /
    ``local_steps`` shaped to broadcast; ``grad`` already holds weight decay. A plain-number ``lr`` of 0 leaves an
    SGD-family parameter as it is (LocalUpdate with gamma = 0 only accumulates q).
    """
    if family == "fedcm":
        return fedcm_local_step(param, grad, lr, momentum, 0.0 if extra is None else extra, local_steps)
    if family == "ghbm":
        return ghbm_local_step(param, grad, lr, momentum, 0.0 if extra is None else extra, local_steps)
    if family == "fedhbm":
        term = 0.0 if extra is None else fedhbm_momentum(extra, param, participation)
        return ghbm_local_step(param, grad, lr, momentum, term, local_steps)
    if family in ("sgd", "localupdate"):
        return param if isinstance(lr, int | float) and lr == 0 else sgd_step(param, grad, lr)
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
