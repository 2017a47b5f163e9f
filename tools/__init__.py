"""Helpers for development: generated CIFAR-like images (:mod:`tools.datagen`) and small or full-size copies of
paper 2's natural tasks in their hub schemas (:mod:`tools.natural_datagen`), used by the tests, checks and
benchmarks; private Ray temp dirs, the processes of one run and ``ray start`` nodes (:mod:`tools.raytools`); CPU
seconds per process kind of a command (:mod:`tools.proc_cpu`) and a stress run of signals during Ray's start-up
(:mod:`tools.signal_stress`). Each module with a command line runs as ``python -m tools.<module> --help``."""
