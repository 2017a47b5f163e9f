"""GHBM, LocalGHBM, FedHBM: the shared math against closed forms and the Flower strategies offline.

Messages are built with Flower's real classes (TaskIdentity set as Flower does inside a run, see the Flower
notes); client replies run the local steps of theory.problems (shared math) on quadratic clients.
"""

import random

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from test_flower_strategies import NodeList, task_identity  # noqa: F401 (autouse fixture)

from strategies import GHBM, CyclicClientManager, FedAvgM, FedHBM, LocalGHBM, UniformClientManager, protocol
from strategies import math as fm
from theory.problems import fedavgm_client, ghbm_client

MU = 0.7
SHAPES = {"w": (3, 2), "b": (2,)}


def initial_record():
    rng = np.random.default_rng(0)
    return ArrayRecord({k: Array(rng.normal(size=s)) for k, s in SHAPES.items()})


def center(node, key):
    return np.sin(node + np.arange(np.prod(SHAPES[key]))).reshape(SHAPES[key])


def replies_for(messages, J, lr):
    """Each node runs J local steps on f(x) = MU/2 |x - c_node|^2 with the algorithm the message names."""
    out = []
    for m in messages:
        cfg, node = m.content["config"], m.metadata.dst_node_id
        arrays = {k: v.numpy() for k, v in m.content["arrays"].items()}
        new = {}
        for k, x in arrays.items():
            c = center(node, k)

            def grad(y, c=c):
                return MU * (y - c)

            if cfg[protocol.ALGORITHM] == "ghbm":
                term = m.content[protocol.GHBM_MOMENTUM][k].numpy()
                new[k] = ghbm_client(x, grad, lr, float(cfg[protocol.MOMENTUM]), term, J)
            else:
                new[k] = fedavgm_client(x, grad, lr, J)
        content = RecordDict(
            {
                "arrays": ArrayRecord({k: Array(v) for k, v in new.items()}),
                "metrics": MetricRecord({"num-examples": 3 + node}),
            }
        )
        out.append(Message(content, reply_to=m))
    return out


def run(strategy, rounds, J, lr, drop=()):
    arrays, traj, grid = initial_record(), [], NodeList([1, 2, 3])
    for t in range(1, rounds + 1):
        msgs = list(strategy.configure_train(t, arrays, ConfigRecord(), grid))
        new, _ = strategy.aggregate_train(t, [] if t in drop else replies_for(msgs, J, lr))
        arrays = new if new is not None else arrays
        traj.append({k: v.numpy().copy() for k, v in arrays.items()})
    return traj


def max_diff(a, b):
    return max(float(np.max(np.abs(x[k] - y[k]))) for x, y in zip(a, b) for k in x)


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9])
def test_ghbm_tau1_single_step_unit_server_lr_equals_fedavgm_over_50_rounds(beta):
    """tau = 1, J = 1, eta = 1: theta - eta_l g - beta (theta^{t-2} - theta^{t-1}) is FedAvgM(1/(1-beta), beta)."""
    ghbm = run(GHBM(server_lr=1.0, client_lr=0.2, momentum=beta, tau=1), 50, J=1, lr=0.2)
    avgm = run(FedAvgM(server_lr=1.0 / (1.0 - beta), client_lr=0.2, momentum=beta), 50, J=1, lr=0.2)
    assert max_diff(ghbm, avgm) < 1e-12
    assert max_diff(ghbm[:1], ghbm[-1:]) > 1e-2  # the model moved


def test_first_tau_rounds_are_fedavg_whatever_beta():
    tau, J = 4, 3
    plain = run(FedAvgM(server_lr=0.8, client_lr=0.1), tau + 1, J=J, lr=0.1)
    for beta in (0.3, 0.9, 1.0):
        ghbm = run(GHBM(server_lr=0.8, client_lr=0.1, momentum=beta, tau=tau), tau + 1, J=J, lr=0.1)
        # the momentum sent is exactly zero; only the summation order of Flower's random node sampling differs
        assert max_diff(ghbm[:tau], plain[:tau]) < 1e-13
        assert max_diff(ghbm[tau:], plain[tau:]) > 1e-4  # round tau + 1 uses (theta^0 - theta^tau) / tau


def test_one_ghbm_round_with_local_steps_matches_the_hand_derived_closed_form():
    """f(x) = mu/2 x^2 + s G x, J steps x <- a x - eta_l s G - (beta/J) m with a = 1 - eta_l mu give
    x_J = a^J x0 - (eta_l s G + beta m / J)(1 - a^J)/(1 - a); server: x0 - eta (x0 - x_J)."""
    mu, G, s, eta_l, eta, beta, J, tau = 2.0, 10.0, -1.0, 0.05, 0.7, 0.9, 5, 3
    old, x0 = np.array([3.0, -1.0]), np.array([1.5, 0.25])  # theta^{t-1-tau}, theta^{t-1}
    m = fm.ghbm_momentum([old], [x0], tau)[0]
    np.testing.assert_array_equal(m, (old - x0) / tau)
    local = ghbm_client(x0, lambda x: mu * x + s * G, eta_l, beta, m, J)
    delta = fm.model_delta([x0], fm.weighted_mean([[local]], [1.0]))
    new = fm.ghbm_server_update([x0], delta, eta)[0]
    a = 1.0 - eta_l * mu
    x_J = a**J * x0 - (eta_l * s * G + beta * m / J) * (1.0 - a**J) / (1.0 - a)
    np.testing.assert_allclose(local, x_J, rtol=1e-13)
    np.testing.assert_allclose(new, x0 - eta * (x0 - x_J), rtol=1e-13)


def test_fedhbm_step_uses_participation_times_anchor_distance():
    anchor, theta, g = np.array([1.0, 2.0]), np.array([0.5, -1.0]), np.array([0.1, 0.2])
    term = fm.fedhbm_momentum(anchor, theta, 0.25)
    np.testing.assert_allclose(term, 0.25 * (anchor - theta))
    step = fm.ghbm_local_step(theta, g, 0.1, 1.0, term, 4)
    np.testing.assert_allclose(step, theta - 0.1 * g - (1.0 * 0.25 / 4) * (anchor - theta))


def test_a_round_without_replies_keeps_the_model_and_the_history_stays_indexed_by_round():
    tau = 2
    traj = run(GHBM(server_lr=1.0, client_lr=0.1, momentum=0.9, tau=tau), 6, J=2, lr=0.1, drop=(3,))
    assert max_diff(traj[1:2], traj[2:3]) == 0.0  # theta^3 = theta^2
    strategy = GHBM(server_lr=1.0, client_lr=0.1, momentum=0.9, tau=tau)
    arrays = initial_record()
    history = [{k: v.numpy() for k, v in arrays.items()}]
    for t in range(1, 7):
        msgs = list(strategy.configure_train(t, arrays, ConfigRecord(), NodeList([1, 2, 3])))
        sent = {k: v.numpy() for k, v in msgs[0].content[protocol.GHBM_MOMENTUM].items()}
        if t > tau:
            for k in sent:  # m^t = (theta^{t-1-tau} - theta^{t-1}) / tau with the models indexed by round
                np.testing.assert_array_equal(sent[k], (history[t - 1 - tau][k] - history[t - 1][k]) / tau)
        else:
            assert all(not np.any(v) for v in sent.values())
        new, metrics = strategy.aggregate_train(t, [] if t == 3 else replies_for(msgs, 2, 0.1))
        arrays = new if new is not None else arrays
        history.append({k: v.numpy() for k, v in arrays.items()})
        assert sorted(strategy.history) == list(range(max(0, t - tau), t + 1))
    assert metrics["num-replies"] == 3


def test_ghbm_state_dict_round_trip_continues_identically():
    a = GHBM(server_lr=1.0, client_lr=0.1, momentum=0.9, tau=3)
    run(a, 5, J=2, lr=0.1)
    b = GHBM(server_lr=1.0, client_lr=0.1, momentum=0.9, tau=3)
    b.load_state_dict(*a.state_dict())
    arrays = a.model_record()
    for t in (6, 7, 8):
        outs = []
        for s in (a, b):
            random.seed(t)  # Flower's node sampling (random.sample) fixes the summation order
            msgs = list(s.configure_train(t, arrays, ConfigRecord(), NodeList([1, 2, 3])))
            outs.append(s.aggregate_train(t, replies_for(msgs, 2, 0.1))[0])
        for k in outs[0].keys():
            np.testing.assert_array_equal(outs[0][k].numpy(), outs[1][k].numpy())
        arrays = outs[0]
    with pytest.raises(ValueError, match="tau"):
        GHBM(server_lr=1.0, client_lr=0.1, tau=2).load_state_dict(*a.state_dict())


def test_stateful_strategies_send_only_the_model_and_the_state_identity():
    assert (
        FedHBM(server_lr=1.0, client_lr=0.1, client_manager=UniformClientManager(8, 0.25)).participation_fraction()
        == 0.25
    )
    assert (
        FedHBM(server_lr=1.0, client_lr=0.1, client_manager=CyclicClientManager(8, 0.125)).participation_fraction()
        == 0.125
    )
    strategy = FedHBM(server_lr=1.0, client_lr=0.1, client_state_dir="/tmp/states", participation=0.25)
    msgs = list(strategy.configure_train(1, initial_record(), ConfigRecord(), NodeList([1, 2])))
    content = msgs[0].content
    assert list(content.array_records) == ["arrays"]
    cfg = content["config"]
    assert cfg[protocol.PARTICIPATION] == 0.25 and cfg[protocol.MOMENTUM] == 1.0
    assert cfg[protocol.STATE_DIR] == "/tmp/states" and cfg[protocol.STATE_STARTS] == [1]
    assert cfg[protocol.STATE_KEEP] == 0  # no checkpoint yet: only the newest state can be needed again
    strategy.checkpoint_saved(7)
    assert strategy._round_config(9, ConfigRecord())[protocol.STATE_KEEP] == 7
    meta, arrays = strategy.state_dict()
    resumed = FedHBM(server_lr=1.0, client_lr=0.1, client_state_dir="/tmp/states")
    resumed.last_round = 0
    meta["last_round"] = 7
    resumed.load_state_dict(meta, arrays)
    assert resumed.state_run == strategy.state_run  # the run identity survives the resume
    assert resumed.state_starts == [1, 8] and resumed.state_ids[0] == strategy.state_ids[0]
    assert resumed.state_ids[1] != strategy.state_ids[0] and resumed.checkpoint_round == 7
    local = LocalGHBM(server_lr=1.0, client_lr=0.1)
    assert protocol.PARTICIPATION not in local._round_config(1, ConfigRecord())


@pytest.mark.parametrize(
    "cls,kwargs,name",
    [
        (GHBM, {"tau": 0}, "tau"),
        (GHBM, {"tau": 2.5}, "tau"),
        (GHBM, {"momentum": 1.2}, "momentum"),
        (GHBM, {"momentum": -0.1}, "momentum"),
        (LocalGHBM, {"client_lr": -1.0}, "client_lr"),
        (FedHBM, {"participation": 0.0}, "participation"),
        (FedHBM, {"server_lr": -2.0}, "server_lr"),
    ],
)
def test_bad_parameters_raise_value_error_naming_them(cls, kwargs, name):
    with pytest.raises(ValueError, match=name):
        cls(**{"server_lr": 1.0, "client_lr": 0.1, **kwargs})
