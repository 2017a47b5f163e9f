"""Seed 001 experiments: surrogate minimizers (Section 4), LocalUpdate convergence, spectrum, Theorem 4."""

import numpy as np
import pytest

from strategies import math as fm
from theory import closed_forms as cf
from theory.experiments import spectrum, surrogate


@pytest.mark.parametrize("gamma", [0.0, 0.1, 0.25, 0.45])
def test_two_point_surrogate_vs_gamma(gamma):
    pop = surrogate.population("two-point")
    assert surrogate.true_minimizer(pop) == pytest.approx(2 / 3, rel=1e-14)
    x_s = surrogate.surrogate_minimizer(pop, gamma, fm.theta_weights("fedavg", 2))
    assert x_s == pytest.approx(cf.two_point_surrogate_gamma(gamma), rel=1e-13)


@pytest.mark.parametrize("K", [1, 2, 4, 8, 30])
def test_two_point_surrogate_vs_K(K):
    x_s = surrogate.surrogate_minimizer(surrogate.population("two-point"), 0.5, fm.theta_weights("fedavg", K))
    assert x_s == pytest.approx(cf.two_point_surrogate_K(K), rel=1e-13)
    assert 3 / 4 - x_s >= -1e-15  # increases monotonically to the mean client optimum 3/4 (gap 1/12)


def test_localupdate_converges_to_the_surrogate_not_the_true_minimizer():
    payload = surrogate.sweep(rounds=600)
    for r in payload["rows"]:
        assert abs(r["lu_minus_surrogate"]) < 1e-9, r
        if r["gamma"] > 0 and r["K"] > 1:
            assert abs(r["x_localupdate"] - r["x_true"]) > 5e-3, r
    fig1 = [r for r in payload["rows"] if r["example"] == "figure1"]
    assert fig1[0]["x_true"] == pytest.approx(5 / 7, rel=1e-12)  # 1 / E[i] with E[i] = 1.4
    assert fig1[0]["x_avg_client_opt"] == pytest.approx(0.8, rel=1e-12)  # E[1/i]
    by_k = sorted((r["K"], r["x_surrogate"]) for r in fig1 if r["varied"] == "K")
    assert [x for _, x in by_k] == sorted(x for _, x in by_k)  # moves towards E[c_i] as K grows


def test_surrogate_point_and_bad_gamma():
    res = surrogate.point("figure1", 0.3, 5, "fomaml", rounds=600)
    assert set(res) >= {"x_true", "x_surrogate", "x_localupdate"}
    assert res["x_localupdate"] == pytest.approx(res["x_surrogate"], abs=1e-9)
    with pytest.raises(ValueError, match="smaller --gamma"):
        surrogate.point("two-point", 1.3, 2)
    with pytest.raises(ValueError):
        surrogate.population("three-point")


def test_spectrum_lemma11_lemma12_corollary13():
    rows = spectrum.spectrum(Ks=(1, 2, 5, 10), n_gamma=6)["rows"]
    for r in rows:
        assert r["max_eig_err_fedavg"] < 1e-10 and r["max_eig_err_fomaml"] < 1e-10
        assert r["lambda_max"] == pytest.approx(r["phi_K_L"], rel=1e-10)
        assert r["lambda_min"] == pytest.approx(r["phi_K_mu"], rel=1e-10)
        assert r["cond_numeric"] == pytest.approx(r["cond_closed"], rel=1e-10)
        assert r["cond_closed"] <= r["cond_true"] * (1 + 1e-12)
    for K in (2, 5, 10):  # the condition number decreases with gamma ...
        conds = [r["cond_closed"] for r in rows if r["K"] == K]
        assert all(a > b for a, b in zip(conds, conds[1:]))
    gamma = max(r["gamma"] for r in rows)  # ... and with K
    conds = [r["cond_closed"] for r in sorted(rows, key=lambda r: r["K"]) if r["gamma"] == gamma]
    assert all(a > b for a, b in zip(conds, conds[1:]))


def test_theorem4_kmaml_equals_theta_2k_plus_1():
    rows = spectrum.maml_equivalence(Ks=(1, 2, 4))["rows"]
    for r in rows:
        assert r["max_client_diff"] < 1e-12 * max(1.0, r["client_norm"])
        assert r["server_round_diff"] < 1e-12
    # and it is not Theta_{2K}: FOMAML with 2K steps gives a different client output
    A = spectrum.random_spd(4, 0.3, 3.0, np.random.default_rng(3))
    x, pop = np.ones(4), spectrum.QuadraticClient(A, np.zeros(4))
    maml = spectrum.maml_client_torch(x, pop, 0.1, 2)
    other = spectrum.localupdate_client(x, pop.grad, 0.1, fm.theta_weights("fomaml", 4))
    assert np.max(np.abs(maml - other)) > 1e-3
