"""studies/convex_replay.py: each algorithm's noise-free replay against closed forms and independent recurrences."""

import numpy as np
import pytest

from studies import convex_curvature as curvature
from studies import convex_replay as replay

LAM = np.array([0.0, 1e-3, 0.05, 0.4, 1.5])


def cfg(name, **strategy):
    return {
        "strategy": {"name": name, "server_optimizer": "sgd", **strategy},
        "participation": {"mode": "cyclic", "fraction": 0.1},
    }


def rates(rounds, server_lr, client_lr):
    return np.full(rounds, float(server_lr)), np.full(rounds, float(client_lr))


def heavy_ball(step, beta, rounds, momentum_from=2):
    """x_t = x_{t-1} - step λ x_{t-1} + beta (x_{t-1} - x_{t-2}), written out independently."""
    prev, x = np.ones_like(LAM), np.ones_like(LAM)
    for t in range(1, rounds + 1):
        b = beta if t >= momentum_from else 0.0
        prev, x = x, x - step * LAM * x + b * (x - prev)
    return x


def test_fedavg_is_the_closed_form_with_time_varying_rates():
    server_lr, client_lr = np.array([1.0, 2.0, 0.5, 1.5]), np.array([0.1, 0.05, 0.2, 0.1])
    got = replay.replay_factors(cfg("fedavgm", momentum=0.0), server_lr, client_lr, 3, LAM)
    want = np.prod([1 - s * (1 - (1 - c * LAM) ** 3) for s, c in zip(server_lr, client_lr)], axis=0)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


def test_localupdate_is_the_closed_form_of_its_gradient_sum():
    server_lr, client_lr = rates(20, 0.7, 0.3)
    got = replay.replay_factors(cfg("localupdate", theta="fedavg"), server_lr, client_lr, 4, LAM)
    q = sum((1 - 0.3 * LAM) ** k for k in range(4)) * LAM  # Θ_{1:K}: Σ_k g_k, g_k = λ (1 − γλ)^k x
    np.testing.assert_allclose(got, (1 - 0.7 * q) ** 20, rtol=1e-12, atol=1e-15)
    fomaml = replay.replay_factors(cfg("localupdate_decay", theta="fomaml"), server_lr, client_lr, 4, LAM)
    np.testing.assert_allclose(fomaml, (1 - 0.7 * LAM * (1 - 0.3 * LAM) ** 3) ** 20, rtol=1e-12, atol=1e-15)


def test_one_step_fedavgm_and_fedcm_are_the_same_heavy_ball():
    """With K = 1 both are heavy ball with step η (1 − β) η_l and momentum β (seed 000 Corollary B.12)."""
    server_lr, client_lr = rates(60, 2.0, 0.2)
    want = heavy_ball(2.0 * 0.1 * 0.2, 0.9, 60)
    for name in ("fedavgm", "fedcm"):
        got = replay.replay_factors(cfg(name, momentum=0.9), server_lr, client_lr, 1, LAM)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13)


def test_ghbm_with_tau_1_is_heavy_ball_with_momentum_eta_beta():
    server_lr, client_lr = rates(60, 0.8, 0.25)
    got = replay.replay_factors(cfg("ghbm", momentum=0.5, tau=1), server_lr, client_lr, 1, LAM)
    np.testing.assert_allclose(got, heavy_ball(0.8 * 0.25, 0.8 * 0.5, 60), rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("beta", [0.5, 0.9])
def test_ghbm_multiplies_the_slow_step_by_one_over_one_minus_eta_beta(beta):
    """Along a flat direction GHBM(τ) descends as FedAvg with 1 / (1 − η β) times its step, once steady."""
    lam = np.array([1e-4])
    server_lr, client_lr = rates(4000, 1.0, 0.001)
    ghbm = replay.replay_factors(cfg("ghbm", momentum=beta, tau=10), server_lr, client_lr, 8, lam)
    fedavg = replay.replay_factors(cfg("fedavgm", momentum=0.0), server_lr, client_lr, 8, lam)
    assert np.log(ghbm[0]) / np.log(fedavg[0]) == pytest.approx(1 / (1 - beta), rel=0.02)
    fedavgm = replay.replay_factors(cfg("fedavgm", momentum=0.9), server_lr, client_lr, 8, lam)
    assert np.log(fedavgm[0]) / np.log(fedavg[0]) == pytest.approx(1.0, rel=0.01)  # gain 1 (Eq. 92's normalisation)


def test_localghbm_under_cyclic_participation_is_ghbm_with_tau_the_period():
    server_lr, client_lr = rates(50, 1.0, 0.05)
    local = replay.replay_factors(cfg("localghbm", momentum=0.9), server_lr, client_lr, 3, LAM)
    ghbm = replay.replay_factors(cfg("ghbm", momentum=0.9, tau=10), server_lr, client_lr, 3, LAM)
    np.testing.assert_array_equal(local, ghbm)


def test_replay_error_through_the_quadrature_is_exact_on_a_diagonal_quadratic():
    rng = np.random.default_rng(1)
    e0 = rng.normal(size=LAM.size)
    fit = curvature.lanczos_measure(lambda v: LAM * v, e0, LAM.size)
    server_lr, client_lr = rates(30, 1.0, 0.1)
    c = cfg("ghbm", momentum=0.9, tau=3)
    eT = replay.replay_factors(c, server_lr, client_lr, 2, LAM) * e0  # direct: each coordinate its own λ
    norm, bias = replay.replay_error(*fit, float(e0 @ e0), replay.replay_factors(c, server_lr, client_lr, 2, fit[0]))
    assert norm == pytest.approx(np.linalg.norm(eT), rel=1e-9)
    assert bias == pytest.approx(0.5 * eT @ (LAM * eT), rel=1e-9)


@pytest.mark.parametrize("local_steps", [1, 3])
def test_fedhbm_is_theory_s_fedhbm_on_the_two_client_problem_without_heterogeneity(local_steps):
    """Cyclic with p = 2 and G = 0: theory/ghbm.py's FedHBM round (per-client anchors in its own state) gives the
    replay's factors, lane by lane, through the whole run."""
    from theory.ghbm import GHBMRound

    server_lr, client_lr = rates(40, 0.9, 0.3)
    two = {**cfg("fedhbm", momentum=1.0), "participation": {"mode": "cyclic", "fraction": 0.5}}
    got = list(replay.replay_path(two, server_lr, client_lr, local_steps, LAM))
    step = GHBMRound(variant="fedhbm", momentum=1.0, mu=LAM, local_steps=local_steps, server_lr=0.9, participation=0.5)
    state = step.initial_state(np.ones_like(LAM))
    for t, want in enumerate(got, start=1):
        state = step(state, 0.0, t, 0.3)
        np.testing.assert_allclose(want, state[0], rtol=1e-13, atol=1e-15)
    ghbm = replay.replay_factors(
        {**two, "strategy": {**two["strategy"], "name": "ghbm", "tau": 2}}, server_lr, client_lr, local_steps, LAM
    )
    assert not np.allclose(got[-1][1:], ghbm[1:])  # a_i is a local final, not GHBM's global anchor


@pytest.mark.parametrize(
    "config, words",
    [
        (cfg("scaffold"), "not replayed"),
        (cfg("fedavgm", momentum=0.0, server_optimizer="yogi"), "only sgd"),
        ({**cfg("fedhbm", momentum=1.0), "participation": {"mode": "uniform", "fraction": 0.1}}, "only under cyclic"),
        (cfg("fedavgm", momentum=0.0, server_optimizer="adam"), "only sgd"),
        (
            {**cfg("localghbm", momentum=0.9), "participation": {"mode": "uniform", "fraction": 0.1}},
            "only under cyclic",
        ),
    ],
)
def test_unsupported_runs_are_named_with_the_reason(config, words):
    assert words in replay.replay_check(config)
    with pytest.raises(ValueError, match=words):
        replay.replay_factors(config, *rates(2, 1.0, 0.1), 1, LAM)
