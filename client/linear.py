"""Stacked local training of logistic regression with its gradient in closed form.

For ``softmax(W x + b)`` and the mean cross-entropy over a client's real rows (mask m, count n), the gradient
with respect to the logits is G = (softmax(z) − onehot(y)) · m / n, so ∇W = Gᵀ X and ∇b = Σ_rows G: two batched
matrix products per step for all clients of a chunk, where ``vmap(grad(...))`` of :mod:`client.stacked` traces
autograd every step (measured in docs/benchmarks.md). Everything else (batches, masks, update rules, loss-before
on the same examples) is :class:`client.chunk.Chunk`'s; tests/client/test_stacked.py checks both against the
one-client loop.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from client.chunk import Chunk
from client.models import LogisticRegression
from client.train import loss_before_indices

WEIGHT, BIAS = "linear.weight", "linear.bias"


def is_linear(model: nn.Module) -> bool:
    """Whether ``model`` is :class:`client.models.LogisticRegression` (a linear layer on flattened inputs)."""
    return type(model) is LogisticRegression


def logits(weight: torch.Tensor, bias: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
    """(A, C, B) logits, classes first, of A clients' (A, B, ...) inputs under their (A, C, D) weights and (A, C)
    biases: ``bmm(W, Xᵀ)`` reads both operands in their stored layout (measured faster than ``X Wᵀ``)."""
    return torch.bmm(weight, xs.flatten(2).transpose(1, 2)) + bias.unsqueeze(2)


def logit_gradient(log_p: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, dim: int) -> torch.Tensor:
    """∂/∂z of Σ_rows weight · cross-entropy(z, y): (softmax(z) − onehot(y)) · weight, classes along ``dim`` of
    ``log_p`` = log_softmax(z). The one place this gradient is written: the stacked client steps here and the convex
    objective's f and ∇f (server/convex/objective.py) call it."""
    g = log_p.exp()
    g.scatter_add_(dim, y.unsqueeze(dim), -torch.ones_like(y, dtype=g.dtype).unsqueeze(dim))
    return g.mul_(weight.unsqueeze(dim))


class LinearChunk(Chunk):
    """A chunk of logistic-regression clients: closed-form gradients and one matrix product per client for
    loss-before."""

    def _grads(
        self, params: dict[str, torch.Tensor], xs: torch.Tensor, ys: torch.Tensor, masks: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        with torch.no_grad():
            x = xs.flatten(2)
            z = logits(params[WEIGHT], params[BIAS], x)  # (A, C, B)
            log_p = F.log_softmax(z, dim=1)
            ce = -log_p.gather(1, ys.unsqueeze(1)).squeeze(1)  # (A, B)
            weight = masks.to(z.dtype) / masks.sum(1, keepdim=True).to(z.dtype)  # m / n per row
            losses = (torch.where(masks, ce, torch.zeros_like(ce)) * weight).sum(1)
            g = logit_gradient(log_p, ys, weight, dim=1)  # dL/dz, (A, C, B)
            return {WEIGHT: torch.bmm(g, x), BIAS: g.sum(2)}, losses

    def loss_before(self) -> list[float]:
        sums, sizes = [], []  # each client's loss sum, read back in one copy
        with torch.no_grad():
            for i, (c, gen, steps) in enumerate(zip(self.clients, self.generators, self.steps)):
                idx = loss_before_indices(len(c.y), self.cfg.batch_size, steps, self.cfg.loss_before_batches, gen)
                rows = np.arange(len(c.y)) if idx is None else idx
                x = self.plain[i] if idx is None and self.rows[i] is None else self.batch(i, rows, augment=False)
                target = (
                    self.y[i]
                    if idx is None
                    else torch.index_select(self.y[i], 0, torch.from_numpy(rows).to(self.device))
                )
                z = F.linear(x.flatten(1), self.params[WEIGHT][i], self.params[BIAS][i])
                sums.append(F.cross_entropy(z, target, reduction="sum"))
                sizes.append(len(rows))
        return [s / n for s, n in zip(torch.stack(sums).tolist(), sizes)]
