"""Stacked training of several clients (client/stacked.py) equals the one-client loop (client/train.py)."""

import numpy as np
import pytest
import torch

from checks.engine_cases import MEAN, STD, stacked_clients, train_one_by_one
from client.models import build_model
from client.stacked import can_stack, stacked_local_train
from client.train import TRAIN_TIME

# max |diff| / max |expected| per array in float32, after at most 3 steps. Logistic regression (smooth): sums in
# another order, measured <= 1.6e-6 over 50 data seeds. The CNN: ReLU and max-pool turn a rounding difference that
# crosses an activation's edge into a jump (checks/float32_flips.py): over 50 data seeds (rng 0..24 x fedavgm,
# ghbm) 8 exceed 1e-5, up to 9.3e-3, and which ones depends on the CPU's kernels. So the CNN's float32 bound only
# catches what float32 alone can break (dtype, non-finite values, a lost client); its algorithm is checked below in
# float64 to 1e-12, where no activation lies within rounding of its edge.
TOL = {"logreg": 1e-5, "cnn": 5e-2}


def assert_close(got, expected, tol, what=""):
    """Normwise relative difference max|got - expected| / max|expected| <= tol (elementwise relative errors are
    meaningless for entries that cancel to ~0, e.g. q's sum of gradients)."""
    scale = max(float(np.abs(expected).max()), 1e-12)
    assert float(np.abs(got - expected).max()) <= tol * scale, what


@pytest.mark.parametrize("model_name", ["logreg", "cnn"])
@pytest.mark.parametrize("algorithm", ["fedavgm", "fedcm", "localupdate", "ghbm", "localghbm", "fedhbm"])
def test_stacked_equals_one_client_loop(algorithm, model_name):
    """float32, the engine's precision: the same arrays (dtype, names), steps, examples and loss at θ⁰ (a forward
    pass only) as the loop, the weights within :data:`TOL`."""
    torch.manual_seed(0)
    model = build_model(model_name)
    clients = stacked_clients(algorithm, model, np.random.default_rng(1), weight_decay=1e-3, augment=True)
    expected = train_one_by_one(model_name, clients)
    got = stacked_local_train(model, clients, MEAN, STD, torch.device("cpu"))
    for e, g in zip(expected, got):
        assert list(e.arrays) == list(g.arrays)
        for k in e.arrays:
            assert g.arrays[k].dtype == e.arrays[k].dtype == torch.float32, k
            assert_close(g.arrays[k].numpy(), e.arrays[k].numpy(), TOL[model_name], k)
        for key in ("num-examples", "num-steps", "nonfinite"):
            assert g.metrics[key] == e.metrics[key], key
        assert g.metrics["loss-before"] == pytest.approx(e.metrics["loss-before"], rel=1e-5)
        assert g.metrics["train-loss"] == pytest.approx(e.metrics["train-loss"], rel=TOL[model_name])


@pytest.fixture
def float64():
    """Train in float64: both paths are then the same algorithm to ~1e-15 (float32 leaves only rounding)."""
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("model_name", ["logreg", "cnn", "resnet20"])
@pytest.mark.parametrize("algorithm", ["fedavgm", "fedcm", "localupdate", "ghbm", "fedhbm"])
def test_stacked_is_the_same_algorithm_in_float64(float64, algorithm, model_name):
    """In float64 the stacked path equals the one-client loop to 1e-12 for every model, ResNet-20 (GroupNorm)
    included. In float32 the ReLU networks' few steps can amplify rounding (ResNet-20: 7e-3 normwise after 3 steps
    at lr 0.05 from a loss of 5.7; the CNN: :data:`TOL`), so they are checked here, in the precision where rounding
    cannot hide a bug. (LocalGHBM trains as GHBM with its own momentum term: the same stacked code.)"""
    torch.manual_seed(0)
    model = build_model(model_name)
    clients = stacked_clients(algorithm, model, np.random.default_rng(4), weight_decay=1e-3, augment=True)
    expected = train_one_by_one(model_name, clients)
    got = stacked_local_train(model, clients, MEAN, STD, torch.device("cpu"))
    for e, g in zip(expected, got):
        for k in e.arrays:
            assert e.arrays[k].dtype == torch.float64
            scale = max(float(e.arrays[k].abs().max()), 1e-12)
            assert float((g.arrays[k] - e.arrays[k]).abs().max()) <= 1e-12 * scale, k
        assert g.metrics["loss-before"] == pytest.approx(e.metrics["loss-before"], rel=1e-12)
        assert g.metrics["num-steps"] == e.metrics["num-steps"]


def test_a_diverging_client_stops_alone():
    """A client whose loss turns non-finite stops there and says nonfinite; the others train on."""
    model = build_model("logreg")
    clients = stacked_clients("fedavgm", model, np.random.default_rng(2))
    clients[1].cfg.client_lr = clients[0].cfg.client_lr  # all share the round's settings
    clients[1].initial = {k: np.full_like(v, np.inf) for k, v in clients[1].initial.items()}
    expected = train_one_by_one("logreg", clients)
    got = stacked_local_train(model, clients, MEAN, STD, torch.device("cpu"))
    assert [g.metrics["nonfinite"] for g in got] == [e.metrics["nonfinite"] for e in expected] == [0, 1, 0]
    assert got[1].metrics["num-steps"] == expected[1].metrics["num-steps"] == 0
    for i in (0, 2):
        for k in expected[i].arrays:
            assert_close(got[i].arrays[k].numpy(), expected[i].arrays[k].numpy(), TOL["logreg"], k)


def test_models_with_buffers_are_refused():
    assert can_stack(build_model("resnet20")) and can_stack(build_model("cnn"))
    with pytest.raises(ValueError, match="only trainable parameters"):
        stacked_local_train(torch.nn.BatchNorm1d(3), [], MEAN, STD, torch.device("cpu"))


def test_a_cached_client_does_not_read_its_images_again():
    """A client whose float copy is cached (by ``key``) trains the same without its images being read: the
    batched engine hands a reader (``ImageExamples`` with ``rows`` reads on first use), called on a miss only."""
    import client.stacked as stacked
    from client.chunk import clear_cache
    from client.examples import ImageExamples

    clear_cache()
    model = build_model("logreg")
    clients = stacked_clients("fedavgm", model, np.random.default_rng(1), augment=False)
    source = np.concatenate([c.x for c in clients])
    starts = np.cumsum([0] + [len(c.y) for c in clients])
    reads = []

    def inputs():
        out = []
        for i, c in enumerate(clients):
            examples = ImageExamples(source, c.y, MEAN, STD, False, rows=np.arange(starts[i], starts[i + 1]))

            def reader(examples=examples, i=i):
                reads.append(i)
                return examples.x

            out.append(stacked.ClientInput(reader, c.y, c.cfg, c.initial, key=("data", i)))
        return out

    expected = stacked_local_train(model, clients, MEAN, STD, torch.device("cpu"))
    first = stacked_local_train(model, inputs(), MEAN, STD, torch.device("cpu"))
    again = stacked_local_train(model, inputs(), MEAN, STD, torch.device("cpu"))
    assert reads == list(range(len(clients)))  # the first round's misses only
    for e, f, a in zip(expected, first, again):
        for k in e.arrays:
            assert torch.equal(e.arrays[k], f.arrays[k]) and torch.equal(e.arrays[k], a.arrays[k]), k
    examples = ImageExamples(source, clients[0].y, MEAN, STD, False, rows=np.array([2, 0]))
    assert np.array_equal(examples.x, source[[2, 0]]) and examples.x is examples.x  # read once, then kept


@pytest.mark.parametrize("augment", [False, True])
def test_clients_that_are_rows_of_one_split_share_its_float_copy_and_train_as_with_their_own(monkeypatch, augment):
    """Clients whose images are rows of one array (``ClientInput.rows``: partitions of a split, in any order and
    under any partitioning) share one cached float copy of it, converted a part at a time, and train bitwise as
    with float copies of their own."""
    import dataclasses

    import client.chunk as chunk

    chunk.clear_cache()
    monkeypatch.setattr(chunk, "CONVERT_ROWS", 7)  # the split converted in several parts
    model = build_model("logreg")
    clients = stacked_clients("ghbm", model, np.random.default_rng(2), augment=augment)
    order = np.random.default_rng(3).permutation(sum(len(c.y) for c in clients))
    source = np.empty((len(order), *clients[0].x.shape[1:]), np.uint8)
    starts = np.cumsum([0] + [len(c.y) for c in clients])
    rows = [order[starts[i] : starts[i + 1]] for i in range(len(clients))]
    for c, r in zip(clients, rows):
        source[r] = c.x
    shared = [dataclasses.replace(c, x=source, key="split", rows=r) for c, r in zip(clients, rows)]
    expected = stacked_local_train(model, clients, MEAN, STD, torch.device("cpu"))
    got = stacked_local_train(model, shared, MEAN, STD, torch.device("cpu"))
    assert len(chunk._CACHE) == (2 if augment else 1)  # the split's one copy (and its normalised one, to augment)
    for e, g in zip(expected, got):
        assert {k: v for k, v in e.metrics.items() if k != TRAIN_TIME} == {
            k: v for k, v in g.metrics.items() if k != TRAIN_TIME
        }
        for k in e.arrays:
            assert torch.equal(e.arrays[k], g.arrays[k]), k
    assert chunk.shares_split(source) and not chunk.shares_split(source, budget=source.size * 4 - 1)


@pytest.mark.parametrize("augment", [False, True])
@pytest.mark.parametrize("loss_before_batches", [0, 1, -1])
@pytest.mark.parametrize("algorithm", ["fedavgm", "localupdate", "ghbm"])
def test_closed_form_logreg_equals_vmap_and_the_loop(float64, algorithm, loss_before_batches, augment):
    """Logistic regression trains through client/linear.py's closed-form gradient; in float64 it equals the
    one-client loop and the generic vmap chunk to 1e-12 (arrays, loss-before, train-loss)."""
    import client.stacked as stacked
    from client.chunk import Chunk
    from client.linear import LinearChunk

    model = build_model("logreg")
    assert stacked.chunk_class(model) is LinearChunk and stacked.chunk_class(build_model("cnn")) is Chunk
    assert stacked.chunk_class(model, generic=True) is Chunk
    clients = stacked_clients(
        algorithm,
        model,
        np.random.default_rng(5),
        weight_decay=1e-3,
        augment=augment,
        loss_before_batches=loss_before_batches,
    )
    expected = train_one_by_one("logreg", clients)
    closed = stacked_local_train(model, clients, MEAN, STD, torch.device("cpu"))
    generic = stacked_local_train(model, clients, MEAN, STD, torch.device("cpu"), generic=True)
    for e, c, g in zip(expected, closed, generic):
        for k in e.arrays:
            scale = max(float(e.arrays[k].abs().max()), 1e-12)
            assert float((c.arrays[k] - e.arrays[k]).abs().max()) <= 1e-12 * scale, k
            assert float((c.arrays[k] - g.arrays[k]).abs().max()) <= 1e-12 * scale, k
        for key in ("loss-before", "train-loss"):
            assert c.metrics[key] == pytest.approx(e.metrics[key], rel=1e-12), key
        assert c.metrics["num-steps"] == e.metrics["num-steps"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("model_name", ["logreg", "cnn"])
@pytest.mark.parametrize("algorithm", ["fedavgm", "fedcm", "localupdate", "ghbm", "fedhbm"])
def test_clients_with_their_own_lr_and_beta_train_in_one_chunk(algorithm, model_name, dtype):
    """eta_l and beta are per-client tensors of a chunk: in a chunk whose clients differ in them (the jobs of a
    learning-rate or beta sweep) each client's result equals, bitwise, its result in the same chunk where every client
    has its values; eta_l = 0 included (LocalUpdate's mini-batch SGD, gamma = 0). (The same chunk: the kernels may
    round differently for another number of clients, e.g. a chunk of one.)"""
    import dataclasses

    def with_values(clients, lrs, betas):
        return [
            dataclasses.replace(c, cfg=dataclasses.replace(c.cfg, client_lr=lr, momentum=beta))
            for c, lr, beta in zip(clients, lrs, betas)
        ]

    torch.set_default_dtype(dtype)
    try:
        torch.manual_seed(0)
        model = build_model(model_name)
        clients = stacked_clients(algorithm, model, np.random.default_rng(2), weight_decay=1e-3, augment=True)
        lrs = (0.0, 0.1, 0.03) if algorithm in ("fedavgm", "localupdate") else (0.05, 0.1, 0.03)
        betas = (0.9, 0.5, 0.99)
        mixed = stacked_local_train(model, with_values(clients, lrs, betas), MEAN, STD, torch.device("cpu"))
        uniform = [
            stacked_local_train(model, with_values(clients, [lr] * 3, [beta] * 3), MEAN, STD, torch.device("cpu"))[i]
            for i, (lr, beta) in enumerate(zip(lrs, betas))
        ]
    finally:
        torch.set_default_dtype(torch.float32)
    for m, u in zip(mixed, uniform):
        for k in u.arrays:
            assert m.arrays[k].dtype == u.arrays[k].dtype == dtype and torch.equal(m.arrays[k], u.arrays[k]), k
        assert {k: v for k, v in m.metrics.items() if k != "train-time"} == {
            k: v for k, v in u.metrics.items() if k != "train-time"
        }
    if algorithm == "fedavgm":  # eta_l = 0: the model received (LocalUpdate replies q, not its model)
        assert all(np.array_equal(mixed[0].arrays[k].numpy(), clients[0].initial[k]) for k in clients[0].initial)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("model_name", ["logreg", "cnn"])
def test_a_job_s_clients_beside_another_job_s_train_as_alone(model_name, dtype):
    """Clients of unequal sizes (20, 13, 7 examples: 3, 2, 1 steps) trained beside three clients of another job (3
    steps each), as a stacked sweep trains them, against the same clients alone. Batches are padded to B whatever
    the chunk, so a client's sums do not depend on its neighbours: float64 is bitwise; in float32 the client left
    alone in its last step is, alone, a chunk of one, which the CPU kernels round differently (measured ~1e-7
    relative), within the float32 bar of 1e-5."""
    torch.set_default_dtype(dtype)
    try:
        torch.manual_seed(0)
        model = build_model(model_name)
        job = stacked_clients("fedavgm", model, np.random.default_rng(2), weight_decay=1e-3, augment=True)
        other = stacked_clients("fedavgm", model, np.random.default_rng(3), weight_decay=1e-3, augment=True)[:1] * 3
        alone = stacked_local_train(model, job, MEAN, STD, torch.device("cpu"))
        beside = stacked_local_train(model, job + other, MEAN, STD, torch.device("cpu"))[: len(job)]
    finally:
        torch.set_default_dtype(torch.float32)
    for b, a in zip(beside, alone):
        for k in a.arrays:
            if dtype == torch.float64:
                assert torch.equal(b.arrays[k], a.arrays[k]), k
            else:
                assert_close(b.arrays[k].numpy(), a.arrays[k].numpy(), 1e-5, k)
        assert b.metrics["num-steps"] == a.metrics["num-steps"]


def test_a_batch_size_beyond_every_client_is_full_batch_without_padding_to_b():
    """B larger than every client (full-batch gradient descent): one step of all of a client's examples, the input
    buffers as wide as the largest client (not B rows), the same models as B = the largest client's size."""
    import dataclasses

    torch.manual_seed(0)
    model = build_model("logreg")
    clients = stacked_clients("fedavgm", model, np.random.default_rng(5), augment=False)
    results = {}
    for b in (max(len(c.y) for c in clients), 10**12):
        runs = [dataclasses.replace(c, cfg=dataclasses.replace(c.cfg, batch_size=b)) for c in clients]
        results[b] = stacked_local_train(model, runs, MEAN, STD, torch.device("cpu"))
    for a, b in zip(*results.values()):
        assert a.metrics["num-steps"] == b.metrics["num-steps"] == 1
        assert all(torch.equal(a.arrays[k], b.arrays[k]) for k in a.arrays)


@pytest.mark.parametrize(
    "model_name, dtype, edges",
    [
        *[("logreg", d, e) for d in (torch.float32, torch.float64) for e in (False, True)],
        ("cnn", torch.float32, False),
        ("cnn", torch.float64, True),
    ],
)
def test_clients_of_fedavgm_fedcm_and_ghbm_in_one_chunk_train_as_in_a_chunk_of_their_own(model_name, dtype, edges):
    """One step form (theta - a g + c, :func:`strategies.math.affine_local_step`): a FedAvgM, a FedCM and a GHBM client
    in one chunk each train bitwise as in a chunk of three clients of its own algorithm (the same data, augmentation
    and weight decay); with ``edges`` the FedAvgM client has eta_l = 0 and the others no term yet (FedCM's first round,
    a LocalGHBM client's first participation)."""
    import dataclasses

    algorithms = ("fedavgm", "fedcm", "localghbm" if edges else "ghbm")

    def clients_of(algorithm):
        steps = 2 if model_name == "cnn" else 0  # the CNN: 2 steps a client (0: an epoch)
        clients = stacked_clients(
            algorithm, model, np.random.default_rng(2), weight_decay=1e-3, augment=True, local_steps=steps
        )
        if edges:
            clients = [dataclasses.replace(c, correction=None, momentum_term=None) for c in clients]
            clients[0] = dataclasses.replace(clients[0], cfg=dataclasses.replace(clients[0].cfg, client_lr=0.0))
        return clients

    torch.set_default_dtype(dtype)
    try:
        torch.manual_seed(0)
        model = build_model(model_name)
        alone = [
            stacked_local_train(model, clients_of(a), MEAN, STD, torch.device("cpu"))[i]
            for i, a in enumerate(algorithms)
        ]
        mixed_clients = [clients_of(a)[i] for i, a in enumerate(algorithms)]
        mixed = stacked_local_train(model, mixed_clients, MEAN, STD, torch.device("cpu"))
    finally:
        torch.set_default_dtype(torch.float32)
    assert len(mixed) == len(algorithms) == len(mixed_clients)
    for m, a in zip(mixed, alone):
        for k in a.arrays:
            assert m.arrays[k].dtype == a.arrays[k].dtype == dtype and torch.equal(m.arrays[k], a.arrays[k]), k
        assert {k: v for k, v in m.metrics.items() if k != TRAIN_TIME} == {
            k: v for k, v in a.metrics.items() if k != TRAIN_TIME
        }
    if edges:  # eta_l = 0: the FedAvgM client's model is the one it received
        assert all(np.array_equal(mixed[0].arrays[k].numpy(), mixed_clients[0].initial[k]) for k in mixed[0].arrays)
