"""Models (client/models.py) and batch augmentation (client/augment.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from client.augment import normalise, prepare_batch, random_crop_flip, to_tensor
from client.models import build_model, num_parameters


@pytest.mark.parametrize(("name", "count"), [("cnn", 797_962), ("resnet20", 269_722)])
def test_parameter_counts_and_shapes(name: str, count: int) -> None:
    model = build_model(name)
    assert num_parameters(model) == count
    assert list(model.buffers()) == []  # GroupNorm: the state_dict is the parameters
    assert model(torch.zeros(3, 3, 32, 32)).shape == (3, 10)
    assert build_model(name, num_classes=4)(torch.zeros(1, 3, 32, 32)).shape == (1, 4)


def test_unknown_model() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        build_model("vgg")


def _images(n: int = 16) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)


def test_crop_flip_matches_per_image_reference() -> None:
    x = to_tensor(_images())
    out = random_crop_flip(x, torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)  # replay the draws: top, left, flip
    top = torch.randint(0, 9, (16,), generator=g)
    left = torch.randint(0, 9, (16,), generator=g)
    flip = torch.rand(16, generator=g) < 0.5
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    for i in range(16):
        ref = padded[i, :, top[i] : top[i] + 32, left[i] : left[i] + 32]
        torch.testing.assert_close(out[i], ref.flip(-1) if flip[i] else ref, rtol=0, atol=0)
    assert flip.any() and (~flip).any()


def test_prepare_batch_shapes_and_determinism() -> None:
    images = _images()
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    a = prepare_batch(images, mean, std, generator=torch.Generator().manual_seed(1))
    b = prepare_batch(images, mean, std, generator=torch.Generator().manual_seed(1))
    c = prepare_batch(images, mean, std, generator=torch.Generator().manual_seed(2))
    assert a.shape == (16, 3, 32, 32) and a.dtype == torch.float32
    assert torch.equal(a, b) and not torch.equal(a, c)
    plain = prepare_batch(images, mean, std)  # no generator: no augmentation
    expected = torch.from_numpy(images).permute(0, 3, 1, 2) / 255.0 - torch.tensor(mean).view(1, 3, 1, 1)
    torch.testing.assert_close(plain, expected / torch.tensor(std).view(1, 3, 1, 1))
    assert torch.equal(normalise(to_tensor(images), mean, std), plain)
