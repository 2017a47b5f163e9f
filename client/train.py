"""Local training of one client: the framework loop around the shared update rules of ``strategies.math``.

- ``fedavgm``: J mini-batch SGD steps ``sgd_step`` (paper 1 Eq. 91); returns the local model.
- ``fedcm``: J steps ``fedcm_local_step`` with the server's correction beta (theta^{t-1} - theta^{t-2}) / eta_t
  (paper 1 Eq. 101); zero correction in round 1; returns the local model.
- ``ghbm`` / ``localghbm``: J steps ``ghbm_local_step`` theta - eta_l g - (beta / J) m with the round's momentum m
  (GHBM: sent by the server; LocalGHBM: formed from the client's state by ``client.app``); returns the local model.
- ``fedhbm``: J steps ``ghbm_local_step`` with m = ``fedhbm_momentum``(a_i, theta_k, C) = C (a_i - theta_k), a_i the
  client's final local model of its previous participation (none: zero momentum); returns the local model.
- ``localupdate``: K SGD steps with lr gamma (K = len(Theta) for a list; for a preset "fedavg"/"fomaml",
  K = J from local_steps or epochs), accumulating q = sum_k Theta_k g_k
  (``localupdate_accumulate``; paper 2 Algorithm 2); returns q (same keys/shapes as the model).
  gamma = 0 is valid: the model never moves and q = sum_k Theta_k g_k(x).

Conventions (documented once here):
- Mini-batches: every epoch is a fresh random permutation of the client's examples cut into ceil(n/B)
  batches (drop_last=False, so the last batch may be smaller). E epochs give J = E * ceil(n/B) steps; a
  positive ``local_steps`` J (or K for LocalUpdate) walks through as many consecutive epochs as needed.
- Weight decay wd adds wd * theta to every gradient (all three algorithms, so q includes it too).
- The gradient is that of the mean cross-entropy of the batch.
- "loss-before": mean cross-entropy of the received model, without augmentation, on (``loss_before_batches``)
  0 (default): the examples this round trains on (the union of its J batches: all n examples once the round
  covers an epoch, J * B < n of them otherwise), so its cost is one forward pass per example trained on and
  it is an unbiased estimate of the client's loss f_i(x) (paper 2 Section 9 calls the mean over the sampled
  clients a "stochastic estimate of the true loss"); k > 0: k * B evenly spaced examples; -1: all n.
- "train-loss": mean of the batch losses seen during the local steps (augmented data, pre-step weights).
- Randomness (batch order, augmentation) comes from one CPU torch.Generator seeded by (seed, round,
  partition), so a CPU run is reproducible; the device (CUDA if available) is chosen once per process.
- A non-finite batch loss (or non-finite returned arrays) is reported as metric ``nonfinite = 1``; training
  stops at the first non-finite loss and the arrays are returned as they are.
"""

from __future__ import annotations

import logging
import math
import os
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import nn

from client.environment import DEVICE_ENV, tf32_allowed
from client.examples import Examples, ImageExamples
from strategies import protocol as P
from strategies.client_step import algorithm as registered_algorithm
from strategies.client_step import extra_name, local_step
from strategies.math import localupdate_accumulate, theta_weights

NONFINITE = P.NONFINITE  # int metric: 1 when a loss or a returned array was NaN/inf
TRAIN_TIME = "train-time"  # float metric: seconds spent in local_train (data prep + steps)
EVAL_BATCH = 1000
LOSS_BEFORE_ALL = -1  # loss_before_batches value: "loss-before" over every example of the client


@dataclass
class TrainConfig:
    """One round's local-training settings (see ``strategies.protocol`` for the message keys)."""

    algorithm: str
    client_lr: float
    momentum: float = 0.0
    local_epochs: int = 1
    local_steps: int = 0
    batch_size: int = field(kw_only=True)  # B: no default here (conf/client/*.yaml holds it)
    weight_decay: float = 0.0
    theta: Sequence[float] | str | None = None
    augment: bool = True
    loss_before_batches: int = 0  # 0 = the round's examples, k > 0 = k evenly spaced batches, -1 = all
    seed: int = 0
    server_round: int = 1
    partition_id: int = 0
    participation: float = 1.0  # C of FedHBM's momentum C (a_i - theta_k)

    @property
    def family(self) -> str:
        """The local-step family of the algorithm (:mod:`strategies.client_step`)."""
        return registered_algorithm(self.algorithm).family

    @property
    def step_form(self) -> str:
        """What clients must share to take their steps together (:attr:`strategies.client_step.Algorithm.step_form`)."""
        return registered_algorithm(self.algorithm).step_form

    def __post_init__(self) -> None:
        registered_algorithm(self.algorithm)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.loss_before_batches < LOSS_BEFORE_ALL:
            raise ValueError(f"loss_before_batches must be >= {LOSS_BEFORE_ALL}, got {self.loss_before_batches}")
        if self.family == "localupdate" and self.theta is None:
            raise ValueError("localupdate needs theta (its length is the number of local steps K)")
        needs_j = self.family != "localupdate" or isinstance(self.theta, str)  # K from J, not len(theta)
        if needs_j and self.local_steps <= 0 and self.local_epochs < 1:
            raise ValueError("need local_steps > 0 or local_epochs >= 1")


@dataclass
class TrainResult:
    arrays: dict[str, torch.Tensor]  # local model (fedavgm, fedcm) or q (localupdate), on CPU
    metrics: dict[str, int | float]


@lru_cache(maxsize=1)
def get_device() -> torch.device:
    """``$FEDMOMENTUM_DEVICE`` when set, else CUDA when available, else CPU; decided once per process."""
    choice = os.environ.get(DEVICE_ENV) or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(choice)
    if device.type == "cuda":
        cuda_precision()
    return device


def cuda_precision() -> bool:
    """Float32 on CUDA means float32: TF32 off for cuDNN convolutions (on by torch's default) and cuBLAS matrix
    products, unless ``$FEDMOMENTUM_TF32=1`` (:mod:`client.environment`). With TF32, a CNN's model after 3 rounds
    differed from the CPU's by up to 5e-2 normwise; without it, by 1.4e-6, as CPU paths differ among themselves
    (docs/benchmarks.md "GPU check"). Returns whether TF32 is allowed."""
    tf32 = tf32_allowed()
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    return tf32


@lru_cache(maxsize=8)
def announce_accelerator(device: torch.device) -> None:
    """Once per process and device, say that training runs on a GPU (checks/gpu_check.py counts these) and set
    its float32 precision (:func:`cuda_precision`)."""
    if device.type == "cuda":
        cuda_precision()
        logging.getLogger("flwr").info(
            "pid %d trains on %s (%s)", os.getpid(), device, torch.cuda.get_device_name(device)
        )


def round_generator(seed: int, server_round: int, partition_id: int) -> torch.Generator:
    """CPU generator seeded from (seed, round, partition) through numpy's SeedSequence."""
    state = np.random.SeedSequence([int(seed), int(server_round), int(partition_id)]).generate_state(1, np.uint64)
    return torch.Generator().manual_seed(int(state[0]) & (2**63 - 1))


def num_local_steps(num_examples: int, batch_size: int, local_epochs: int, local_steps: int = 0) -> int:
    """J = local_steps when positive, else E * ceil(n / B)."""
    return int(local_steps) if local_steps > 0 else int(local_epochs) * math.ceil(num_examples / batch_size)


def batch_indices(
    num_examples: int, batch_size: int, num_steps: int, generator: torch.Generator
) -> Iterator[np.ndarray]:
    """``num_steps`` index batches; each epoch is a new permutation cut into ceil(n/B) batches."""
    step = 0
    while step < num_steps:
        order = torch.randperm(num_examples, generator=generator).numpy()
        for start in range(0, num_examples, batch_size):
            if step == num_steps:
                return
            yield order[start : start + batch_size]
            step += 1


# --------------------------------------------------------------------------- arrays <-> model
def load_arrays(model: nn.Module, arrays: Mapping[str, Any] | Sequence[Any]) -> None:
    """Copy arrays into the model: a mapping keyed by state_dict names, or a list in state_dict order."""
    state = model.state_dict()
    values = as_named(state_shapes(model), arrays, "model arrays")
    model.load_state_dict(
        {
            k: torch.as_tensor(np.asarray(v) if not torch.is_tensor(v) else v).to(state[k].dtype)
            for k, v in values.items()
        }
    )


_SHAPES: weakref.WeakKeyDictionary[nn.Module, dict[str, tuple[int, ...]]] = weakref.WeakKeyDictionary()


def state_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """{name: shape} of ``model.state_dict()``, in its order, built once per model object (a model's layers never
    change; ``state_dict()`` walks the module tree on every call: 0.14 ms for ResNet-20)."""
    shapes = _SHAPES.get(model)
    if shapes is None:
        shapes = _SHAPES[model] = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    return shapes


def as_named(shapes: Mapping[str, tuple[int, ...]], arrays: Mapping[str, Any] | Sequence[Any], what: str) -> dict:
    """Key ``arrays`` by the model's state_dict names (accepting "0", "1", ... keys or a plain list) and check their
    shapes against ``shapes`` (:func:`state_shapes`)."""
    if isinstance(arrays, Mapping):
        if arrays.keys() == shapes.keys():
            named = dict(arrays)
        elif set(arrays) == {str(i) for i in range(len(shapes))}:
            named = {k: arrays[str(i)] for i, k in enumerate(shapes)}
        else:
            raise ValueError(f"{what}: keys {sorted(arrays)[:4]}... match neither the model's names nor '0', '1', ...")
    else:
        if len(arrays) != len(shapes):
            raise ValueError(f"{what}: {len(arrays)} arrays for {len(shapes)} model tensors")
        named = dict(zip(shapes, arrays))
    for k, v in named.items():
        if tuple(v.shape) != shapes[k]:
            raise ValueError(f"{what}: {k} has shape {tuple(v.shape)}, model has {shapes[k]}")
    return named


# --------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    mean: Sequence[float],
    std: Sequence[float],
    max_examples: int = 0,
    device: torch.device | None = None,
) -> tuple[float, float, int]:
    """(mean loss, accuracy, n) of the model on uint8 images without augmentation.

    ``max_examples > 0`` evaluates on that many evenly spaced examples instead of all of them.
    """
    return evaluate_examples(model, ImageExamples(x, y, mean, std, augment=False), max_examples, device)


@torch.no_grad()
def evaluate_examples(
    model: nn.Module,
    examples: Examples,
    max_examples: int = 0,
    device: torch.device | None = None,
    indices: np.ndarray | None = None,
) -> tuple[float, float, int]:
    """(mean loss, accuracy, n) of the model on ``examples`` (rows ``indices``, or all), without augmentation.

    The loss is the sum of the task's loss terms over the number of terms (examples, or tokens for next-word
    prediction); ``max_examples > 0`` evaluates on that many evenly spaced rows instead of all of them.
    """
    return evaluate_many([model], examples, max_examples, device, indices)[0]


def evaluate_many(
    models: Sequence[nn.Module],
    examples: Examples,
    max_examples: int = 0,
    device: torch.device | None = None,
    indices: np.ndarray | None = None,
) -> list[tuple[float, float, int]]:
    """:func:`evaluate_examples` of each model, each batch prepared once for all of them: every model's figures
    are the ones it gets alone (the same batches, operations and sums, in the same order)."""
    device = device or get_device()
    rows = np.arange(len(examples)) if indices is None else np.asarray(indices)
    n = len(rows)
    if 0 < max_examples < n:
        rows = rows[np.linspace(0, n - 1, max_examples).astype(np.int64)]
    for model in models:
        model.eval()
    sums = [[0.0, 0, 0.0, 0] for _ in models]  # loss sum, loss terms, hits, scored
    with torch.no_grad():
        for start in range(0, len(rows), EVAL_BATCH):
            inputs, targets = examples.batch(rows[start : start + EVAL_BATCH], device, None)
            for acc, model in zip(sums, models):
                outputs = model(inputs)
                total, count = examples.loss(outputs, targets)
                acc[0], acc[1] = acc[0] + float(total), acc[1] + count
                h, s = examples.correct(outputs, targets)
                acc[2], acc[3] = acc[2] + h, acc[3] + s
    return [(loss / max(terms, 1), hits / max(scored, 1), len(rows)) for loss, terms, hits, scored in sums]


# --------------------------------------------------------------------------- loss before training
def loss_before_indices(
    num_examples: int, batch_size: int, num_steps: int, loss_before_batches: int, generator: torch.Generator
) -> np.ndarray | None:
    """Sorted indices of the examples "loss-before" is measured on; None means all of them.

    The default (0) predicts the examples of the round's ``num_steps`` batches without consuming
    ``generator``: fewer than one epoch of batches are the first J * B entries of the first permutation
    that :func:`batch_indices` draws, which a copy of the generator reproduces.
    """
    if loss_before_batches == LOSS_BEFORE_ALL:
        return None
    if loss_before_batches > 0:
        wanted = loss_before_batches * batch_size
        return np.linspace(0, num_examples - 1, wanted).astype(np.int64) if wanted < num_examples else None
    if num_steps * batch_size >= num_examples:  # the round covers at least one epoch
        return None
    peek = torch.Generator().set_state(generator.get_state())
    return np.sort(torch.randperm(num_examples, generator=peek).numpy()[: num_steps * batch_size])


def _loss_before(
    model: nn.Module,
    examples: Examples,
    cfg: TrainConfig,
    num_steps: int,
    generator: torch.Generator,
    device: torch.device,
) -> float:
    idx = loss_before_indices(len(examples), cfg.batch_size, num_steps, cfg.loss_before_batches, generator)
    return evaluate_examples(model, examples, device=device, indices=idx)[0]


# --------------------------------------------------------------------------- local training
def _per_param(
    model: nn.Module,
    names: list[str],
    params: list[torch.Tensor],
    arrays: Mapping[str, Any] | Sequence[Any] | None,
    what: str,
    device: torch.device,
) -> list[torch.Tensor] | None:
    """One tensor per trainable parameter (in ``params`` order, on ``device``) from arrays keyed like the model."""
    if arrays is None:
        return None
    named = as_named(state_shapes(model), arrays, what)
    return [
        torch.as_tensor(np.asarray(named[k]) if not torch.is_tensor(named[k]) else named[k]).to(device, p.dtype)
        for k, p in zip(names, params)
    ]


def local_train(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    mean: Sequence[float],
    std: Sequence[float],
    cfg: TrainConfig,
    correction: Mapping[str, Any] | Sequence[Any] | None = None,
    device: torch.device | None = None,
    momentum_term: Mapping[str, Any] | Sequence[Any] | None = None,
    anchor: Mapping[str, Any] | Sequence[Any] | None = None,
) -> TrainResult:
    """Run one round of local training on (x uint8 (n, 32, 32, 3), y int64) starting from ``model``'s weights.

    ``correction`` is FedCM's server term per parameter (None = zero); ``momentum_term`` GHBM's / LocalGHBM's m
    and ``anchor`` FedHBM's a_i (None = zero momentum). The model is trained in place.
    """
    return train_examples(
        model, ImageExamples(x, y, mean, std, cfg.augment), cfg, correction, device, momentum_term, anchor
    )


def train_examples(
    model: nn.Module,
    examples: Examples,
    cfg: TrainConfig,
    correction: Mapping[str, Any] | Sequence[Any] | None = None,
    device: torch.device | None = None,
    momentum_term: Mapping[str, Any] | Sequence[Any] | None = None,
    anchor: Mapping[str, Any] | Sequence[Any] | None = None,
) -> TrainResult:
    """:func:`local_train` on any task's :class:`client.examples.Examples` (its batches, loss and metric)."""
    start_time = time.perf_counter()
    device = device or get_device()
    model.to(device)
    announce_accelerator(next(model.parameters()).device)
    n = len(examples)
    generator = round_generator(cfg.seed, cfg.server_round, cfg.partition_id)

    names = [k for k, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    family = cfg.family
    if family == "localupdate":
        # a list fixes K = len(theta); a preset ("fedavg", "fomaml") takes K = J of local_steps / epochs
        weights = theta_weights(cfg.theta, num_local_steps(n, cfg.batch_size, cfg.local_epochs, cfg.local_steps))
        num_steps = len(weights)
        q = [torch.zeros_like(p) for p in params]
    else:
        num_steps = num_local_steps(n, cfg.batch_size, cfg.local_epochs, cfg.local_steps)
    loss_before = _loss_before(model, examples, cfg, num_steps, generator, device)
    received = {"correction": correction, "momentum_term": momentum_term, "anchor": anchor}.get(extra_name(family))
    extra = _per_param(model, names, params, received, f"{cfg.algorithm} {extra_name(family)}", device)

    model.train()
    losses: list[torch.Tensor] = []
    nonfinite = False
    steps_done = 0
    for k, idx in enumerate(batch_indices(n, cfg.batch_size, num_steps, generator)):
        inputs, targets = examples.batch(idx, device, generator)
        total, count = examples.loss(model(inputs), targets)
        loss = total / count
        if not torch.isfinite(loss):
            nonfinite = True
            break
        losses.append(loss.detach())
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(params, grads)):
                if cfg.weight_decay:
                    g = g + cfg.weight_decay * p
                if family == "localupdate":
                    q[i] = localupdate_accumulate(q[i], g, float(weights[k]))
                term = None if extra is None else extra[i]
                new = local_step(family, p, g, cfg.client_lr, cfg.momentum, term, num_steps, cfg.participation)
                if new is not p:
                    p.copy_(new)
        steps_done += 1

    if family == "localupdate":
        by_name = dict(zip(names, q))
        out = {k: by_name[k] if k in by_name else torch.zeros_like(v) for k, v in model.state_dict().items()}
    else:
        out = dict(model.state_dict())
    out = {k: v.detach().cpu().clone() for k, v in out.items()}
    nonfinite = nonfinite or not all(bool(torch.isfinite(v).all()) for v in out.values())
    train_loss = float(torch.stack(losses).mean()) if losses else float("nan")
    metrics: dict[str, int | float] = {
        P.NUM_EXAMPLES: int(n),
        P.LOSS_BEFORE: float(loss_before),
        P.TRAIN_LOSS: train_loss,
        P.NUM_STEPS: int(steps_done),
        NONFINITE: int(nonfinite),
        TRAIN_TIME: float(time.perf_counter() - start_time),
    }
    return TrainResult(out, metrics)
