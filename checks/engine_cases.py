"""Small cases shared by the engine-equality tests and checks/gpu_equality.py (which runs them on a GPU).

``STRATEGIES``: the Hydra overrides of each strategy in the engines' experiment, :func:`experiment_overrides`.
:func:`stacked_clients` / :func:`train_one_by_one`: three unequal clients (20, 13 and 7 random images: 3, 2 and 1
steps of B = 8, smaller last batches) for one algorithm, and the one-client loop (client/train.py) over them, the
reference of the stacked path (tests/client/test_stacked.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

STRATEGIES = {
    "fedavg": [],
    "fedavgm": ["strategy=fedavgm", "strategy.momentum=0.9"],
    "fedcm": ["strategy=fedcm"],
    "localupdate": ["strategy=localupdate"],
    "localupdate_decay": ["strategy=localupdate_decay"],
    "ghbm": ["strategy=ghbm", "strategy.tau=2"],
    "localghbm": ["strategy=localghbm"],
    "fedhbm": ["strategy=fedhbm"],
}
MEAN, STD = (0.5, 0.4, 0.45), (0.25, 0.2, 0.22)
SIZES = (20, 13, 7)
NUM_CLIENTS = 4


def experiment_overrides(run_dir: Any, data_root: Any, cache_dir: Any) -> list[str]:
    """The engines' small complete experiment: 4 unequal clients (alpha = 1), C = 0.5 cyclic, 3 rounds, 1 epoch of
    B = 8, one torch thread, 20 evaluation examples, no PNGs (the CNN and no weight decay unless added)."""
    return [
        f"run_dir={run_dir}",
        f"data.root={data_root}",
        f"data.cache_dir={cache_dir}",
        f"num_clients={NUM_CLIENTS}",
        "num_rounds=3",
        "participation.fraction=0.5",
        "client.batch_size=8",
        "client.torch_threads=1",
        "eval_max_examples=20",
        "data.alpha=1.0",
        "round_timeout=120",
        "plots=false",
    ]


def stacked_clients(algorithm: str, model: Any, rng: np.random.Generator, **cfg: Any) -> list[Any]:
    """:class:`client.stacked.ClientInput` of each size: random images and labels, initial models shifted per
    client, the algorithm's extra (FedCM's correction, GHBM's momentum term, FedHBM's anchor); ``cfg`` adds
    :class:`client.train.TrainConfig` fields."""
    from client.stacked import ClientInput
    from client.train import TrainConfig

    state = {k: v.numpy() for k, v in model.state_dict().items()}
    out = []
    for pid, n in enumerate(SIZES):
        x = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        y = rng.integers(0, 10, n)
        initial = {k: v + 0.01 * pid for k, v in state.items()}
        noise = {k: rng.normal(size=v.shape).astype(np.float32) * 0.01 for k, v in state.items()}
        extra = {}
        if algorithm == "fedcm":
            extra["correction"] = noise
        elif algorithm in ("ghbm", "localghbm"):
            extra["momentum_term"] = noise
        elif algorithm == "fedhbm":
            extra["anchor"] = {k: v + noise[k] for k, v in initial.items()}
        theta = "fomaml" if algorithm == "localupdate" else None
        tc = TrainConfig(
            algorithm=algorithm,
            client_lr=0.05,
            momentum=0.9,
            batch_size=8,
            theta=theta,
            seed=3,
            server_round=2,
            partition_id=pid,
            participation=0.5,
            **cfg,
        )
        out.append(ClientInput(x, y, tc, initial, **extra))
    return out


def train_one_by_one(model_name: str, clients: list[Any], device: Any = None) -> list[Any]:
    """Each client through :func:`client.train.local_train` (the ClientApp's training) on ``device`` (CPU)."""
    import torch

    from client.models import build_model
    from client.train import local_train

    device = device or torch.device("cpu")
    results = []
    for c in clients:
        model = build_model(model_name)
        model.load_state_dict({k: torch.as_tensor(v) for k, v in c.initial.items()})
        results.append(
            local_train(
                model.to(device),
                c.x,
                c.y,
                MEAN,
                STD,
                c.cfg,
                correction=c.correction,
                momentum_term=c.momentum_term,
                anchor=c.anchor,
                device=device,
            )
        )
    return results
