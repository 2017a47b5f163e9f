"""The stacked state of a chunk of clients during one round (:func:`client.stacked.stacked_local_train`): their
parameters along a leading client axis, their batches, one ``torch.func.vmap`` of ``grad`` per step and the update
rules of ``strategies.math``; :class:`client.linear.LinearChunk` replaces its gradients by closed forms."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from client.augment import normalise, random_crop_flip, to_tensor
from client.train import (
    TrainConfig,
    as_named,
    loss_before_indices,
    num_local_steps,
    round_generator,
    state_shapes,
)
from strategies.client_step import extra_name, local_step
from strategies.math import affine_local_step, fedcm_shift, ghbm_shift, localupdate_accumulate
from strategies.math import theta_weights as make_theta_weights

EVAL_ROWS = 1000  # examples per client and vmapped forward pass when measuring loss-before
SHARED_FIELDS = (
    "step_form",  # the algorithm, or "affine": FedAvgM's, FedCM's and the GHBM family's clients step together
    "batch_size",
    "weight_decay",
    "theta",
    "augment",
    "participation",
    "local_epochs",
    "local_steps",
    "loss_before_batches",
    "server_round",
)
# per-client tensors of a chunk: clients that differ only in these (the jobs of a learning-rate or beta sweep) train
# in one chunk, each with the arithmetic of a chunk of its own
PER_CLIENT_FIELDS = ("client_lr", "momentum")


@dataclass
class ClientInput:
    """One client of a chunk: its data (uint8 images, labels), received arrays and algorithm extras."""

    x: np.ndarray | Callable[[], np.ndarray]  # the images, or what reads them (only when they are not cached)
    y: np.ndarray
    cfg: TrainConfig
    initial: Mapping[str, Any] | Sequence[Any]
    correction: Mapping[str, Any] | Sequence[Any] | None = None
    momentum_term: Mapping[str, Any] | Sequence[Any] | None = None
    anchor: Mapping[str, Any] | Sequence[Any] | None = None
    key: Any = None  # identifies x across rounds (e.g. dataset and partition): its float tensors are cached
    rows: np.ndarray | None = None  # the client's images are x[rows]: x is the split its clients share (one float copy)


CACHE_BYTES = 2 << 30  # the most memory the per-client float copies of the data may take
CONVERT_ROWS = 4096  # images converted to float at once
_CACHE: dict[tuple, torch.Tensor] = {}
_CACHE_LOCK = threading.Lock()  # chunks may be built side by side (a stacked group's threads)


def clear_cache() -> None:
    """Forget every cached float copy of the clients' images."""
    with _CACHE_LOCK:
        _CACHE.clear()


def _images(
    c: ClientInput, mean: Sequence[float], std: Sequence[float], device: torch.device, normalised: bool
) -> torch.Tensor:
    """A client's images as a contiguous float (n, 3, H, W) tensor: in [0, 1] (augmentation crops and flips
    before normalising, as :func:`client.augment.prepare_batch`) or already normalised. Rows gathered from it are
    bitwise ``prepare_batch`` of the same rows (both are elementwise). Cached per ``key`` up to CACHE_BYTES."""
    cache_key = None if c.key is None else (c.key, str(device), normalised, tuple(mean), tuple(std))
    if cache_key is None:
        return _float_images(c, mean, std, device, normalised)
    with _CACHE_LOCK:
        if cache_key in _CACHE:
            return _CACHE[cache_key]
        x = _float_images(c, mean, std, device, normalised)
        while _CACHE and sum(v.numel() * v.element_size() for v in _CACHE.values()) + x.numel() * 4 > CACHE_BYTES:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[cache_key] = x
        return x


def _float_images(
    c: ClientInput, mean: Sequence[float], std: Sequence[float], device: torch.device, normalised: bool
) -> torch.Tensor:
    images = c.x() if callable(c.x) else c.x
    out = None
    for start in range(0, max(len(images), 1), CONVERT_ROWS):  # a whole split: a part at a time
        x = to_tensor(np.array(images[start : start + CONVERT_ROWS]), device).contiguous()  # a writable copy
        x = normalise(x, mean, std) if normalised else x
        if len(images) <= CONVERT_ROWS:
            return x
        if out is None:
            out = torch.empty((len(images), *x.shape[1:]), dtype=x.dtype, device=device)
        out[start : start + len(x)] = x
    return out


def shares_split(images: Any, budget: int = CACHE_BYTES // 2) -> bool:
    """Whether clients whose images are rows of ``images`` (n, H, W, C) uint8 may use one float copy of all of it
    (:attr:`ClientInput.rows`): it fits in ``budget`` bytes (half the cache: room for the normalised copy that
    augmentation adds)."""
    return int(np.prod(np.shape(images))) * 4 <= budget


def can_stack(model: nn.Module) -> bool:
    """Whether ``model`` can be trained stacked: every tensor of its state is a trainable parameter."""
    state = model.state_dict()
    params = {k for k, p in model.named_parameters() if p.requires_grad}
    return set(state) == params


def _stack(
    model: nn.Module, arrays: list[Any], names: list[str], what: str, device: torch.device
) -> dict[str, torch.Tensor] | None:
    """{name: (K, ...) tensor} of per-client arrays keyed like the model; None when every entry is None; a
    missing entry is zero (FedCM's first round)."""
    if all(a is None for a in arrays):
        return None
    state = model.state_dict()
    named = [as_named(state_shapes(model), a, what) if a is not None else None for a in arrays]
    out = {}
    for k in names:
        rows = [torch.as_tensor(np.asarray(n[k])) if n is not None else torch.zeros_like(state[k]) for n in named]
        out[k] = torch.stack(rows).to(device, state[k].dtype)
    return out


def _client_view(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Per-client scalars (A,) shaped to broadcast against (A, ...) tensors of rank ``rows.dim()``."""
    return t.view(-1, *([1] * (rows.dim() - 1)))


def _take(t: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """``t[rows]``, or ``t`` itself when ``rows`` is None (every client of the chunk)."""
    return t if rows is None else t[rows]


class Chunk:
    """The stacked state of one chunk during its round."""

    def __init__(
        self,
        model: nn.Module,
        clients: Sequence[ClientInput],
        device: torch.device,
        mean: Sequence[float],
        std: Sequence[float],
    ) -> None:
        cfgs = [c.cfg for c in clients]
        for name in SHARED_FIELDS:
            if len({repr(getattr(c, name)) for c in cfgs}) > 1:
                raise ValueError(f"clients of one chunk must share {name!r}")
        self.cfg, self.model, self.device = cfgs[0], model, device
        self.clients = list(clients)
        self.names = [k for k, p in model.named_parameters() if p.requires_grad]
        self.params = _stack(model, [c.initial for c in clients], self.names, "model arrays", device)
        families = {c.family for c in cfgs}
        # one family, or "affine": clients of several families of one step form (strategies.math.affine_local_step)
        self.family = family = families.pop() if len(families) == 1 else "affine"
        received = [getattr(c, extra_name(c.cfg.family)) if extra_name(c.cfg.family) else None for c in clients]
        what = f"{self.cfg.algorithm} {extra_name(family)}" if family != "affine" else "client terms"
        self.extra = _stack(model, received, self.names, what, device)
        # FedHBM's term C (a_i - theta) is zero for a client without an anchor, not C (0 - theta)
        mixed = family == "fedhbm" and self.extra is not None and any(r is None for r in received)
        self.participation = (
            torch.tensor([self.cfg.participation * (r is not None) for r in received], device=device) if mixed else None
        )
        self.n = [len(c.y) for c in clients]
        # every batch padded to B (or to the largest client, when B is larger): a client's sums then have the same
        # length, so the same rounding, whichever clients share its chunk (the jobs of a stacked sweep)
        self.width = min(self.cfg.batch_size, max(self.n))
        self.generators = [round_generator(c.cfg.seed, c.cfg.server_round, c.cfg.partition_id) for c in clients]
        if family == "localupdate":
            self.weights = [
                make_theta_weights(
                    self.cfg.theta, num_local_steps(n, self.cfg.batch_size, self.cfg.local_epochs, self.cfg.local_steps)
                )
                for n in self.n
            ]
            self.steps = [len(w) for w in self.weights]
            self.q = {k: torch.zeros_like(v) for k, v in self.params.items()}
        else:
            self.steps = [
                num_local_steps(n, self.cfg.batch_size, self.cfg.local_epochs, self.cfg.local_steps) for n in self.n
            ]
        self.steps_t = torch.tensor([float(s) for s in self.steps], device=device)  # J per client, as a tensor
        dtype = next(iter(self.params.values())).dtype
        self.lr_t, self.momentum_t = self._coefficients(cfgs, dtype)
        # eta_l = 0 in the parameters' dtype leaves an SGD-family client's parameters as they are (local_step's
        # plain-number rule)
        lrs = torch.tensor([c.client_lr for c in cfgs], dtype=torch.float64).to(dtype).tolist()
        zero_lr = [c.family in ("sgd", "localupdate") and lr == 0 for c, lr in zip(cfgs, lrs)]
        self.zero_lr = torch.tensor(zero_lr, device=device) if any(zero_lr) else None
        self.shift = self._shifts(cfgs) if family == "affine" else None
        if family == "localupdate":  # Theta_k per client and step (0 past a client's last step)
            self.theta_t = torch.tensor(
                [[float(w[k]) if k < len(w) else 0.0 for k in range(max(self.steps))] for w in self.weights],
                device=device,
            )
        self.y = [torch.from_numpy(np.asarray(c.y, dtype=np.int64)).to(device) for c in clients]
        self.rows = [None if c.rows is None else np.asarray(c.rows, dtype=np.int64) for c in clients]
        self.mean, self.std = mean, std
        self.images = [_images(c, mean, std, device, normalised=not self.cfg.augment) for c in clients]
        self.plain = (
            self.images if not self.cfg.augment else [_images(c, mean, std, device, normalised=True) for c in clients]
        )  # loss-before: no augmentation
        self._xs: torch.Tensor | None = None  # the steps' input buffers (:meth:`_buffers`)
        self._ys: torch.Tensor | None = None
        # every client's rows of one shared float split, without augmentation: a step gathers all of its inputs (and
        # labels, from their concatenation) with one index each instead of two copies and two gathers per client
        shared = not self.cfg.augment and all(r is not None for r in self.rows)
        self.shared = self.plain[0] if shared and all(p is self.plain[0] for p in self.plain) else None
        if self.shared is not None:
            self.y_all = torch.cat(self.y)
            self.y_offsets = np.cumsum([0, *self.n[:-1]])

    def _coefficients(self, cfgs: Sequence[TrainConfig], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-client eta_l and beta as tensors, each value the one a plain number gives in the same expression of
        :func:`strategies.client_step.local_step`: eta_l in the parameters' dtype; beta in J's (it divides J); for
        FedCM eta_l (1 - beta) as one number, its product taken in double precision as Python takes it (its beta
        is then 0); for the GHBM family beta / J as one number, as torch computes a number over a tensor (J's
        reciprocal times the number)."""
        lrs = [c.client_lr * (1.0 - c.momentum) if c.family == "fedcm" else c.client_lr for c in cfgs]
        lr = torch.tensor(lrs, dtype=torch.float64).to(self.device, dtype)
        momentum = torch.tensor([c.momentum for c in cfgs], dtype=torch.float64).to(self.device, self.steps_t.dtype)
        if self.family in ("ghbm", "fedhbm", "affine"):
            momentum = self.steps_t.reciprocal() * momentum
        return lr, momentum

    def _shifts(self, cfgs: Sequence[TrainConfig]) -> dict[str, torch.Tensor]:
        """Each client's term c of :func:`strategies.math.affine_local_step` in a chunk of several families, as its
        family's own step forms it (FedCM: correction / J; GHBM: -(beta / J) m, beta / J as one number as above;
        SGD: -0.0), so each client steps as in a chunk of its family alone."""
        kinds = [c.family for c in cfgs]
        fedcm = torch.tensor([k == "fedcm" for k in kinds], device=self.device)
        ghbm = torch.tensor([k == "ghbm" for k in kinds], device=self.device)
        out = {}
        for name in self.names:
            p = self.params[name]
            extra = self.extra[name] if self.extra is not None else torch.zeros_like(p)
            shift = torch.where(_client_view(ghbm, p), ghbm_shift(_client_view(self.momentum_t, p), extra, 1), -0.0)
            out[name] = torch.where(_client_view(fedcm, p), fedcm_shift(extra, _client_view(self.steps_t, p)), shift)
        return out

    def source_rows(self, i: int, rows: np.ndarray) -> torch.Tensor:
        """Client ``i``'s ``rows`` as rows of its float images (of the shared split, with :attr:`ClientInput.rows`)."""
        return torch.from_numpy(rows if self.rows[i] is None else self.rows[i][rows]).to(self.device)

    def batch(self, i: int, rows: np.ndarray, augment: bool) -> torch.Tensor:
        """Model input of client ``i``'s ``rows``: ``prepare_batch`` (augmented with its generator when asked)."""
        idx = self.source_rows(i, rows)
        if not augment:
            return torch.index_select(self.plain[i], 0, idx)  # = plain[i][idx], without advanced indexing's cost
        return normalise(random_crop_flip(self.images[i][idx], self.generators[i]), self.mean, self.std)

    # ------------------------------------------------------------------ losses
    def _loss(
        self, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Mean cross-entropy of one client's batch over its real rows (``mask``)."""
        ce = F.cross_entropy(functional_call(self.model, params, (x,)), y, reduction="none")
        return torch.where(mask, ce, torch.zeros_like(ce)).sum() / mask.sum()

    def loss_before(self) -> list[float]:
        """Each client's "loss-before" on the examples :func:`client.train._loss_before` picks."""
        picks = []
        for c, gen, steps in zip(self.clients, self.generators, self.steps):
            idx = loss_before_indices(len(c.y), self.cfg.batch_size, steps, self.cfg.loss_before_batches, gen)
            picks.append(np.arange(len(c.y)) if idx is None else idx)
        sums = [0.0] * len(self.clients)
        if self.device.type == "cpu":  # one forward per client: no stacked copy of the inputs (measured faster)
            with torch.no_grad():
                for i, pick in enumerate(picks):
                    params = {k: v[i] for k, v in self.params.items()}
                    for start in range(0, len(pick), EVAL_ROWS):
                        r = pick[start : start + EVAL_ROWS]
                        logits = functional_call(self.model, params, (self.batch(i, r, augment=False),))
                        target = self.y[i][torch.from_numpy(r).to(self.device)]
                        sums[i] += float(F.cross_entropy(logits, target, reduction="sum"))
            return [s / len(p) for s, p in zip(sums, picks)]
        logits_fn = vmap(lambda p, x: functional_call(self.model, p, (x,)))
        for start in range(0, max(len(p) for p in picks), EVAL_ROWS):
            rows = [p[start : start + EVAL_ROWS] for p in picks]
            width = max(len(r) for r in rows)
            padded = [np.concatenate([r, np.full(width - len(r), r[0] if len(r) else 0)]) for r in rows]
            xs = torch.stack([self.batch(i, r, augment=False) for i, r in enumerate(padded)])
            with torch.no_grad():
                logits = logits_fn(self.params, xs)
                block = {  # the block's sum of each client with rows in it, read back in one copy
                    i: F.cross_entropy(
                        logits[i, : len(r)], self.y[i][torch.from_numpy(r).to(self.device)], reduction="sum"
                    )
                    for i, r in enumerate(rows)
                    if len(r)
                }
            for i, value in zip(block, torch.stack(list(block.values())).tolist()):
                sums[i] += value
        return [s / len(p) for s, p in zip(sums, picks)]

    # ------------------------------------------------------------------ steps
    def _buffers(self, rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, width, ...) input and (rows, width) label tensors for a step: views of two buffers of the whole
        chunk."""
        if self._xs is None or self._xs.shape[1] != width:
            shape = (len(self.clients), width)
            self._xs = torch.empty((*shape, *self.plain[0].shape[1:]), dtype=self.plain[0].dtype, device=self.device)
            self._ys = torch.empty(shape, dtype=torch.long, device=self.device)
        return self._xs[:rows], self._ys[:rows]

    def step(self, active: list[int], batches: list[np.ndarray], step_index: int) -> torch.Tensor:
        """One local step of the ``active`` clients on their index ``batches``; returns their batch losses."""
        width = self.width
        xs, ys = self._buffers(len(active), width)
        masks = torch.arange(width, device=self.device)[None, :] < torch.tensor(
            [[len(b)] for b in batches], device=self.device
        )
        if self.shared is not None:
            self._gather_shared(active, batches, xs, ys)
        else:
            self._gather(active, batches, xs, ys)
        rows = None if len(active) == len(self.clients) else torch.tensor(active, device=self.device)
        params = {k: _take(v, rows) for k, v in self.params.items()}  # every client active: no copy
        grads, losses = self._grads(params, xs, ys, masks)
        finite = torch.isfinite(losses)
        with torch.no_grad():
            self._update(rows, params, grads, None if bool(finite.all()) else finite, step_index)
        return losses

    def _padded(self, batch: np.ndarray) -> np.ndarray:
        """A batch padded to the step's width with copies of its first row."""
        width = self.width
        return np.concatenate([batch, np.full(width - len(batch), batch[0])]) if len(batch) < width else batch

    def _gather_shared(self, active: list[int], batches: list[np.ndarray], xs: torch.Tensor, ys: torch.Tensor) -> None:
        """The step's inputs and labels of clients whose rows are of :attr:`shared`: one gather each."""
        picked = [self._padded(b) for b in batches]
        sources = np.concatenate([self.rows[i][p] for i, p in zip(active, picked)])
        labels = np.concatenate([self.y_offsets[i] + p for i, p in zip(active, picked)])
        torch.index_select(self.shared, 0, torch.from_numpy(sources).to(self.device), out=xs.view(-1, *xs.shape[2:]))
        torch.index_select(self.y_all, 0, torch.from_numpy(labels).to(self.device), out=ys.view(-1))

    def _gather(self, active: list[int], batches: list[np.ndarray], xs: torch.Tensor, ys: torch.Tensor) -> None:
        """The step's inputs (augmented when asked) and labels, client by client."""
        for j, (i, b) in enumerate(zip(active, batches)):
            picked = self._padded(b)
            padded = torch.from_numpy(picked).to(self.device)
            if self.cfg.augment:
                x = self.batch(i, b, True)
                xs[j, : len(b)] = x
                xs[j, len(b) :] = x[:1]
            else:
                source = padded if self.rows[i] is None else self.source_rows(i, picked)
                torch.index_select(self.plain[i], 0, source, out=xs[j])
            torch.index_select(self.y[i], 0, padded, out=ys[j])

    def _grads(
        self, params: dict[str, torch.Tensor], xs: torch.Tensor, ys: torch.Tensor, masks: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Each active client's gradient of its masked mean loss, and that loss: vmap of autograd."""
        return vmap(grad_and_value(self._loss))(params, xs, ys, masks)

    def _update(
        self,
        rows: torch.Tensor | None,
        params: dict[str, torch.Tensor],
        grads: dict[str, torch.Tensor],
        finite: torch.Tensor | None,
        k: int,
    ) -> None:
        """Step the clients of ``rows`` (None: all) from ``params``; a client whose loss is not ``finite`` (None:
        every loss is) keeps its parameters (and its q)."""
        cfg = self.cfg
        steps = _take(self.steps_t, rows)
        for name in self.names:
            p, g = params[name], grads[name]
            if cfg.weight_decay:
                g = g + cfg.weight_decay * p
            local_steps = _client_view(steps, p)
            if self.family == "localupdate":
                weight = _take(self.theta_t[:, k], rows)
                q = localupdate_accumulate(_take(self.q[name], rows), g, _client_view(weight, p).to(g.dtype))
                self._put(self.q, name, rows, q, finite)
            lr = _client_view(_take(self.lr_t, rows), p)
            if self.shift is not None:  # clients of several families: each its own a and c
                new = affine_local_step(p, g, lr, _take(self.shift[name], rows))
            else:
                extra = None if self.extra is None else _take(self.extra[name], rows)
                participation = (
                    cfg.participation
                    if self.participation is None
                    else _client_view(_take(self.participation, rows), p)
                )
                if self.family in ("ghbm", "fedhbm"):  # beta / J as one number (J = 1 below)
                    momentum, local_steps = _client_view(_take(self.momentum_t, rows), p), 1
                else:
                    momentum = 0.0 if self.family == "fedcm" else _client_view(_take(self.momentum_t, rows), p)
                new = local_step(self.family, p, g, lr, momentum, extra, local_steps, participation)
            if self.zero_lr is not None:
                new = torch.where(_client_view(_take(self.zero_lr, rows), p), p, new)
            self._put(self.params, name, rows, new, finite)

    @staticmethod
    def _put(
        stacked: dict[str, torch.Tensor],
        name: str,
        rows: torch.Tensor | None,
        new: torch.Tensor,
        finite: torch.Tensor | None,
    ) -> None:
        """``stacked[name][rows] = new`` for the clients whose loss is finite (None: all of them)."""
        if finite is not None:
            new = torch.where(_client_view(finite, new), new, _take(stacked[name], rows))
        if rows is None:
            stacked[name] = new  # a fresh tensor of every client: no copy
        else:
            stacked[name][rows] = new

    def outputs(self) -> tuple[list[dict[str, torch.Tensor]], list[bool]]:
        """Every client's reply arrays in state_dict order, on CPU (its model, or q for LocalUpdate), and whether they
        are all finite: one copy and one finiteness reduction per stacked tensor, not per client (each client's
        arrays are views of the copy)."""
        source = self.q if self.family == "localupdate" else self.params
        names = list(state_shapes(self.model))
        stacked = {k: source[k].detach() for k in names}
        per_client = [
            torch.isfinite(v).flatten(1).all(1) if v.dim() > 1 else torch.isfinite(v) for v in stacked.values()
        ]
        finite = torch.stack(per_client).all(0).tolist()
        copies = {k: v.to("cpu", copy=True) for k, v in stacked.items()}
        return [{k: copies[k][i] for k in names} for i in range(len(self.clients))], finite
