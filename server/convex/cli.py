"""``flower-optimum``: f* of a run's population objective (docs/convex.md), one JSON line on stdout.

    flower-optimum model=logreg client.weight_decay=1e-3 +experiment=fedavg_cnn      # the same overrides as a run
    {"f_star": 1.61..., "mu": 0.001, "grad_norm": 6.1e-09, "converged": true, "cached": false, ...}

It takes the Hydra config of ``flower-simulation`` (data, normalisation, num_clients, data.alpha and seed fix the
split, whose client weights enter f as in ``pop_loss``) and solves (or reads from the cache) f* = min f. Exit codes:
0 solved to ‖∇f‖₂ ≤ 1e-8; 2 invalid configuration (a non-convex model, μ < 0, bad data: one line, before any work);
1 the solver stopped above the tolerance (μ = 0 on separable data: f* is not attained; nothing is cached).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from server.run import config as config_lib
from server.run import hydra_errors

HELP = """\
usage: flower-optimum [OVERRIDE ...]

flower-optimum: f* = min f of a convex run's population objective, printed as one JSON line on stdout.

It takes the Hydra overrides of flower-simulation (data, normalisation, num_clients, data.alpha and seed fix the
split, whose client weights enter f as in the pop_loss column), needs model=logreg, and solves f(w) = pop_loss(w)
+ (mu/2)|w|^2 with mu = client.weight_decay in float64 to |grad f| <= 1e-8, or reads f* from its cache. A run with
eval_train=true eval_gap=true logs pop_gap = f(x) - f* every evaluated round (docs/convex.md).

examples:
  flower-optimum +experiment=fedavg_cnn model=logreg client.weight_decay=1e-3
  {"f_star": 1.61..., "mu": 0.001, "grad_norm": 6.1e-09, "converged": true, "cached": false, ...}

exit status: 0 solved; 2 invalid configuration (a non-convex model, mu < 0, bad data: one line, before any work);
1 the solver stopped above the tolerance (mu = 0 on separable data: f* is not attained; nothing is cached).
"""

MU_ZERO_WARNING = (
    "flower-optimum: warning: μ = client.weight_decay = 0: f is convex but not strongly convex — its "
    "minimisers are never unique (the softmax shift) and on separable data f* = 0 is not attained; "
    "the solver still stops at ‖∇f‖₂ ≤ 1e-8 (converged true: f* is the value there) or reports "
    "converged false with the lowest value found, exit 1, nothing cached"
)


def compose(overrides: Sequence[str]) -> dict:
    """The plain config ``flower-simulation`` would run with these Hydra overrides (no run directory)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(config_lib.CONF_DIR), version_base=None):
        cfg = hydra_compose("config", overrides=[*overrides, "run_dir=null"])  # no run: no run directory to check
    return config_lib.to_plain(cfg)


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: ``flower-optimum [HYDRA OVERRIDES...]``."""
    from server.convex.checks import check_convex

    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(HELP, end="")
        return
    try:
        try:
            cfg = compose(argv)
        except Exception as err:  # Hydra's own errors: unknown group or key, bad override syntax
            raise config_lib.ConfigError(hydra_errors.describe(err)) from None
        mu = check_convex(cfg, "'model.name'")
        config_lib.validate(cfg)
    except config_lib.ConfigError as err:
        print(f"flower-optimum: invalid configuration: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if mu == 0:
        print(MU_ZERO_WARNING, file=sys.stderr)
    from server.convex.optimum import optimum
    from server.run.data import server_dataset

    found = optimum(cfg, server_dataset(cfg))
    print(json.dumps(found.record()), flush=True)
    if not found.converged:
        raise SystemExit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
