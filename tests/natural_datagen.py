"""Small datasets in the exact hub schemas of seed 001's tasks (client/datasets/), for tests and benchmarks.

Each ``make_<task>(num_clients, per_client, seed)`` returns a ``datasets.DatasetDict`` whose ``train`` split
has the columns and feature types of the hub copy (flwrlabs/femnist, flwrlabs/shakespeare, flwrlabs/cifar100,
TFF Stack Overflow exported to parquet); labels depend on the inputs, so a model can learn something.
``write(dd, path, fmt)`` stores one as a saved dataset ("disk") or parquet files ("parquet").
"""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
from PIL import Image

LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
WORDS = [f"w{i}" for i in range(60)] + ["the", "a", "python", "java", "error"]
TAGS = ["python", "java", "c++", "javascript", "sql", "android"]


def _sizes(num_clients: int, per_client: int, rng: np.random.Generator) -> list[int]:
    return [int(per_client + rng.integers(0, per_client // 2 + 1)) for _ in range(num_clients)]


def make_femnist(num_clients: int = 4, per_client: int = 12, seed: int = 0, size: int = 28) -> datasets.DatasetDict:
    rng = np.random.default_rng(seed)
    images, writers, labels = [], [], []
    for c, n in enumerate(_sizes(num_clients, per_client, rng)):
        for _ in range(n):
            y = int(rng.integers(0, 62))
            img = np.full((size, size), 255 - 4 * y, dtype=np.uint8)
            img[rng.integers(0, size, 20), rng.integers(0, size, 20)] = 0
            images.append(Image.fromarray(img, mode="L"))
            writers.append(f"f{c:04d}_{c % 100:02d}")
            labels.append(y)
    features = datasets.Features({"image": datasets.Image(), "writer_id": datasets.Value("string"),
                                  "hsf_id": datasets.Value("int64"),
                                  "character": datasets.ClassLabel(num_classes=62)})
    train = datasets.Dataset.from_dict({"image": images, "writer_id": writers, "hsf_id": [0] * len(labels),
                                        "character": labels}, features=features)
    return datasets.DatasetDict({"train": train})


def make_shakespeare(num_clients: int = 4, per_client: int = 12, seed: int = 0) -> datasets.DatasetDict:
    rng = np.random.default_rng(seed)
    rows: dict[str, list[str]] = {"character_id": [], "x": [], "y": []}
    for c, n in enumerate(_sizes(num_clients, per_client, rng)):
        text = "".join(rng.choice(list(LETTERS[1:]), size=n + 80))
        for i in range(n):
            rows["character_id"].append(f"PLAY_{c}_ROLE")
            rows["x"].append(text[i : i + 80])
            rows["y"].append(text[i + 80])
    return datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)})


def make_cifar100(num_rows: int = 800, test_rows: int = 50, seed: int = 0) -> datasets.DatasetDict:
    rng = np.random.default_rng(seed)
    features = datasets.Features({"img": datasets.Image(), "fine_label": datasets.ClassLabel(num_classes=100),
                                  "coarse_label": datasets.ClassLabel(num_classes=20)})

    def split(n: int) -> datasets.Dataset:
        fine = rng.integers(0, 100, n)
        imgs = [Image.fromarray(np.clip(rng.normal(2 * f, 30, (32, 32, 3)), 0, 255).astype(np.uint8))
                for f in fine]
        return datasets.Dataset.from_dict({"img": imgs, "fine_label": fine.tolist(),
                                           "coarse_label": (fine // 5).tolist()}, features=features)

    return datasets.DatasetDict({"train": split(num_rows), "test": split(test_rows)})


def make_stackoverflow(num_clients: int = 4, per_client: int = 12, seed: int = 0) -> datasets.DatasetDict:
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {k: [] for k in ("client_id", "tokens", "title", "tags", "creation_date", "score",
                                             "type")}
    for c, n in enumerate(_sizes(num_clients, per_client, rng)):
        for _ in range(n):
            tag = TAGS[int(rng.integers(0, len(TAGS)))]
            words = [tag] + list(rng.choice(WORDS, size=int(rng.integers(3, 30))))
            rows["client_id"].append(str(1000 + 7 * c))
            rows["tokens"].append(" ".join(words))
            rows["title"].append(f"how to {tag} {rng.choice(WORDS)}")
            rows["tags"].append("|".join([tag, TAGS[int(rng.integers(0, len(TAGS)))]]))
            rows["creation_date"].append("2016-01-01 00:00:00+00:00")
            rows["score"].append(int(rng.integers(0, 5)))
            rows["type"].append("question")
    return datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)})


def write(dd: datasets.DatasetDict, path: str | Path, fmt: str = "parquet") -> Path:
    """Save as a Hugging Face dataset folder ("disk") or as ``<split>.parquet`` files ("parquet")."""
    path = Path(path)
    if fmt == "disk":
        dd.save_to_disk(str(path))
    else:
        path.mkdir(parents=True, exist_ok=True)
        for split, ds in dd.items():
            ds.to_parquet(str(path / f"{split}.parquet"))
    return path


MAKERS = {"femnist": make_femnist, "shakespeare": make_shakespeare, "cifar100": make_cifar100,
          "stackoverflow_nwp": make_stackoverflow, "stackoverflow_tp": make_stackoverflow}
