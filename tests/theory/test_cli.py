"""flower-theory CLI: outputs, JSON schema, single-point surrogate mode, clear errors."""

import json

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
    assert "entries match" in capsys.readouterr().out


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
        (["surrogate", "--gamma", "abc"], "expected a number"),
        (["surrogate", "--gamma", "inf"], "expected a finite number >= 0, got 'inf'"),  # printed NaN minimizers
        (["ghbm-point", "--server-lr", "inf"], "--server-lr must be a finite number >= 0, got 'inf'"),
        (["surrogate", "--example", "x"], "invalid choice"),
        (["surrogate", "--gamma", "3", "--K", "2"], "smaller --gamma"),
        (["table1", "--out", "/proc/x"], "--out /proc/x: cannot create it"),
        (["ghbm-point", "--out", "/proc/x"], "--out /proc/x: cannot create it"),
    ],
)
def test_bad_input_gives_a_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2 and message in capsys.readouterr().err
