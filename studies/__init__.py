"""Study pipelines and analyses of finished runs: the convex study end to end through ``flower-simulation -m`` and
``flower-report`` (:mod:`studies.convex_study`), where the remaining gap of a convex run lies
(:mod:`studies.convex_curvature`, with the noise-free replay of :mod:`studies.convex_replay`) and f at the average of
a run's last server models (:mod:`studies.tail_average`). Each module with a command line runs as
``python -m studies.<module> --help``."""
