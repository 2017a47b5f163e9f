"""GHBM family on seed 000's problem: state driver == loop, known equalities, closed form, CLI outputs and errors."""

import json

import numpy as np
import pytest

from theory.cli import main
from theory.driver import Schedule, run_fast
from theory.experiments import ghbm as exp
from theory.ghbm import GHBMRound
from theory.problems import MomentumRound
from theory.state_driver import run_state_fast, run_state_loop

T = 3000


def schedule(base):
    return Schedule(np.full(3, base), ["polynomial", "constant", "exponential"], np.array([0.5, 1.0, 0.999]))


@pytest.mark.parametrize(
    "variant,tau,J", [("ghbm", 1, 1), ("ghbm", 3, 2), ("localghbm", 1, 3), ("fedhbm", 1, 1), ("fedhbm", 1, 4)]
)
def test_state_driver_equals_the_per_round_loop(variant, tau, J):
    rf = GHBMRound(
        variant,
        tau=tau,
        momentum=0.9 if variant != "fedhbm" else 1.0,
        local_steps=J,
        client_lr=0.05,
        scheduled="server",
    )
    sched = schedule(0.8)
    checks = [1, 2, 17, 1000, T]
    fast = run_state_fast(rf, rf.dim, sched, rf.initial_state(10.0), 10.0, T, checks, chunk=256)
    loop = run_state_loop(rf, sched, rf.initial_state(10.0), 10.0, T, checks)
    assert np.max(np.abs(fast - loop) / np.maximum(1.0, np.abs(loop))) < 1e-11
    assert np.ptp(loop[-1]) > 1e-6  # lanes differ: the schedules matter


def test_ghbm_tau1_is_fedavgm_and_localghbm_is_ghbm_tau_p():
    beta, eta = 0.9, 5.0
    sched = schedule(eta)
    avgm, _ = run_fast(MomentumRound("fedavgm", client_lr=1.0, momentum=beta), sched, 10.0, 10.0, T, [100, T])
    got = {}
    for name, tau in (("ghbm", 1), ("localghbm", 1), ("ghbm", 2)):
        rf = GHBMRound(name, tau=tau, momentum=beta)  # server lr 1, client step eta_t (1 - beta)
        got[name, tau] = run_state_fast(
            rf, rf.dim, schedule(eta * (1 - beta)), rf.initial_state(10.0), 10.0, T, [100, T]
        )
    np.testing.assert_allclose(got["ghbm", 1], avgm, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got["localghbm", 1], got["ghbm", 2], rtol=1e-12, atol=1e-14)
    assert np.max(np.abs(got["ghbm", 2] - avgm)) > 1e-3  # GHBM(tau=2) is not heavy ball


def test_limit_cycle_matches_the_closed_form_and_is_linear_in_G():
    payload = exp.limit_cycle(betas=(0.5, 0.9), taus=(1, 2, 3), Js=(1, 3), T=4000)
    rows = [r for r in payload["rows"] if r["stable_sim"]]
    assert len(rows) == len(payload["rows"]) and all(r["linear_in_G"] for r in rows)
    for r in rows:
        if r["amplitude_cf_per_G"] is not None:
            assert r["amplitude_per_G"] == pytest.approx(r["amplitude_cf_per_G"], rel=1e-10)
        if r["algorithm"] in ("ghbm_tau2", "localghbm") and r["J"] == 1:
            assert r["vs_no_momentum"] == pytest.approx(1.0, rel=1e-10)  # beta drops out for tau = p
    avgm = next(r for r in rows if r["algorithm"] == "fedavgm" and r["beta"] == 0.9 and r["J"] == 1)
    assert avgm["vs_no_momentum"] == pytest.approx((2 - 0.2) / (2 * 1.9 - 0.2), rel=1e-10)  # Eq. 10 / plain IGD


def test_flower_theory_ghbm_writes_every_output(tmp_path, capsys):
    assert main(["ghbm", "--T", "10000", "--out", str(tmp_path)]) == 0
    for name in ("ghbm.md", "ghbm.json", "ghbm.png", "ghbm_table1.csv", "ghbm_limit_cycle.csv", "ghbm_rates.csv"):
        assert (tmp_path / name).stat().st_size > 0, name
    payload = json.loads((tmp_path / "ghbm.json").read_text())
    entries = payload["table1"]["entries"]
    assert len(entries) == 45 and {
        "fedavgm",
        "fedcm",
        "ghbm_tau1",
        "ghbm_tau2",
        "ghbm_tau4",
        "localghbm",
        "fedhbm",
        "paper_momentum",
    } <= set(entries[0])
    assert {r["algorithm"] for r in payload["rates"]["rows"]} == {
        "fedavgm",
        "ghbm_tau1",
        "ghbm_tau2",
        "ghbm_tau4",
        "localghbm",
        "fedhbm",
    }
    assert len(payload["findings"]) >= 5 and "heterogeneity" in (tmp_path / "ghbm.md").read_text()
    assert "ghbm.png" in capsys.readouterr().out


def test_ghbm_point_prints_one_json_line_with_theta_R(capsys):
    args = [
        "ghbm-point",
        "--tau",
        "1",
        "--momentum",
        "0.5",
        "--server-lr",
        "1",
        "--client-lr",
        "0.3",
        "--J",
        "1",
        "--G",
        "4",
        "--theta0",
        "2",
        "--mu",
        "1.5",
        "--rounds",
        "40",
    ]
    assert main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert list(out) == ["tau", "momentum", "server_lr", "client_lr", "J", "G", "theta0", "mu", "rounds", "theta"]
    th = prev = 2.0  # tau = 1, J = 1, eta = 1 is heavy ball with step eta_l: an independent inline recurrence
    for t in range(1, 41):
        s = 1.0 if t % 2 else -1.0
        th, prev = th - 0.3 * (1.5 * th + s * 4.0) + (0.5 * (th - prev) if t > 1 else 0.0), th
    assert out["theta"] == pytest.approx(th, rel=1e-12)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--tau", "0"], "--tau"),
        (["--momentum", "1.01"], "--momentum"),
        (["--server-lr", "-1"], "--server-lr"),
        (["--client-lr", "x"], "--client-lr"),
        (["--J", "0"], "--J"),
        (["--rounds", "2.5"], "--rounds"),
    ],
)
def test_ghbm_point_bad_input_exits_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as err:
        main(["ghbm-point", *argv])
    captured = capsys.readouterr()
    assert err.value.code == 2 and captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and message in captured.err


def test_ghbm_point_that_diverges_prints_null_theta_and_exits_3(capsys):
    """Step sizes past stability: theta^R is NaN, which strict JSON cannot hold; the line says null, exit 3."""
    assert main(["ghbm-point", "--client-lr", "10", "--rounds", "2000"]) == 3
    captured = capsys.readouterr()
    out = json.loads(captured.out, parse_constant=lambda name: pytest.fail(f"not strict JSON: {name}"))
    assert out["theta"] is None and out["client_lr"] == 10.0
    assert "not finite" in captured.err and len(captured.err.strip().splitlines()) == 1
