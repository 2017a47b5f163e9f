"""The fast linear-map driver equals the per-round loop through the shared functions (seed 000 Lemma III.4)."""

import numpy as np
import pytest

from theory.driver import Schedule, log_checkpoints, run_fast, run_loop
from theory.problems import MomentumRound

KINDS = ["constant", "polynomial", "polynomial", "exponential", "exponential", "polynomial"]
PARAMS = [1.0, 0.5, 1.0, 0.999, 0.9, 2.0]


def lanes(beta: float, eta0: float) -> Schedule:
    return Schedule(np.full(len(KINDS), eta0), KINDS, np.array(PARAMS))


@pytest.mark.parametrize(
    "algorithm,J,client_lr,beta,eta0",
    [
        ("fedavgm", 1, 1.0, 0.9, 9.0),
        ("fedavgm", 3, 0.2, 0.5, 1.0),
        ("fedcm", 1, 1.0, 0.9, 9.0),
        ("fedcm", 4, 0.1, 0.7, 2.0),
    ],
)
def test_fast_driver_equals_loop(algorithm, J, client_lr, beta, eta0):
    T = 3000
    sched = lanes(beta, eta0)
    rf = MomentumRound(algorithm, mu=2.0, client_lr=client_lr, momentum=beta, local_steps=J)
    G = np.array([100.0, 10.0, 0.0, 10.0, 100.0, 1.0])
    theta0 = np.array([0.0, 10.0, 10.0, -3.0, 1.0, 2.0])
    checks = log_checkpoints(T, 12)
    slow = run_loop(rf, sched, theta0, G, T, checks)
    fast = run_fast(rf, sched, theta0, G, T, checks, chunk=512)
    scale = np.maximum(1.0, np.max(np.abs(slow[0]), axis=0))
    assert np.max(np.abs(fast[0] - slow[0]) / scale) < 1e-11
    assert np.max(np.abs(fast[1] - slow[1]) / scale) < 1e-11


def test_fedcm_and_fedavgm_coincide_for_one_local_step():
    """Corollary B.12: with J = 1 both are IGD with momentum (eta = server lr x client lr)."""
    T, sched = 500, lanes(0.9, 9.0)
    kw = dict(mu=2.0, momentum=0.9, local_steps=1)
    a = run_loop(MomentumRound("fedavgm", client_lr=1.0, **kw), sched, 10.0, 100.0, T, [T])
    b = run_loop(MomentumRound("fedcm", client_lr=1.0, **kw), sched, 10.0, 100.0, T, [T])
    np.testing.assert_allclose(a[0], b[0], rtol=1e-9, atol=1e-12)


def test_igd_recurrence_of_corollary_b12():
    """One round of FedAvgM (J = 1) is theta^t = (1 + beta - mu eta~) theta^{t-1} - beta theta^{t-2} + (-1)^t eta~ G."""
    beta, mu, G, eta = 0.9, 2.0, 7.0, 0.3
    rf = MomentumRound("fedavgm", mu=mu, client_lr=1.0, momentum=beta)
    th, prev = 1.3, -0.4
    for t in (1, 2, 3):
        eta_t = eta * (1 - beta)
        expected = (1 + beta - mu * eta_t) * th - beta * prev + (-1) ** t * eta_t * G
        assert rf(th, prev, G, t, eta) == pytest.approx(expected, rel=1e-14)


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError):
        MomentumRound("adam")
    with pytest.raises(ValueError):
        Schedule(np.array([1.0]), ["linear"], np.array([1.0]))
    with pytest.raises(ValueError):
        run_loop(MomentumRound(), lanes(0.0, 0.1), 0.0, 1.0, 0)
