"""Hydra's own composition errors as one line (server/run/hydra_errors.py), on the real config tree."""

import os
import subprocess

import pytest
from hydra import compose, initialize_config_dir
from simcli import BIN, sim_args

from server.run import config as config_lib
from server.run.hydra_errors import FULL_ERROR, composition_errors, describe


def compose_error(*overrides: str) -> BaseException:
    with pytest.raises(Exception) as info, initialize_config_dir(str(config_lib.CONF_DIR), version_base=None):
        config_lib.to_plain(compose("config", overrides=list(overrides)))
    return info.value


@pytest.mark.parametrize(
    "override, line",
    [
        ("hydra/launcher=nope", "Could not find 'hydra/launcher/nope' (options: basic, stacked)"),
        (
            "data.bogus=1",
            "Could not override 'data.bogus'. To append to your config use +data.bogus=1 "
            "(the config has no key 'data.bogus')",
        ),  # fmt: skip
        ("~bogus", "Could not delete from config. 'bogus' does not exist."),
        ("seed=[", "cannot parse the override 'seed=[': no viable alternative at input '['"),
        ("num_rounds=${nope}", "num_rounds: Interpolation key 'nope' not found"),
    ],
)
def test_each_error_is_one_line(override, line):
    err = compose_error(override)
    assert describe(err) == line


def test_a_missing_group_option_lists_the_options():
    described = describe(compose_error("model=nope"))
    assert described.startswith("Could not find 'model/nope' (options: ") and "logreg" in described
    assert "\n" not in described and "search path" not in described


def test_the_block_turns_a_composition_error_into_exit_2_and_restores_the_environment(capsys, monkeypatch):
    monkeypatch.delenv(FULL_ERROR, raising=False)
    err = compose_error("data.bogus=1")
    with pytest.raises(SystemExit) as info, composition_errors("prog"):
        assert os.environ[FULL_ERROR] == "1"  # Hydra hands its errors on instead of printing them
        raise err
    assert info.value.code == 2 and FULL_ERROR not in os.environ
    assert capsys.readouterr().err == f"prog: invalid configuration: {describe(err)}\n"
    with pytest.raises(KeyError), composition_errors("prog"):  # any other error is left as it is
        raise KeyError("x")
    assert FULL_ERROR not in os.environ


def test_hydra_full_error_keeps_hydras_own_report(tiny_data, tmp_path):
    env = {**os.environ, FULL_ERROR: "1", "FLWR_TELEMETRY_ENABLED": "0"}
    args = sim_args(tiny_data, tmp_path / "bad", "strategy=sgd")
    proc = subprocess.run([str(BIN / "flower-simulation"), *args], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "MissingConfigException" in proc.stderr


def test_a_sweep_value_that_does_not_compose_is_one_line_before_any_job_runs(tiny_data, tmp_path):
    """Hydra composes every job of a sweep before the first one runs (its sweeper's check of the batch): a swept value
    that does not compose is the same one line as in a lone run, and no job ran."""
    sweep = tmp_path / "sweep"
    args = ["-m", *sim_args(tiny_data, tmp_path / "unused")[:-1], "engine=batched", "model=logreg,nope"]
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    proc = subprocess.run(
        [str(BIN / "flower-simulation"), *args, f"hydra.sweep.dir={sweep}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    expected = "flower-simulation: invalid configuration: Could not find 'model/nope'"
    assert len(lines) == 1 and lines[0].startswith(expected), proc.stderr
    assert not list(sweep.glob("*/metrics.csv"))  # the first job did not run


@pytest.mark.parametrize("where", [["hydra.run.dir=/proc/x"], ["hydra.sweep.dir=/proc/x", "seed=0,1"]])
def test_an_output_folder_hydra_cannot_create_is_one_line(tiny_data, tmp_path, where):
    """Hydra creates the run's (or the sweep's) folder before the command's task runs: that it cannot was Hydra's
    stack trace."""
    multirun = ["-m"] if "seed=0,1" in where else []
    args = [*multirun, *sim_args(tiny_data, tmp_path / "unused")[:-1], "engine=batched", "model=logreg", *where]
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    proc = subprocess.run([str(BIN / "flower-simulation"), *args], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "flower-simulation: cannot write Hydra's output folder: /proc/x (No such file or directory); set "
        "hydra.run.dir (hydra.sweep.dir with -m) to a folder this user can write"
    ]


def test_an_os_error_of_the_command_s_own_work_keeps_its_stack_trace(tmp_path):
    with pytest.raises(FileNotFoundError), composition_errors("prog"):
        (tmp_path / "absent" / "file").read_text()  # the task's own I/O, not Hydra's output folder
