"""Correctness checks that run outside the test suite, mostly on a CUDA machine: the batched engine on CUDA against
the ClientApp on CPU (:mod:`checks.gpu_equality`), the GPU readiness check of the presets and of the convex study's
run (:mod:`checks.gpu_check`), stacked float32 training against the one-client loop (:mod:`checks.stacked_float32`)
and how far a rounding-level difference travels in local training (:mod:`checks.float32_flips`);
``checks/gpu_all.sh`` runs the GPU checks one after another. :mod:`checks.engine_cases` holds the small cases these
checks share with the engine-equality tests. Each module with a command line runs as
``python -m checks.<module> --help``."""
