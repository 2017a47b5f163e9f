"""How far a rounding-level difference travels in local training, and why (docs/benchmarks.md "GPU check").

    python -m checks.float32_flips                       # CNN, float32, generated images, 120 steps
    python -m checks.float32_flips --model logreg
    python -m checks.float32_flips --dtype float64
    python -m checks.float32_flips --data /path/to/cifar10/train   # an ImageFolder tree of 32x32 images

Two copies of a model train on the same augmented batches with the client's step (SGD, client lr, weight decay):
one from θ⁰, one from θ⁰ with every entry moved one ulp up or down (``checks.gpu_equality.one_ulp_nudge``, the
``cpu_perturbed`` variant); ``--nudge-at k`` moves it after k steps instead (logistic regression starts from 0,
whose one-ulp neighbours are denormals that the first step absorbs). Each step prints the normwise relative
difference of the two models and, for the CNN, how many activations differ in kind between them: a pre-activation
of a ReLU on the other side of 0, or a 2x2 max-pool window whose maximum is at another position. Where the gradient
is smooth (logistic regression) and the step stable (η below ~2/L) the difference stays at rounding level; where
the gradient is not smooth, a flip turns it into a jump, and flips multiply. Prints one line per step and a JSON
summary: the first flip, the first jump (the difference grows ≥ 10× in one step) with the difference before and
after it, and the last difference.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from checks.engine_cases import MEAN, STD
from checks.gpu_equality import PERTURB_SEED, one_ulp_nudge, relative
from client.augment import normalise, random_crop_flip
from client.models import build_model


def load_images(data: Path | None, per_class: int, work: Path) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 (n, 32, 32, 3), labels) from an ImageFolder tree, or generated images (tools/datagen.py)."""
    from PIL import Image

    if data is None:
        from tools.datagen import make_image_folder

        data = make_image_folder(work / "generated", per_class=per_class, test_per_class=1, seed=1) / "train"
    classes = sorted(p.name for p in data.iterdir() if p.is_dir())
    files = [(f, c) for c, name in enumerate(classes) for f in sorted((data / name).iterdir())[:per_class]]
    if not files:
        raise SystemExit(f"float32_flips: no images under {data}")
    images = np.stack([np.asarray(Image.open(f).convert("RGB")) for f, _ in files])
    return images, np.array([c for _, c in files])


class Activations:
    """The pre-activations of the CNN's ReLUs (conv1, conv2, fc1, fc2) in the last forward pass."""

    LAYERS = ("conv1", "conv2", "fc1", "fc2")

    def __init__(self, model: torch.nn.Module) -> None:
        self.out: dict[str, torch.Tensor] = {}
        for name in self.LAYERS:
            getattr(model, name).register_forward_hook(self._keep(name))

    def _keep(self, name: str):
        def hook(module, inputs, output):
            self.out[name] = output.detach()

        return hook


def flips(a: Activations, b: Activations) -> dict[str, int]:
    """Activations that differ in kind: ReLU sign (every layer) and max-pool argmax (the two conv layers)."""
    out = {f"{n} relu": int(((a.out[n] > 0) != (b.out[n] > 0)).sum()) for n in Activations.LAYERS}
    for n in ("conv1", "conv2"):
        _, ia = F.max_pool2d(F.relu(a.out[n]), 2, return_indices=True)
        _, ib = F.max_pool2d(F.relu(b.out[n]), 2, return_indices=True)
        out[f"{n} max-pool"] = int((ia != ib).sum())
    return out


def difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """gpu_equality's normwise relative difference of two models' parameters."""

    def arrays(m: torch.nn.Module) -> dict:
        return {k: p.detach().numpy() for k, p in m.named_parameters()}

    return relative(arrays(a), arrays(b))


def nudge(model: torch.nn.Module) -> None:
    """Move every parameter entry of ``model`` one ulp (``gpu_equality.one_ulp_nudge``, its seed)."""
    rng = np.random.default_rng(PERTURB_SEED)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(one_ulp_nudge(p.numpy(), rng)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("cnn", "logreg"), default="cnn")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--client-lr", type=float, default=0.05)
    parser.add_argument("--weight-decay", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--per-class", type=int, default=12, help="images per class (generated, or the first ones)")
    parser.add_argument("--data", type=Path, help="an ImageFolder train/ tree (default: generated images)")
    parser.add_argument("--nudge-at", type=int, default=0, help="nudge the second copy after this many steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/float32_flips"))
    args = parser.parse_args(argv)
    if args.steps < 1 or args.client_lr <= 0 or args.batch_size < 1 or args.per_class < 1:
        parser.error("--steps, --client-lr, --batch-size and --per-class must be positive")
    if not 0 <= args.nudge_at < args.steps:
        parser.error(f"--nudge-at must be in 0..{args.steps - 1}")
    if args.weight_decay < 0:
        parser.error("--weight-decay must be >= 0")
    if args.data is not None and not args.data.is_dir():
        parser.error(f"--data {args.data}: not a folder (an ImageFolder train/ tree of class folders)")
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(1)
    images, labels = load_images(args.data, args.per_class, args.work)
    torch.manual_seed(args.seed)
    models = [build_model(args.model).to(dtype)]
    models.append(copy.deepcopy(models[0]))
    acts = [Activations(m) for m in models] if args.model == "cnn" else None
    optimisers = [torch.optim.SGD(m.parameters(), lr=args.client_lr, weight_decay=args.weight_decay) for m in models]
    batches = np.random.default_rng(args.seed)
    history = []
    for step in range(1, args.steps + 1):
        if step == args.nudge_at + 1:
            nudge(models[1])
        index = batches.choice(len(images), min(args.batch_size, len(images)), replace=False)
        x = torch.from_numpy(images[index]).permute(0, 3, 1, 2).to(dtype).div(255)
        x = normalise(random_crop_flip(x, torch.Generator().manual_seed(step)), MEAN, STD)
        y = torch.from_numpy(labels[index])
        for model, optimiser in zip(models, optimisers):
            optimiser.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimiser.step()
        row = {
            "step": step,
            "difference": difference(models[1], models[0]),
            "flips": {k: v for k, v in flips(*acts).items() if v} if acts else {},
        }
        history.append(row)
        print(f"step {step:4d}  rel. diff {row['difference']:.3g}  " + json.dumps(row["flips"]))
    flipped = next((r["step"] for r in history if r["flips"]), None)
    jump = next((r for r, prev in zip(history[1:], history) if r["difference"] >= 10 * prev["difference"] > 0), None)
    summary = {
        "model": args.model,
        "dtype": args.dtype,
        "steps": args.steps,
        "client_lr": args.client_lr,
        "nudge_at": args.nudge_at,
        "after_nudge": history[args.nudge_at]["difference"],
        "first_flip_step": flipped,
        "first_jump_step": jump and jump["step"],
        "before_first_jump": jump and history[jump["step"] - 2]["difference"],
        "at_first_jump": jump and jump["difference"],
        "last": history[-1]["difference"],
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
