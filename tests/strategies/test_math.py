"""The pure update rules against the seeds' closed forms."""

import math

import numpy as np
import pytest

from strategies import math as fm
from strategies import schedules


def quad_grad(mu, G, sign):
    """Gradient of f(theta) = mu/2 theta^2 + sign * G * theta (seed 000 Lemma III.4)."""
    return lambda theta: mu * theta + sign * G


def fedavgm_round(theta, prev, t, eta, eta_l, beta, J, mu, G):
    grad = quad_grad(mu, G, -1 if t % 2 == 0 else 1)  # client 1 (f_1 = +G) at odd t
    local = theta
    for _ in range(J):
        local = fm.sgd_step(local, grad(local), eta_l)
    delta = fm.model_delta([theta], fm.weighted_mean([[local]], [1.0]))
    return fm.fedavgm_server_update([theta], [prev], delta, eta, beta)[0]


def fedcm_round(theta, prev, t, eta, eta_l, beta, J, mu, G):
    grad = quad_grad(mu, G, -1 if t % 2 == 0 else 1)
    corr = fm.fedcm_correction([theta], [prev], eta, beta)[0]
    local = theta
    for _ in range(J):
        local = fm.fedcm_local_step(local, grad(local), eta_l, beta, corr, J)
    delta = fm.model_delta([theta], fm.weighted_mean([[local]], [1.0]))
    return fm.fedcm_server_update([theta], delta, eta)[0]


def pqr_fedavgm(eta, eta_l, beta, J, mu):
    """Seed 000 Eq. 5."""
    et = eta * (1 - beta)
    D = sum((1 - mu * eta_l) ** j for j in range(J))
    return 1 + beta + et * ((1 - mu * eta_l) ** J - 1), et * eta_l * D, beta


def pqr_fedcm(eta, eta_l, beta, J, mu):
    """Seed 000 Eq. 6."""
    el = eta_l * (1 - beta)
    D = sum((1 - mu * el) ** j for j in range(J))
    return 1 + beta / J * D + eta * ((1 - mu * el) ** J - 1), eta * el * D, beta / J * D


@pytest.mark.parametrize("J", [2, 3, 7])
@pytest.mark.parametrize("algo", ["fedavgm", "fedcm"])
def test_one_round_matches_lemmas_b10_b11(algo, J):
    mu, G, eta, eta_l, beta = 2.0, 10.0, 0.7, 0.05, 0.9
    round_fn, pqr = (fedavgm_round, pqr_fedavgm) if algo == "fedavgm" else (fedcm_round, pqr_fedcm)
    p, q, r = pqr(eta, eta_l, beta, J, mu)
    rng = np.random.default_rng(0)
    for t in (1, 2, 5, 6):
        theta, prev = rng.normal(size=2)
        got = round_fn(theta, prev, t, eta, eta_l, beta, J, mu, G)
        expected = p * theta + q * (-1) ** t * G - r * prev  # Eq. 3
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_single_local_step_fedavgm_equals_fedcm_equals_corollary_b12():
    mu, G, beta, eta_l = 2.0, 10.0, 0.9, 1.0
    eta0 = (1 + beta) / (mu * (1 - beta)) - 1e-2
    th_a = pv_a = th_c = pv_c = th_r = pv_r = 10.0
    for t in range(1, 200):
        eta = eta0 / t**0.5
        th_a, pv_a = fedavgm_round(th_a, pv_a, t, eta, eta_l, beta, 1, mu, G), th_a
        th_c, pv_c = fedcm_round(th_c, pv_c, t, eta, eta_l, beta, 1, mu, G), th_c
        et = eta * (1 - beta)
        th_r, pv_r = th_r * (1 - mu * et + beta) - beta * pv_r + (-1) ** t * et * G, th_r
        assert th_a == pytest.approx(th_r, rel=1e-11, abs=1e-11)
        assert th_c == pytest.approx(th_r, rel=1e-11, abs=1e-11)
    assert math.isfinite(th_r)


def test_fedavgm_matches_flower_sgd_momentum_convention():
    """Heavy ball with eta(1-beta) equals v = beta v + g; x -= eta(1-beta) v (Flower's FedAvgM)."""
    rng = np.random.default_rng(1)
    eta, beta = 1.3, 0.8
    x = prev = [rng.normal(size=(4,)), rng.normal(size=(2, 3))]
    y, v = [a.copy() for a in x], None
    for _ in range(25):
        delta = [rng.normal(size=a.shape) for a in x]
        x, prev = fm.fedavgm_server_update(x, prev, delta, eta, beta), x
        v = delta if v is None else [beta * a + d for a, d in zip(v, delta)]
        y = [a - eta * (1 - beta) * b for a, b in zip(y, v)]
    for a, b in zip(x, y):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9, 0.99])
def test_fedavgm_steady_step_is_server_lr_whatever_beta(beta):
    """Eq. 92's eta (1 - beta) normalises the heavy ball: under a constant Delta the server moves eta Delta per
    round, FedAvg's step at the same eta (so eta ~ 1 is FedAvgM's range, not 1 - beta; docs/convex.md)."""
    eta, delta = 0.7, [np.array([1.0, -2.0, 0.5])]
    x = prev = [np.zeros(3)]
    for _ in range(math.ceil(math.log(1e-14) / math.log(beta)) + 2 if beta else 2):
        x, prev = fm.fedavgm_server_update(x, prev, delta, eta, beta), x
    np.testing.assert_allclose(x[0] - prev[0], -eta * delta[0], rtol=1e-10)  # rounding over ~3,200 rounds


def test_localupdate_fedavg_theta_with_gamma_equal_eta_is_model_averaging():
    """Seed 001 Appendix A: Theta_{1:K}, gamma = eta gives x - eta * mean(sum g) = mean of local models."""
    rng = np.random.default_rng(2)
    A = [np.diag(rng.uniform(0.5, 2, size=3)) for _ in range(3)]
    c = [rng.normal(size=3) for _ in range(3)]
    x0, gamma, K = rng.normal(size=3), 0.1, 4
    weights = fm.theta_weights("fedavg", K)
    qs, locals_ = [], []
    for Ai, ci in zip(A, c):
        x, q = x0.copy(), np.zeros(3)
        for w in weights:
            g = Ai @ (x - ci)
            q = fm.localupdate_accumulate(q, g, w)
            x = fm.sgd_step(x, g, gamma)
        qs.append([q])
        locals_.append([x])
    n = [3.0, 5.0, 2.0]
    via_q = fm.localupdate_server_update([x0], fm.weighted_mean(qs, n), gamma)[0]
    averaged = fm.weighted_mean(locals_, n)[0]
    np.testing.assert_allclose(via_q, averaged, rtol=1e-13, atol=1e-13)


def test_localupdate_gamma_zero_is_minibatch_sgd_with_summed_gradients():
    rng = np.random.default_rng(3)
    A = [np.diag(rng.uniform(0.5, 2, size=3)) for _ in range(2)]
    c = [rng.normal(size=3) for _ in range(2)]
    x0, eta, K = rng.normal(size=3), 0.05, 3
    qs = []
    for Ai, ci in zip(A, c):
        x, q = x0.copy(), np.zeros(3)
        for w in fm.theta_weights("fedavg", K):
            g = Ai @ (x - ci)
            q = fm.localupdate_accumulate(q, g, w)
            x = fm.sgd_step(x, g, 0.0)
        qs.append([q])
    got = fm.localupdate_server_update([x0], fm.weighted_mean(qs, [1, 1]), eta)[0]
    full_grad = np.mean([Ai @ (x0 - ci) for Ai, ci in zip(A, c)], axis=0)
    np.testing.assert_allclose(got, x0 - eta * K * full_grad, rtol=1e-13)


def test_theta_presets_and_validation():
    np.testing.assert_array_equal(fm.theta_weights("fedavg", 3), [1, 1, 1])
    np.testing.assert_array_equal(fm.theta_weights("fomaml", 3), [0, 0, 1])
    np.testing.assert_array_equal(fm.theta_weights([0.5, 0, 2], 99), [0.5, 0, 2])
    with pytest.raises(ValueError, match="theta"):
        fm.theta_weights("maml", 3)
    with pytest.raises(ValueError, match="theta"):
        fm.theta_weights([], 3)


def test_validation_names_the_parameter():
    fm.check_momentum(0.0)
    fm.check_momentum(np.array([0.0, 0.9]))
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="momentum"):
            fm.check_momentum(bad)
    with pytest.raises(ValueError, match="client_lr"):
        fm.check_lr(-1e-3, "client_lr")
    with pytest.raises(ValueError, match="server_lr"):
        fm.check_lr(0.0, "server_lr", allow_zero=False)
    with pytest.raises(ValueError, match="server_lr_schedule"):
        schedules.check_schedule("cosine", 1.0)
    with pytest.raises(ValueError, match="exponential"):
        schedules.check_schedule("exponential", 1.5)
    for bad in (0.0, -5.0, float("inf")):
        with pytest.raises(ValueError, match="inverse_time schedule needs t0 > 0"):
            schedules.check_schedule("inverse_time", bad)
    with pytest.raises(ValueError, match="^client_lr_schedule must be one of"):
        schedules.check_schedule("cosine", 1.0, "client_lr_schedule")


def test_schedules():
    t = np.arange(1, 6)
    np.testing.assert_allclose(schedules.scheduled_lr(2.0, "constant", 0.0, t), 2.0)
    np.testing.assert_allclose(schedules.scheduled_lr(2.0, "polynomial", 0.5, t), 2.0 / np.sqrt(t))
    np.testing.assert_allclose(schedules.scheduled_lr(2.0, "exponential", 0.9, t), 2.0 * 0.9**t)
    assert schedules.scheduled_lr(2.0, "polynomial", 1.0, 4) == 0.5
    inv = schedules.scheduled_lr(2.0, "inverse_time", 100.0, np.array([1, 101, 201, 10_001]))
    np.testing.assert_allclose(inv, [2.0, 1.0, 2.0 / 3, 2.0 / 101])  # eta at t = 1, halved at t0 + 1, ~ eta t0 / t
    lanes = schedules.scheduled_lr(np.array([1.0, 2.0]), "polynomial", 1.0, 2)
    np.testing.assert_allclose(lanes, [0.5, 1.0])


def test_weighted_mean_weights_by_examples():
    out = fm.weighted_mean([[np.array([1.0])], [np.array([4.0])]], [1, 2])
    assert out[0][0] == pytest.approx(3.0)
    with pytest.raises(ValueError):
        fm.weighted_mean([[np.array([1.0])]], [0])
