"""The strategy registry is the one table every part reads: conf/, validation, builder, clients and engine cases agree
with it, and each client-step family is its rule of strategies.math."""

import numpy as np
import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir

from checks.engine_cases import MEAN, STD, STRATEGIES, stacked_clients, train_one_by_one
from client.models import build_model
from client.stacked import stacked_local_train
from server.ray.engine import CONF_DIR
from server.run import config as config_lib
from server.run.strategy_factory import build_strategy
from strategies import client_step, registry
from strategies import math as fm


def composed(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return config_lib.to_plain(compose(config_name="config", overrides=["run_dir=/tmp/unused", *overrides]))


CONF_STRATEGIES = {p.stem: yaml.safe_load(p.read_text()) for p in (CONF_DIR / "strategy").glob("*.yaml")}


def test_every_registered_strategy_has_a_client_algorithm_and_a_family():
    for spec in registry.STRATEGIES.values():
        assert spec.algorithm in client_step.ALGORITHMS
        assert spec.family in client_step.FAMILIES
    assert {a.family for a in client_step.ALGORITHMS.values()} == set(client_step.FAMILIES)


def test_conf_strategy_groups_name_registered_strategies_with_every_required_key():
    names = {c["name"] for c in CONF_STRATEGIES.values()}
    assert names == set(registry.STRATEGIES)
    for group, c in CONF_STRATEGIES.items():
        missing = set(registry.STRATEGIES[c["name"]].required) - set(c)
        assert not missing, (group, missing)


def test_the_engine_cases_cover_every_registered_strategy():
    """tests/server/test_batched_engine.py runs each case on the Ray and the batched engines."""
    covered = {registry.STRATEGIES[CONF_STRATEGIES[o[0].split("=")[1]]["name"]].name for o in STRATEGIES.values() if o}
    assert covered == set(registry.STRATEGIES)


@pytest.mark.parametrize("group", sorted(CONF_STRATEGIES))
def test_each_group_builds_its_registered_class(group, tiny_data):
    cfg = config_lib.validate(composed(f"strategy={group}", f"data.root={tiny_data['folder']}"))
    strategy = build_strategy(cfg, num_train=100)
    assert type(strategy) is registry.STRATEGIES[cfg["strategy"]["name"]].cls


@pytest.mark.parametrize(
    "group, key, value",
    [
        (g, key, bad)
        for g, c in sorted(CONF_STRATEGIES.items())
        for key, bad in (("momentum", 1.5), ("tau", 0), ("theta", "nope"))
        if key in registry.STRATEGIES[c["name"]].required
    ],
)
def test_each_registered_check_rejects_a_bad_value(group, key, value, tiny_data):
    cfg = composed(f"strategy={group}", f"data.root={tiny_data['folder']}", f"strategy.{key}={value}")
    with pytest.raises(config_lib.ConfigError, match=f"strategy.{key}"):
        config_lib.validate(cfg)


def test_unknown_names_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="fedavgm"):
        client_step.algorithm("adam")
    with pytest.raises(ValueError, match="localupdate_decay"):
        registry.strategy("adam")
    with pytest.raises(ValueError, match="family"):
        client_step.local_step("adam", 1.0, 1.0, 0.1)


def test_each_family_is_its_rule_of_strategies_math():
    rng = np.random.default_rng(0)
    p, g, e = rng.normal(size=5), rng.normal(size=5), rng.normal(size=5)
    lr, beta, J, C = 0.1, 0.9, 3, 0.25
    step = client_step.local_step
    np.testing.assert_array_equal(step("sgd", p, g, lr), fm.sgd_step(p, g, lr))
    np.testing.assert_array_equal(step("localupdate", p, g, lr), fm.sgd_step(p, g, lr))
    assert step("sgd", p, g, 0.0) is p  # gamma = 0: LocalUpdate's model stays, q still accumulates
    np.testing.assert_array_equal(step("fedcm", p, g, lr, beta, e, J), fm.fedcm_local_step(p, g, lr, beta, e, J))
    np.testing.assert_array_equal(step("fedcm", p, g, lr, beta, None, J), fm.fedcm_local_step(p, g, lr, beta, 0.0, J))
    np.testing.assert_array_equal(step("ghbm", p, g, lr, beta, e, J), fm.ghbm_local_step(p, g, lr, beta, e, J))
    fedhbm = fm.ghbm_local_step(p, g, lr, beta, fm.fedhbm_momentum(e, p, C), J)
    np.testing.assert_array_equal(step("fedhbm", p, g, lr, beta, e, J, C), fedhbm)
    np.testing.assert_array_equal(step("fedhbm", p, g, lr, beta, None, J, C), fm.sgd_step(p, g, lr))


def test_a_fedhbm_client_without_an_anchor_among_others_takes_no_momentum():
    """Stacked FedHBM with one client at its first participation: its term is 0, not C (0 - theta)."""
    torch.manual_seed(0)
    model = build_model("logreg")
    clients = stacked_clients("fedhbm", model, np.random.default_rng(5))
    clients[1].anchor = None
    expected = train_one_by_one("logreg", clients)
    got = stacked_local_train(model, clients, MEAN, STD, torch.device("cpu"))
    for e, r in zip(expected, got):
        for k in e.arrays:
            scale = float(e.arrays[k].abs().max())
            assert float((r.arrays[k] - e.arrays[k]).abs().max()) <= 1e-5 * scale, k
