"""The server evaluator: its test set's batches prepared once and kept within a memory budget, the metrics those
batches give equal to freshly prepared ones."""

import numpy as np
import torch

from client.examples import ImageExamples
from client.models import build_model
from client.train import evaluate_examples
from server.run import evaluator as evaluator_lib
from server.run.evaluator import PreparedBatches


def examples(n=30):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    return ImageExamples(x, rng.integers(0, 10, n), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), augment=False)


def test_a_batch_is_prepared_once_and_equals_a_fresh_one():
    plain, kept = examples(), PreparedBatches(examples())
    idx = np.arange(5, 17)
    first = kept.batch(idx, torch.device("cpu"), None)
    again = kept.batch(idx, torch.device("cpu"), None)
    fresh = plain.batch(idx, torch.device("cpu"), None)
    assert again[0] is first[0] and again[1] is first[1]
    assert torch.equal(first[0], fresh[0]) and torch.equal(first[1], fresh[1])
    assert len(kept) == len(plain) and kept.loss is not None  # the examples' own loss, correct, ...


def test_augmented_batches_and_batches_past_the_budget_are_not_kept(monkeypatch):
    kept = PreparedBatches(examples())
    generator = torch.Generator().manual_seed(0)
    kept.batch(np.arange(4), torch.device("cpu"), generator)
    assert not kept.kept
    one = 4 * 3 * 32 * 32 * 4 + 4 * 8  # four float32 images and their int64 labels
    monkeypatch.setattr(evaluator_lib, "MEMO_BYTES", one)
    kept.batch(np.arange(4), torch.device("cpu"), None)
    kept.batch(np.arange(4, 8), torch.device("cpu"), None)
    assert len(kept.kept) == 1 and kept.bytes == one


def test_metrics_from_kept_batches_equal_fresh_ones():
    model = build_model("cnn")
    fresh = evaluate_examples(model, examples(), 0)
    kept = PreparedBatches(examples())
    assert evaluate_examples(model, kept, 0) == fresh == evaluate_examples(model, kept, 0)


class CountedExamples:
    """``examples`` that count the batches they prepare."""

    def __init__(self, inner):
        self.inner, self.prepared = inner, 0

    def __len__(self):
        return len(self.inner)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def batch(self, idx, device, generator):
        self.prepared += 1
        return self.inner.batch(idx, device, generator)


def test_several_models_evaluated_on_each_batch_prepared_once_get_their_own_figures(monkeypatch):
    """evaluate_many: every model's (loss, accuracy, n) equals evaluate_examples of that model alone (bitwise), and
    each batch is prepared once for all of them."""
    from client.train import evaluate_many

    monkeypatch.setattr("client.train.EVAL_BATCH", 8)  # 30 examples: 4 batches
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        models.append(build_model("cnn"))
    alone = [evaluate_examples(m, examples(), 0) for m in models]
    counted = CountedExamples(examples())
    assert evaluate_many(models, counted, 0) == alone and counted.prepared == 4
    assert len(set(alone)) == 3  # three different models
    assert evaluate_many(models, examples(), 10) == [evaluate_examples(m, examples(), 10) for m in models]


def test_populations_of_one_evaluator_equal_each_models_population(tiny_data, tmp_path):
    """Evaluator.populations (the pass of a stacked group's models that share an evaluator, without ``pop_gap``)
    gives each model the pop_loss and pop_accuracy it gets alone, bitwise, through metrics_of_many too."""
    from hydra import compose, initialize_config_dir

    from checks.engine_cases import experiment_overrides
    from server.run import config as config_lib
    from server.run.data import server_dataset

    with initialize_config_dir(config_dir=str(config_lib.CONF_DIR), version_base=None):
        overrides = [
            *experiment_overrides(tmp_path / "run", tiny_data["tarball"], tiny_data["cache"]),
            "eval_train=true",
        ]
        cfg = config_lib.to_plain(compose(config_name="config", overrides=overrides))
    evaluator = evaluator_lib.Evaluator(cfg, server_dataset(cfg))
    rng = np.random.default_rng(1)
    state = {k: v.numpy() for k, v in evaluator.model.state_dict().items()}
    models = [{k: v + rng.normal(0, 0.05, v.shape).astype(v.dtype) for k, v in state.items()} for _ in range(3)]
    alone = [evaluator.metrics(m) for m in models]
    assert evaluator.populations(models) == [(r["pop_loss"], r["pop_accuracy"]) for r in alone]
    assert evaluator_lib.metrics_of_many([(evaluator, m) for m in models]) == alone
    assert len({r["pop_loss"] for r in alone}) == 3
