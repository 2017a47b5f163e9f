"""The pre-training loss ("loss-before") of client/train.py: by default on the round's own examples."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from client.augment import prepare_batch
from client.models import build_model
from client.train import (
    LOSS_BEFORE_ALL,
    TrainConfig,
    batch_indices,
    local_train,
    loss_before_indices,
    round_generator,
)
from strategies import protocol as P

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
CPU = torch.device("cpu")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("cnn")


def _loss(model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        return float(F.cross_entropy(model(prepare_batch(x, MEAN, STD)), torch.from_numpy(np.asarray(y))))


@pytest.mark.parametrize("n, batch, steps", [(40, 8, 1), (40, 8, 3), (55, 10, 5), (100, 7, 2)])
def test_default_indices_are_the_rounds_batches_and_leave_the_generator_alone(n, batch, steps) -> None:
    gen = round_generator(3, 2, 1)
    state = gen.get_state()
    idx = loss_before_indices(n, batch, steps, 0, gen)
    assert torch.equal(gen.get_state(), state)
    trained = np.concatenate(list(batch_indices(n, batch, steps, gen)))
    assert idx is not None and idx.tolist() == sorted(trained.tolist())


def test_other_settings_select_all_or_evenly_spaced_examples() -> None:
    gen = torch.Generator().manual_seed(0)
    assert loss_before_indices(40, 8, 5, 0, gen) is None  # 5 x 8 >= 40: the round covers an epoch
    assert loss_before_indices(40, 8, 1, LOSS_BEFORE_ALL, gen) is None
    assert loss_before_indices(40, 8, 1, 2, gen).tolist() == np.linspace(0, 39, 16).astype(int).tolist()
    assert loss_before_indices(40, 8, 1, 5, gen) is None  # 5 batches hold every example


def test_local_train_reports_the_loss_on_the_examples_it_trains_on(client_data) -> None:
    x, y = client_data
    kw = dict(algorithm="fedavgm", client_lr=0.1, local_steps=2, batch_size=8, seed=5, server_round=3, partition_id=2)
    start = _model()
    idx = np.sort(np.concatenate(list(batch_indices(40, 8, 2, round_generator(5, 3, 2)))))
    assert len(idx) == 16
    default = local_train(_model(), x, y, MEAN, STD, TrainConfig(**kw), device=CPU)
    assert default.metrics[P.LOSS_BEFORE] == pytest.approx(_loss(start, x[idx], y[idx]), rel=1e-5)
    full = local_train(_model(), x, y, MEAN, STD, TrainConfig(**kw, loss_before_batches=LOSS_BEFORE_ALL), device=CPU)
    assert full.metrics[P.LOSS_BEFORE] == pytest.approx(_loss(start, x, y), rel=1e-5)
    assert abs(default.metrics[P.LOSS_BEFORE] - full.metrics[P.LOSS_BEFORE]) > 1e-4  # 16 of 40 examples
    # where the loss is measured changes nothing in the training itself
    assert all(torch.equal(default.arrays[k], full.arrays[k]) for k in default.arrays)
    assert default.metrics[P.TRAIN_LOSS] == full.metrics[P.TRAIN_LOSS]


def test_invalid_setting_is_rejected() -> None:
    with pytest.raises(ValueError, match="loss_before_batches"):
        TrainConfig(algorithm="fedavgm", client_lr=0.1, batch_size=8, loss_before_batches=-2)
