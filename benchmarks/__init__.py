"""Timing scripts: each measures and prints figures (seconds per round, throughput, overheads, the convex study's
compute bound) of the engines, the clients, the deployment, the theory package and paper 2's natural tasks. Each
runs as ``python -m benchmarks.<module> --help``; ``benchmarks/gpu_concurrent.sh`` times several convex-study runs
at once on one machine."""
