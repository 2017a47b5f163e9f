"""The environment variables that decide where and how precisely a process's clients compute (no torch here, so
the config checks can read them before any heavy import).

``$FEDMOMENTUM_DEVICE``: the torch device of the ClientApp's training and of the evaluation (``cpu``, ``cuda``,
``cuda:N``); the batched engine sets it from ``engine.device`` for itself and its workers. Unset: CUDA when visible.
``$FEDMOMENTUM_TF32``: ``1`` lets cuDNN and cuBLAS round float32 products to TF32 on CUDA (faster; a CNN drifted
5–9 % from the CPU's model in 3 rounds, docs/benchmarks.md "GPU check"); ``0`` or unset keeps float32.
"""

from __future__ import annotations

import os
import re

DEVICE_ENV = "FEDMOMENTUM_DEVICE"
TF32_ENV = "FEDMOMENTUM_TF32"
DEVICE = re.compile(r"(cpu|cuda(:\d+)?|mps|meta)")


def check_environment() -> None:
    """Raise ValueError (one line naming the variable) when either variable holds something unusable."""
    tf32 = os.environ.get(TF32_ENV, "")
    if tf32 not in ("", "0", "1"):
        raise ValueError(f"${TF32_ENV} must be 0 or 1 (TF32 on CUDA), got {tf32!r}")
    device = os.environ.get(DEVICE_ENV, "")
    if device and not DEVICE.fullmatch(device):
        raise ValueError(f"${DEVICE_ENV} must be a torch device: cpu, cuda or cuda:N, got {device!r}")


def tf32_allowed() -> bool:
    """Whether ``$FEDMOMENTUM_TF32`` is 1."""
    return os.environ.get(TF32_ENV, "0") == "1"
