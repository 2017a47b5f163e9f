"""Adaptive server optimizers (Adam, Adagrad, Yogi on the pseudo-gradient) against Flower's FedOpt strategies,
the shared math, checkpoints and bad values. Offline: Flower's real Message classes, no Ray."""

import random

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedYogi
from test_flower_strategies import NodeList, initial_record, replies_for, run_rounds, task_identity  # noqa: F401

from server.run import checkpoint
from strategies import FedAvgM, FedCM, LocalUpdate, LocalUpdateDecay
from strategies import math as fm

KNOBS = {
    "yogi": dict(beta_1=0.8, beta_2=0.95, tau=1e-2),
    "adam": dict(beta_1=0.7, beta_2=0.9, tau=1e-2),
    "adagrad": dict(tau=1e-2),
}
FLOWER = {"yogi": FedYogi, "adam": FedAdam, "adagrad": FedAdagrad}


@pytest.mark.parametrize("name", ["yogi", "adam", "adagrad"])
def test_fedavgm_with_adaptive_optimizer_equals_flower_fedopt_over_25_rounds(name):
    eta = 0.05
    grid = NodeList([1, 2, 3])
    ours = run_rounds(FedAvgM(server_lr=eta, momentum=0.0, server_optimizer=name, **KNOBS[name]), 25, grid)
    theirs = run_rounds(FLOWER[name](eta=eta, **KNOBS[name]), 25, grid)
    moved = 0.0
    for k in ours.keys():
        np.testing.assert_allclose(ours[k].numpy(), theirs[k].numpy(), rtol=1e-10, atol=1e-10)
        moved += float(np.abs(ours[k].numpy() - initial_record()[k].numpy()).max())
    assert moved > 0.1


@pytest.mark.parametrize("name", ["yogi", "adam", "adagrad"])
def test_defaults_are_flowers(name):
    s = FedAvgM(server_lr=0.1, server_optimizer=name)
    flower = FLOWER[name]()
    assert s.server_optimizer.tau == flower.tau
    assert (s.server_optimizer.beta_1, s.server_optimizer.beta_2) == (flower.beta_1, flower.beta_2)


@pytest.mark.parametrize("name", ["yogi", "adam", "adagrad"])
@pytest.mark.parametrize("strategy", [FedAvgM, LocalUpdate])
def test_a_float32_model_stays_float32_and_its_replies_are_accepted(strategy, name):
    """Adam's bias-corrected eta is a float64 scalar: it made a float32 model float64 after round 1, and from round
    2 on every float32 reply was rejected for its dtype (the model then never moved again)."""
    grid = NodeList([1, 2, 3])
    kwargs = dict(server_lr=0.05, client_lr=0.1, server_optimizer=name)
    s = strategy(**kwargs, momentum=0.0) if strategy is FedAvgM else strategy(**kwargs, theta="fedavg")
    arrays = ArrayRecord({k: Array(v.numpy().astype(np.float32)) for k, v in initial_record().items()})
    for t in (1, 2, 3):
        msgs = list(s.configure_train(t, arrays, ConfigRecord(), grid))
        replies = []
        for reply in replies_for(msgs, t):
            record = reply.content["arrays"]
            reply.content["arrays"] = ArrayRecord({k: Array(v.numpy().astype(np.float32)) for k, v in record.items()})
            replies.append(reply)
        before = arrays.to_numpy_ndarrays()
        arrays, metrics = s.aggregate_train(t, replies)
        assert metrics["num-rejected"] == 0, t
        after = arrays.to_numpy_ndarrays()
        assert all(a.dtype == np.float32 for a in after) and all(a.dtype == np.float32 for a in s.model)
        assert any(np.any(a != b) for a, b in zip(after, before)), t


def test_adam_without_bias_correction_is_reddi_algorithm_2_by_hand():
    grid = NodeList([1, 2])
    s = FedAvgM(server_lr=0.1, server_optimizer="adam", bias_correction=False, beta_1=0.5, beta_2=0.75, tau=0.01)
    x = initial_record().to_numpy_ndarrays()
    m = [np.zeros_like(a) for a in x]
    v = [np.zeros_like(a) for a in x]
    arrays = initial_record()
    for t in (1, 2, 3):
        msgs = list(s.configure_train(t, arrays, ConfigRecord(), grid))
        replies = replies_for(msgs, t)
        arrays, metrics = s.aggregate_train(t, replies)
        clients = [r.content["arrays"].to_numpy_ndarrays() for r in replies]
        w = [float(r.content["metrics"]["num-examples"]) for r in replies]
        delta = [a - (w[0] * c0 + w[1] * c1) / sum(w) for a, c0, c1 in zip(x, *clients)]
        m = [0.5 * mi + 0.5 * d for mi, d in zip(m, delta)]
        v = [0.75 * vi + 0.25 * d**2 for vi, d in zip(v, delta)]
        x = [a - 0.1 * mi / (np.sqrt(vi) + 0.01) for a, mi, vi in zip(x, m, v)]
        for got, want in zip(arrays.to_numpy_ndarrays(), x):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
        assert metrics["update-norm"] == pytest.approx(fm.l2_norm(delta), rel=1e-12)


def test_localupdate_decay_steps_the_optimizer_with_the_decayed_server_lr():
    grid = NodeList([1, 2])
    s = LocalUpdateDecay(
        server_lr=0.5,
        client_lr=0.1,
        window=1,
        patience=1,
        cooldown=0,
        min_delta=10.0,
        server_decay=0.5,
        server_optimizer="yogi",
    )
    arrays = initial_record()
    for t in (1, 2, 3):
        model, m, v, lr = s.model, s.opt_m, s.opt_v, s.current_server_lr(t)
        msgs = list(s.configure_train(t, arrays, ConfigRecord(), grid))
        model = model if model is not None else arrays.to_numpy_ndarrays()
        m = m if m is not None else [np.zeros_like(a) for a in model]
        v = v if v is not None else [np.zeros_like(a) for a in model]
        replies = replies_for(msgs, t)
        w = [float(r.content["metrics"]["num-examples"]) for r in replies]
        mean_q = fm.weighted_mean([r.content["arrays"].to_numpy_ndarrays() for r in replies], w)
        arrays, _ = s.aggregate_train(t, replies)
        want, _, _ = fm.fedopt_server_update(model, m, v, mean_q, lr, s.server_optimizer, t)
        for got, exp in zip(arrays.to_numpy_ndarrays(), want):
            np.testing.assert_array_equal(got, exp)
    assert s.decay_state.num_decays == 2 and s.current_server_lr(4) == pytest.approx(0.5 * 0.5**2)


@pytest.mark.parametrize(
    "factory",
    [
        lambda **kw: FedAvgM(server_lr=0.3, momentum=0.0, client_lr=0.1, server_optimizer="yogi", **kw),
        lambda **kw: LocalUpdate(server_lr=0.3, client_lr=0.1, theta="fedavg", server_optimizer="adagrad", **kw),
        lambda **kw: LocalUpdateDecay(
            server_lr=0.3,
            client_lr=0.1,
            window=1,
            patience=2,
            cooldown=0,
            min_delta=10.0,
            server_optimizer="adam",
            **kw,
        ),
    ],
)
def test_optimizer_state_survives_a_checkpoint_bitwise(factory, tmp_path):
    """6 rounds in one go == 3 rounds, checkpoint on disk, a fresh strategy loads it, 3 more rounds.

    Flower's node sampling draws from ``random``, whose state the checkpoint restores (as in a resumed run)."""
    grid = NodeList([1, 2, 3])
    random.seed(0)
    full = factory()
    run_rounds(full, 6, grid)

    random.seed(0)
    first = factory()
    arrays = run_rounds(first, 3, grid)
    meta, state_arrays = first.state_dict()
    checkpoint.save(tmp_path, 3, meta, state_arrays, {"unused": True})
    resumed = factory()
    state, loaded = checkpoint.load(tmp_path)
    resumed.load_state_dict(state["strategy"], loaded)
    for t in range(4, 7):
        msgs = list(resumed.configure_train(t, arrays, ConfigRecord(), grid))
        arrays, _ = resumed.aggregate_train(t, replies_for(msgs, t))
    for name in ("model", "prev_model", "opt_m", "opt_v"):
        for a, b in zip(getattr(full, name), getattr(resumed, name), strict=True):
            np.testing.assert_array_equal(a, b)
    assert any(np.any(v != 0) for v in resumed.opt_v)


def test_a_checkpoint_of_another_optimizer_is_refused(tmp_path):
    grid = NodeList([1, 2])
    s = FedAvgM(server_lr=0.1, server_optimizer="yogi")
    run_rounds(s, 1, grid)
    meta, arrays = s.state_dict()
    with pytest.raises(ValueError, match="server_optimizer"):
        FedAvgM(server_lr=0.1, server_optimizer="adam").load_state_dict(meta, arrays)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(server_optimizer="yogi", momentum=0.9), "momentum"),
        (dict(server_optimizer="adam", tau=-1e-3), "tau"),
        (dict(server_optimizer="yogi", tau=0.0), "tau"),
        (dict(server_optimizer="yogi", beta_1=1.0), "beta_1"),
        (dict(server_optimizer="adam", beta_2=-0.1), "beta_2"),
        (dict(server_optimizer="adagrad", beta_1=0.9), "beta_1"),
        (dict(server_optimizer="sgd", tau=1e-3), "tau"),
        (dict(server_optimizer="yogi", bias_correction=False), "bias_correction"),
        (dict(server_optimizer="rmsprop"), "server_optimizer"),
    ],
)
def test_invalid_optimizer_values_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        FedAvgM(server_lr=0.1, **kwargs)


def test_fedcm_has_no_server_optimizer():
    with pytest.raises(TypeError):
        FedCM(server_lr=0.1, client_lr=0.1, server_optimizer="yogi")
