"""Stack Overflow's vectorised encoders (client/datasets/stackoverflow.py, arrow_text.py) against the documented
rules written plainly in Python: words of ``str.split()``, non-empty ``|`` tags, top-k vocabularies with ties in
code point order, nwp's bos/oov/eos/pad layout, tp's in-vocabulary bags — on rows that interleave users and hold
every edge the rules name (runs and kinds of whitespace, empty strings, empty tags, long sentences)."""

from __future__ import annotations

from collections import Counter

import datasets
import numpy as np
import pytest

import client.datasets.stackoverflow as so
from client.datacheck import DataSourceError
from client.datasets import load_task
from tools.natural_datagen import write

TEXTS = [
    "how to  sort a list",
    "  leading and trailing  ",
    "tabs\tand\nnewlines",
    "",
    "\u3000ideographic\u3000space",
    "unit\x1fseparator",
    "é à z a",
    "a a a b b c",
    " ".join(f"w{i % 7}" for i in range(30)),
    " ".join(f"w{i}" for i in range(20)),
    "z",
    "zz z é",
]
TAGS = ["python|sorting", "|java||", "", "c++|python", "a|b|c|d|e", "python", "é|z"]


def _rows(n: int, seed: int) -> dict[str, list]:
    rng = np.random.default_rng(seed)
    return {
        "client_id": [f"{u:03d}" for u in rng.integers(0, 6, n)],  # users interleaved, not grouped
        "tokens": [TEXTS[i] for i in rng.integers(0, len(TEXTS), n)],
        "title": [TEXTS[i] for i in rng.integers(0, len(TEXTS), n)],
        "tags": [TAGS[i] for i in rng.integers(0, len(TAGS), n)],
    }


def _top(counter: Counter, k: int) -> list[str]:
    return [w for w, _ in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]


def _reference(train: dict[str, list], test: dict[str, list], task: str) -> tuple[dict, dict]:
    """(meta, {split: arrays}) by the module docstring's rules, one row at a time."""
    title = task == "stackoverflow_tp"
    words = lambda r: r["tokens"].split() + (r["title"].split() if title else [])  # noqa: E731
    tags = lambda r: [t for t in r["tags"].split("|") if t]  # noqa: E731
    as_rows = lambda cols: [dict(zip(cols, v)) for v in zip(*cols.values())]  # noqa: E731
    users = sorted(set(train["client_id"]))
    train_rows = [r for u in users for r in as_rows(train) if r["client_id"] == u]  # partition order
    vocab = _top(Counter(w for r in train_rows for w in words(r)), so.VOCAB_SIZE)
    meta = {"vocab": vocab, "natural_ids": users}
    out = {}
    for split, rows in (("train", train_rows), ("test", as_rows(test))):
        if not title:
            ids = np.full((len(rows), so.SEQ_LEN + 1), so.PAD, dtype=np.int32)
            for i, r in enumerate(rows):
                seq = [so.BOS] + [vocab.index(w) + 1 if w in vocab else so.OOV for w in words(r)[: so.SEQ_LEN]]
                seq += [so.EOS] if len(words(r)) < so.SEQ_LEN else []
                ids[i, : len(seq)] = seq
            out[split] = {"ids": ids}
            continue
        meta["tags"] = tag_list = _top(Counter(t for r in train_rows for t in tags(r)), so.NUM_TAGS)
        bags = [[vocab.index(w) for w in words(r) if w in vocab] for r in rows]
        hot = [[tag_list.index(t) for t in tags(r) if t in tag_list] for r in rows]
        ptr = lambda lists: np.concatenate([[0], np.cumsum([len(v) for v in lists])])  # noqa: E731
        out[split] = {
            "words": np.asarray([v for b in bags for v in b]),
            "words_ptr": ptr(bags),
            "tags": np.asarray([v for b in hot for v in b]),
            "tags_ptr": ptr(hot),
        }
    return meta, out


@pytest.mark.parametrize("task", ["stackoverflow_nwp", "stackoverflow_tp"])
@pytest.mark.parametrize("sizes", [(10_000, 500), (5, 3)])  # the real vocabularies; tiny ones cut ties
def test_encoding_follows_the_documented_rules(task, sizes, tmp_path, monkeypatch):
    from client.datasets import arrow_text

    monkeypatch.setattr(arrow_text, "BATCH", 37)  # many batches of several whole partitions (test: cut anywhere)
    monkeypatch.setattr(arrow_text, "MERGE", 16)  # and counts merged many times
    monkeypatch.setattr(so, "VOCAB_SIZE", sizes[0])
    monkeypatch.setattr(so, "NUM_TAGS", sizes[1])
    train, test = _rows(300, 0), _rows(40, 1)
    copy = write(
        datasets.DatasetDict({"train": datasets.Dataset.from_dict(train), "test": datasets.Dataset.from_dict(test)}),
        tmp_path / "copy",
    )
    data = load_task(task, str(copy), str(tmp_path / "cache"))
    meta, arrays = _reference(train, test, task)
    assert data.meta["vocab"] == meta["vocab"] and data.meta["natural_ids"] == meta["natural_ids"]
    assert data.meta.get("tags") == meta.get("tags")
    for split in ("train", "test"):
        assert sorted(data.arrays[split]) == sorted(arrays[split])
        for name, expected in arrays[split].items():  # each split's ragged arrays sized by its own words
            assert np.array_equal(data.arrays[split][name], expected), (split, name)


def test_partitions_read_from_the_index_table_equal_flwr_datasets_views(tmp_path, monkeypatch):
    """Whole partitions gathered from the index table (interleaved users) or sliced (grouped users) hold the rows
    of flwr-datasets' NaturalIdPartitioner.load_partition, in partition order."""
    from flwr_datasets.partitioner import NaturalIdPartitioner

    from client.datasets import arrow_text, base
    from client.datasets.natural_ids import ArrowNaturalIdPartitioner

    monkeypatch.setattr(arrow_text, "BATCH", 64)
    rows = _rows(500, 2)
    for grouped in (False, True):
        order = np.argsort(rows["client_id"], kind="stable") if grouped else np.arange(500)
        ds = datasets.Dataset.from_dict({k: [v[i] for i in order] for k, v in rows.items()})
        ours, theirs = ArrowNaturalIdPartitioner(partition_by="client_id"), NaturalIdPartitioner("client_id")
        ours.dataset = theirs.dataset = ds
        got = [t for b in base._arrow_partition_batches(ds, ours) for t in b.column("tokens").to_pylist()]
        assert got == [t for p in range(theirs.num_partitions) for t in theirs.load_partition(p)["tokens"]]


@pytest.mark.parametrize("column, value", [("tokens", None), ("tags", 7), ("title", None)])
def test_a_column_that_is_not_strings_is_one_line(column, value, tmp_path):
    rows = _rows(20, 3)
    rows[column][4] = value
    if value is not None:
        rows[column] = [value] * 20
    copy = write(datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}), tmp_path / "copy")
    with pytest.raises(DataSourceError, match=f"^column '{column}' must hold strings$"):
        load_task("stackoverflow_tp", str(copy), str(tmp_path / "cache"))


def test_a_split_of_several_parquet_files_is_read_in_file_order_and_needs_one_schema(tmp_path):
    """Parquet copies are streamed into one Arrow file per split (client/datasets/base.py ``_from_parquet``): the
    files of a split are concatenated in name order; a file with another schema is a one-line error."""
    first, second = _rows(30, 4), _rows(25, 5)
    folder = tmp_path / "copy"
    folder.mkdir()
    datasets.Dataset.from_dict(first).to_parquet(str(folder / "train-0.parquet"))
    datasets.Dataset.from_dict(second).to_parquet(str(folder / "train-1.parquet"))
    data = load_task("stackoverflow_nwp", str(folder), str(tmp_path / "cache"))
    assert data.meta["num_rows"]["train"] == 55
    both = {k: first[k] + second[k] for k in first}
    meta, arrays = _reference(both, _rows(1, 6), "stackoverflow_nwp")
    assert data.meta["vocab"] == meta["vocab"] and np.array_equal(data.arrays["train"]["ids"], arrays["train"]["ids"])
    datasets.Dataset.from_dict({**second, "score": list(range(25))}).to_parquet(str(folder / "train-2.parquet"))
    with pytest.raises(DataSourceError, match=r"train-2.parquet has another schema than .*train-0.parquet$"):
        load_task("stackoverflow_nwp", str(folder), str(tmp_path / "cache2"))


def test_a_file_that_is_not_parquet_is_one_line(tmp_path):
    folder = tmp_path / "copy"
    folder.mkdir()
    (folder / "train.parquet").write_bytes(b"not a parquet file at all" * 10)
    with pytest.raises(DataSourceError, match=r"^cannot read .*copy: ") as err:
        load_task("stackoverflow_tp", str(folder), str(tmp_path / "cache"))
    assert "\n" not in str(err.value)
