"""issue 17 parts 1-2 on generated data: the float64 population objective against the model's own loss (autograd)
and the run's Evaluator, the minimiser f* (gradient norm, strong-convexity bound), flower-optimum and its cache,
and the one-line exit-2 errors of a non-convex model or a negative μ."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from simcli import run_cli

from client.models import build_model
from server.convex.cli import compose
from server.convex.objective import BIAS, WEIGHT, PopulationObjective, population_values
from server.convex.optimum import PopulationGap, cache_path, objective, optimum
from server.convex.solver import TOL, solve
from server.run import config as config_lib
from server.run.data import server_dataset
from server.run.evaluator import Evaluator, metrics_of_many
from server.run.partitions import client_partitions

MU = 1e-2
NUM_CLIENTS = 7  # 120 examples: partitions of 17 and 18, so the client weights differ from 1/n


def overrides(data, *extra):
    return [
        f"data.root={data['tarball']}",
        f"data.cache_dir={data['cache']}",
        "model=logreg",
        f"client.weight_decay={MU}",
        f"num_clients={NUM_CLIENTS}",
        "participation.fraction=1",
        "eval_train=true",
        *extra,
    ]


@pytest.fixture(scope="module")
def problem(tiny_data):
    cfg = config_lib.validate(compose(overrides(tiny_data)))
    ds = server_dataset(cfg)
    return cfg, ds, objective(cfg, ds)


@pytest.fixture(scope="module")
def solution(problem):
    return solve(problem[2])


def model_f(cfg, ds, w_arrays):
    """f by the model itself in float64: mean over clients of F.cross_entropy means, + (μ/2)‖θ‖² (autograd-able)."""
    model = build_model("logreg").double()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in w_arrays.items()})
    mean, std = torch.tensor(ds.mean, dtype=torch.float64), torch.tensor(ds.std, dtype=torch.float64)
    losses = []
    for idx in client_partitions(cfg, ds):
        x = torch.from_numpy(np.asarray(ds.x_train[idx])).permute(0, 3, 1, 2).double() / 255
        x = (x - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
        losses.append(F.cross_entropy(model(x), torch.from_numpy(np.asarray(ds.y_train[idx]))))
    reg = sum((p * p).sum() for p in model.parameters())
    return torch.stack(losses).mean() + 0.5 * MU * reg, list(model.parameters())


def random_w(obj, seed, scale=1e-2):
    return np.random.default_rng(seed).normal(scale=scale, size=obj.dim)


def test_unequal_partitions_weigh_examples_by_client(problem):
    cfg, ds, obj = problem
    sizes = {len(p) for p in client_partitions(cfg, ds)}
    assert sizes == {17, 18}
    assert obj.c.sum().item() == pytest.approx(1.0, abs=1e-15)
    assert sorted(set(np.round(obj.c.numpy() * NUM_CLIENTS * 17 * 18, 9))) == [17.0, 18.0]  # 1/(N n_i)


def test_value_gradient_and_hessian_equal_autograd_of_the_model(problem):
    cfg, ds, obj = problem
    w, v = random_w(obj, 0), random_w(obj, 1, 1.0)
    f, params = model_f(cfg, ds, obj.arrays(w))
    grads = torch.autograd.grad(f, params, create_graph=True)
    flat_grad = torch.cat([grads[0].reshape(-1), grads[1]])
    assert obj.value(w) == pytest.approx(float(f.detach()), rel=1e-13)
    np.testing.assert_allclose(obj.grad(w), flat_grad.detach().numpy(), rtol=1e-10, atol=1e-14)
    vt = torch.from_numpy(v)
    hv = torch.autograd.grad(flat_grad @ vt, params)
    np.testing.assert_allclose(obj.hessp(w, v), torch.cat([hv[0].reshape(-1), hv[1]]).numpy(), rtol=1e-9, atol=1e-13)


def test_value_is_the_runs_pop_loss_plus_the_weight_decay_term(problem):
    """The Evaluator's float32 pop_loss (seed 001 Eq. 2, the column of every run) + (μ/2)‖w‖² is f to float32."""
    cfg, ds, obj = problem
    w = random_w(obj, 2)
    arrays = {k: a.astype(np.float32) for k, a in obj.arrays(w).items()}
    pop_loss, _ = Evaluator(cfg, ds).population(ArrayRecord({k: torch.from_numpy(a) for k, a in arrays.items()}))
    w32 = obj.flatten(arrays)
    assert obj.value(w32) == pytest.approx(pop_loss + 0.5 * MU * float(w32 @ w32), rel=1e-6)


def test_gap_runs_take_pop_loss_and_accuracy_from_the_float64_pass(problem, solution):
    """With eval_gap, the metrics row's pop_loss and pop_accuracy come from f's float64 logits (one pass): they
    equal the float32 per-client evaluation to float32 precision, and pop_gap + f* − pop_loss is (μ/2)‖w‖²."""
    cfg, ds, obj = problem
    w = random_w(obj, 3)
    arrays = ArrayRecord({k: torch.from_numpy(a.astype(np.float32)) for k, a in obj.arrays(w).items()})
    with_gap = Evaluator({**cfg, "eval_gap": True, "eval_fstar": solution.f_star}, ds)
    row, float32 = with_gap.metrics(arrays), with_gap.population(arrays)
    assert row["pop_loss"] == pytest.approx(float32[0], rel=1e-6)
    assert row["pop_accuracy"] == pytest.approx(float32[1], abs=1e-12)
    w32 = obj.flatten({k: v.numpy() for k, v in arrays.items()})
    assert row["pop_gap"] + solution.f_star - row["pop_loss"] == pytest.approx(0.5 * MU * float(w32 @ w32), rel=1e-9)


def test_runs_of_one_data_share_its_features_and_evaluate_many_models_in_one_pass(problem, solution):
    """Evaluators of other seeds (other splits, so other example weights) hold one feature tensor; the metrics of
    several models from one product equal one evaluation at a time to float64 rounding, the float32 test columns
    and the accuracies exactly."""
    cfg, ds, obj = problem
    cfgs = [{**cfg, "seed": seed, "eval_gap": True, "eval_fstar": solution.f_star} for seed in (0, 1, 0)]
    evaluators = [Evaluator(c, ds) for c in cfgs]
    assert evaluators[0].gap.obj.x is evaluators[1].gap.obj.x is obj.x
    assert not np.array_equal(evaluators[0].gap.obj.c.numpy(), evaluators[1].gap.obj.c.numpy())
    models = [{k: a.astype(np.float32) for k, a in obj.arrays(random_w(obj, seed, 0.05)).items()} for seed in (4, 5)]
    models.append(obj.arrays(random_w(obj, 6, 0.05)))  # a float64 model (the window's mean) as well
    pairs = list(zip(evaluators, models))
    together = metrics_of_many(pairs)
    for (evaluator, model), row in zip(pairs, together):
        alone = evaluator.metrics(model)
        assert list(row) == list(alone)
        for key in ("loss", "accuracy", "pop_accuracy"):
            assert row[key] == alone[key], key
        for key in ("pop_loss", "pop_gap"):
            assert row[key] == pytest.approx(alone[key], rel=1e-12, abs=1e-14), key


def test_population_values_refuses_objectives_with_their_own_features(problem):
    cfg, ds, obj = problem
    other = PopulationObjective(obj.x.clone(), ds.y_train, obj.c.numpy(), MU, ds.num_classes)
    with pytest.raises(ValueError, match="sharing their features"):
        population_values([obj, other], [random_w(obj, 1), random_w(obj, 2)])
    assert population_values([], []) == []


def test_solution_is_a_true_minimiser(problem, solution):
    """‖∇f(w*)‖ ≤ 1e-8 recomputed here, and f(w* + d) > f(w*) for every direction: f is μ-strongly convex, so
    f(w* + d) − f(w*) ≥ −‖∇f‖‖d‖ + (μ/2)‖d‖², > 0 for ‖d‖ > 2‖∇f‖/μ = 2e-6 — checked with margin at 1e-3 and 1e-1."""
    _, _, obj = problem
    assert solution.converged and solution.grad_norm <= TOL
    grad_norm = float(np.linalg.norm(obj.grad(solution.w)))
    assert grad_norm <= TOL and obj.value(solution.w) == solution.f_star
    rng = np.random.default_rng(3)
    for scale in (1e-3, 1e-1):
        for _ in range(5):
            d = rng.normal(size=obj.dim)
            d *= scale / np.linalg.norm(d)
            bound = -grad_norm * scale + 0.5 * MU * scale**2
            assert obj.value(solution.w + d) - solution.f_star >= bound > 0
    assert abs(float(obj.rows(solution.w).sum(0).abs().max())) < 1e-9  # Σ_k w'_k = 0: the softmax shift is pinned


def test_optimum_caches_and_distrusts_its_cache(problem, solution, tmp_path):
    cfg, ds, obj = problem
    cfg = {**cfg, "data": {**cfg["data"], "cache_dir": str(tmp_path)}}
    first = optimum(cfg, ds, obj)
    assert not first.cached and first.path.parent == tmp_path / "optimum"
    assert first.f_star == pytest.approx(solution.f_star, rel=1e-13, abs=0)
    again = optimum(cfg, ds, obj)
    assert again.cached and again.f_star == first.f_star
    with np.load(first.path) as npz:  # a tampered entry (f* lowered) is solved again, not believed
        np.savez(first.path, w=npz["w"], f_star=npz["f_star"] - 1e-3, mu=npz["mu"], grad_norm=npz["grad_norm"])
    redone = optimum(cfg, ds, obj)
    assert not redone.cached and redone.f_star == pytest.approx(first.f_star, rel=1e-13)
    with np.load(first.path) as npz:  # an entry off by rounding only is believed, and its own number is returned
        nudged = float(npz["f_star"]) * (1 + 1e-14)
        np.savez(first.path, w=npz["w"], f_star=nudged, mu=npz["mu"], grad_norm=npz["grad_norm"])
    assert optimum(cfg, ds, obj).f_star == nudged != obj.value(np.load(first.path)["w"])
    first.path.write_bytes(first.path.read_bytes()[:300])  # an entry cut short (not a zip file): solved again
    resolved = optimum(cfg, ds, obj)
    assert not resolved.cached and resolved.f_star == pytest.approx(first.f_star, rel=1e-13)
    other_mu = {**cfg, "client": {**cfg["client"], "weight_decay": 2 * MU}}
    assert cache_path(other_mu, ds, objective(other_mu, ds)) != first.path


def test_pop_gap_of_the_minimiser_is_zero_and_of_zero_is_positive(problem, solution):
    cfg, ds, obj = problem
    gap = PopulationGap({**cfg, "eval_gap": True, "eval_fstar": solution.f_star}, ds)
    # zero up to f's float64 rounding: another instance (alignment) or thread count sums in another order
    assert abs(gap(obj.arrays(solution.w))) <= 1e-14 * solution.f_star
    zero = {WEIGHT: np.zeros((10, 3072), np.float32), BIAS: np.zeros(10, np.float32)}
    assert gap(zero) == pytest.approx(np.log(10) - solution.f_star, rel=1e-12)


def test_flower_optimum_prints_one_json_line_and_reads_its_cache(tiny_data, tmp_path):
    args = overrides(tiny_data, f"data.cache_dir={tmp_path}")
    first = run_cli("flower-optimum", args, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    record = json.loads(first.stdout.strip())
    assert first.stdout.count("\n") == 1 and record["mu"] == MU and record["grad_norm"] <= TOL
    assert not record["cached"]
    second = run_cli("flower-optimum", args, timeout=300)
    assert json.loads(second.stdout)["cached"] and json.loads(second.stdout)["f_star"] == record["f_star"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["model=cnn"], "model.name=cnn is not convex"),
        (["client.weight_decay=-0.1"], "'client.weight_decay'"),
        (["data.root=/nonexistent.tar.gz"], "'data.root'"),
        (["strategy=nosuch"], "strategy"),
    ],
)
def test_flower_optimum_bad_input_exits_2_with_one_line(tiny_data, tmp_path, extra, message):
    proc = run_cli("flower-optimum", [*overrides(tiny_data, f"data.cache_dir={tmp_path}"), *extra], timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert proc.stdout == "" and not (tmp_path / "optimum").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["model=cnn", "eval_gap=true"], "'eval_gap': model.name=cnn is not convex"),
        (["eval_gap=true", "eval_train=false"], "'eval_gap' needs eval_train=true"),
        (["eval_fstar=1.5"], "'eval_fstar' is set but eval_gap=false"),
    ],
)
def test_eval_gap_config_errors_exit_2_before_any_work(tiny_data, tmp_path, extra, message):
    run_dir = tmp_path / "run"
    proc = run_cli(
        "flower-simulation", [*overrides(tiny_data), "engine=batched", f"hydra.run.dir={run_dir}", *extra], timeout=120
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (run_dir / "metrics.csv").exists()


def test_flower_optimum_s_config_names_no_run_directory(tiny_data, tmp_path, monkeypatch):
    """flower-optimum (and the study driver's override check) compose a config to solve f*, not to run: a working
    folder that holds a run's metrics is no reason to refuse it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"round": 3}\n')
    cfg = compose(overrides(tiny_data))
    assert cfg["run_dir"] is None
    config_lib.validate(cfg)
