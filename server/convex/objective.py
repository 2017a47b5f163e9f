"""The population objective of the convex model, in float64: value, gradient, Hessian-vector product.

    f(w) = (1/N) Σ_i f_i(w) + (μ/2) ‖w‖²,   f_i(w) = (1/n_i) Σ_{j ∈ D_i} ℓ(w; x_j, y_j)

with ℓ the cross-entropy of multinomial logistic regression (``model=logreg``: logits W x + b on the normalised
pixels, no augmentation), D_i the training partition of client i (the Dirichlet split of the run), P uniform over
the N clients as in paper 2 Eq. 2 — exactly the ``pop_loss`` column of a run (:class:`server.run.evaluator.Evaluator`)
— and μ = ``client.weight_decay`` over *every* parameter (W and b): the clients add μθ to every gradient
(client/train.py), the gradient of (μ/2)‖θ‖². Written per example, f(w) = Σ_j c_j ℓ_j(w) + (μ/2)‖w‖² with
c_j = 1 / (N n_{i(j)}); the partitions of this project hold ⌊n/N⌋ or ⌈n/N⌉ examples, so c_j = 1/n (the plain
mean over the training set) exactly when N divides n, and differs from it in the last digits otherwise.

w is flat: the ``linear.weight`` rows (C × d, d = 3·32·32 in NCHW order, as the model flattens its input), then
``linear.bias`` (C). The gradient and the Hessian-vector product are the closed forms of softmax regression
(P = softmax(Z), Z = X Wᵀ + b): ∇_W = Gᵀ X + μW with G_j = c_j (P_j − e_{y_j}); H·v: dZ = X Vᵀ + v_b,
R_j = c_j (P_j ⊙ dZ_j − P_j ⟨P_j, dZ_j⟩), H_W v = Rᵀ X + μV. tests/server/test_convex.py checks them against
torch autograd of the model's own cross-entropy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from client.augment import normalise, to_tensor
from client.linear import logit_gradient

WEIGHT, BIAS = "linear.weight", "linear.bias"  # client.models.LogisticRegression's state_dict
FEATURE_CHUNK = 4096  # images converted to float64 at once while building the features


def example_weights(parts: Sequence[np.ndarray], num_examples: int) -> np.ndarray:
    """c_j = 1 / (N n_i) for example j of client i (paper 2 Eq. 2 with P uniform); the c_j sum to 1.

    Raises ValueError unless the partitions cover every example exactly once (the Dirichlet split does)."""
    weights = np.zeros(num_examples, dtype=np.float64)
    seen = np.zeros(num_examples, dtype=np.int64)
    for idx in parts:
        if len(idx) == 0:
            raise ValueError("a client has no training example")
        weights[idx] = 1.0 / (len(parts) * len(idx))
        np.add.at(seen, idx, 1)
    if not np.all(seen == 1):
        raise ValueError("the partitions do not cover every training example exactly once")
    return weights


def features(x: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """(n, d) float64 model inputs of uint8 images (n, H, W, 3): the clients' ``prepare_batch`` without augmentation
    (:func:`client.augment.to_tensor` and :func:`client.augment.normalise`) in float64, flattened as the model does."""
    chunks = [
        normalise(to_tensor(np.array(x[s : s + FEATURE_CHUNK]), dtype=torch.float64), mean, std).flatten(1)
        for s in range(0, len(x), FEATURE_CHUNK)
    ]
    return torch.cat(chunks)


class PopulationObjective:
    """f, ∇f and ∇²f·v of the module docstring's objective on fixed data, float64 throughout."""

    def __init__(self, x: torch.Tensor, y: np.ndarray, weights: np.ndarray, mu: float, num_classes: int) -> None:
        if x.dtype != torch.float64 or x.ndim != 2 or len(x) != len(y) or len(y) != len(weights):
            raise ValueError("need float64 features (n, d), n labels and n example weights")
        if not (np.isfinite(mu) and mu >= 0):
            raise ValueError(f"mu must be a finite number >= 0, got {mu!r}")
        self.x, self.mu, self.num_classes = x, float(mu), int(num_classes)
        self.y = torch.as_tensor(np.array(y, dtype=np.int64))
        self.c = torch.as_tensor(np.asarray(weights, dtype=np.float64))
        self.num_features = x.shape[1]
        self.dim = self.num_classes * (self.num_features + 1)
        self._at: tuple[bytes, torch.Tensor, torch.Tensor] | None = None  # (w bytes, Z, log-softmax) of the last w

    # ----------------------------------------------------------------------- layout
    def split(self, w: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(W (C, d), b (C,)) views of a flat float64 vector."""
        w = torch.as_tensor(np.asarray(w, dtype=np.float64))
        if w.shape != (self.dim,):
            raise ValueError(f"w must have {self.dim} entries, got shape {tuple(w.shape)}")
        k = self.num_classes * self.num_features
        return w[:k].view(self.num_classes, self.num_features), w[k:]

    def flatten(self, arrays: Mapping[str, Any]) -> np.ndarray:
        """The flat float64 w of model arrays {``linear.weight``, ``linear.bias``} (an ArrayRecord's numpy values)."""
        weight = np.asarray(arrays[WEIGHT], dtype=np.float64)
        bias = np.asarray(arrays[BIAS], dtype=np.float64)
        if weight.shape != (self.num_classes, self.num_features) or bias.shape != (self.num_classes,):
            raise ValueError(f"logreg arrays of shapes {weight.shape}, {bias.shape} do not fit this objective")
        return np.concatenate([weight.ravel(), bias])

    def arrays(self, w: np.ndarray) -> dict[str, np.ndarray]:
        """Model arrays (float64) of a flat w: the inverse of :meth:`flatten`."""
        weight, bias = self.split(w)
        return {WEIGHT: weight.numpy().copy(), BIAS: bias.numpy().copy()}

    def rows(self, w: np.ndarray) -> torch.Tensor:
        """(C, d + 1) rows [w_k | b_k] of a flat w (the affine parameters of class k)."""
        weight, bias = self.split(w)
        return torch.cat([weight, bias[:, None]], dim=1)

    def from_rows(self, rows: torch.Tensor) -> np.ndarray:
        """The flat w of (C, d + 1) rows: the inverse of :meth:`rows`."""
        return torch.cat([rows[:, :-1].reshape(-1), rows[:, -1]]).numpy()

    def second_moment(self) -> torch.Tensor:
        """Σ = Σ_j c_j x'_j x'_jᵀ of the affine inputs x' = (x, 1), (d + 1) × (d + 1): the loss Hessian of one class
        is Xᵀ diag(c p(1 − p)) X, close to p(1 − p) Σ (the solver's preconditioner)."""
        d = self.num_features
        out = torch.zeros(d + 1, d + 1, dtype=torch.float64)
        for s in range(0, len(self.x), FEATURE_CHUNK):
            x, c = self.x[s : s + FEATURE_CHUNK], self.c[s : s + FEATURE_CHUNK]
            cx = x * c[:, None]
            out[:d, :d] += x.T @ cx
            out[:d, d] += cx.sum(0)
        out[d, :d] = out[:d, d]
        out[d, d] = self.c.sum()
        return out

    # ----------------------------------------------------------------------- math
    def _logits(self, w: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        key = np.asarray(w, dtype=np.float64).tobytes()
        if self._at is None or self._at[0] != key:
            weight, bias = self.split(w)
            z = torch.addmm(bias, self.x, weight.T)
            self._at = (key, z, torch.log_softmax(z, dim=1))
        return self._at[1], self._at[2]

    def value(self, w: np.ndarray) -> float:
        """f(w) (the population loss of paper 2 Eq. 2 plus (μ/2)‖w‖²)."""
        return self._value(self._logits(w)[1], w)

    def _value(self, logp: torch.Tensor, w: np.ndarray) -> float:
        loss = -torch.dot(self.c, logp.gather(1, self.y[:, None]).squeeze(1))
        return float(loss) + 0.5 * self.mu * float(np.dot(w, w))

    def value_grad(self, w: np.ndarray) -> tuple[float, np.ndarray]:
        """(f(w), ∇f(w))."""
        _, logp = self._logits(w)
        g = logit_gradient(logp, self.y, self.c, dim=1)
        weight, bias = self.split(w)
        grad = torch.cat([(g.T @ self.x + self.mu * weight).ravel(), g.sum(0) + self.mu * bias])
        return self.value(w), grad.numpy()

    def grad(self, w: np.ndarray) -> np.ndarray:
        """∇f(w)."""
        return self.value_grad(w)[1]

    def hessp(self, w: np.ndarray, v: np.ndarray) -> np.ndarray:
        """∇²f(w) · v."""
        _, logp = self._logits(w)
        p = torch.exp(logp)
        vw, vb = self.split(v)
        dz = torch.addmm(vb, self.x, vw.T)
        s = p * dz
        r = (s - p * s.sum(1, keepdim=True)).mul_(self.c[:, None])
        return torch.cat([(r.T @ self.x + self.mu * vw).ravel(), r.sum(0) + self.mu * vb]).numpy()

    def accuracy(self, w: np.ndarray) -> float:
        """Σ_j c_j [argmax_k Z_jk = y_j] (the population accuracy, weighted like f)."""
        return self._accuracy(self._logits(w)[0])

    def _accuracy(self, z: torch.Tensor) -> float:
        return float(torch.dot(self.c, (z.argmax(1) == self.y).to(torch.float64)))


MANY = 32  # models evaluated per product in population_values


def population_values(objs: Sequence[PopulationObjective], ws: Sequence[np.ndarray]) -> list[tuple[float, float]]:
    """(f(w), accuracy(w)) of each (objective, w) pair, the objectives sharing one feature tensor X: the logits of
    up to :data:`MANY` models come from one product X [W_1; …; W_J]ᵀ, so the data is read once for all of them.
    Equal to :meth:`PopulationObjective.value` and :meth:`~PopulationObjective.accuracy` up to the summation order
    of the wider product (float64 rounding, ~1e-12 on the logits)."""
    if not objs:
        return []
    x = objs[0].x
    if any(o.x is not x or o.num_classes != objs[0].num_classes for o in objs) or len(objs) != len(ws):
        raise ValueError("population_values needs one w per objective and objectives sharing their features")
    out: list[tuple[float, float]] = []
    for s in range(0, len(objs), MANY):
        group = list(zip(objs[s : s + MANY], ws[s : s + MANY]))
        parts = [o.split(w) for o, w in group]
        z = torch.addmm(torch.cat([b for _, b in parts]), x, torch.cat([wt for wt, _ in parts]).T)
        for j, (o, w) in enumerate(group):
            zj = z[:, j * o.num_classes : (j + 1) * o.num_classes].contiguous()  # argmax of a strided view: slower
            out.append((o._value(torch.log_softmax(zj, dim=1), w), o._accuracy(zj)))
    return out
