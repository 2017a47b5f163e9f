"""Local training loop (client/train.py) against manual computations with the shared math."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from client.augment import prepare_batch
from client.models import build_model
from client.train import (
    NONFINITE,
    TrainConfig,
    batch_indices,
    load_arrays,
    local_train,
    num_local_steps,
    state_shapes,
)
from strategies import protocol as P

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
CPU = torch.device("cpu")


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("cnn")


def _full_grad(model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> list[torch.Tensor]:
    loss = F.cross_entropy(model(prepare_batch(x, MEAN, STD)), torch.from_numpy(np.asarray(y, dtype=np.int64)))
    return [g.detach() for g in torch.autograd.grad(loss, list(model.parameters()))]


def _train(model, data, **kw):
    return local_train(model, data[0], data[1], MEAN, STD, TrainConfig(**kw), device=CPU)


def test_fedavgm_one_step_is_manual_sgd(client_data) -> None:
    model = _model()
    start = copy.deepcopy(model)
    lr, wd = 0.1, 0.01
    res = _train(
        model,
        client_data,
        algorithm="fedavgm",
        client_lr=lr,
        local_steps=1,
        batch_size=64,
        weight_decay=wd,
        augment=False,
    )
    grads = _full_grad(start, *client_data)
    for (name, p), g in zip(start.named_parameters(), grads):
        torch.testing.assert_close(res.arrays[name], p.detach() - lr * (g + wd * p.detach()), rtol=1e-5, atol=1e-6)
    assert res.metrics[P.NUM_STEPS] == 1 and res.metrics[P.NUM_EXAMPLES] == 40 and res.metrics[NONFINITE] == 0
    with torch.no_grad():
        loss0 = F.cross_entropy(start(prepare_batch(client_data[0], MEAN, STD)), torch.from_numpy(client_data[1]))
    assert res.metrics[P.LOSS_BEFORE] == pytest.approx(float(loss0), rel=1e-5)
    assert res.metrics[P.TRAIN_LOSS] == pytest.approx(float(loss0), rel=1e-5)  # the one step's loss


def test_localupdate_gamma_zero_sums_full_gradients(client_data) -> None:
    model = _model()
    start = copy.deepcopy(model)
    theta = [1.0, 0.5, 2.0]
    res = _train(model, client_data, algorithm="localupdate", client_lr=0.0, theta=theta, batch_size=40, augment=False)
    grads = _full_grad(start, *client_data)
    for (name, p), g in zip(start.named_parameters(), grads):
        torch.testing.assert_close(res.arrays[name], sum(theta) * g, rtol=1e-4, atol=1e-6)
        assert torch.equal(dict(model.named_parameters())[name], p)  # gamma = 0: the model did not move
    assert res.metrics[P.NUM_STEPS] == 3


def test_localupdate_positive_gamma_moves_and_returns_q(client_data) -> None:
    model = _model()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    res = _train(model, client_data, algorithm="localupdate", client_lr=0.05, theta=[1.0] * 4, batch_size=10)
    # with Theta = 1 (FedAvg), x_0 - x_K = gamma * q
    for k, v in model.state_dict().items():
        torch.testing.assert_close(start[k] - v, 0.05 * res.arrays[k], rtol=1e-4, atol=1e-6)


def test_fedcm_zero_correction_beta_zero_equals_fedavgm(client_data) -> None:
    common = dict(client_lr=0.05, local_epochs=2, batch_size=16, weight_decay=1e-3, seed=3, server_round=2)
    a = _train(_model(), client_data, algorithm="fedavgm", **common)
    b = _train(_model(), client_data, algorithm="fedcm", momentum=0.0, **common)
    c = local_train(
        _model(),
        *client_data,
        MEAN,
        STD,
        TrainConfig(algorithm="fedcm", **common),
        correction={k: torch.zeros_like(v) for k, v in _model().state_dict().items()},
        device=CPU,
    )
    for k in a.arrays:
        assert torch.equal(a.arrays[k], b.arrays[k]) and torch.equal(a.arrays[k], c.arrays[k])
    assert a.metrics[P.NUM_STEPS] == 2 * 3  # E * ceil(40 / 16)


def test_fedcm_correction_sums_to_one_over_the_round(client_data) -> None:
    model = _model()
    start = [v.clone() for v in model.state_dict().values()]
    corr = [torch.full_like(v, 0.01) for v in start]  # list form, in state_dict order
    res = local_train(
        model,
        *client_data,
        MEAN,
        STD,
        TrainConfig(algorithm="fedcm", client_lr=0.0, momentum=0.9, local_steps=5, batch_size=8),
        correction={str(i): c.numpy() for i, c in enumerate(corr)},
        device=CPU,
    )
    for s, v in zip(start, res.arrays.values()):  # lr = 0: J steps of + c / J add exactly c
        torch.testing.assert_close(v, s + 0.01, rtol=0, atol=1e-6)


def test_deterministic_given_seed_round_partition(client_data) -> None:
    kw = dict(algorithm="fedavgm", client_lr=0.05, local_epochs=1, batch_size=8, seed=1, server_round=4)
    a = _train(_model(), client_data, **kw)
    b = _train(_model(), client_data, **kw)
    c = _train(_model(), client_data, **{**kw, "server_round": 5})
    assert all(torch.equal(a.arrays[k], b.arrays[k]) for k in a.arrays)
    assert not all(torch.equal(a.arrays[k], c.arrays[k]) for k in a.arrays)


def test_nonfinite_loss_is_reported(client_data) -> None:
    model = _model()
    with torch.no_grad():
        model.fc3.bias.fill_(float("nan"))
    res = _train(model, client_data, algorithm="fedavgm", client_lr=0.1, local_epochs=1, batch_size=8)
    assert res.metrics[NONFINITE] == 1 and res.metrics[P.NUM_STEPS] == 0
    assert np.isnan(res.metrics[P.TRAIN_LOSS])


def test_step_count_and_batches() -> None:
    assert num_local_steps(55, 10, 2) == 12 and num_local_steps(55, 10, 2, local_steps=7) == 7
    batches = list(batch_indices(55, 10, 12, torch.Generator().manual_seed(0)))
    assert [len(b) for b in batches] == [10] * 5 + [5] + [10] * 5 + [5]
    assert sorted(np.concatenate(batches[:6]).tolist()) == list(range(55))  # each epoch is a permutation


def test_load_arrays_accepts_names_and_lists() -> None:
    src, dst = _model(1), _model(2)
    arrays = [v.numpy().astype(np.float64) for v in src.state_dict().values()]  # server may send float64
    load_arrays(dst, arrays)
    assert all(torch.equal(a, b) for a, b in zip(src.state_dict().values(), dst.state_dict().values()))
    with pytest.raises(ValueError, match="shape"):
        load_arrays(dst, {k: np.zeros(1) for k in src.state_dict()})
    with pytest.raises(ValueError, match="arrays for"):
        load_arrays(dst, arrays[:-1])


def test_state_shapes_are_the_state_dicts_built_once_per_model_object() -> None:
    for name in ("logreg", "cnn", "resnet20"):
        model = build_model(name, 10)
        shapes = state_shapes(model)
        assert list(shapes.items()) == [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
        assert state_shapes(model) is shapes  # cached: the module tree is walked once
        assert state_shapes(build_model(name, 7)) is not shapes  # another object, its own shapes
    wrong = {k: np.zeros(v[::-1] + (2,)) for k, v in state_shapes(model).items()}
    with pytest.raises(ValueError, match="model arrays: conv1.weight has shape"):
        load_arrays(model, wrong)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="algorithm"):
        TrainConfig(algorithm="sgd", client_lr=0.1, batch_size=8)
    with pytest.raises(ValueError, match="theta"):
        TrainConfig(algorithm="localupdate", client_lr=0.1, batch_size=8)


def test_localupdate_theta_preset_takes_k_from_steps(client_data) -> None:
    model = _model()
    start = copy.deepcopy(model)
    res = _train(
        model,
        client_data,
        algorithm="localupdate",
        client_lr=0.0,
        theta="fomaml",
        local_steps=3,
        batch_size=40,
        augment=False,
    )
    assert res.metrics[P.NUM_STEPS] == 3
    for (name, _), g in zip(start.named_parameters(), _full_grad(start, *client_data)):
        torch.testing.assert_close(res.arrays[name], g, rtol=1e-4, atol=1e-6)  # Theta_K = (0, 0, 1)
    res = _train(
        _model(), client_data, algorithm="localupdate", client_lr=0.01, theta="fedavg", local_epochs=2, batch_size=16
    )
    assert res.metrics[P.NUM_STEPS] == 6  # K = E * ceil(40 / 16)


def test_ghbm_momentum_moves_the_model_by_beta_m_over_the_round(client_data) -> None:
    """lr = 0: J steps of - (beta / J) m move the model by exactly - beta m (GHBM and LocalGHBM share the step)."""
    for algorithm in ("ghbm", "localghbm"):
        model = _model()
        start = {k: v.clone() for k, v in model.state_dict().items()}
        m = {k: np.full(v.shape, 0.02, dtype=np.float32) for k, v in start.items()}
        res = local_train(
            model,
            *client_data,
            MEAN,
            STD,
            TrainConfig(algorithm=algorithm, client_lr=0.0, momentum=0.5, local_steps=4, batch_size=8),
            momentum_term=m,
            device=CPU,
        )
        for k, v in res.arrays.items():
            torch.testing.assert_close(v, start[k] - 0.5 * 0.02, rtol=0, atol=1e-6)
    plain = _train(_model(), client_data, algorithm="fedavgm", client_lr=0.05, local_steps=3, batch_size=8)
    first = _train(_model(), client_data, algorithm="ghbm", client_lr=0.05, momentum=0.9, local_steps=3, batch_size=8)
    for k in plain.arrays:  # no momentum term (a first participation) is plain SGD, bitwise
        assert torch.equal(plain.arrays[k], first.arrays[k])


def test_fedhbm_step_pulls_away_from_its_anchor(client_data) -> None:
    """lr = 0, J = 1: theta - (beta C / J)(a - theta) with the anchor a_i of the previous participation."""
    model = _model()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    anchor = {k: (v + 1.0).numpy() for k, v in start.items()}
    res = local_train(
        model,
        *client_data,
        MEAN,
        STD,
        TrainConfig(algorithm="fedhbm", client_lr=0.0, momentum=1.0, local_steps=1, batch_size=8, participation=0.1),
        anchor=anchor,
        device=CPU,
    )
    for k, v in res.arrays.items():
        torch.testing.assert_close(v, start[k] - 0.1 * 1.0, rtol=0, atol=1e-6)


def test_get_device_follows_the_engines_choice(monkeypatch) -> None:
    """``$FEDMOMENTUM_DEVICE`` (set by engine.device of the batched engine) decides where the ClientApp trains."""
    from client.environment import DEVICE_ENV
    from client.train import get_device

    monkeypatch.setenv(DEVICE_ENV, "meta")
    get_device.cache_clear()
    try:
        assert get_device() == torch.device("meta")
        monkeypatch.delenv(DEVICE_ENV)
        get_device.cache_clear()
        assert get_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    finally:
        get_device.cache_clear()


def test_float32_on_cuda_stays_float32_unless_asked(monkeypatch) -> None:
    """cuda_precision turns TF32 off for cuDNN and cuBLAS (torch allows it for cuDNN by default); FEDMOMENTUM_TF32=1
    turns it on (the flags can be set without a GPU)."""
    from client.environment import TF32_ENV
    from client.train import cuda_precision

    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        monkeypatch.delenv(TF32_ENV, raising=False)
        assert cuda_precision() is False
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        monkeypatch.setenv(TF32_ENV, "1")
        assert cuda_precision() is True
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before
