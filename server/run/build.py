"""Build the run's parts from a validated config: strategy + participation, initial model, evaluator."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord

from client.data import Dataset, load_dataset
from client.datasets import NaturalData, load_task
from client.examples import ImageExamples
from client.models import build_model
from client.partition import client_sizes, dirichlet_partition, label_histograms, parse_alpha, save_histograms
from client.tasks import MODEL_OUTPUTS, NATURAL_DATASETS
from client.train import evaluate_examples, get_device, load_arrays
from server.run import config as config_lib
from strategies import CyclicClientManager, FedAvgM, FedCM, LocalUpdate, LocalUpdateDecay, UniformClientManager
from strategies.base import ServerOptStrategy
from strategies.ghbm import GHBM, FedHBM, LocalGHBM

DECAY_KEYS = ("window", "patience", "cooldown", "min_delta", "client_decay", "server_decay", "min_lr")
SERVER_OPTIMIZER_KEYS = ("server_optimizer", "beta_1", "beta_2", "tau", "bias_correction")


def max_num_examples(cfg: Mapping[str, Any], num_train: int | None) -> float | None:
    """``trust.max_num_examples``: "auto" = the largest partition of the split (needs ``num_train``)."""
    value = cfg.get("trust", {}).get("max_num_examples", "auto")
    if value == "auto":
        return None if num_train is None else float(client_sizes(num_train, int(cfg["num_clients"])).max())
    return None if value is None else float(value)


def build_strategy(cfg: Mapping[str, Any], num_train: int | None = None) -> ServerOptStrategy:
    """The configured strategy with its cyclic or uniform client manager (server-side evaluation only).

    ``num_train``: size of the clients' training split, for the default ``trust.max_num_examples``.
    """
    s, p = cfg["strategy"], cfg["participation"]
    manager_cls = CyclicClientManager if p["mode"] == "cyclic" else UniformClientManager
    extra = {"groups": p.get("groups")} if p["mode"] == "cyclic" else {}
    manager = manager_cls(int(cfg["num_clients"]), float(p["fraction"]), int(cfg["seed"]),
                          query_timeout=query_timeout(cfg), wait_timeout=float(p.get("wait_timeout", 300)),
                          bind_partitions=bind_partitions(cfg), owners=partition_owners(cfg), **extra)
    common = dict(
        server_lr=float(s["server_lr"]),
        client_lr=float(s["client_lr"]),
        server_lr_schedule=s.get("server_lr_schedule", "constant"),
        schedule_param=float(s.get("schedule_param", 1.0)),
        client_lr_schedule=s.get("client_lr_schedule", "constant"),
        client_schedule_param=float(s.get("client_schedule_param", 1.0)),
        client_manager=manager,
        max_update_norm=cfg.get("trust", {}).get("max_update_norm"),
        max_num_examples=max_num_examples(cfg, num_train),
        fraction_evaluate=0.0,
        min_available_nodes=1,
        min_train_nodes=1,
    )
    name = s["name"]
    if name == "fedcm":
        return FedCM(momentum=float(s["momentum"]), **common)
    if name == "ghbm":
        return GHBM(momentum=float(s["momentum"]), tau=int(s["tau"]), **common)
    if name in ("localghbm", "fedhbm"):
        cls = LocalGHBM if name == "localghbm" else FedHBM
        return cls(momentum=float(s["momentum"]), client_state_dir=client_state_dir(cfg), **common)
    common.update({k: s[k] for k in SERVER_OPTIMIZER_KEYS if k in s})  # Adam / Adagrad / Yogi (Reddi et al.)
    if name == "fedavgm":
        return FedAvgM(momentum=float(s["momentum"]), **common)
    theta = s.get("theta", "fedavg")
    theta = theta if isinstance(theta, str) else [float(w) for w in theta]
    if name == "localupdate":
        return LocalUpdate(theta=theta, local_steps=int(cfg["client"].get("local_steps", 0)), **common)
    return LocalUpdateDecay(theta=theta, local_steps=int(cfg["client"].get("local_steps", 0)),
                            **{k: s[k] for k in DECAY_KEYS}, **common)


def client_state_dir(cfg: Mapping[str, Any]) -> str | None:
    """Where LocalGHBM/FedHBM clients keep their files: ``client.state_dir``, else <run_dir>/client_state
    (a node's ``node_config["client-state-dir"]`` overrides it; docs/ghbm.md)."""
    state_dir = cfg.get("client", {}).get("state_dir")
    if state_dir:
        return str(state_dir)
    return str(Path(cfg["run_dir"]) / "client_state") if cfg.get("run_dir") else None


def bind_partitions(cfg: Mapping[str, Any]) -> bool:
    """Whether a partition stays with the node that claimed it first: ``deploy.bind_partitions``, where null
    follows ``deploy.auth`` (only authenticated node ids are stable; see strategies/client_manager.py)."""
    d = cfg.get("deploy") or {}
    bind = d.get("bind_partitions")
    return bool(d.get("auth")) if bind is None else bool(bind)


def query_timeout(cfg: Mapping[str, Any]) -> float:
    """Seconds a round waits for a node's answer to the partition query (``participation.query_timeout``, at most
    ``round_timeout``); a node that misses it is silent and not waited for again (strategies/client_manager.py)."""
    return min(float(cfg["participation"].get("query_timeout", 30)), float(cfg["round_timeout"]))


def partition_owners(cfg: Mapping[str, Any]) -> dict[str, int] | None:
    """Key fingerprint -> partition of the SuperNodes allowed to serve each partition, or None (no key
    ownership): ``deploy.partition_owners``, which flower-deploy writes (server/deploy/ownership.py)."""
    owners = (cfg.get("deploy") or {}).get("partition_owners")
    return None if owners is None else {str(k): int(v) for k, v in owners.items()}


def initial_model(cfg: Mapping[str, Any]) -> ArrayRecord:
    """theta^0: the configured model initialised from ``seed``."""
    torch.manual_seed(int(cfg["seed"]))
    name = cfg["model"]["name"]
    model = build_model(name, MODEL_OUTPUTS.get(name, 10))
    return ArrayRecord(model.state_dict())


def server_dataset(cfg: Mapping[str, Any]) -> Dataset | NaturalData:
    """The dataset the clients use (same source and cache), for server-side evaluation."""
    d = cfg["data"]
    if d["name"] in NATURAL_DATASETS:
        return load_task(d["name"], d.get("root"), d.get("cache_dir"), bool(d.get("download", False)))
    return load_dataset(d["name"], d["root"], d.get("cache_dir") or None, download=bool(d.get("download", False)))


def client_partitions(cfg: Mapping[str, Any], ds: Dataset) -> list[np.ndarray]:
    """Train indices of every client: the Dirichlet split the ClientApps draw (partition seed = ``seed``)."""
    return dirichlet_partition(np.asarray(ds.y_train), int(cfg["num_clients"]), parse_alpha(cfg["data"]["alpha"]),
                               int(cfg["seed"]), ds.num_classes)


def train_size(ds: Dataset | NaturalData) -> int | None:
    """Training examples of a CIFAR-10 split (for trust.max_num_examples=auto); None for a natural task,
    whose cap :func:`server.run.config.validate` sets to its largest selected client."""
    return None if isinstance(ds, NaturalData) else len(ds.y_train)


def save_partition_summary(cfg: Mapping[str, Any], ds: Dataset | NaturalData, run_dir: Path) -> np.ndarray:
    """Per-client label histograms of the clients' split (csv, json, png unless ``plots=false``); for a natural task,
    ``partition.csv``: partition id, natural id and number of examples of every selected client."""
    if isinstance(ds, NaturalData):
        return save_natural_partitions(ds, int(cfg["num_clients"]), run_dir)
    parts = client_partitions(cfg, ds)
    hist = label_histograms(np.asarray(ds.y_train), parts, ds.num_classes)
    save_histograms(run_dir, hist, ds.classes, title=f"alpha={cfg['data']['alpha']}", stem="partition",
                    plot=cfg.get("plots", True))
    return hist


def evaluation_examples(cfg: Mapping[str, Any], ds: Dataset | NaturalData) -> tuple[Any, list[Any]]:
    """(server test examples, each selected client's training examples). A natural task without a test split
    (FEMNIST, Shakespeare, Stack Overflow: seed 001 §8 uses training clients only) is tested on the training
    examples of the selected clients, which are contiguous rows of its cache."""
    n = int(cfg["num_clients"])
    if isinstance(ds, NaturalData):
        test = ds.split("test") if "test" in ds.meta["num_rows"] else ds.split("train", int(ds.offsets[n]))
        return test, [ds.client(i, augment=False) for i in range(n)] if cfg.get("eval_train") else []
    test = ImageExamples(ds.x_test, ds.y_test, ds.mean, ds.std, augment=False)
    parts = client_partitions(cfg, ds) if cfg.get("eval_train") else []
    return test, [ImageExamples(ds.x_train[idx], ds.y_train[idx], ds.mean, ds.std, False) for idx in parts]


def save_natural_partitions(ds: NaturalData, num_clients: int, run_dir: Path) -> np.ndarray:
    """``partition.csv``: partition id, natural id (writer, role, user, ...) and examples of each selected client."""
    sizes = np.diff(ds.offsets)[:num_clients]
    ids = ds.meta["natural_ids"]
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = ["client,natural_id,total"] + [f"{i},{ids[i]},{int(s)}" for i, s in enumerate(sizes)]
    (run_dir / "partition.csv").write_text("\n".join(lines) + "\n")
    return sizes[:, None]


class Evaluator:
    """Server-side evaluation of a global model: the test set, and with ``eval_train`` the clients' population.

    The population loss is seed 001 Eq. 2, f(x) = E_{i~P} f_i(x) with P uniform over the N clients and f_i the
    mean loss over client i's training examples (no augmentation): the mean over clients of their mean losses
    (the partitions are equal up to one example, so this is also the loss over the union of their data).
    ``eval_train_max_examples`` > 0 takes that many examples in all, evenly spaced within each partition.
    """

    def __init__(self, cfg: Mapping[str, Any], ds: Dataset | NaturalData) -> None:
        self.ds = ds
        self.model = build_model(cfg["model"]["name"], ds.num_classes).to(get_device())
        self.max_examples = int(cfg.get("eval_max_examples", 0))
        self.test, clients = evaluation_examples(cfg, ds)
        self.partitions = clients if cfg.get("eval_train") else None
        train_max = int(cfg.get("eval_train_max_examples", 0))
        self.per_client_max = max(1, -(-train_max // int(cfg["num_clients"]))) if train_max > 0 else 0
        self.gap = None
        if cfg.get("eval_gap"):  # pop_gap = f(x) - f* (issue 17; docs/convex.md)
            from server.convex.optimum import PopulationGap

            self.gap = PopulationGap(cfg, ds)

    def __call__(self, arrays: ArrayRecord | Mapping[str, np.ndarray]) -> tuple[float, float]:
        """(test loss, test accuracy)."""
        load_arrays(self.model, _numpy(arrays))
        with torch.no_grad():
            loss, acc, _ = evaluate_examples(self.model, self.test, self.max_examples)
        return float(loss), float(acc)

    def population(self, arrays: ArrayRecord | Mapping[str, np.ndarray]) -> tuple[float, float]:
        """(population train loss f(x), population train accuracy): means over clients of their means."""
        load_arrays(self.model, _numpy(arrays))
        per_client = [evaluate_examples(self.model, examples, self.per_client_max)[:2]
                      for examples in self.partitions]
        loss, acc = np.mean(np.asarray(per_client, dtype=np.float64), axis=0)
        return float(loss), float(acc)

    def metrics(self, arrays: ArrayRecord | Mapping[str, np.ndarray]) -> dict[str, float]:
        """Metrics-row entries: ``loss``, ``accuracy`` and, with ``eval_train``, ``pop_loss``, ``pop_accuracy``
        (and with ``eval_gap``, ``pop_gap``). Numpy arrays are evaluated as given: a float64 model (the window's
        mean) gets its ``pop_gap`` in float64 and its test metrics in the model's float32."""
        values = _numpy(arrays)
        row = dict(zip(("loss", "accuracy"), self(values)))
        if self.gap is not None and not self.per_client_max:  # every example: f's float64 pass gives all three
            row.update(self.gap.with_population(values))
            return row
        if self.partitions is not None:
            row.update(zip(("pop_loss", "pop_accuracy"), self.population(values)))
        if self.gap is not None:
            row["pop_gap"] = self.gap(values)
        return row


def _numpy(arrays: ArrayRecord | Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.numpy() if hasattr(v, "numpy") else np.asarray(v) for k, v in arrays.items()}


def prepare_data(cfg: dict[str, Any]) -> None:
    """Download torchvision's CIFAR-10 now, once, if asked to (not in every client at the same time)."""
    d = cfg["data"]
    if d["name"] != "cifar10" or not d.get("download"):
        return
    from client import datacheck

    try:
        datacheck.download_cifar10(d["root"])
    except datacheck.DataSourceError as err:
        raise config_lib.ConfigError(f"'data.download': {err} (offline? point data.root at an ImageFolder tree "
                                     "or .tar.gz of CIFAR-10 with data=cifar10_folder)") from None
    config_lib.validate(cfg)  # now the counts are known: num_clients against the examples
