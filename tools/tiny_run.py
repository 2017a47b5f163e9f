"""The overrides of a tiny but complete ``flower-simulation`` experiment, shared by the end-to-end tests and
:mod:`tools.signal_stress`."""

from __future__ import annotations

from pathlib import Path


def sim_args(data: dict, run_dir: Path, *extra: str) -> list[str]:
    """Overrides of a tiny but complete experiment (4 clients, 2 rounds, CNN, 2 local steps; ``extra`` last)."""
    return [
        f"data.root={data['tarball']}",
        f"data.cache_dir={data['cache']}",
        "num_clients=4",
        "num_rounds=2",
        "participation.fraction=0.5",
        "client.local_steps=2",
        "client.batch_size=8",
        "client.torch_threads=1",
        "eval_max_examples=20",
        "plots=false",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]
