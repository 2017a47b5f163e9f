"""studies/convex_curvature.py's quadrature: exact on a small diagonal quadratic, and its inverse."""

import numpy as np
import pytest

from studies import convex_curvature as curvature


def test_flow_is_exact_descent_on_a_diagonal_quadratic():
    rng = np.random.default_rng(0)
    lam = np.array([1e-3, 3e-3, 1e-2, 0.1, 1.0, 5.0])  # six distinct curvatures: six Lanczos steps are exact
    e0 = rng.normal(size=lam.size)
    fit = curvature.lanczos_measure(lambda v: lam * v, e0, 6)
    assert fit[1].sum() == pytest.approx(1.0, rel=1e-12)
    for mass in (0.0, 40.0, 400.0):
        e = np.exp(-lam * mass) * e0  # gradient flow on ½ eᵀ diag(lam) e for a total step M
        norm, quad = curvature.flow(*fit, float(e0 @ e0), mass)
        assert norm == pytest.approx(np.linalg.norm(e), rel=1e-9)
        assert quad == pytest.approx(0.5 * e @ (lam * e), rel=1e-9)


def test_matched_mass_inverts_the_flow():
    lam = np.linspace(1e-3, 2.0, 50)
    e0 = np.ones(lam.size)
    fit = curvature.lanczos_measure(lambda v: lam * v, e0, 50)
    norm2 = float(e0 @ e0)
    for mass in (5.0, 85.0, 338.0):
        target = curvature.flow(*fit, norm2, mass)[0]
        assert curvature.matched_mass(fit, norm2, target) == pytest.approx(mass, rel=1e-6)
    assert curvature.matched_mass(fit, norm2, 2 * np.sqrt(norm2)) == 0.0  # no nearer w* than the start


def test_bad_replay_input_is_one_line_and_exit_2_before_any_work(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    np.savez(run / "final_model.npz", w=np.zeros(2))
    (run / "config.json").write_text(
        '{"strategy": {"name": "fedhbm", "momentum": 0.9}, "participation": {"mode": "uniform", "fraction": 0.1}}'
    )
    broken = tmp_path / "broken"
    broken.mkdir()
    np.savez(broken / "final_model.npz", w=np.zeros(2))
    (broken / "config.json").write_text('{"strategy": {"name": "fedavgm"')  # what a kill mid-write leaves
    for argv, words in (
        ([str(run), "--plot", str(tmp_path / "x.png")], "--plot needs --replay"),
        ([str(run), "--replay"], "fedhbm is replayed only under cyclic"),
        ([str(run), "--replay", "--plot", "/proc/y/x.png"], "--plot's folder /proc/y: cannot create it"),
        ([str(broken)], f"{broken}/config.json cannot be read (JSONDecodeError: "),
        ([str(run)], f"{run}/config.json cannot be read (KeyError: 'data')"),
    ):
        with pytest.raises(SystemExit) as exit_:
            curvature.main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and words in err[-1], err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
    "client, steps",
    [
        ({"batch_size": 64, "local_epochs": 1, "local_steps": 0}, 8),  # the study: 7 batches of 64 and one of 52
        ({"batch_size": 64, "local_epochs": 2, "local_steps": 0}, 16),
        ({"batch_size": 500, "local_epochs": 0, "local_steps": 8}, 8),  # full-batch steps: J from local_steps
        ({"batch_size": 64, "local_epochs": 1, "local_steps": 3}, 3),
    ],
)
def test_local_steps_are_the_client_s_own(client, steps):
    assert curvature.local_steps({"client": client}, 500) == steps
