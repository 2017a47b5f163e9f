"""flower-theory CLI: outputs, JSON schema, single-point surrogate mode, clear errors."""

import json
import warnings

import pytest

from theory.cli import main


def test_table1_writes_md_csv_json_with_schema(tmp_path, capsys):
    assert main(["table1", "--T", "2000", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "table1.json").read_text())
    assert len(data["entries"]) == 90
    keys = {"momentum", "schedule", "param", "G", "theta0", "value", "paper", "match"}
    assert all(set(e) == keys for e in data["entries"])
    assert {e["schedule"] for e in data["entries"]} == {"const", "poly", "exp"}
    assert (tmp_path / "table1.md").read_text().count("\n|") >= 90 and (tmp_path / "table1.csv").exists()
    # the paper's values are theta^T at T = 10^6: at another T nothing is compared (it listed false mismatches)
    assert all(e["match"] is None for e in data["entries"])
    assert "not compared with the paper, whose values are for T = 10^6" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name,files",
    [("limit-cycle", ["limit_cycle.png", "limit_cycle.json"]), ("local-steps", ["local_steps.png", "local_steps.csv"])],
)
def test_experiments_write_plots(tmp_path, name, files):
    assert main([name, "--T", "3000", "--out", str(tmp_path)]) == 0
    for f in files:
        assert (tmp_path / f).stat().st_size > 0


def test_surrogate_point_mode_prints_json(tmp_path, capsys):
    args = ["surrogate", "--example", "two-point", "--gamma", "0.3", "--K", "2", "--theta", "fedavg"]
    args += ["--rounds", "1000"]
    assert main(args + ["--out", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["x_surrogate"] == pytest.approx((4 - 0.9) / (6 - 1.5), rel=1e-12)
    assert out["x_localupdate"] == pytest.approx(out["x_surrogate"], abs=1e-9)
    assert json.loads((tmp_path / "surrogate_point.json").read_text())["x_true"] == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["table9"], "invalid choice"),
        (["table1", "--T", "-5"], "positive integer"),
        # below an experiment's least T its limits are transients (these were tracebacks, or wrong classifications)
        (["limit-cycle", "--T", "100"], "--T 100 is too short for limit-cycle"),
        (["rates", "--T", "1"], "--T 1 is too short for rates"),
        (["cycle-mean", "--T", "1"], "use --T >= 1000"),
        (["ghbm", "--T", "3000"], "--T 3000 is too short for ghbm"),
        (["all", "--T", "999"], "--T 999 is too short for limit-cycle"),
        (["surrogate", "--gamma", "abc"], "expected a number"),
        (["surrogate", "--gamma", "inf"], "expected a finite number >= 0, got 'inf'"),  # printed NaN minimizers
        (["ghbm-point", "--server-lr", "inf"], "--server-lr must be a finite number >= 0, got 'inf'"),
        (["surrogate", "--example", "x"], "invalid choice"),
        (["surrogate", "--gamma", "3", "--K", "2"], "smaller --gamma"),
        (["surrogate", "--gamma", "1e308"], "smaller --gamma"),  # printed overflow warnings before the line
        (["table1", "--out", "/proc/x"], "--out /proc/x: cannot create it"),
        (["ghbm-point", "--out", "/proc/x"], "--out /proc/x: cannot create it"),
    ],
)
def test_bad_input_gives_a_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as err, warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning printed before the line is a failure
        main(argv)
    err_text = capsys.readouterr().err
    assert err.value.code == 2 and message in err_text and "Warning" not in err_text


def test_least_rounds_read_settled_limits():
    """At each experiment's least --T (theory.cli.MIN_T) its transients are gone: simulated stability equals the
    closed form's in every lane (fewer rounds called some stable steps unstable), amplitudes and cycle centres equal
    the closed forms / the default horizon's, and the rate fits run on enough rounds."""
    from theory.cli import MIN_T
    from theory.experiments import cycle_mean, ghbm, seed000

    rows = seed000.limit_cycle(T=MIN_T["limit-cycle"][0])["rows"]
    assert all(r["stable_sim"] == r["stable_eq9"] for r in rows)
    rows = ghbm.limit_cycle(T=MIN_T["ghbm"][0])["rows"]
    assert all(bool(r["stable_sim"]) == (r["rho"] is not None and r["rho"] < 1) for r in rows)
    for r in seed000.local_steps(T=MIN_T["local-steps"][0])["rows"]:
        assert r["amplitude_sim"] == pytest.approx(r["amplitude_cf"], rel=1e-9)
    least, full = (cycle_mean.cycle_mean(T=T)["rows"] for T in (MIN_T["cycle-mean"][0], 20_000))
    for a, b in zip(least, full):
        assert a["cycle_mean"] == pytest.approx(b["cycle_mean"], abs=1e-9)
        assert a["half_spread"] == pytest.approx(b["half_spread"], abs=1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fit over too few rounds warned RankWarning
        seed000.rates(T=MIN_T["rates"][0])
