"""Reply validation: every broken reply is rejected with a reason, and broken clients cannot change the model.

The end-to-end part runs a real Flower simulation with honest quadratic clients plus one client of each broken
kind (``tests/broken_app.py``) and checks that every strategy ends with exactly the model that the honest
clients alone produce in the same federation.
"""

import math

import broken_app
import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from strategies import CyclicClientManager, FedAvgM, FedCM, LocalUpdate, LocalUpdateDecay, protocol
from strategies import math as fm
from strategies.validation import RejectedReply, ReplySpec, aggregate_metrics, check_cap, check_reply

MODEL = [np.arange(6, dtype=np.float32).reshape(3, 2), np.ones(2, dtype=np.float32)]
SPEC = ReplySpec.like(
    ["w", "b"], MODEL, required_metrics=(protocol.LOSS_BEFORE,), max_num_examples=100.0, max_update_norm=50.0
)


def reply(arrays=None, metrics=None, extra=None):
    arrays = {"w": MODEL[0] - 0.5, "b": MODEL[1] * 2} if arrays is None else arrays
    metrics = (
        {protocol.NUM_EXAMPLES: 10, protocol.LOSS_BEFORE: 1.5, protocol.TRAIN_LOSS: 1.0} if metrics is None else metrics
    )
    content = RecordDict(
        {"arrays": ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()}), "metrics": MetricRecord(metrics)}
    )
    for key, record in (extra or {}).items():
        content[key] = record
    return content


def delta(arrays):
    return fm.model_delta(MODEL, arrays)


def test_a_valid_reply_is_accepted_with_its_weight_metrics_and_update_norm():
    checked = check_reply(reply(), SPEC, delta)
    assert checked.weight == 10.0
    assert checked.metrics == {protocol.LOSS_BEFORE: 1.5, protocol.TRAIN_LOSS: 1.0}
    assert [a.dtype for a in checked.arrays] == [np.float32, np.float32]
    assert checked.update_norm == pytest.approx(math.sqrt(6 * 0.25 + 2 * 1.0))


W, B = MODEL[0] - 0.5, MODEL[1] * 2
GOOD = {protocol.NUM_EXAMPLES: 10, protocol.LOSS_BEFORE: 1.5}


@pytest.mark.parametrize(
    "content, reason",
    [
        (reply({"w": W}), "array keys differ"),
        (reply({"w": W, "b": B, "c": B}), "array keys differ"),
        (reply({"w": W.T, "b": B}), "shape (2, 3), expected (3, 2)"),
        (reply({"w": W.astype(np.float64), "b": B}), "dtype float64, expected float32"),
        (reply({"w": W.astype(np.int64), "b": B}), "dtype int64"),
        (reply({"w": W, "b": np.array([np.nan, 1], dtype=np.float32)}), "'b' has non-finite values"),
        (reply({"w": W, "b": np.array([np.inf, 1], dtype=np.float32)}), "'b' has non-finite values"),
        (reply(metrics={protocol.LOSS_BEFORE: 1.0}), "'num-examples' is missing"),
        (reply(metrics={**GOOD, protocol.NUM_EXAMPLES: 0}), "must be > 0"),
        (reply(metrics={**GOOD, protocol.NUM_EXAMPLES: -3}), "must be > 0"),
        (reply(metrics={**GOOD, protocol.NUM_EXAMPLES: float("inf")}), "not a finite number"),
        (reply(metrics={**GOOD, protocol.NUM_EXAMPLES: 101}), "exceeds max_num_examples 100"),
        (reply(metrics={protocol.NUM_EXAMPLES: 10}), "'loss-before' is missing"),
        (reply(metrics={**GOOD, protocol.LOSS_BEFORE: float("nan")}), "'loss-before' is not a finite number"),
        (reply(metrics={**GOOD, "per-step": [1.0, float("nan")]}), "'per-step' has non-finite entries"),
        (reply(metrics={**GOOD, protocol.NONFINITE: 1}), "non-finite local training"),
        (reply({"w": W + 100, "b": B}), "exceeds max_update_norm 50"),
        (reply(extra={"more": ArrayRecord({"w": Array(W)})}), "exactly one ArrayRecord, got 2"),
        (reply(extra={"more": MetricRecord({"x": 1.0})}), "exactly one MetricRecord, got 2"),
    ],
)
def test_each_broken_reply_is_rejected_with_its_reason(content, reason):
    with pytest.raises(RejectedReply, match=None) as err:
        check_reply(content, SPEC, delta)
    assert reason in str(err.value)


def test_corrupt_array_bytes_are_rejected_not_raised():
    bad = Array(dtype="float32", shape=(3, 2), stype="numpy.ndarray", data=b"not an npy file")
    content = RecordDict({"arrays": ArrayRecord({"w": bad, "b": Array(B)}), "metrics": MetricRecord(GOOD)})
    with pytest.raises(RejectedReply, match="'w' cannot be decoded"):
        check_reply(content, SPEC, delta)


def test_caps_and_metric_aggregation():
    assert check_cap(None, "x") is None and check_cap(3, "x") == 3.0
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="max_update_norm"):
            check_cap(bad, "max_update_norm")
    with pytest.raises(ValueError, match="max_num_examples"):
        FedAvgM(server_lr=1.0, max_num_examples=0)
    means = aggregate_metrics([{"a": 1.0, "b": 2.0}, {"a": 3.0}], [1.0, 3.0])
    assert means == {"a": 2.5}  # "b" is not reported by every accepted reply


# --------------------------------------------------------------------------- real simulation
NUM_NODES = broken_app.NUM_HONEST + len(broken_app.BROKEN_KINDS)
STRATEGIES = {
    "fedavgm": lambda **kw: FedAvgM(server_lr=1.0, momentum=0.5, client_lr=0.1, **kw),
    "fedcm": lambda **kw: FedCM(server_lr=0.5, client_lr=0.1, momentum=0.9, **kw),
    "localupdate": lambda **kw: LocalUpdate(server_lr=0.1, client_lr=0.1, theta=[1.0, 1.0, 1.0], **kw),
    "localupdate_decay": lambda **kw: LocalUpdateDecay(
        server_lr=0.1,
        client_lr=0.1,
        theta="fedavg",
        local_steps=2,
        window=1,
        patience=1,
        cooldown=0,
        min_delta=100.0,
        **kw,
    ),
}


def initial():
    return ArrayRecord({f"p{i}": Array(np.full(s, 0.5)) for i, s in enumerate(broken_app.toy_app.SHAPES)})


@pytest.fixture(scope="module")
def federation_results():
    results = {}
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        for name, make in STRATEGIES.items():
            for who, partitions in (("all", NUM_NODES), ("honest", broken_app.NUM_HONEST)):
                strategy = make(fraction_evaluate=0.0, min_available_nodes=1, max_num_examples=1000)
                strategy.client_manager = CyclicClientManager(partitions, 1.0, wait_timeout=60)
                result = strategy.start(grid, initial(), num_rounds=3, timeout=120)
                results[name, who] = (result, strategy)

    run_simulation(
        app,
        broken_app.app,
        num_supernodes=NUM_NODES,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2, "num_gpus": 0},
        },
    )
    return results


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_broken_clients_cannot_change_the_model(federation_results, name):
    (result, strategy), (honest, honest_strategy) = federation_results[name, "all"], federation_results[name, "honest"]
    assert sorted(strategy.client_manager.node_to_partition.values()) == list(range(NUM_NODES))
    for a, b, a0 in zip(
        result.arrays.to_numpy_ndarrays(), honest.arrays.to_numpy_ndarrays(), initial().to_numpy_ndarrays()
    ):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
        assert not np.allclose(a, a0)  # the honest clients did move the model
    rejected = len(broken_app.BROKEN_KINDS) - 1  # "raises" is an error reply: a failure, not a rejection
    for rnd in (1, 2, 3):
        metrics = result.train_metrics_clientapp[rnd]
        assert metrics["num-replies"] == broken_app.NUM_HONEST
        assert metrics["num-rejected"] == rejected and metrics["num-failures"] == 1
        assert honest.train_metrics_clientapp[rnd]["num-rejected"] == 0
        for key in ("update-norm", "client-update-norm", "server-lr"):
            assert metrics[key] == honest.train_metrics_clientapp[rnd][key]
    if name == "localupdate_decay":
        assert vars(strategy.decay_state) == vars(honest_strategy.decay_state)
