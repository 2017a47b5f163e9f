"""The server evaluator's test set: its batches prepared once and kept within a memory budget, the metrics those
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
