"""``hydra/launcher=stacked``: a multirun of ``flower-simulation`` as one program per group of jobs that share a
shape (:mod:`server.stacked`)."""
