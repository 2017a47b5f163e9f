"""Local training of several clients at once: their parameters stacked along a leading client axis, one
``torch.func.vmap`` of ``grad`` over a model ``functional_call`` per step, and the update rules of
``strategies.math`` applied to the stacked tensors. It is :func:`client.train.local_train` for a chunk of
clients; every convention documented there holds per client:

- each client's batch order and augmentation come from its own ``(seed, round, partition)`` generator, drawn in
  the same order as the one-client loop (batch permutation, then crop offsets and flips of each batch);
- clients with fewer examples take fewer steps and a smaller last batch: a client is active in a step only while
  it has steps left, and a smaller batch is padded (to B, or to the chunk's largest client when B is larger) with
  copies of its own rows that a mask leaves out of the loss (every model here treats examples independently: no
  BatchNorm);
- FedCM's correction, GHBM's m, FedHBM's per-step C (a_i - theta), LocalUpdate's Theta-weighted q, weight decay,
  ``loss-before``, ``train-loss``, ``num-steps`` and ``nonfinite`` (a client stops at its first non-finite loss).

Results equal the one-client loop up to floating-point summation order (batched matrix products and masked
means); tests/server/test_batched_engine.py bounds the difference.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from client.chunk import Chunk, ClientInput, can_stack
from client.linear import LinearChunk, is_linear
from client.train import (
    NONFINITE,
    TRAIN_TIME,
    TrainResult,
    announce_accelerator,
    batch_indices,
)
from strategies import protocol as P


def stacked_local_train(
    model: nn.Module,
    clients: Sequence[ClientInput],
    mean: Sequence[float],
    std: Sequence[float],
    device: torch.device,
    generic: bool = False,
) -> list[TrainResult]:
    """One round of local training of every client in ``clients`` together (see the module docstring).

    ``model`` gives the architecture only (its weights are not used or changed); the clients must share their
    round settings (:data:`client.chunk.SHARED_FIELDS`: step form, batch size, ...), not their data, sizes, seeds,
    learning rates or beta. ``generic``: vmap of autograd even for logistic regression (:func:`chunk_class`).
    """
    start_time = time.perf_counter()
    if not can_stack(model):
        raise ValueError("stacked training needs a model whose state is only trainable parameters")
    model = model.to(device)
    announce_accelerator(device)
    chunk = chunk_class(model, generic)(model, clients, device, mean, std)
    loss_before = chunk.loss_before()
    batches = [batch_indices(n, chunk.cfg.batch_size, s, g) for n, s, g in zip(chunk.n, chunk.steps, chunk.generators)]
    losses: list[list[float]] = [[] for _ in clients]
    stopped = [False] * len(clients)
    for k in range(max(chunk.steps)):
        active = [i for i in range(len(clients)) if k < chunk.steps[i] and not stopped[i]]
        if not active:
            break
        step_losses = chunk.step(active, [next(batches[i]) for i in active], k)
        for i, loss in zip(active, step_losses.tolist()):
            if np.isfinite(loss):
                losses[i].append(loss)
            else:
                stopped[i] = True
    elapsed = (time.perf_counter() - start_time) / len(clients)
    results = []
    dtype = next(iter(chunk.params.values())).dtype  # the loop's mean is in the model's precision
    outputs, finite = chunk.outputs()
    for i, out in enumerate(outputs):
        nonfinite = stopped[i] or not finite[i]
        train_loss = float(torch.tensor(losses[i], dtype=dtype).mean()) if losses[i] else float("nan")
        results.append(
            TrainResult(
                out,
                {
                    P.NUM_EXAMPLES: int(chunk.n[i]),
                    P.LOSS_BEFORE: float(loss_before[i]),
                    P.TRAIN_LOSS: train_loss,
                    P.NUM_STEPS: len(losses[i]),
                    NONFINITE: int(nonfinite),
                    TRAIN_TIME: float(elapsed),
                },
            )
        )
    return results


def chunk_class(model: nn.Module, generic: bool = False) -> type[Chunk]:
    """The closed-form linear chunk for logistic regression (same results, measured faster), else vmap of autograd
    (also for logistic regression when ``generic``)."""
    return LinearChunk if is_linear(model) and not generic else Chunk
