"""Small datasets in the exact hub schemas of paper 2's tasks (client/datasets/), for tests and benchmarks.

Each ``make_<task>(num_clients, per_client, seed)`` returns a ``datasets.DatasetDict`` whose ``train`` split
has the columns and feature types of the hub copy (flwrlabs/femnist, flwrlabs/shakespeare, flwrlabs/cifar100,
TFF Stack Overflow exported to parquet); labels depend on the inputs, so a model can learn something.
``write(dd, path, fmt)`` stores one as a saved dataset ("disk") or parquet files ("parquet").
``write_<task>_copy(path, ...)`` writes a copy of any size (the real one for ``benchmarks.natural_tasks``),
vectorised, as parquet files in the same schema.
"""

from __future__ import annotations

import io
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from PIL import Image

LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
WORDS = [f"w{i}" for i in range(60)] + ["the", "a", "python", "java", "error"]
TAGS = ["python", "java", "c++", "javascript", "sql", "android"]
FEMNIST_FEATURES = datasets.Features(
    {
        "image": datasets.Image(),
        "writer_id": datasets.Value("string"),
        "hsf_id": datasets.Value("int64"),
        "character": datasets.ClassLabel(num_classes=62),
    }
)
SHAKESPEARE_FEATURES = datasets.Features({k: datasets.Value("string") for k in ("character_id", "x", "y")})
CIFAR100_FEATURES = datasets.Features(
    {
        "img": datasets.Image(),
        "fine_label": datasets.ClassLabel(num_classes=100),
        "coarse_label": datasets.ClassLabel(num_classes=20),
    }
)
STACKOVERFLOW_FEATURES = datasets.Features(
    {
        **{k: datasets.Value("string") for k in ("client_id", "tokens", "title", "tags", "creation_date")},
        "score": datasets.Value("int64"),
        "type": datasets.Value("string"),
    }
)


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
    train = datasets.Dataset.from_dict(
        {"image": images, "writer_id": writers, "hsf_id": [0] * len(labels), "character": labels},
        features=FEMNIST_FEATURES,
    )
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

    def split(n: int) -> datasets.Dataset:
        fine = rng.integers(0, 100, n)
        imgs = [Image.fromarray(np.clip(rng.normal(2 * f, 30, (32, 32, 3)), 0, 255).astype(np.uint8)) for f in fine]
        return datasets.Dataset.from_dict(
            {"img": imgs, "fine_label": fine.tolist(), "coarse_label": (fine // 5).tolist()}, features=CIFAR100_FEATURES
        )

    return datasets.DatasetDict({"train": split(num_rows), "test": split(test_rows)})


def make_stackoverflow(num_clients: int = 4, per_client: int = 12, seed: int = 0) -> datasets.DatasetDict:
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {k: [] for k in ("client_id", "tokens", "title", "tags", "creation_date", "score", "type")}
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
    """Save as a Hugging Face dataset folder ("disk"), as ``<split>.parquet`` files ("parquet") or as
    ``<split>.csv`` files ("csv", pandas' default quoting, as the hub's ``flwrlabs/shakespeare`` CSV)."""
    path = Path(path)
    if fmt == "disk":
        dd.save_to_disk(str(path))
    elif fmt == "csv":
        path.mkdir(parents=True, exist_ok=True)
        for split, ds in dd.items():
            ds.to_csv(str(path / f"{split}.csv"), index=False)
    else:
        path.mkdir(parents=True, exist_ok=True)
        for split, ds in dd.items():
            ds.to_parquet(str(path / f"{split}.parquet"))
    return path


MAKERS = {
    "femnist": make_femnist,
    "shakespeare": make_shakespeare,
    "cifar100": make_cifar100,
    "stackoverflow_nwp": make_stackoverflow,
    "stackoverflow_tp": make_stackoverflow,
}


# --------------------------------------------------------------------------- full-size copies (benchmarks)
# Vectorised writers of a task's local copy at a given size, straight into parquet files in the hub schema
# (the features above in the files' ``huggingface`` metadata, as the hub's parquet files carry), row group by
# row group, so generation holds one row group at a time. Rows are grouped by client, as in the hub copies
# (LEAF's per-user files); client sizes are lognormal with the real data's coefficient of variation.
ROW_GROUP = 65_536
IMAGE_ROW_GROUP = 100  # push_to_hub's row groups for image datasets in datasets 2.x, which wrote the flwrlabs copies


class ParquetSink:
    """Appends pyarrow tables to ``path``, written in row groups of ROW_GROUP rows (IMAGE_ROW_GROUP with images)."""

    def __init__(self, path: Path, features: datasets.Features) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.schema = features.arrow_schema
        self.writer = pq.ParquetWriter(str(path), self.schema)
        self.row_group = IMAGE_ROW_GROUP if any(isinstance(f, datasets.Image) for f in features.values()) else ROW_GROUP
        self.pending: list[pa.Table] = []
        self.rows = 0

    def add(self, columns: dict[str, pa.Array]) -> None:
        table = pa.Table.from_pydict({k: columns[k] for k in self.schema.names}).cast(self.schema)
        self.pending.append(table)
        if sum(t.num_rows for t in self.pending) >= ROW_GROUP:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            table = pa.concat_tables(self.pending)
            self.writer.write_table(table, row_group_size=self.row_group)
            self.rows += table.num_rows
            self.pending = []

    def close(self) -> int:
        self.flush()
        self.writer.close()
        return self.rows


def client_sizes(total: int, num_clients: int, cv: float, rng: np.random.Generator) -> np.ndarray:
    """``num_clients`` sizes >= 1 summing to ``total``: lognormal with coefficient of variation ``cv``."""
    sigma = float(np.sqrt(np.log1p(cv**2)))
    raw = rng.lognormal(0.0, sigma, num_clients)
    sizes = np.maximum(1, np.floor(raw / raw.sum() * total)).astype(np.int64)
    diff = total - int(sizes.sum())  # largest clients absorb the rounding
    order = np.argsort(-sizes)
    step = 1 if diff > 0 else -1
    for i in range(abs(diff)):
        sizes[order[i % num_clients]] += step
    return sizes


def _strings(values: np.ndarray, width: int) -> pa.Array:
    """uint8 rows of ``width`` ASCII bytes -> an Arrow string array, no Python string per row."""
    n = len(values)
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(values)))


def _pngs(pixels: np.ndarray, mode: str) -> pa.Array:
    """PNG bytes of each image (the ``Image`` feature's storage: {"bytes", "path"})."""
    out = []
    for img in pixels:
        buf = io.BytesIO()
        Image.fromarray(img, mode=mode).save(buf, format="PNG")
        out.append(buf.getvalue())
    return pa.StructArray.from_arrays(
        [pa.array(out, pa.binary()), pa.nulls(len(out), pa.string())], names=["bytes", "path"]
    )


def write_femnist_copy(path: Path, num_rows: int, num_clients: int, seed: int = 0) -> Path:
    """``train.parquet``: 28x28 PNG characters (a class template + per-image strokes) of ``num_clients``
    writers ``f0000_00``..., sizes with LEAF's FEMNIST spread (mean 227, std 89: cv 0.39)."""
    rng = np.random.default_rng(seed)
    templates = np.full((62, 28, 28), 255, dtype=np.uint8)
    for y in range(62):  # a few dark strokes per class
        templates[y, rng.integers(4, 24, 40), rng.integers(4, 24, 40)] = 0
    sink = ParquetSink(path / "train.parquet", FEMNIST_FEATURES)
    for c, n in enumerate(client_sizes(num_rows, num_clients, 0.39, rng)):
        y = rng.integers(0, 62, n)
        x = templates[y].copy()
        rows, cols = rng.integers(0, 28, (2, n, 12))
        x[np.arange(n)[:, None], rows, cols] = rng.integers(0, 256, (n, 12), dtype=np.uint8)
        sink.add(
            {
                "image": _pngs(x, "L"),
                "writer_id": pa.array([f"f{c:04d}_{c % 100:02d}"] * n),
                "hsf_id": pa.array(np.full(n, c % 8)),
                "character": pa.array(y),
            }
        )
    sink.close()
    return path


PLAYS = [
    "THE_TRAGEDY_OF_HAMLET_PRINCE_OF_DENMARK",
    "KING_LEAR",
    "THE_MERCHANT_OF_VENICE",
    "AS_YOU_LIKE_IT",
    "THE_FIRST_PART_OF_KING_HENRY_THE_FOURTH",
    "A_MIDSUMMER_NIGHTS_DREAM",
    "THE_TEMPEST",
    "OTHELLO",
]
_FREQ = np.ones(len(LETTERS) - 1)  # LETTERS[1:]: lower case and space far more often than the rest
_FREQ[[LETTERS[1:].index(ch) for ch in " etaoinshrdlu"]] = 60.0
_FREQ[[LETTERS[1:].index(ch) for ch in "cmfwypvbgkjqxz,."]] = 15.0
_FREQ /= _FREQ.sum()


def write_shakespeare_copy(path: Path, num_rows: int, num_clients: int, seed: int = 0) -> Path:
    """``train.parquet``: per speaking role ``PLAY_ROLE``, 80-character windows of one text and the next
    character (LEAF's rows), sizes with LEAF's Shakespeare spread (mean 3,743, std 6,212: cv 1.66)."""
    rng = np.random.default_rng(seed)
    alphabet = np.frombuffer(LETTERS[1:].encode("ascii"), dtype=np.uint8)
    sink = ParquetSink(path / "train.parquet", SHAKESPEARE_FEATURES)
    for c, n in enumerate(client_sizes(num_rows, num_clients, 1.66, rng)):
        text = alphabet[rng.choice(len(alphabet), size=n + 80, p=_FREQ)]
        windows = np.lib.stride_tricks.sliding_window_view(text, 81)[:n]
        role = f"{PLAYS[c % len(PLAYS)]}_ROLE{c:04d}"
        sink.add(
            {
                "character_id": pa.array([role] * n),
                "x": _strings(windows[:, :80], 80),
                "y": _strings(windows[:, 80:], 1),
            }
        )
    sink.close()
    return path


def write_cifar100_copy(path: Path, num_train: int = 50_000, num_test: int = 10_000, seed: int = 0) -> Path:
    """``train.parquet`` and ``test.parquet``: 32x32 RGB PNGs, every fine label equally often (CIFAR-100's
    500 / 100 per label), coarse label = fine // 5 (a 20 x 5 tree like CIFAR-100's)."""
    rng = np.random.default_rng(seed)
    means = rng.integers(30, 226, (100, 1, 1, 3))
    for split, n in (("train", num_train), ("test", num_test)):
        sink = ParquetSink(path / f"{split}.parquet", CIFAR100_FEATURES)
        fine = rng.permutation(np.arange(n) % 100)
        for start in range(0, n, 4096):
            f = fine[start : start + 4096]
            x = np.clip(means[f] + rng.normal(0, 40, (len(f), 32, 32, 3)), 0, 255).astype(np.uint8)
            sink.add({"img": _pngs(x, "RGB"), "fine_label": pa.array(f), "coarse_label": pa.array(f // 5)})
        sink.close()
    return path


def _zipf_words(count: int, vocabulary: pa.Array, rng: np.random.Generator, exponent: float) -> pa.Array:
    """``count`` draws from ``vocabulary`` with Zipf probabilities (rank r: r^-exponent)."""
    cdf = np.cumsum(np.arange(1, len(vocabulary) + 1, dtype=np.float64) ** -exponent)
    ids = np.minimum(np.searchsorted(cdf / cdf[-1], rng.random(count)), len(vocabulary) - 1)
    return vocabulary.take(pa.array(ids))


def _joined(lengths: np.ndarray, vocabulary: pa.Array, rng: np.random.Generator, sep: str) -> pa.Array:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    words = _zipf_words(int(offsets[-1]), vocabulary, rng, 1.05)
    return pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), words), sep)


def write_stackoverflow_copy(path: Path, num_rows: int, num_clients: int, seed: int = 0) -> Path:
    """``train.parquet`` in TFF's Stack Overflow schema: users ``%08d``, one row per sentence, sizes lognormal
    with cv 3 (heavy-tailed: an assumption, TFF publishes only the totals); tokens of 1 + Poisson(13) words
    and titles of 1 + Poisson(7) words from a Zipf(1.05) vocabulary of 200,000 words, 1-5 tags from 20,000."""
    rng = np.random.default_rng(seed)
    words = pa.array([f"w{i}" for i in range(200_000)])
    tags = pa.array([f"tag{i}" for i in range(20_000)])
    ids = np.sort(rng.choice(10 * num_clients + 100, num_clients, replace=False))
    sink = ParquetSink(path / "train.parquet", STACKOVERFLOW_FEATURES)
    sizes = client_sizes(num_rows, num_clients, 3.0, rng)
    for start in range(0, num_clients, 256):  # 256 users per batch
        n = sizes[start : start + 256]
        users = np.repeat(np.asarray([f"{i:08d}" for i in ids[start : start + 256]]), n)
        total = int(n.sum())
        sink.add(
            {
                "client_id": pa.array(users),
                "tokens": _joined(1 + rng.poisson(13, total), words, rng, " "),
                "title": _joined(1 + rng.poisson(7, total), words, rng, " "),
                "tags": _joined(rng.integers(1, 6, total), tags, rng, "|"),
                "creation_date": pa.array(["2016-01-01 00:00:00+00:00"] * total),
                "score": pa.array(rng.integers(0, 5, total)),
                "type": pa.array(np.where(rng.random(total) < 0.5, "question", "answer")),
            }
        )
    sink.close()
    return path
