"""Hydra composition of conf/ (groups, paper presets) and validation messages, in-process."""

import pytest
from hydra import compose, initialize_config_dir

from server.ray.engine import CONF_DIR, backend_config
from server.run import config as config_lib


def composed(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=["run_dir=/tmp/unused", *overrides])
    return config_lib.to_plain(cfg)


@pytest.mark.parametrize(
    "preset, expected",
    [
        ("fedavg_cnn", ("fedavgm", "cnn", 1.5, 0.01, 0.0)),
        ("fedavg_resnet20", ("fedavgm", "resnet20", 1.0, 0.5, 0.0)),
        ("fedcm_cnn", ("fedcm", "cnn", 0.1, 0.1, 0.9)),
        ("fedcm_resnet20", ("fedcm", "resnet20", 1.0, 0.1, 0.9)),
        ("ghbm_cnn", ("ghbm", "cnn", 1.0, 0.1, 0.9)),
        ("ghbm_resnet20", ("ghbm", "resnet20", 1.0, 0.01, 0.9)),
        ("fedhbm_cnn", ("fedhbm", "cnn", 1.0, 0.1, 1.0)),
        ("fedhbm_resnet20", ("fedhbm", "resnet20", 1.0, 0.01, 1.0)),
    ],
)
def test_paper_presets_hold_appendix_a_values(preset, expected, tiny_data):
    cfg = composed(f"+experiment={preset}", f"data.root={tiny_data['tarball']}")
    s = cfg["strategy"]
    assert (s["name"], cfg["model"]["name"], s["server_lr"], s["client_lr"], s["momentum"]) == expected
    assert (cfg["num_clients"], cfg["participation"]["fraction"], cfg["participation"]["mode"]) == (100, 0.1, "cyclic")
    assert cfg["data"]["alpha"] == 0.0
    config_lib.validate(cfg)


@pytest.mark.parametrize(
    "group", ["fedavg", "fedavgm", "fedcm", "localupdate", "localupdate_decay", "ghbm", "localghbm", "fedhbm"]
)
def test_every_strategy_group_validates(group, tiny_data):
    cfg = config_lib.validate(composed(f"strategy={group}", f"data.root={tiny_data['folder']}"))
    assert cfg["data"]["root"].startswith("/")
    static = config_lib.client_config(cfg)
    assert static["num-partitions"] == cfg["num_clients"] and static["data-root"] == cfg["data"]["root"]
    assert config_lib.decode(config_lib.encode(cfg)) == cfg


@pytest.mark.parametrize("method", sorted(p.stem for p in (CONF_DIR / "method").glob("*.yaml")))
def test_every_method_preset_validates(method, tiny_data):
    """conf/method/: each composes with the convex study's preset and passes validation."""
    sweep = "convex_seed001" if method.startswith("localupdate") else "convex_seed000"
    cfg = config_lib.validate(composed(f"+sweep={sweep}", f"method={method}", f"data.root={tiny_data['folder']}"))
    if method == "localupdate_invtime":  # seed 001 §7: both rates on the same 1/t schedule
        s = cfg["strategy"]
        assert (s["server_lr_schedule"], s["client_lr_schedule"]) == ("inverse_time", "inverse_time")
        assert s["schedule_param"] == s["client_schedule_param"] > 0


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["strategy.momentum=-0.5"], "strategy.momentum"),
        (["strategy=fedcm", "strategy.server_lr=0"], "strategy.server_lr"),
        (["strategy=localupdate", "strategy.theta=reptile"], "strategy.theta"),
        (["strategy=localupdate_decay", "strategy.patience=0"], "patience"),
        (["num_clients=10", "participation.fraction=0.25"], "participation.fraction"),
        (["participation=uniform", "participation.fraction=0.01"], "participation.fraction"),
        (["participation.query_timeout=0"], "participation.query_timeout"),
        (["participation.query_timeout=soon"], "participation.query_timeout"),
        (["num_rounds=0"], "num_rounds"),
        (["eval_tail=-1"], "eval_tail"),
        (["eval_tail_at=[0]"], "eval_tail_at"),
        (["num_rounds=10", "eval_tail_at=[11]"], "eval_tail_at"),
        (["eval_tail_at=5"], "eval_tail_at"),
        (["eval_tail_at=0"], "eval_tail_at"),
        (["eval_average=-1"], "eval_average"),
        (["eval_average=2.5"], "eval_average"),
        (["eval_average=true"], "eval_average"),
        (["num_rounds=10", "eval_average=11"], "eval_average"),
        (["plots=sometimes"], "plots"),
        (["data.alpha=-1"], "data.alpha"),
        (["client.batch_size=0"], "client.batch_size"),
        (["data=cifar10", "data.download=false", "data.root=/nonexistent"], "data.root"),
        (["strategy.server_lr_schedule=cosine"], "server_lr_schedule"),
        (["strategy.client_lr_schedule=cosine"], "strategy.client_lr_schedule"),
        (
            ["strategy.client_lr_schedule=exponential", "strategy.client_schedule_param=1.5"],
            "strategy.client_lr_schedule",
        ),
        (["strategy.server_lr_schedule=inverse_time", "strategy.schedule_param=0"], "strategy.server_lr_schedule"),
        (["client.loss_before_batches=-2"], "client.loss_before_batches"),
        (["client.torch_threads=-1"], "client.torch_threads"),
        (["backend.address=somewhere"], "backend.address"),
        (["backend.address=auto", "backend.init_num_cpus=2"], "backend.init_num_cpus"),
        (["num_clients=200", "participation.fraction=0.5"], "num_clients"),
        (["data.cache_dir=/proc/version/cache"], "data.cache_dir"),
        (["strategy=ghbm", "strategy.tau=0"], "strategy.tau"),
        (["strategy=ghbm", "strategy.momentum=1.5"], "strategy.momentum"),
        (["strategy=fedhbm", "strategy.momentum=-1"], "strategy.momentum"),
        (["strategy=localghbm", "client.state_dir=''"], "client.state_dir"),
        (["participation.fraction=abc"], "participation.fraction"),
        (["participation.wait_timeout=abc"], "participation.wait_timeout"),
        (["client.local_steps=abc"], "client.local_steps"),
        (["resume=maybe"], "resume"),
        (["overwrite=maybe"], "overwrite"),
        (["resume=true", "overwrite=true"], "'resume' and 'overwrite'"),  # resume won, overwrite was silently ignored
        (["progress_every=nan"], "progress_every"),
        (["num_clients=4", "participation.groups=abc"], "participation.groups"),
        (["num_clients=4", "participation.groups=[[0,1.5],[2,3]]"], "participation.groups"),  # was taken as [0, 1]
        (["num_clients=4", "participation.groups=[[0,1],[1,2,3]]"], "participation.groups"),
        (  # the list's K = 2 steps were run, client.local_steps=5 ignored
            ["strategy=localupdate", "strategy.theta=[1,2]", "client.local_steps=5"],
            "'strategy.theta': a list of 2 weights sets K = 2 local steps and local_steps=5 another",
        ),
        (["num_clients=4", "participation.groups=3"], "'participation.groups': participation.groups must be lists"),
        (  # uniform ignored the groups
            ["num_clients=4", "participation.mode=uniform", "participation.groups=[[0,1],[2,3]]"],
            "'participation.groups': participation.groups are cyclic groups; participation.mode=uniform",
        ),
        (["seed=-1"], "seed"),
        (["seed=9223372036854775808"], "seed"),  # past int64: Flower's records (it was a stack trace)
        (["backend.num_cpus=abc"], "backend.num_cpus"),
        (["backend.init_num_cpus=0"], r"'backend.init_num_cpus' must be >= 1 or null \(all cores\), got 0"),
        (["backend.init_num_gpus=-1"], r"'backend.init_num_gpus' must be >= 0 or null \(all GPUs\), got -1"),
        (["backend.num_gpus=abc"], "backend.num_gpus"),
        (["round_timeout=abc"], "round_timeout"),
        (["round_timeout=0"], "round_timeout"),
        (["client.augment=maybe"], "client.augment"),
        (["strategy.client_lr=[0.1]"], "strategy.client_lr"),
        (["strategy.server_lr=abc"], "strategy.server_lr"),
        (["client.weight_decay={a: 1}"], "client.weight_decay"),
        (["strategy=ghbm", "strategy.momentum=[0.5]"], "strategy.momentum"),
        (["strategy=localupdate_decay", "strategy.min_delta=abc"], "min_delta"),
        (["strategy.server_optimizer=adam", "strategy.beta_1=abc"], "strategy.beta_1"),
        (["strategy.weighting=sizes"], "strategy.weighting"),
        # a paper-2 task's model on CIFAR-10: a traceback after the run started (its outputs are the task's)
        (["model=resnet18"], "'model.name': model=resnet18 is the model of data=cifar100"),
        (["model=char_lstm"], "'model.name': model=char_lstm is the model of data=shakespeare"),
    ],
)
def test_invalid_values_name_the_key(overrides, key, tiny_data):
    cfg = composed(f"data.root={tiny_data['tarball']}", *overrides)
    with pytest.raises(config_lib.ConfigError, match=key.replace(".", r"\.")):
        config_lib.validate(cfg)


def test_backend_resources_pass_to_ray():
    cfg = composed("backend.num_gpus=0.25", "backend.num_cpus=2", "backend.init_num_gpus=1")
    assert backend_config(cfg) == {
        "client_resources": {"num_cpus": 2.0, "num_gpus": 0.25},
        "init_args": {"address": "local", "num_gpus": 1},
    }
    joined = composed("backend.address=10.0.0.5:6379")
    assert backend_config(joined, "10.0.0.5:6379", gpus_visible=True) == {
        "client_resources": {"num_cpus": 1.0, "num_gpus": 0.25},
        "init_args": {"address": "10.0.0.5:6379"},
    }


def test_gpu_share_defaults_to_auto_and_is_zero_without_cuda():
    import torch

    cfg = composed()
    assert cfg["backend"]["num_gpus"] is None
    expected = 0.25 if torch.cuda.is_available() else 0.0
    assert backend_config(cfg)["client_resources"]["num_gpus"] == expected


@pytest.mark.parametrize(
    "preset, tau, weight_decay",
    [("ghbm_cnn", 10, 1e-4), ("ghbm_resnet20", 10, 1e-5), ("fedhbm_cnn", None, 1e-4), ("fedhbm_resnet20", None, 1e-5)],
)
def test_ghbm_presets_hold_the_authors_values_and_build_their_strategy(preset, tau, weight_decay, tiny_data):
    from server.run.strategy_factory import build_strategy

    cfg = config_lib.validate(composed(f"+experiment={preset}", f"data.root={tiny_data['tarball']}"))
    assert cfg["strategy"].get("tau") == tau and cfg["client"]["weight_decay"] == weight_decay
    assert (cfg["client"]["batch_size"], cfg["client"]["local_epochs"]) == (64, 1)
    strategy = build_strategy(cfg)
    assert strategy.algorithm == cfg["strategy"]["name"] and strategy.momentum == cfg["strategy"]["momentum"]
    if tau is None:
        assert strategy.client_state_dir == "/tmp/unused/client_state" and strategy.participation_fraction() == 0.1
    else:
        assert strategy.tau == tau


def test_tail_rounds_cover_the_last_eval_tail_rounds_before_each_horizon():
    from server.run.app import tail_rounds

    assert tail_rounds({"num_rounds": 20, "eval_tail": 3, "eval_tail_at": [10]}) == {8, 9, 10, 18, 19, 20}
    assert tail_rounds({"num_rounds": 20, "eval_tail": 3}) == {18, 19, 20}
    assert tail_rounds({"num_rounds": 20, "eval_tail": 0, "eval_tail_at": [10]}) == set()
    assert tail_rounds({"num_rounds": 5, "eval_tail": 8, "eval_tail_at": [2]}) == {1, 2, 3, 4, 5}


def test_a_checkpoint_from_before_the_client_schedule_resumes_and_a_changed_one_does_not():
    """Checkpoints written before ``strategy.client_lr_schedule`` existed hold no such key: they had the constant
    schedule, so they resume; a run whose schedule, lr or seed differs from its checkpoint's does not."""
    from server.run.checkpoint import resume_mismatch

    now = {
        "strategy": {
            "name": "fedavg",
            "client_lr": 0.1,
            "client_lr_schedule": "constant",
            "client_schedule_param": 1.0,
        },
        "model": {"name": "cnn"},
        "num_clients": 10,
        "participation": {"mode": "cyclic"},
        "seed": 0,
    }
    before = {**now, "strategy": {"name": "fedavg", "client_lr": 0.1}}
    assert resume_mismatch(before, now) is None and resume_mismatch(now, now) is None
    scheduled = {**now, "strategy": {**now["strategy"], "client_lr_schedule": "polynomial"}}
    assert resume_mismatch(before, scheduled) == "strategy"
    assert resume_mismatch(before, {**now, "strategy": {**now["strategy"], "client_lr": 0.2}}) == "strategy"
    assert resume_mismatch(now, {**now, "seed": 1}) == "seed"
    # local training and the data's split are compared too; a checkpoint from before they were is not refused
    trained = {**now, "client": {"local_steps": 2, "batch_size": 8}, "data": {"name": "cifar10", "alpha": 1.0}}
    assert resume_mismatch(now, trained) is None
    assert resume_mismatch(trained, {**trained, "client": {"local_steps": 3, "batch_size": 8}}) == "client.local_steps"
    assert resume_mismatch(trained, {**trained, "data": {"name": "cifar10", "alpha": 0.1}}) == "data.alpha"
    moved = {
        **trained,
        "data": {**trained["data"], "root": "/elsewhere"},
        "participation": {"mode": "cyclic", "wait_timeout": 5},
    }
    assert resume_mismatch(trained, moved) is None  # where the data lies, how long round 1 waits


def test_the_folder_dataset_needs_a_root(monkeypatch):
    """data=cifar10_folder (the default) has no built-in location: without data.root or $FEDMOMENTUM_DATA the config
    is refused with one line saying what to give."""
    monkeypatch.delenv("FEDMOMENTUM_DATA", raising=False)
    with pytest.raises(config_lib.ConfigError, match=r"'data.root' is required: .* or set \$FEDMOMENTUM_DATA"):
        config_lib.validate(composed())
    monkeypatch.setenv("FEDMOMENTUM_DATA", "/nonexistent/cifar10.tar.gz")
    with pytest.raises(config_lib.ConfigError, match="'data.root'") as err:
        config_lib.validate(composed())
    assert "/nonexistent/cifar10.tar.gz" in str(err.value)


def test_a_run_dir_that_cannot_be_created_or_written_is_a_config_error(tmp_path):
    assert config_lib.make_run_dir(tmp_path / "a" / "b") == str((tmp_path / "a" / "b").resolve())
    with pytest.raises(
        config_lib.ConfigError, match=r"^'run_dir' /proc/x: cannot create it \(No such file or directory\)$"
    ):
        config_lib.make_run_dir("/proc/x")
    (tmp_path / "file").write_text("")
    with pytest.raises(config_lib.ConfigError, match="'run_dir' .*/file/run: cannot create it"):
        config_lib.make_run_dir(tmp_path / "file" / "run")
    # a folder that exists and whose permission bits root passes, but that takes no file: tried, not read from bits
    with pytest.raises(config_lib.ConfigError, match=r"^'run_dir' /proc: is not writable \("):
        config_lib.make_run_dir("/proc")


def test_a_decode_cache_that_cannot_be_created_is_a_config_error_before_any_work(tiny_data, tmp_path):
    """data.cache_dir under /proc passed the permission-bit check (as root) and was a FileNotFoundError trace when
    the dataset was first decoded; now it is one line naming the key, and a good one is created by the check."""
    cfg = composed(f"data.root={tiny_data['tarball']}", "data.cache_dir=/proc/cache", f"run_dir={tmp_path / 'run'}")
    with pytest.raises(config_lib.ConfigError, match=r"^'data.cache_dir': cannot create or write the decode cache "):
        config_lib.validate(cfg)
    assert not (tmp_path / "run").exists()
    cfg = composed(f"data.root={tiny_data['tarball']}", f"data.cache_dir={tmp_path / 'new'}", f"run_dir={tmp_path}")
    config_lib.validate(cfg)
    assert (tmp_path / "new").is_dir()


@pytest.mark.parametrize("cfg", [None, "config.yaml", [("num_rounds", 1)]])
def test_a_configuration_that_is_no_mapping_is_a_config_error(cfg):
    """The Python API (``simulate(cfg)``) takes a mapping: anything else is one line (was a TypeError/ValueError)."""
    with pytest.raises(config_lib.ConfigError, match=r"^a run's configuration is a mapping of keys to values, got "):
        config_lib.RunConfig.of(cfg)
