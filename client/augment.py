"""Batch preprocessing on tensors: uint8 NHWC -> normalised float NCHW, with the standard CIFAR augmentation
(random 32x32 crop of the image zero-padded by 4, random horizontal flip; paper 1 §IV-B).

The crop and the flip are one vectorised gather per batch, so they cost little on CPU and run on the GPU
when the batch lives there. Random offsets come from a CPU ``torch.Generator``, so results are identical
on every device for a given seed. Padding is black (0 before normalisation), as torchvision's
``RandomCrop(32, padding=4)`` on PIL images.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def to_tensor(images: np.ndarray, device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> torch.Tensor:
    """(B, H, W, 3) uint8 array -> (B, 3, H, W) tensor in [0, 1] on ``device``, of ``dtype`` or torch's default
    dtype (float32; tests set float64 to check that two computations are the same algorithm; the convex
    objective of ``server.convex`` asks for float64)."""
    x = torch.from_numpy(np.ascontiguousarray(images)).to(device, non_blocking=True)
    return x.permute(0, 3, 1, 2).to(dtype or torch.get_default_dtype()).div_(255.0)


def random_crop_flip(x: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """Random crop (zero padding ``padding``) and horizontal flip of a (B, C, H, W) batch, in one gather."""
    b, c, h, w = x.shape
    padded = torch.nn.functional.pad(x, (padding, padding, padding, padding))
    top = torch.randint(0, 2 * padding + 1, (b,), generator=generator).to(x.device)
    left = torch.randint(0, 2 * padding + 1, (b,), generator=generator).to(x.device)
    flip = (torch.rand(b, generator=generator) < 0.5).to(x.device)
    ar_h = torch.arange(h, device=x.device)
    ar_w = torch.arange(w, device=x.device)
    rows = top[:, None] + ar_h  # (B, H)
    cols = left[:, None] + torch.where(flip[:, None], w - 1 - ar_w, ar_w)  # (B, W), reversed when flipped
    batch = torch.arange(b, device=x.device)[:, None, None, None]
    chan = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch, chan, rows[:, None, :, None], cols[:, None, None, :]]


def normalise(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """(x - mean) / std per channel of a (B, 3, H, W) batch."""
    m = torch.as_tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return (x - m) / s


def prepare_batch(
    images: np.ndarray,
    mean: Sequence[float],
    std: Sequence[float],
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """uint8 images -> model input; augmented when a ``generator`` is given (training), plain otherwise."""
    x = to_tensor(images, device)
    if generator is not None:
        x = random_crop_flip(x, generator)
    return normalise(x, mean, std)
