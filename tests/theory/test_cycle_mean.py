"""flower-theory cycle-mean: Lemma III.4's problem with unequal client curvatures (theory/experiments/cycle_mean.py)."""

import pytest

from theory import closed_forms as cf
from theory.experiments import cycle_mean


@pytest.fixture(scope="module")
def rows():
    return {(r["h"], r["J"], r["algorithm"]): r for r in cycle_mean.cycle_mean(T=5000)["rows"]}


def test_equal_curvatures_centre_every_method_on_x_star(rows):
    for (h, _, name), r in rows.items():
        if h == 0.0:
            assert abs(r["cycle_mean"]) <= 1e-12 * max(r["half_spread"], 1e-3), name


def test_fedavg_follows_its_closed_form_and_j1_formula(rows):
    for (_, _, name), r in rows.items():
        if name == "fedavg":
            assert r["cycle_mean"] == pytest.approx(r["fedavg_closed_mean"], rel=1e-9, abs=1e-15)
            assert r["half_spread"] == pytest.approx(r["fedavg_closed_spread"], rel=1e-9)
    mu1, mu2, k = 1.0, 3.0, 0.1  # h = 0.5, J = 1, eta eta_l = 0.1
    assert rows[0.5, 1, "fedavg"]["cycle_mean"] == pytest.approx(k * (mu2 - mu1) / (2 * (mu1 + mu2 - k * mu1 * mu2)))
    assert cf.fedavg_cycle(1.0, 0.1, 2.0, 2.0, 5, 1.0)[0] == 0.0


def test_unequal_curvatures_move_the_centre_and_ghbm_with_tau_p_is_fedavg(rows):
    for J in (1, 5):
        fedavg = rows[0.5, J, "fedavg"]
        assert abs(fedavg["cycle_mean"]) > 1e-3  # off x* = 0
        for name in ("ghbm_tau2", "localghbm"):  # tau = period 2: the round is FedAvg's (docs/ghbm.md)
            assert rows[0.5, J, name]["cycle_mean"] == pytest.approx(fedavg["cycle_mean"], rel=1e-9)
    # one local step: every method's centre is h times its half-spread (lower oscillation, smaller shift)
    for (h, J, name), r in rows.items():
        if J == 1 and h > 0:
            assert r["mean_over_spread"] == pytest.approx(h, rel=1e-6), name
    # heavy ball at J = 1 scales the centre with the spread; with J = 5 local steps it moves it further than FedAvg
    assert abs(rows[0.5, 1, "fedavgm"]["cycle_mean"]) < abs(rows[0.5, 1, "fedavg"]["cycle_mean"]) / 10
    assert abs(rows[0.5, 5, "fedavgm"]["cycle_mean"]) > 3 * abs(rows[0.5, 5, "fedavg"]["cycle_mean"])


def test_cli_writes_the_table(tmp_path, capsys):
    from theory.cli import main

    assert main(["cycle-mean", "--out", str(tmp_path), "--T", "2000"]) == 0
    assert (tmp_path / "cycle_mean.csv").read_text().startswith("h,J,algorithm,cycle_mean")
    assert "[cycle-mean]" in capsys.readouterr().out
