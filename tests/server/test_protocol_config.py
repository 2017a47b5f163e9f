"""Hydra composition of the protocol presets (+sweep=...), the server-optimizer and eval_train keys, and their
validation, in-process (no Ray)."""

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from simcli import run_cli, sim_args

from server.ray.engine import CONF_DIR
from server.run import config as config_lib
from server.run import strategy_factory


def composed(*overrides, hydra=False):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=["run_dir=/tmp/unused", *overrides], return_hydra_config=hydra)
    return cfg if hydra else config_lib.to_plain(cfg)


def jobs(*command_line):
    """The job override lists ``flower-simulation -m *command_line`` runs: the preset's hydra.sweeper.params, then
    the command line (a key given there replaces the preset's list), expanded as Hydra's BasicSweeper does."""
    cfg = composed(*[arg for arg in command_line if arg.startswith("+sweep=")], hydra=True)
    params = [f"{k}={v}" for k, v in OmegaConf.to_container(cfg.hydra.sweeper.params).items()]
    [batch] = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides([*params, *command_line]), None)
    return batch


@pytest.mark.parametrize(
    "preset, num_jobs, first, fixed",
    [
        (
            "appendix_a_fedavg_cnn",
            20,
            {"strategy.server_lr": 2.0, "strategy.client_lr": 0.1},
            {
                "strategy.name": "fedavgm",
                "num_clients": 100,
                "participation.fraction": 0.1,
                "data.alpha": 0.0,
                "participation.mode": "cyclic",
                "model.name": "cnn",
                "eval_train": False,
            },
        ),
        (
            "gamma_tuned_eta",
            35,
            {"strategy.client_lr": 0.0, "strategy.server_lr": 0.001},
            {
                "strategy.name": "localupdate",
                "client.local_steps": 10,
                "client.batch_size": 20,
                "eval_train": True,
                "participation.mode": "uniform",
                "participation.fraction": 0.1,
                "strategy.theta": "fedavg",
            },
        ),
        (
            "decay_vs_tuned",
            70,
            {"strategy.name": "localupdate_decay", "strategy.client_lr": 0.0},
            {"client.local_steps": 10, "eval_train": True, "participation.mode": "uniform"},
        ),
    ],
)
def test_sweep_presets_expand_compose_and_validate(preset, num_jobs, first, fixed, tiny_data):
    batch = jobs(f"+sweep={preset}")
    assert len(batch) == num_jobs and len({tuple(j) for j in batch}) == num_jobs
    for job in (batch[0], batch[-1]):
        cfg = config_lib.validate(composed(*job, f"data.root={tiny_data['tarball']}"))
        for key, value in (fixed | (first if job is batch[0] else {})).items():
            node = cfg
            for part in key.split("."):
                node = node[part]
            assert node == value, key
        strategy_factory.build_strategy(cfg, num_train=50_000)


def test_a_preset_shrinks_with_command_line_overrides():
    batch = jobs("+sweep=gamma_tuned_eta", "strategy.client_lr=0,0.1", "strategy.server_lr=0.01", "num_rounds=5")
    assert [sorted(j) for j in batch] == [
        sorted(["+sweep=gamma_tuned_eta", f"strategy.client_lr={g}", "strategy.server_lr=0.01", "num_rounds=5"])
        for g in ("0", "0.1")
    ]
    decay_only = jobs("+sweep=decay_vs_tuned", "strategy=localupdate_decay", "strategy.client_lr=1.0")
    assert len(decay_only) == 7
    cfg = composed(*decay_only[0])
    assert (cfg["strategy"]["name"], cfg["strategy"]["client_lr"], cfg["strategy"]["patience"]) == (
        "localupdate_decay",
        1.0,
        100,
    )


@pytest.mark.parametrize("group", ["fedavg", "localupdate", "localupdate_decay"])
@pytest.mark.parametrize("optimizer", ["adam", "adagrad", "yogi"])
def test_server_optimizer_keys_reach_the_strategy(group, optimizer, tiny_data):
    cfg = config_lib.validate(
        composed(
            f"strategy={group}",
            f"strategy.server_optimizer={optimizer}",
            "strategy.tau=1e-5",
            f"data.root={tiny_data['tarball']}",
        )
    )
    strategy = strategy_factory.build_strategy(cfg)
    assert strategy.server_optimizer.name == optimizer and strategy.server_optimizer.tau == 1e-5
    assert strategy.server_optimizer.beta_1 == (0.0 if optimizer == "adagrad" else 0.9)


def test_sgd_stays_the_strategys_own_rule(tiny_data):
    cfg = config_lib.validate(composed("strategy=fedavgm", f"data.root={tiny_data['tarball']}"))
    assert strategy_factory.build_strategy(cfg).server_optimizer is None
    assert cfg["eval_train"] is False and cfg["eval_train_max_examples"] == 0


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["strategy=fedavgm", "strategy.server_optimizer=yogi"], "strategy.momentum"),
        (["strategy=fedavg", "strategy.server_optimizer=adam", "strategy.tau=-1e-3"], "strategy.tau"),
        (["strategy=localupdate", "strategy.server_optimizer=adagrad", "strategy.beta_1=0.9"], "strategy.beta_1"),
        (["strategy=localupdate", "strategy.server_optimizer=yogi", "strategy.beta_2=1.0"], "strategy.beta_2"),
        (["strategy=fedavg", "strategy.tau=0.1"], "strategy.tau"),
        (["strategy=fedavg", "strategy.server_optimizer=sgdm"], "strategy.server_optimizer"),
        (
            ["strategy=fedavg", "strategy.server_optimizer=yogi", "strategy.bias_correction=false"],
            "strategy.bias_correction",
        ),
        (["strategy=fedcm", "strategy.server_optimizer=yogi"], "strategy.server_optimizer"),
        (["eval_train=maybe"], "eval_train"),
        (["eval_train_max_examples=-5"], "eval_train_max_examples"),
    ],
)
def test_invalid_protocol_values_name_the_key(overrides, key, tiny_data):
    cfg = composed(f"data.root={tiny_data['tarball']}", *overrides)
    with pytest.raises(config_lib.ConfigError, match=key.replace(".", r"\.")):
        config_lib.validate(cfg)


def test_bad_server_optimizer_exits_2_before_ray_starts(tiny_data, tmp_path):
    proc = run_cli(
        "flower-simulation",
        sim_args(tiny_data, tmp_path / "bad", "strategy=fedavgm", "strategy.server_optimizer=yogi"),
        timeout=120,
    )
    assert proc.returncode == 2
    [line] = [ln for ln in proc.stderr.splitlines() if "invalid configuration" in ln]
    assert "strategy.momentum must be 0 with server_optimizer='yogi'" in line
    assert "ActorPool" not in proc.stdout + proc.stderr and not (tmp_path / "bad" / "metrics.csv").exists()
