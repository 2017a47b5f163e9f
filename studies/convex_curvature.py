"""Where the remaining gap of a convex run lies: the curvature along its error and the step mass it received.

    python -m studies.convex_curvature RUN_DIR...        # runs of one objective (same data, split, μ)

For each run directory (``model=logreg`` with ``eval_gap``; docs/convex.md) it reads the final model x_T and the
per-round learning rates of metrics.csv, takes w* from the f* cache (solved if absent) and prints one JSON line:

- ``gap``: f(x_T) − f*, and ``quadratic``: ½ eᵀ∇²f(w*) e with e = x_T − w* (how well the quadratic model holds);
- ``rayleigh``: eᵀ∇²f(w*) e / ‖e‖², the curvature of the direction the error lies along (μ ≤ it ≤ L);
- ``step_mass``: the total step of the server model as one gradient descent, K Σ_t η_t for LocalUpdate* (q is the
  sum of K gradients: paper 2's Algorithm 1) and K Σ_t η_t η_l,t for the FedAvg family (momentum not counted), with
  K the local steps of a round (one epoch of ⌈n_i / B⌉ batches). Along a direction of curvature λ the deterministic
  part of the error shrinks by about exp(−λ · step_mass) when λ η_t K ≪ 1, so directions with λ < 1 / step_mass
  are not yet traversed.

With ``--flow M1,M2,...`` it also prints, for each step mass M, where noise-free gradient descent on the quadratic
model at w* would stand after a total step M from the runs' start x_0 = 0: e_M = exp(−∇²f(w*) M)(−w*), with
‖e_M‖ and ½ e_Mᵀ∇²f(w*) e_M from a Lanczos quadrature of the spectral measure of w* (``--lanczos`` steps, full
reorthogonalisation; the printout repeats it with half the steps as a convergence check). Then, per run, the
``matched_mass``: the M at which that descent is as far from w* as the run (‖e_M‖ = ‖x_T − w*‖), its ``bias`` =
½ e_Mᵀ∇²f(w*) e_M (the part of the gap a noise-free descent that far would still have, almost all of it along
low-curvature directions) and ``excess`` = gap − bias (what the run's noise, heterogeneity and surrogate add).

    python -m studies.convex_curvature RUN_DIR... --flow 40,80,400

With ``--replay`` it replays, per run, the run's own algorithm (momentum included) with its logged rates on the same
quadratic model, every client's gradient the population's (:mod:`studies.convex_replay`), from the same quadrature:
``replay_error_norm`` (where the noise-free algorithm stands; the run's ‖x_T − w*‖ beside it tests the model),
``replay_bias`` = its ½ e_Tᵀ∇²f(w*) e_T and ``replay_excess`` = gap − replay_bias, with the half-step quadrature's
values as a convergence check.

    python -m studies.convex_curvature RUN_DIR... --replay [--plot replay.png]

``--plot`` draws, per configuration (strategy, β, rates; the mean over its runs), the run's f(x^t) − f* and its
replay's bias every 10 rounds on a log scale.

The numbers are diagnostics of one final point under a quadratic model, not a model of the noise floor.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from client.train import num_local_steps
from server.convex.optimum import objective, optimum
from server.report.metrics import read_metrics
from server.report.run_plots import aggregate_runs
from server.run.data import server_dataset
from server.run.errors import ConfigError, first_line, make_dir
from studies.convex_replay import plot_replays, replay_check, replay_error, replay_label, replay_path


def local_steps(cfg: dict, n_i: int) -> int:
    """J of a client with n_i examples, as the client takes it (``client.train.num_local_steps``): client.local_steps
    when positive, else local_epochs × ⌈n_i / batch_size⌉ (last batch kept)."""
    client = cfg["client"]
    return num_local_steps(
        n_i, int(client["batch_size"]), int(client.get("local_epochs", 1)), int(client.get("local_steps", 0))
    )


def lanczos_measure(matvec, v0: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes θ_j and weights τ_j² (Σ τ_j² = 1) of the Gauss quadrature of v0's spectral measure:
    v0ᵀ φ(H) v0 ≈ ‖v0‖² Σ_j τ_j² φ(θ_j) (Golub-Meurant); full reorthogonalisation."""
    basis = np.zeros((steps, v0.size))
    alpha, beta = np.zeros(steps), np.zeros(steps)
    q = v0 / np.linalg.norm(v0)
    for j in range(steps):
        basis[j] = q
        w = matvec(q)
        alpha[j] = q @ w
        w -= basis[: j + 1].T @ (basis[: j + 1] @ w)
        w -= basis[: j + 1].T @ (basis[: j + 1] @ w)
        beta[j] = np.linalg.norm(w)
        if j + 1 == steps or beta[j] < 1e-12:
            steps = j + 1
            break
        q = w / beta[j]
    tri = np.diag(alpha[:steps]) + np.diag(beta[: steps - 1], 1) + np.diag(beta[: steps - 1], -1)
    nodes, vectors = np.linalg.eigh(tri)
    return nodes, vectors[0] ** 2


def flow(nodes: np.ndarray, weights: np.ndarray, norm2: float, mass: float) -> tuple[float, float]:
    """‖e_M‖ and ½ e_Mᵀ H e_M for e_M = exp(−H M) e_0, from e_0's quadrature (nodes, weights, ‖e_0‖²)."""
    decay = np.exp(-2.0 * np.clip(nodes, 0.0, None) * mass)
    return float(np.sqrt(norm2 * weights @ decay)), float(0.5 * norm2 * weights @ (nodes * decay))


def matched_mass(fit: tuple[np.ndarray, np.ndarray], norm2: float, error_norm: float) -> float:
    """The step mass M at which the noise-free descent's ‖e_M‖ equals ``error_norm`` (bisection on log M; ‖e_M‖
    falls with M); 0 when the run is no nearer w* than its start."""
    if error_norm >= flow(*fit, norm2, 0.0)[0]:
        return 0.0
    low, high = 1e-6, 1e9
    for _ in range(200):
        mid = math.sqrt(low * high)
        low, high = (mid, high) if flow(*fit, norm2, mid)[0] > error_norm else (low, mid)
    return math.sqrt(low * high)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="convex_curvature.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories with final_model.npz and config.json")
    parser.add_argument("--flow", help="comma-separated step masses M: noise-free descent from 0 on the quadratic")
    parser.add_argument(
        "--replay",
        action="store_true",
        help="replay each run's algorithm and rates noise-free on the quadratic model (its own bias)",
    )
    parser.add_argument("--plot", type=Path, help="with --replay: PNG of each configuration's gap and its replay")
    parser.add_argument("--lanczos", type=int, default=160, help="Lanczos steps of --flow/--replay (default 160)")
    args = parser.parse_args(argv)
    try:
        masses = [float(m) for m in args.flow.split(",")] if args.flow else []
    except ValueError:
        parser.error(f"--flow must be comma-separated numbers, got {args.flow!r}")
    if any(not (m >= 0 and math.isfinite(m)) for m in masses) or args.lanczos < 2:
        parser.error("--flow masses must be finite and >= 0, --lanczos >= 2")
    if args.plot is not None and not args.replay:
        parser.error("--plot needs --replay")
    if args.plot is not None:
        try:  # written last of all: its folder is made before any work
            make_dir(args.plot.parent, "--plot's folder")
        except ConfigError as err:
            parser.error(str(err))
    for run in args.runs:
        if not (run / "final_model.npz").exists() or not (run / "config.json").exists():
            parser.error(f"{run} has no final_model.npz or config.json (a finished run directory is needed)")
    cfgs, keys = [], []
    for run in args.runs:
        try:
            cfg = json.loads((run / "config.json").read_text())
            reason = replay_check(cfg) if args.replay else None
            if reason is None:
                data, client = cfg["data"], cfg["client"]
                keys.append((data["name"], cfg["num_clients"], client["weight_decay"], data["alpha"]))
        except (OSError, ValueError, KeyError, TypeError) as err:
            parser.error(f"{run}/config.json cannot be read ({type(err).__name__}: {first_line(err)})")
        if reason is not None:
            parser.error(f"--replay: {run}: {reason}")
        cfgs.append(cfg)
    first = cfgs[0]
    for run, key in zip(args.runs, keys):
        if key != keys[0]:
            parser.error(f"{run} has another objective than {args.runs[0]} (data, num_clients, μ or alpha)")
    ds = server_dataset(first)
    obj = objective(first, ds)
    opt = optimum(first, ds, obj)
    n_i = round(len(ds.y_train) / int(first["num_clients"]))
    records: list[dict] = []
    for run, cfg in zip(args.runs, cfgs):
        with np.load(run / "final_model.npz") as npz:
            x = obj.flatten({k: npz[k] for k in npz.files})
        e = x - opt.w
        he = obj.hessp(opt.w, e)
        rows = read_metrics(run)
        rows = [r for r in rows if r["round"] >= 1 and r.get("server_lr") is not None]
        server_lr = np.array([r["server_lr"] for r in rows], dtype=float)
        client_lr = np.array([r["client_lr"] for r in rows], dtype=float)
        eta = server_lr if str(cfg["strategy"]["name"]).startswith("localupdate") else server_lr * client_lr
        record = {
            "run": str(run),
            "rounds": int(len(eta)),
            "gap": float(obj.value(x) - opt.f_star),
            "quadratic": float(0.5 * e @ he),
            "error_norm": float(np.linalg.norm(e)),
            "rayleigh": float(e @ he / (e @ e)),
            "mu": obj.mu,
            "step_mass": float(local_steps(cfg, n_i) * eta.sum()),
            "eta_end": float(eta[-1]),
        }
        print(json.dumps(record), flush=True)
        records.append({**record, "rates": (server_lr, client_lr), "cfg": cfg, "local_steps": local_steps(cfg, n_i)})
    if masses or args.replay:

        def hv(v: np.ndarray) -> np.ndarray:
            return obj.hessp(opt.w, v)

        e0 = -opt.w  # every run starts at w = 0
        norm2 = float(e0 @ e0)
        fits = [lanczos_measure(hv, e0, k) for k in (args.lanczos // 2, args.lanczos)]
        for mass in [0.0, *masses]:
            (n_half, g_half), (n_full, g_full) = (flow(*fit, norm2, mass) for fit in fits)
            print(
                json.dumps(
                    {
                        "flow_mass": mass,
                        "error_norm": n_full,
                        "quadratic": g_full,
                        "error_norm_half_steps": n_half,
                        "quadratic_half_steps": g_half,
                    }
                ),
                flush=True,
            )
        for record in records if masses else []:  # the mass whose noise-free descent is as far from w*: its bias
            mass = matched_mass(fits[1], norm2, record["error_norm"])
            bias = flow(*fits[1], norm2, mass)[1]
            print(
                json.dumps({"run": record["run"], "matched_mass": mass, "bias": bias, "excess": record["gap"] - bias}),
                flush=True,
            )
        curves: dict[str, dict[str, list]] = {}
        for record in records if args.replay else []:
            nodes = np.concatenate([fit[0] for fit in fits])  # both quadratures in one pass
            path = [(0, 0.5 * norm2 * float(fits[1][1] @ fits[1][0]))]
            factors = np.ones_like(nodes)
            for t, factors in enumerate(replay_path(record["cfg"], *record["rates"], record["local_steps"], nodes), 1):
                if args.plot is not None and t % 10 == 0:
                    path.append((t, replay_error(*fits[1], norm2, factors[fits[0][0].size :])[1]))
            curve = curves.setdefault(replay_label(record["cfg"]), {"runs": [], "replay": []})
            curve["runs"].append(record["run"])
            curve["replay"].append(path)
            (n_half, b_half), (n_full, b_full) = (
                replay_error(fit[0], fit[1], norm2, part)
                for fit, part in zip(fits, np.split(factors, [fits[0][0].size]))
            )
            print(
                json.dumps(
                    {
                        "run": record["run"],
                        "replay_error_norm": n_full,
                        "error_norm": record["error_norm"],
                        "replay_bias": b_full,
                        "replay_excess": record["gap"] - b_full,
                        "replay_error_norm_half_steps": n_half,
                        "replay_bias_half_steps": b_half,
                    }
                ),
                flush=True,
            )
        if args.plot is not None:
            measured = {label: aggregate_runs(curve["runs"], [], "pop_gap")[""] for label, curve in curves.items()}
            plot_replays(
                {
                    label: {
                        "measured": (measured[label]["round"], measured[label]["mean"]),
                        "replay": mean_curve(curve["replay"]),
                    }
                    for label, curve in curves.items()
                },
                str(args.plot),
            )
            print(json.dumps({"plot": str(args.plot)}), flush=True)


def mean_curve(parts: list[list[tuple[int, float]]]) -> tuple[np.ndarray, np.ndarray]:
    """The mean of the runs' replay curves at the rounds every run has (the measured ones: ``aggregate_runs``)."""
    common = sorted(set.intersection(*(set(dict(p)) for p in parts)))
    return np.array(common), np.array([np.mean([dict(p)[t] for p in parts]) for t in common])


if __name__ == "__main__":
    main()
