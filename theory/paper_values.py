"""Values printed in paper 1 Tables I and II (theta^T after T = 10^6 iterations), transcribed verbatim.

These are the *paper's* numbers, used only as the comparison column; every "ours" value is computed.
Columns of Table I: (G, theta0) in COLUMNS order; left half with momentum (beta = 0.9), right half without.
"""

from __future__ import annotations

COLUMNS: tuple[tuple[float, float], ...] = ((100.0, 0.0), (100.0, 10.0), (10.0, 0.0), (10.0, 10.0), (0.0, 10.0))

# (schedule, param) rows of Table I; param = alpha (poly) or gamma (exp), None for constant
ROWS: tuple[tuple[str, float | None], ...] = (
    ("const", None),
    ("poly", 0.1),
    ("poly", 0.5),
    ("poly", 1.0),
    ("poly", 2.0),
    ("exp", 0.9999),
    ("exp", 0.999),
    ("exp", 0.99),
    ("exp", 0.9),
)

TABLE1_MOMENTUM: tuple[tuple[float, ...], ...] = (
    (2.5e-05, 2.5e-05, 2.5e-06, 2.5e-06, 5.7e-08),
    (7.2e00, 7.2e00, 7.2e-01, 7.2e-01, -5.0e-324),
    (2.5e-02, 2.5e-02, 2.5e-03, 2.5e-03, 1.5e-323),
    (2.5e-05, 2.5e-05, 2.5e-06, 2.5e-06, -1.7e-78),
    (4.8e01, 5.7e01, 4.8e00, 1.4e01, 9.0e00),
    (1.5e-17, 1.5e-17, 2.4e-18, 2.4e-18, -1.5e-323),
    (1.8e-17, 1.8e-17, -6.3e-18, -6.3e-18, -1.7e-163),
    (1.1e-14, 9.8e-15, 1.1e-15, -3.5e-16, -1.5e-15),
    (-7.2e00, -6.2e00, -7.2e-01, -2.4e01, 9.5e-01),
)

TABLE1_PLAIN: tuple[tuple[float, ...], ...] = (
    (1.5e-05, 3.7e00, 1.5e-06, 3.7e00, 3.7e00),
    (7.2e00, 7.2e00, 7.2e-01, 7.0e-01, 5.0e-324),
    (2.5e-02, 2.5e-02, 2.5e-03, 2.5e-03, 9.4e-322),
    (-8.6e-06, -8.3e-06, -8.6e-07, -6.0e-07, 2.6e-07),
    (-1.9e01, -1.9e01, -1.9e00, -1.8e00, 1.0e-01),
    (1.9e-17, 1.9e-17, 2.3e-18, 2.3e-18, 0.0e00),
    (2.3e-17, 2.3e-17, 7.0e-18, 7.0e-18, 0.0e00),
    (1.5e-16, 1.5e-16, 1.8e-18, 1.8e-18, 1.1e-65),
    (-1.0e-04, -8.2e-05, -1.0e-05, 1.1e-05, 2.2e-05),
)

# Table II: alpha = 1, G = 10, beta = 0.9; rows = initial step, columns theta0 = 0, 10
TABLE2_COLUMNS: tuple[float, ...] = (0.0, 10.0)
TABLE2: dict[str, tuple[float, float]] = {
    "(1+beta)/(mu(1-beta)) - eps": (2.5e-06, 2.5e-06),
    "1/mu - eps": (-3.9e-06, -1.2e-04),
}

ROUNDOFF = 1e-12  # |value| below this is round-off noise: compared as "both ~ 0"
