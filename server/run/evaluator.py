"""Server-side evaluation of the global model: the test set and, with ``eval_train``, the clients' population."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord

from client.data import Dataset
from client.datasets import NaturalData
from client.examples import ImageExamples
from client.linear import is_linear
from client.models import build_model
from client.train import evaluate_examples, evaluate_many, get_device, load_arrays
from server.report.metrics import gap_tolerance
from server.run.partitions import client_partitions

Model = ArrayRecord | Mapping[str, np.ndarray]  # a model's arrays: an ArrayRecord or numpy values by name


def evaluation_examples(cfg: Mapping[str, Any], ds: Dataset | NaturalData) -> tuple[Any, list[Any]]:
    """(server test examples, each selected client's training examples). A natural task without a test split
    (FEMNIST, Shakespeare, Stack Overflow: paper 2 §8 uses training clients only) is tested on the training
    examples of the selected clients, which are contiguous rows of its cache."""
    n = int(cfg["num_clients"])
    if isinstance(ds, NaturalData):
        test = ds.split("test") if "test" in ds.meta["num_rows"] else ds.split("train", int(ds.offsets[n]))
        return test, [ds.client(i, augment=False) for i in range(n)] if cfg.get("eval_train") else []
    test = ImageExamples(ds.x_test, ds.y_test, ds.mean, ds.std, augment=False)
    parts = client_partitions(cfg, ds) if cfg.get("eval_train") else []
    return test, [ImageExamples(ds.x_train[idx], ds.y_train[idx], ds.mean, ds.std, False) for idx in parts]


MEMO_BYTES = 256 << 20  # the most memory the test set's prepared batches may take (beyond it they are prepared again)


class PreparedBatches:
    """``examples`` whose un-augmented batches are prepared once and kept (the test set: the same batches at every
    evaluation, each the tensors :meth:`batch` made the first time), up to :data:`MEMO_BYTES`. ``contiguous``: the
    inputs in row-major layout, so a model that flattens them (logistic regression) reads them without a copy at each
    evaluation (the same values; convolutions keep the layout the images come in)."""

    def __init__(self, examples: Any, contiguous: bool = False) -> None:
        self.examples, self.kept, self.bytes, self.contiguous = examples, {}, 0, contiguous

    def __len__(self) -> int:
        return len(self.examples)

    def __getattr__(self, name: str) -> Any:  # loss, correct, ...: the examples' own
        return getattr(self.examples, name)

    def batch(self, idx: np.ndarray, device: torch.device, generator: Any) -> tuple[torch.Tensor, torch.Tensor]:
        key = (np.asarray(idx).tobytes(), str(device))
        if generator is None and key in self.kept:
            return self.kept[key]
        inputs, targets = self.examples.batch(idx, device, generator)
        inputs = inputs.contiguous() if self.contiguous else inputs
        size = inputs.numel() * inputs.element_size() + targets.numel() * targets.element_size()
        if generator is None and self.bytes + size <= MEMO_BYTES:
            self.kept[key], self.bytes = (inputs, targets), self.bytes + size
        return inputs, targets


class Evaluator:
    """Server-side evaluation of a global model: the test set, and with ``eval_train`` the clients' population.

    The population loss is paper 2 Eq. 2, f(x) = E_{i~P} f_i(x) with P uniform over the N clients and f_i the
    mean loss over client i's training examples (no augmentation): the mean over clients of their mean losses
    (the partitions are equal up to one example, so this is also the loss over the union of their data).
    ``eval_train_max_examples`` > 0 takes that many examples in all, evenly spaced within each partition.
    """

    def __init__(self, cfg: Mapping[str, Any], ds: Dataset | NaturalData) -> None:
        self.ds = ds
        self.model = build_model(cfg["model"]["name"], ds.num_classes).to(get_device())
        self.copies: list[torch.nn.Module] = []  # more modules of the architecture, for passes over several models
        self.max_examples = int(cfg.get("eval_max_examples", 0))
        test, clients = evaluation_examples(cfg, ds)
        self.test = PreparedBatches(test, contiguous=is_linear(self.model))
        self.partitions = clients if cfg.get("eval_train") else None
        train_max = int(cfg.get("eval_train_max_examples", 0))
        self.per_client_max = max(1, -(-train_max // int(cfg["num_clients"]))) if train_max > 0 else 0
        self.gap = None
        if cfg.get("eval_gap"):  # pop_gap = f(x) - f* (docs/convex.md)
            from server.convex.optimum import PopulationGap

            self.gap = PopulationGap(cfg, ds)

    def gap_below_zero(self, row: Mapping[str, Any]) -> str | None:
        """Why ``row``'s ``pop_gap`` (or ``avg_pop_gap``) proves f* wrong, or None: f* = min f, so f(x) − f* below
        −1e-9 (relative to |f*| when larger), what the solver's tolerance leaves, means f* is not this objective's
        minimum (an ``eval_fstar`` of another μ, split or data) and every pop_gap of the run is off by as much."""
        if self.gap is None:
            return None
        low = min((row[k] for k in ("pop_gap", "avg_pop_gap") if row.get(k) is not None), default=0.0)
        if low >= -gap_tolerance(self.gap.f_star):
            return None
        return (
            f"pop_gap {low:.6g} < 0 at round {row['round']}: f there is below f* = {self.gap.f_star:.12g}, so f* is "
            "not this run's minimum and its pop_gap columns are off (eval_fstar null solves f* for this run)"
        )

    def __call__(self, arrays: ArrayRecord | Mapping[str, np.ndarray]) -> tuple[float, float]:
        """(test loss, test accuracy)."""
        load_arrays(self.model, _numpy(arrays))
        with torch.no_grad():
            loss, acc, _ = evaluate_examples(self.model, self.test, self.max_examples)
        return float(loss), float(acc)

    def population(self, arrays: ArrayRecord | Mapping[str, np.ndarray]) -> tuple[float, float]:
        """(population train loss f(x), population train accuracy): means over clients of their means."""
        return self.populations([arrays])[0]

    def populations(self, models: Sequence[Model]) -> list[tuple[float, float]]:
        """:meth:`population` of each model, each client's batches prepared once for all of them (each model's figures
        are the ones it gets alone: :func:`client.train.evaluate_many`)."""
        nets = self._nets(len(models))
        for net, arrays in zip(nets, models):
            load_arrays(net, _numpy(arrays))
        per_client = [evaluate_many(nets, examples, self.per_client_max) for examples in self.partitions]
        out = []
        for k in range(len(models)):
            loss, acc = np.mean(np.asarray([client[k][:2] for client in per_client], dtype=np.float64), axis=0)
            out.append((float(loss), float(acc)))
        return out

    def _nets(self, count: int) -> list[torch.nn.Module]:
        """``count`` modules of the model's architecture: the evaluator's own, then copies kept for the next pass."""
        while len(self.copies) < count - 1:
            self.copies.append(copy.deepcopy(self.model))
        return [self.model, *self.copies[: count - 1]]

    @property
    def population_from_gap(self) -> bool:
        """Whether the three pop_* columns come from the ``pop_gap`` objective's float64 pass (every example)."""
        return self.gap is not None and not self.per_client_max

    def metrics(self, arrays: Model, population: Mapping[str, float] | None = None) -> dict[str, float]:
        """Metrics-row entries: ``loss``, ``accuracy`` and, with ``eval_train``, ``pop_loss``, ``pop_accuracy``
        (and with ``eval_gap``, ``pop_gap``). Numpy arrays are evaluated as given: a float64 model (the window's
        mean) gets its ``pop_gap`` in float64 and its test metrics in the model's float32. ``population``: the
        pop_* columns already computed from the same model (:func:`metrics_of_many`)."""
        values = _numpy(arrays)
        row = dict(zip(("loss", "accuracy"), self(values)))
        if self.population_from_gap:
            row.update(population if population is not None else self.gap.with_population(values))
            return row
        if self.partitions is not None:
            row.update(population or dict(zip(("pop_loss", "pop_accuracy"), self.population(values))))
        if self.gap is not None:
            row["pop_gap"] = self.gap(values)
        return row


def metrics_of_many(pairs: Sequence[tuple[Evaluator, Model]]) -> list[dict[str, float]]:
    """:meth:`Evaluator.metrics` of each (evaluator, model) pair. The population columns of the pairs whose
    ``pop_gap`` objectives share their data (the runs of a stacked sweep) come from one pass over it for all of
    their models (:func:`server.convex.optimum.with_populations`): equal to one evaluation at a time up to the
    float64 summation order of the wider product. Without ``pop_gap``, the population columns of the pairs of one
    evaluator come from one pass over its clients' batches (:meth:`Evaluator.populations`): each model's own figures.
    Every other column is the single evaluation's own."""
    models = [_numpy(arrays) for _, arrays in pairs]
    rows: list[dict[str, float] | None] = [None] * len(pairs)
    shared: dict[int, list[int]] = {}  # id of the shared features -> pairs
    by_evaluator: dict[int, list[int]] = {}  # population over the clients' batches: id of the evaluator -> pairs
    for i, (evaluator, _) in enumerate(pairs):
        if evaluator.population_from_gap:
            shared.setdefault(id(evaluator.gap.obj.x), []).append(i)
        elif evaluator.partitions is not None:
            by_evaluator.setdefault(id(evaluator), []).append(i)
        else:
            rows[i] = evaluator.metrics(models[i])
    for group in by_evaluator.values():
        evaluator = pairs[group[0]][0]
        populations = evaluator.populations([models[i] for i in group])
        for i, (loss, acc) in zip(group, populations):
            rows[i] = evaluator.metrics(models[i], {"pop_loss": loss, "pop_accuracy": acc})
    if shared:
        from server.convex.optimum import with_populations

        for group in shared.values():
            populations = with_populations([pairs[i][0].gap for i in group], [models[i] for i in group])
            for i, population in zip(group, populations):
                rows[i] = pairs[i][0].metrics(models[i], population)
    return rows  # type: ignore[return-value]


def _numpy(arrays: ArrayRecord | Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.numpy() if hasattr(v, "numpy") else np.asarray(v) for k, v in arrays.items()}
