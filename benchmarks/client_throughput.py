"""Client-side figures: JPEG-tarball decode (cold / warm cache), fresh-process load cost, and local-training
throughput of the CNN and ResNet-20 with augmentation.

    python -m benchmarks.client_throughput --source /data/cifar10-jpeg.tar.gz --threads 2

The cold decode uses a fresh temporary cache directory (removed afterwards), so the user's cache is untouched.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time

import torch

from benchmarks.cli_args import require_data
from client.data import load_dataset
from client.models import build_model
from client.partition import dirichlet_partition
from client.train import TrainConfig, local_train

LOAD_SNIPPET = """
import time; t0 = time.perf_counter()
from client.app import get_dataset, get_partition; from client import config as C
cfg = C.resolve({{C.DATA_ROOT: {root!r}, C.CACHE_DIR: {cache!r}, C.NUM_PARTITIONS: 100, C.ALPHA: 0.1}})
t1 = time.perf_counter(); get_partition(cfg); t2 = time.perf_counter()
print(round(t1 - t0, 3), round(t2 - t1, 3))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", required=True, help="CIFAR-10 ImageFolder tree or .tar.gz")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2, help="local epochs per measured client")
    parser.add_argument("--clients", type=int, default=3, help="clients (500 images each) per model")
    args = parser.parse_args()
    if min(args.threads, args.epochs, args.clients) < 1:
        parser.error("--threads, --epochs and --clients must be >= 1")
    require_data(parser, "--source", args.source)
    torch.set_num_threads(args.threads)
    out: dict[str, float] = {}
    cache = tempfile.mkdtemp(prefix="fm-bench-")
    try:
        t = time.perf_counter()
        ds = load_dataset("cifar10_folder", args.source, cache)
        out["decode_cold_s"] = time.perf_counter() - t
        t = time.perf_counter()
        ds = load_dataset("cifar10_folder", args.source, cache)
        out["load_warm_s"] = time.perf_counter() - t
        # what a fresh flwr-clientapp process pays: imports + mmap load, then the partition
        res = subprocess.run(
            [sys.executable, "-c", LOAD_SNIPPET.format(root=args.source, cache=cache)],
            capture_output=True,
            text=True,
            check=True,
        )
        out["fresh_process_import_load_s"], out["fresh_process_partition_s"] = map(float, res.stdout.split())

        parts = dirichlet_partition(ds.y_train, 100, 0.1, seed=0)
        for name in ("cnn", "resnet20"):
            model = build_model(name)
            cfg = TrainConfig("fedavgm", 0.05, local_epochs=args.epochs, batch_size=64, loss_before_batches=0)
            images, seconds = 0, 0.0
            for i in range(args.clients + 1):  # client 0 warms up
                idx = parts[i]
                r = local_train(model, ds.x_train[idx], ds.y_train[idx], ds.mean, ds.std, cfg)
                if i:
                    images += args.epochs * len(idx)
                    seconds += r.metrics["train-time"]
            out[f"{name}_images_per_s_incl_loss_before"] = images / seconds
            cfg_train_only = TrainConfig(
                "fedavgm", 0.05, local_epochs=args.epochs, batch_size=64, loss_before_batches=1
            )
            t = time.perf_counter()
            for i in range(1, args.clients + 1):
                local_train(model, ds.x_train[parts[i]], ds.y_train[parts[i]], ds.mean, ds.std, cfg_train_only)
            out[f"{name}_train_images_per_s"] = images / (time.perf_counter() - t)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(json.dumps({k: round(v, 3) for k, v in out.items()}, indent=1))


if __name__ == "__main__":
    main()
