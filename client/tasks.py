"""Names of paper 2's tasks and models (§8, App. C), without torch: config validation reads them before any
heavy import, so bad input is a one-line error in about a second (client/task_models.py builds the models)."""

from __future__ import annotations

TASK_MODELS = ("femnist_cnn", "resnet18", "char_lstm", "so_logreg", "so_lstm")
MODEL_OUTPUTS = {"femnist_cnn": 62, "resnet18": 100, "char_lstm": 81, "so_logreg": 500, "so_lstm": 10_004}
# paper 2's tasks (client/datasets/) and the model each is trained with
TASK_MODEL = {
    "femnist": "femnist_cnn",
    "cifar100": "resnet18",
    "shakespeare": "char_lstm",
    "stackoverflow_tp": "so_logreg",
    "stackoverflow_nwp": "so_lstm",
}
NATURAL_DATASETS = tuple(TASK_MODEL)
