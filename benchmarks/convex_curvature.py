"""Where the remaining gap of a convex run lies: the curvature along its error and the step mass it received.

    python benchmarks/convex_curvature.py RUN_DIR...        # runs of one objective (same data, split, μ)

For each run directory (``model=logreg`` with ``eval_gap``; docs/convex.md) it reads the final model x_T and the
per-round learning rates of metrics.csv, takes w* from the f* cache (solved if absent) and prints one JSON line:

- ``gap``: f(x_T) − f*, and ``quadratic``: ½ eᵀ∇²f(w*) e with e = x_T − w* (how well the quadratic model holds);
- ``rayleigh``: eᵀ∇²f(w*) e / ‖e‖², the curvature of the direction the error lies along (μ ≤ it ≤ L);
- ``step_mass``: the total step of the server model as one gradient descent, K Σ_t η_t for LocalUpdate* (q is the
  sum of K gradients: seed 001 Algorithm 1) and K Σ_t η_t η_l,t for the FedAvg family (momentum not counted), with
  K the local steps of a round (one epoch of ⌈n_i / B⌉ batches). Along a direction of curvature λ the deterministic
  part of the error shrinks by about exp(−λ · step_mass) when λ η_t K ≪ 1, so directions with λ < 1 / step_mass
  are not yet traversed.

The numbers are diagnostics of one final point, not a model of the noise floor.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from server.convex.optimum import objective, optimum  # noqa: E402
from server.report.metrics import read_metrics  # noqa: E402
from server.run.build import server_dataset  # noqa: E402


def local_steps(cfg: dict, n_i: int) -> int:
    """Batches of one local epoch of a client with n_i examples (client.batch_size, last batch kept)."""
    return math.ceil(n_i / int(cfg["client"]["batch_size"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="convex_curvature.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories with final_model.npz and config.json")
    args = parser.parse_args(argv)
    for run in args.runs:
        if not (run / "final_model.npz").exists() or not (run / "config.json").exists():
            parser.error(f"{run} has no final_model.npz or config.json (a finished run directory is needed)")
    cfgs = [json.loads((run / "config.json").read_text()) for run in args.runs]
    first = cfgs[0]
    key = (first["data"]["name"], first["num_clients"], first["client"]["weight_decay"], first["data"]["alpha"])
    for run, cfg in zip(args.runs, cfgs):
        if (cfg["data"]["name"], cfg["num_clients"], cfg["client"]["weight_decay"], cfg["data"]["alpha"]) != key:
            parser.error(f"{run} has another objective than {args.runs[0]} (data, num_clients, μ or alpha)")
    ds = server_dataset(first)
    obj = objective(first, ds)
    opt = optimum(first, ds, obj)
    n_i = round(len(ds.y_train) / int(first["num_clients"]))
    for run, cfg in zip(args.runs, cfgs):
        with np.load(run / "final_model.npz") as npz:
            x = obj.flatten({k: npz[k] for k in npz.files})
        e = x - opt.w
        he = obj.hessp(opt.w, e)
        rows = read_metrics(run)
        rows = [r for r in rows if r["round"] >= 1 and r.get("server_lr") is not None]
        eta = np.array([r["server_lr"] for r in rows], dtype=float)
        if not str(cfg["strategy"]["name"]).startswith("localupdate"):
            eta = eta * np.array([r["client_lr"] for r in rows], dtype=float)
        record = {"run": str(run), "rounds": int(len(eta)), "gap": float(obj.value(x) - opt.f_star),
                  "quadratic": float(0.5 * e @ he), "error_norm": float(np.linalg.norm(e)),
                  "rayleigh": float(e @ he / (e @ e)), "mu": obj.mu,
                  "step_mass": float(local_steps(cfg, n_i) * eta.sum()), "eta_end": float(eta[-1])}
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
