"""Seed 001's tasks (client/datasets, client/task_models): generated data in each hub schema, run through the
real flwr-datasets partitioners, every model's forward/backward and size, and bad copies (one-line errors)."""

from __future__ import annotations

import logging
import os

import datasets
import numpy as np
import pytest
import torch

from client.datacheck import DataSourceError
from client.datasets import TASK_MODELS, load_task
from client.datasets.pachinko import pachinko_split
from client.models import build_model, num_parameters
from client.task_models import resnet18_gn
from client.tasks import MODEL_OUTPUTS
from client.train import TrainConfig, evaluate_examples, train_examples
from server.run.config import ConfigError, validate
from tools.natural_datagen import MAKERS, make_cifar100, make_femnist, make_shakespeare, write

PARAMS = {
    "femnist_cnn": 1_690_046,
    "resnet18": 11_227_812,
    "char_lstm": 820_185,
    "so_logreg": 5_000_500,
    "so_lstm": 4_053_428,
}


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_model_sizes_match_their_docstrings(name):
    model = build_model(name, MODEL_OUTPUTS[name])
    assert num_parameters(model) == PARAMS[name]
    doc = resnet18_gn.__doc__ if name == "resnet18" else type(model).__doc__
    assert f"{PARAMS[name]:,} parameters" in " ".join((doc or "").split())


@pytest.mark.parametrize("name", sorted(MAKERS))
@pytest.mark.parametrize("fmt", ["parquet", "disk"])
def test_task_loads_partitions_and_trains(name, fmt, tmp_path):
    torch.manual_seed(0)
    source = MAKERS[name]()
    root = write(source, tmp_path / "copy", fmt)
    data = load_task(name, str(root), str(tmp_path / "cache"))
    train = source["train"]
    if name == "cifar100":  # Pachinko split: 100 examples per client, disjoint
        assert data.num_partitions == len(train) // 100 and set(np.diff(data.offsets)) == {100}
    else:  # natural ids in sorted order, sizes equal to the rows of each id
        column = {"femnist": "writer_id", "shakespeare": "character_id"}.get(name, "client_id")
        ids = sorted(set(train[column]))
        assert data.meta["natural_ids"] == ids
        assert list(np.diff(data.offsets)) == [train[column].count(i) for i in ids]
    model = build_model(TASK_MODELS[name], data.num_classes)
    examples = data.client(1)
    cfg = TrainConfig(algorithm="localupdate", client_lr=0.1, theta="fedavg", local_steps=2, batch_size=4)
    result = train_examples(model, examples, cfg)
    assert result.metrics["num-examples"] == len(examples) and result.metrics["nonfinite"] == 0
    assert all(torch.isfinite(v).all() for v in result.arrays.values())
    assert any(float(v.abs().sum()) > 0 for v in result.arrays.values())  # q carries gradients
    loss, acc, n = evaluate_examples(model, data.split("train"))
    assert np.isfinite(loss) and 0 <= acc <= 1 and n == data.meta["num_rows"]["train"]
    again = load_task(name, str(root), str(tmp_path / "cache"))  # cache hit: same arrays, memory-mapped
    assert again.cache_path == data.cache_path
    assert all(isinstance(a, np.memmap) for a in again.arrays["train"].values())


def _looks_missing_or_numeric(name: str, dd):
    """Fields pandas would read as missing ("None", "NA", "null") or as numbers ("999" sorts after "1000" as text,
    before it as a number)."""
    column = "character_id" if name == "shakespeare" else "client_id"
    first = dd["train"][0][column]
    renamed = "None" if name == "shakespeare" else "999"

    def change(row, i):
        row = dict(row)
        if row[column] == first:
            row[column] = renamed
        if i == 0 and name != "shakespeare":
            row["tokens"], row["title"] = "null NA", "NA"
        return row

    return datasets.DatasetDict({"train": dd["train"].map(change, with_indices=True)})


@pytest.mark.parametrize("name", ["shakespeare", "stackoverflow_nwp", "stackoverflow_tp"])
def test_a_csv_copy_encodes_as_the_parquet_copy(name, tmp_path):
    """A text task's local copy may be CSV (the hub's flwrlabs/shakespeare is one CSV file): the same clients, in
    the same order, and the same arrays as the same rows in parquet, every field read as the text it is."""
    source = _looks_missing_or_numeric(name, MAKERS[name]())
    parquet = load_task(name, str(write(source, tmp_path / "pq")), str(tmp_path / "cache_pq"))
    csv = load_task(name, str(write(source, tmp_path / "csv", "csv") / "train.csv"), str(tmp_path / "cache_csv"))
    assert csv.meta["natural_ids"] == parquet.meta["natural_ids"]
    assert ("None" if name == "shakespeare" else "999") in csv.meta["natural_ids"]
    assert list(csv.offsets) == list(parquet.offsets)
    for key, array in parquet.arrays["train"].items():
        assert np.array_equal(csv.arrays["train"][key], array), key


def test_the_hub_csv_of_shakespeare_is_read_as_text_too(tmp_path, monkeypatch):
    """flwrlabs/shakespeare is one CSV file on the hub: its download asks datasets' CSV builder to read no field as
    missing, as a local CSV copy is read. Up to the network: ``load_dataset`` of the hub name reads a local CSV with
    the options the download passed."""
    csv = write(_looks_missing_or_numeric("shakespeare", MAKERS["shakespeare"]()), tmp_path / "hub", "csv")
    real, asked = datasets.load_dataset, []

    def hub(path, name=None, **options):
        asked.append(path)
        return real("csv", data_files={"train": str(csv / "train.csv")}, **options)

    monkeypatch.setattr(datasets, "load_dataset", hub)
    data = load_task("shakespeare", None, str(tmp_path / "cache"), download=True)
    assert asked == ["flwrlabs/shakespeare"] and "None" in data.meta["natural_ids"]


@pytest.mark.parametrize(
    "text, words",
    [
        ("character_id,x\nA,b\n", "lacks column 'y'"),
        ("character_id,x,y\nA,b,c\nA,b,c,d\n", "cannot read {}: Error tokenizing data. C error: Expected 3 fields"),
    ],
)
def test_a_bad_csv_copy_is_one_line(text, words, tmp_path, capfd):
    (tmp_path / "shakespeare.csv").write_text(text)
    with pytest.raises(DataSourceError) as err:
        load_task("shakespeare", str(tmp_path / "shakespeare.csv"), str(tmp_path / "cache"))
    assert words.format(tmp_path / "shakespeare.csv") in str(err.value) and "\n" not in str(err.value)
    assert "Failed to read" not in capfd.readouterr().err  # no second report of it from the datasets library


def test_client_rows_match_the_flwr_datasets_partition(tmp_path):
    from flwr_datasets.partitioner import NaturalIdPartitioner

    source = make_shakespeare(num_clients=5)
    data = load_task("shakespeare", str(write(source, tmp_path / "copy")), str(tmp_path / "cache"))
    partitioner = NaturalIdPartitioner(partition_by="character_id")
    partitioner.dataset = source["train"]
    for p in range(5):
        part = partitioner.load_partition(p)
        x = data.client(p).x
        assert (
            len(x) == len(part)
            and "".join(
                "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"[i] for i in x[0]
            )
            == part[0]["x"]
        )


def test_pachinko_split_is_seeded_and_disjoint():
    rng = np.random.default_rng(0)
    fine = rng.integers(0, 100, 3000)
    parts = pachinko_split(fine, fine // 5, 30, 100, seed=3)
    assert parts == parts and len(np.unique(np.concatenate(parts))) == 3000
    again = pachinko_split(fine, fine // 5, 30, 100, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def _cfg(name, root, cache, **extra):
    cfg = {
        "num_rounds": 1,
        "num_clients": "all",
        "seed": 0,
        "eval_every": 1,
        "checkpoint_every": 1,
        "eval_max_examples": 0,
        "strategy": {"name": "localupdate", "server_lr": 0.01, "client_lr": 0.01, "theta": "fedavg"},
        "model": {"name": TASK_MODELS[name]},
        "participation": {"mode": "uniform", "clients_per_round": 2},
        "client": {"batch_size": 4, "local_epochs": 1, "local_steps": 2},
        "data": {"name": name, "root": str(root) if root else None, "cache_dir": str(cache), "download": False},
    }
    cfg.update(extra)
    return cfg


def test_validate_resolves_all_clients_and_fraction(tmp_path):
    root = write(make_femnist(num_clients=5), tmp_path / "copy")
    cfg = validate(_cfg("femnist", root, tmp_path / "cache"))
    assert cfg["num_clients"] == 5 and cfg["participation"]["fraction"] == pytest.approx(0.4)
    assert cfg["trust"]["max_num_examples"] == max(
        np.diff(load_task("femnist", str(root), str(tmp_path / "cache")).offsets)
    )


def _broken(kind, tmp_path):
    dd = make_femnist()
    if kind == "missing column":
        dd["train"] = dd["train"].remove_columns("writer_id")
    elif kind == "label out of range":
        dd["train"] = (
            dd["train"].cast_column("character", __import__("datasets").Value("int64")).map(lambda r: {"character": 70})
        )
    elif kind == "image size":
        dd = make_femnist(size=20)
    return write(dd, tmp_path / "bad")


@pytest.mark.parametrize(
    "kind, words",
    [
        ("missing column", "lacks column 'writer_id'"),
        ("label out of range", "column 'character': label 70 outside [0, 62)"),
        ("image size", "column 'image': image of shape (20, 20)"),
    ],
)
def test_bad_local_copy_is_one_config_error(kind, words, tmp_path):
    with pytest.raises(ConfigError) as err:
        validate(_cfg("femnist", _broken(kind, tmp_path), tmp_path / "cache"))
    assert str(err.value).startswith("'data.root': ") and words in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "change, key",
    [
        ({"data": {"name": "mnist_natural"}}, "'data.name'"),
        ({"model": {"name": "cnn"}}, "'model.name'"),
        ({"num_clients": 99}, "'num_clients'"),
    ],
)
def test_bad_config_names_the_key(change, key, tmp_path):
    root = write(make_femnist(num_clients=3), tmp_path / "copy")
    cfg = _cfg("femnist", root, tmp_path / "cache")
    for k, v in change.items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) else v
    with pytest.raises(ConfigError, match=key):
        validate(cfg)


def test_missing_root_and_no_download(tmp_path):
    with pytest.raises(ConfigError, match=r"^'data.root': no local copy of femnist at"):
        validate(_cfg("femnist", tmp_path / "nowhere", tmp_path / "cache"))
    with pytest.raises(ConfigError, match=r"^'data.download': no data.root for femnist and data.download is false"):
        validate(_cfg("femnist", None, tmp_path / "cache"))
    with pytest.raises(ConfigError, match="stackoverflow_tp has no published copy"):
        validate(_cfg("stackoverflow_tp", None, tmp_path / "cache"))


def test_cifar100_copy_without_enough_rows_for_a_client(tmp_path):
    with pytest.raises(DataSourceError):
        load_task(
            "cifar100", str(write(make_cifar100(num_rows=60, test_rows=5), tmp_path / "c")), str(tmp_path / "cache")
        )


def test_partition_with_no_examples_is_one_line_before_encoding(tmp_path, monkeypatch):
    """A partitioner that leaves a client empty (flwr-datasets' Dirichlet split with min_partition_size=0,
    40 clients of 61 rows) is a one-line error naming data.root, raised before any array is encoded."""
    import dataclasses

    from flwr_datasets.partitioner import DirichletPartitioner

    import client.datasets as natural

    specs = dict(natural.tasks())
    specs["femnist"] = dataclasses.replace(
        specs["femnist"],
        partitioner=lambda seed: DirichletPartitioner(
            num_partitions=40, partition_by="character", alpha=0.1, min_partition_size=0, seed=seed
        ),
    )
    monkeypatch.setattr(natural, "tasks", lambda: specs)
    root = write(make_femnist(), tmp_path / "copy")
    with pytest.raises(ConfigError) as err:
        validate(_cfg("femnist", root, tmp_path / "cache"))
    message = str(err.value)
    assert message.startswith("'data.root': femnist: partition ") and "has no examples" in message
    assert "\n" not in message
    assert not list((tmp_path / "cache").rglob("*.npy*"))  # nothing encoded


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_reading_a_built_cache_imports_no_hub_libraries(name, tmp_path):
    """Only building a task's cache needs flwr_datasets / Hugging Face datasets (~3 s of imports): a ClientApp (a
    Ray actor, a deployment's fork) that reads the cache, and the validation of a run, do not import them."""
    import subprocess
    import sys
    from pathlib import Path

    root = write(MAKERS[name](), tmp_path / "copy")
    load_task(name, str(root), str(tmp_path / "cache"))  # builds the cache in this process
    code = (
        "import sys\nfrom client.datasets import load_task, check_task\n"
        f"data = load_task({name!r}, {str(root)!r}, {str(tmp_path / 'cache')!r})\n"
        f"check_task({name!r}, {str(root)!r}, {str(tmp_path / 'cache')!r})\n"
        "data.client(0)\n"
        "print([m for m in ('flwr_datasets', 'datasets', 'pyarrow') if m in sys.modules])\n"
    )
    top = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={"PYTHONPATH": str(top), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def _cut(path):
    os.truncate(path, 100)


def _shift_ptr(entry):  # a ragged array's offsets that no longer end at its size
    ptr = np.load(entry / "train_words_ptr.npy")
    np.save(entry / "train_words_ptr.npy", ptr + 1)


NATURAL_BREAKS = {
    "an array cut short": ("femnist", lambda e: _cut(e / "train_x.npy"), "ValueError: "),
    "an array missing": ("femnist", lambda e: (e / "train_y.npy").unlink(), "KeyError: 'y'"),
    "offsets that do not split the rows": (
        "femnist",
        lambda e: np.save(e / "train_offsets.npy", np.array([0, 5, 3, 99999])),
        "train_offsets.npy does not split the",
    ),
    "rows missing from an array": (
        "femnist",
        lambda e: np.save(e / "train_y.npy", np.load(e / "train_y.npy")[:-1]),
        "train_y.npy has 60 of 61 rows",
    ),
    "a ragged array's offsets": ("stackoverflow_tp", _shift_ptr, "train_words_ptr.npy does not index"),
    "meta.json not JSON": ("shakespeare", lambda e: (e / "meta.json").write_text("{"), "JSONDecodeError: "),
}


@pytest.mark.parametrize("case", list(NATURAL_BREAKS))
def test_a_broken_cache_entry_is_built_again(case, tmp_path, caplog):
    """A complete entry whose files cannot be read or do not fit together is built again, with a warning naming it
    and why, and gives the same arrays (it was a stack trace on every run)."""
    name, breaks, why = NATURAL_BREAKS[case]
    root = write(MAKERS[name](), tmp_path / "copy", "parquet")
    good = load_task(name, str(root), str(tmp_path / "cache"))
    expected = {k: np.array(v) for k, v in good.arrays["train"].items()}
    breaks(good.cache_path)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        again = load_task(name, str(root), str(tmp_path / "cache"))
    [warning] = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert warning.startswith(f"cache entry {good.cache_path} cannot be read (") and why in warning, warning
    assert again.cache_path == good.cache_path and np.array_equal(again.offsets, good.offsets)
    assert set(again.arrays["train"]) == set(expected)
    assert all(np.array_equal(again.arrays["train"][k], v) for k, v in expected.items())
