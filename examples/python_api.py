"""Run a small fedmomentum experiment from Python and print its per-round metrics.

    python examples/python_api.py            # about 10 s on 2 CPU cores, no download, no Ray

What it does: writes a tiny generated image dataset in ImageFolder layout (``train/<class>/*.png``,
``test/<class>/*.png``) into a temporary directory, composes the project's Hydra configuration with a few
overrides (FedCM, logistic regression, 4 clients, cyclic participation, 3 rounds, the in-process batched
engine), runs it with :func:`server.run.cli.simulate` (what ``flower-simulation`` calls) and prints the rows
of the run's ``metrics.jsonl`` as written by the server (``round``, ``accuracy``, ``loss``, ``train_loss``,
``num_replies``, ``update_norm``, ...), then the final test accuracy from the returned summary.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from hydra import compose, initialize_config_dir
from PIL import Image

from server.report.metrics import read_metrics
from server.run import config as config_lib
from server.run.cli import simulate
from server.run.config import CONF_DIR

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")  # CIFAR-10's
COLUMNS = ("round", "accuracy", "loss", "train_loss", "num_replies", "update_norm")


def write_image_folder(root: Path, train_per_class: int = 8, test_per_class: int = 2, seed: int = 0) -> Path:
    """Write 32x32 RGB PNGs, one colour per class plus noise, as ``root/{train,test}/<class>/NNNN.png``."""
    rng = np.random.default_rng(seed)
    colours = rng.integers(30, 226, size=(len(CLASSES), 3))
    for split, count in (("train", train_per_class), ("test", test_per_class)):
        for c, name in enumerate(CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = np.clip(colours[c] + rng.normal(0, 25, size=(32, 32, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i:04d}.png")
    return root


def make_config(data_root: Path, run_dir: Path, cache_dir: Path) -> dict[str, Any]:
    """The project's configuration (conf/config.yaml) with the overrides of a tiny run, validated."""
    overrides = [
        "strategy=fedcm",  # FedCM: server lr 0.1, client lr 0.1, momentum 0.9 (conf/strategy/fedcm.yaml)
        "model=logreg",
        "engine=batched",  # this process, no Ray
        f"data.root={data_root}",
        f"data.cache_dir={cache_dir}",
        f"run_dir={run_dir}",
        "num_clients=4",
        "participation=cyclic",
        "participation.fraction=0.5",  # two groups of 2 clients, alternating
        "num_rounds=3",
        "client.batch_size=8",
        "client.augment=false",
        "plots=false",
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    return config_lib.validate(config_lib.to_plain(cfg))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        data_root = write_image_folder(tmp_path / "images")
        run_dir = tmp_path / "run"
        cfg = make_config(data_root, run_dir, tmp_path / "cache")
        summary = simulate(cfg)
        print(f"status: {(run_dir / 'status.json').read_text().strip()}")
        print(f"summary keys: {', '.join(sorted(summary))}")
        print(" | ".join(COLUMNS))
        for row in read_metrics(run_dir):
            print(" | ".join(_fmt(row.get(key)) for key in COLUMNS))
        print(f"final: accuracy {summary['accuracy']:.4f} after {summary['rounds']} rounds")


def _fmt(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


if __name__ == "__main__":
    main()
