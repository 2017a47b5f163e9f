"""ConfigRecord keys the ClientApp reads besides those of ``strategies.protocol``, with their defaults (``batch-size``
has none: every train message carries conf's ``client.batch_size``).

Everything a client needs travels in the message's ConfigRecord "config", so clients stay stateless;
``context.node_config`` may override the machine-local paths (``data-root``, ``cache-dir``) and supplies
``partition-id`` (and ``num-partitions`` when the config lacks it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from client.partition import parse_alpha
from client.tasks import NATURAL_DATASETS
from strategies import protocol as P

if TYPE_CHECKING:  # client.train loads torch; the server's config checks read the keys here without it
    from client.train import TrainConfig

MODEL = "model"  # str: "cnn" | "resnet20" | "logreg"
DATASET = "dataset"  # str: "cifar10" (torchvision) | "cifar10_folder" (folder or .tar.gz)
DATA_ROOT = "data-root"  # str: dataset source; node_config["data-root"] overrides it
CACHE_DIR = "cache-dir"  # str: decoded-array cache root ("" = $FEDMOMENTUM_CACHE or ~/.cache/fedmomentum)
DOWNLOAD = "download"  # bool: let torchvision download CIFAR-10 into data-root
NUM_PARTITIONS = P.NUM_PARTITIONS  # int: N clients of the Dirichlet split (one key with the partition query)
ALPHA = "alpha"  # float (inf allowed) or str "inf"/"iid": Dirichlet concentration
PARTITION_SEED = "partition-seed"  # int
BATCH_SIZE = "batch-size"  # int: B
WEIGHT_DECAY = "weight-decay"  # float: wd (adds wd * theta to every gradient)
SEED = "seed"  # int: base seed of batch order and augmentation (combined with round and partition)
AUGMENT = "augment"  # bool: random crop + flip during local training
LOSS_BEFORE_BATCHES = "loss-before-batches"  # int: "loss-before" on 0 = the round's examples, k = k batches, -1 = all
EVAL_SPLIT = "eval-split"  # str: "test" (this partition's IID shard of the test split) | "train" (its train data)
EVAL_MAX_EXAMPLES = "eval-max-examples"  # int: 0 = all examples of the chosen split
TORCH_THREADS = "torch-threads"  # int: torch.set_num_threads when > 0

DEFAULTS: dict[str, Any] = {
    MODEL: "cnn",
    DATASET: "cifar10_folder",
    DATA_ROOT: "",
    CACHE_DIR: "",
    DOWNLOAD: False,
    ALPHA: 0.0,  # paper 1 §IV-B: "the most severe level of heterogeneity" (one class per client)
    PARTITION_SEED: 0,
    WEIGHT_DECAY: 0.0,
    SEED: 0,
    AUGMENT: True,
    LOSS_BEFORE_BATCHES: 0,
    EVAL_SPLIT: "test",
    EVAL_MAX_EXAMPLES: 0,
    TORCH_THREADS: 0,
    P.MOMENTUM: 0.0,
    P.LOCAL_EPOCHS: 1,
    P.LOCAL_STEPS: 0,
    P.SERVER_ROUND: 1,
}
NODE_OVERRIDES = (DATA_ROOT, CACHE_DIR)
DATA_KEYS = (MODEL, DATASET, DATA_ROOT, CACHE_DIR, DOWNLOAD, NUM_PARTITIONS, ALPHA, PARTITION_SEED, TORCH_THREADS)


def resolve(config: Mapping[str, Any], node_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Defaults <- message config <- node_config (paths only; num-partitions only when the config lacks it)."""
    node_config = node_config or {}
    out = {**DEFAULTS, **dict(config)}
    for key in NODE_OVERRIDES:
        if node_config.get(key):
            out[key] = node_config[key]
    if NUM_PARTITIONS not in config and NUM_PARTITIONS in node_config:
        out[NUM_PARTITIONS] = node_config[NUM_PARTITIONS]
    if not out[DATA_ROOT] and out[DATASET] not in NATURAL_DATASETS:  # a natural task may download instead
        raise ValueError(f"config key {DATA_ROOT!r} (or node_config[{DATA_ROOT!r}]) is required")
    if NUM_PARTITIONS not in out:
        raise ValueError(f"config key {NUM_PARTITIONS!r} is required")
    out[ALPHA] = parse_alpha(out[ALPHA])
    return out


def train_config(cfg: Mapping[str, Any], partition_id: int) -> TrainConfig:
    """TrainConfig of a resolved config (see :func:`resolve`); values are cast, since run configs may
    deliver ``1`` for ``1.0``."""
    if P.ALGORITHM not in cfg or P.CLIENT_LR not in cfg:
        raise ValueError(f"train config needs {P.ALGORITHM!r} and {P.CLIENT_LR!r}")
    if BATCH_SIZE not in cfg:  # no default: the server always sends conf's client.batch_size
        raise ValueError(f"config key {BATCH_SIZE!r} is required")
    from client.train import TrainConfig

    theta = cfg.get(P.THETA)
    return TrainConfig(
        algorithm=str(cfg[P.ALGORITHM]),
        client_lr=float(cfg[P.CLIENT_LR]),
        momentum=float(cfg[P.MOMENTUM]),
        local_epochs=int(cfg[P.LOCAL_EPOCHS]),
        local_steps=int(cfg[P.LOCAL_STEPS]),
        batch_size=int(cfg[BATCH_SIZE]),
        weight_decay=float(cfg[WEIGHT_DECAY]),
        theta=theta if isinstance(theta, str) or theta is None else [float(v) for v in theta],
        augment=bool(cfg[AUGMENT]),
        loss_before_batches=int(cfg[LOSS_BEFORE_BATCHES]),
        seed=int(cfg[SEED]),
        server_round=int(cfg[P.SERVER_ROUND]),
        partition_id=int(partition_id),
        participation=float(cfg.get(P.PARTICIPATION, 1.0)),
    )
