"""Our Flower strategies against Flower's own FedAvgM and the shared math, offline.

Messages are built with Flower's real classes; TaskIdentity is set as Flower does inside
a run (see the Flower notes), and the grid only needs ``get_node_ids``.
"""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvgM as FlowerFedAvgM
from flwr.supercore.task_identity import TaskIdentity

from strategies import FedAvgM, FedCM, LocalUpdate, LocalUpdateDecay, protocol
from strategies import math as fm


class NodeList:
    """The part of Flower's Grid that node sampling reads."""

    def __init__(self, ids):
        self.ids = ids

    def get_node_ids(self):
        return list(self.ids)


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = 1
    yield


def initial_record(seed=0):
    rng = np.random.default_rng(seed)
    return ArrayRecord({"w": Array(rng.normal(size=(3, 2))), "b": Array(rng.normal(size=(2,)))})


def replies_for(messages, round_):
    """Deterministic client replies: a step towards a node-dependent target."""
    out = []
    for m in messages:
        arrays = m.content["arrays"].to_numpy_ndarrays()
        node = m.metadata.dst_node_id
        new = [a - 0.3 * (a - np.sin(node + round_ + np.arange(a.size)).reshape(a.shape)) for a in arrays]
        content = RecordDict(
            {
                "arrays": ArrayRecord({k: Array(v) for k, v in zip(m.content["arrays"].keys(), new)}),
                "metrics": MetricRecord({"num-examples": 10 * node, "loss-before": 1.0}),
            }
        )
        out.append(Message(content, reply_to=m))
    return out


def run_rounds(strategy, rounds, grid, seed=0):
    arrays = initial_record(seed)
    for t in range(1, rounds + 1):
        msgs = list(strategy.configure_train(t, arrays, ConfigRecord(), grid))
        arrays, _ = strategy.aggregate_train(t, replies_for(msgs, t))
    return arrays


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9])
def test_fedavgm_equals_flower_fedavgm_over_25_rounds(beta):
    eta = 1.7
    grid = NodeList([1, 2, 3])
    ours = run_rounds(FedAvgM(server_lr=eta, momentum=beta), 25, grid)
    theirs = run_rounds(FlowerFedAvgM(server_learning_rate=eta * (1 - beta), server_momentum=beta), 25, grid)
    for k in ours.keys():
        np.testing.assert_allclose(ours[k].numpy(), theirs[k].numpy(), rtol=1e-10, atol=1e-10)


def test_fedcm_sends_momentum_term_and_applies_eq_102():
    grid = NodeList([1, 2])
    s = FedCM(server_lr=0.5, client_lr=0.1, momentum=0.9)
    arrays = initial_record()
    msgs = list(s.configure_train(1, arrays, ConfigRecord({"batch-size": 8}), grid))
    term = msgs[0].content[protocol.FEDCM_CORRECTION].to_numpy_ndarrays()
    assert all(np.all(a == 0) for a in term)  # round 1: theta^{-1} = theta^0
    cfg = msgs[0].content["config"]
    assert (cfg["algorithm"], cfg["client-lr"], cfg["momentum"], cfg["batch-size"]) == ("fedcm", 0.1, 0.9, 8)
    theta0 = arrays.to_numpy_ndarrays()
    arrays, metrics = s.aggregate_train(1, replies_for(msgs, 1))
    msgs2 = list(s.configure_train(2, arrays, ConfigRecord(), grid))
    term2 = msgs2[0].content[protocol.FEDCM_CORRECTION].to_numpy_ndarrays()
    theta1 = arrays.to_numpy_ndarrays()
    for a, b, m in zip(theta1, theta0, term2):
        np.testing.assert_allclose(m, 0.9 * (a - b) / 0.5)
    assert metrics["num-replies"] == 2 and metrics["num-failures"] == 0


def test_localupdate_applies_mean_of_q():
    grid = NodeList([4])
    s = LocalUpdate(server_lr=0.2, client_lr=0.0, theta=[1.0, 0.5], min_train_nodes=1, min_available_nodes=1)
    arrays = initial_record()
    msgs = list(s.configure_train(1, arrays, ConfigRecord(), grid))
    assert list(msgs[0].content["config"]["theta"]) == [1.0, 0.5]
    assert msgs[0].content["config"]["local-steps"] == 2
    q = [np.ones((3, 2)), 2 * np.ones(2)]
    reply = Message(
        RecordDict(
            {"arrays": ArrayRecord({"w": Array(q[0]), "b": Array(q[1])}), "metrics": MetricRecord({"num-examples": 3})}
        ),
        reply_to=msgs[0],
    )
    new, _ = s.aggregate_train(1, [reply])
    expected = fm.localupdate_server_update(arrays.to_numpy_ndarrays(), q, 0.2)
    for a, b in zip(new.to_numpy_ndarrays(), expected):
        np.testing.assert_array_equal(a, b)


def test_client_lr_schedule_sends_gamma_t_and_logs_it():
    """client_lr_schedule="polynomial" with alpha = 1 (seed 001 §7: gamma_t = gamma / t) sends gamma / t in round t
    and logs it as the round's client lr; the server lr keeps its own schedule; the default stays constant."""
    grid = NodeList([4])
    s = LocalUpdate(
        server_lr=0.2,
        client_lr=0.3,
        theta="fedavg",
        server_lr_schedule="exponential",
        schedule_param=0.5,
        client_lr_schedule="polynomial",
        client_schedule_param=1.0,
        min_train_nodes=1,
        min_available_nodes=1,
    )
    arrays = initial_record()
    for t in (1, 2, 3):
        cfg = list(s.configure_train(t, arrays, ConfigRecord(), grid))[0].content["config"]
        assert cfg["client-lr"] == pytest.approx(0.3 / t) and cfg["server-lr"] == pytest.approx(0.2 * 0.5**t)
    _, metrics = s.aggregate_train(3, replies_for(list(s.configure_train(3, arrays, ConfigRecord(), grid)), 3))
    assert metrics["client-lr"] == pytest.approx(0.1)
    constant = FedAvgM(server_lr=1.0, client_lr=0.3, min_train_nodes=1, min_available_nodes=1)
    assert list(constant.configure_train(7, arrays, ConfigRecord(), grid))[0].content["config"]["client-lr"] == 0.3


def test_localupdate_decay_applies_the_client_schedule_to_its_decayed_lr():
    """The plateau rule decays the base client lr; the schedule multiplies what it left (as for the server lr)."""
    grid = NodeList([1, 2])
    s = LocalUpdateDecay(
        server_lr=1.0,
        client_lr=0.5,
        theta="fedavg",
        window=1,
        patience=2,
        cooldown=0,
        min_delta=0.0,
        client_lr_schedule="polynomial",
        client_schedule_param=1.0,
    )
    arrays = initial_record()
    sent = []
    for t in range(1, 6):
        msgs = list(s.configure_train(t, arrays, ConfigRecord(), grid))
        sent.append(msgs[0].content["config"]["client-lr"])
        arrays, _ = s.aggregate_train(t, replies_for(msgs, t))
    assert sent == pytest.approx([0.5, 0.25, 0.5 / 3, 0.05 / 4, 0.05 / 5])


def test_localupdate_decay_follows_monitored_loss_and_checkpoints():
    grid = NodeList([1, 2])
    s = LocalUpdateDecay(server_lr=1.0, client_lr=0.5, theta="fedavg", window=1, patience=2, cooldown=0, min_delta=0.0)
    arrays = initial_record()
    sent_lrs = []
    for t in range(1, 6):
        msgs = list(s.configure_train(t, arrays, ConfigRecord(), grid))
        sent_lrs.append(msgs[0].content["config"]["client-lr"])
        arrays, metrics = s.aggregate_train(t, replies_for(msgs, t))  # loss-before is constant 1.0
    # r1 best=1; r2 wait 1; r3 wait 2 -> decay (applies from round 4); r4 wait 1; r5 decay.
    assert sent_lrs == pytest.approx([0.5, 0.5, 0.5, 0.05, 0.05])
    assert s.decay_state.num_decays == 2
    meta, saved = s.state_dict()
    clone = LocalUpdateDecay(
        server_lr=1.0, client_lr=0.5, theta="fedavg", window=1, patience=2, cooldown=0, min_delta=0.0
    )
    clone.load_state_dict(meta, saved)
    assert clone.decay_state == s.decay_state and clone.last_round == 5
    for a, b in zip(clone.model, s.model):
        np.testing.assert_array_equal(a, b)


def test_failures_are_counted():
    grid = NodeList([1, 2, 3])
    s = FedAvgM(server_lr=1.0, momentum=0.0)
    msgs = list(s.configure_train(1, initial_record(), ConfigRecord(), grid))
    replies = replies_for(msgs[:2], 1)  # the third node never answers
    _, metrics = s.aggregate_train(1, replies)
    assert metrics["num-replies"] == 2 and metrics["num-failures"] == 1


@pytest.mark.parametrize(
    "factory, name",
    [
        (lambda: FedAvgM(server_lr=1.0, momentum=1.0), "momentum"),
        (lambda: FedAvgM(server_lr=-1.0), "server_lr"),
        (lambda: FedCM(server_lr=0.0, client_lr=0.1), "server_lr"),
        (lambda: FedCM(server_lr=1.0, client_lr=-0.1), "client_lr"),
        (lambda: LocalUpdate(server_lr=1.0, client_lr=0.1, theta="maml"), "theta"),
        (lambda: LocalUpdateDecay(server_lr=1.0, client_lr=0.1, window=0), "window"),
        (lambda: FedAvgM(server_lr=1.0, server_lr_schedule="cosine"), "server_lr_schedule"),
        (lambda: FedAvgM(server_lr=1.0, client_lr=0.1, client_lr_schedule="cosine"), "client_lr_schedule"),
        (
            lambda: LocalUpdate(
                server_lr=1.0, client_lr=0.1, client_lr_schedule="polynomial", client_schedule_param=-1
            ),
            "alpha",
        ),
    ],
)
def test_invalid_values_name_the_parameter(factory, name):
    with pytest.raises(ValueError, match=name):
        factory()


def test_the_model_is_encoded_once_per_model_and_the_round_config_is_a_copy():
    """A round's result and the next round's messages share one record of the model; an update makes a new record,
    and each round's config is its own copy of the static part."""
    grid = NodeList([1, 2])
    s = FedCM(server_lr=0.5, client_lr=0.1, momentum=0.9)
    static = ConfigRecord({"batch-size": 8})
    msgs = list(s.configure_train(1, initial_record(), static, grid))
    arrays, _ = s.aggregate_train(1, replies_for(msgs, 1))
    msgs2 = list(s.configure_train(2, arrays, static, grid))
    assert msgs2[0].content["arrays"] is arrays  # the round's result, not encoded again
    np.testing.assert_array_equal(arrays["w"].numpy(), s.model[s.keys.index("w")])
    assert msgs2[0].content["config"]["server-round"] == 2 and "server-round" not in static
    assert msgs[0].content["config"]["server-round"] == 1  # round 1's config is not round 2's
    arrays2, _ = s.aggregate_train(2, replies_for(msgs2, 2))
    assert arrays2 is not arrays and not np.array_equal(arrays2["w"].numpy(), arrays["w"].numpy())
    np.testing.assert_array_equal(arrays2["w"].numpy(), s.model[s.keys.index("w")])


@pytest.mark.parametrize("weighting", ["examples", "uniform"])
@pytest.mark.parametrize("strategy", ["fedavgm", "localupdate"])
def test_weighting_sets_the_server_average_and_the_round_means(strategy, weighting):
    """``examples``: each reply by its num-examples (FedAvg); ``uniform``: the plain mean of paper 2 Algorithm 1.
    The round's client means (loss-before) use the same weights."""
    grid = NodeList([1, 2, 3])
    common = dict(server_lr=1.0, client_lr=0.1, weighting=weighting)
    s = FedAvgM(momentum=0.0, **common) if strategy == "fedavgm" else LocalUpdate(theta="fedavg", **common)
    arrays = initial_record()
    msgs = list(s.configure_train(1, arrays, ConfigRecord(), grid))
    replies, sent, sizes, losses = [], [], [], []
    for m in msgs:
        node = m.metadata.dst_node_id
        values = [np.full_like(a, float(node)) for a in m.content["arrays"].to_numpy_ndarrays()]
        sent.append(values)
        sizes.append(10.0 * node**2)
        losses.append(float(node))
        content = RecordDict(
            {
                "arrays": ArrayRecord({k: Array(v) for k, v in zip(m.content["arrays"].keys(), values)}),
                "metrics": MetricRecord({"num-examples": sizes[-1], "loss-before": losses[-1]}),
            }
        )
        replies.append(Message(content, reply_to=m))
    new, metrics = s.aggregate_train(1, replies)
    w = np.array(sizes) if weighting == "examples" else np.ones(len(sizes))
    w = w / w.sum()
    mean = [sum(wi * v[k] for wi, v in zip(w, sent)) for k in range(len(sent[0]))]
    x = arrays.to_numpy_ndarrays()
    want = mean if strategy == "fedavgm" else [a - q for a, q in zip(x, mean)]  # eta = 1: x - mean q
    for got, exp in zip(new.to_numpy_ndarrays(), want):
        np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-12)
    assert metrics[protocol.LOSS_BEFORE] == pytest.approx(float(np.dot(w, losses)), rel=1e-12)


def test_an_unknown_weighting_is_refused():
    with pytest.raises(ValueError, match="weighting must be one of"):
        FedAvgM(server_lr=1.0, weighting="sizes")


def test_a_theta_list_and_another_local_steps_is_refused():
    """LocalUpdate(theta=[1, 2], local_steps=5) ran K = 2 steps and ignored local_steps; 0 (epochs) or 2 are fine."""
    with pytest.raises(ValueError, match="a list of 2 weights sets K = 2 local steps and local_steps=5 another"):
        LocalUpdate(server_lr=0.1, client_lr=0.1, theta=[1.0, 2.0], local_steps=5)
    for steps in (0, 2):
        assert LocalUpdate(server_lr=0.1, client_lr=0.1, theta=[1.0, 2.0], local_steps=steps).local_steps == 2
