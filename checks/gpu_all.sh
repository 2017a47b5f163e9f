#!/usr/bin/env bash
# Every GPU check of the project, one after another, on a CUDA machine (docs/benchmarks.md "GPU check"):
#   checks/gpu_all.sh OUT [DATA]            # from the project's root
# OUT gets environment.txt, gpu_equality.{md,json,log} (checks/gpu_equality.py: the batched engine on CUDA
# against the ClientApp on CPU) and gpu_check.{md,json,log} (checks/gpu_check.py: speed of the presets and of
# the convex study's run). DATA: CIFAR-10 as .tar.gz or ImageFolder (generated images when not given or
# absent). PYTHON (default python3), EQUALITY_TIMEOUT (s, default 200), CHECK_BUDGET (s, default 240) and
# CONCURRENT (e.g. "8 16": then benchmarks/gpu_concurrent.sh too, ~3 min more; it needs DATA) and SCALING (e.g.
# "logreg cnn resnet20": then benchmarks/stacked_scaling.py too, 1/8/32/64 jobs of each, within SCALING_BUDGET s,
# default 300) from the environment. On a machine without Flower: checks/gpu_wheels.txt. Exit status: 0 when every check passed.
set -uo pipefail
out=${1:?usage: checks/gpu_all.sh OUT [DATA]}
data=${2:-}
py=${PYTHON:-python3}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
{
  "$py" -c 'import platform, torch, flwr, os; print("python", platform.python_version(), "torch", torch.__version__,
"cuda", torch.version.cuda, "flwr", flwr.__version__, "cpus", os.cpu_count())'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
} > "$out/environment.txt"
cat "$out/environment.txt"
timeout "${EQUALITY_TIMEOUT:-200}" "$py" -m checks.gpu_equality --out "$work/equality" > "$out/gpu_equality.log" 2>&1
equality=$?
cp "$work"/equality/gpu_equality.{md,json} "$out"/ 2>/dev/null
echo "gpu_equality: exit $equality"
"$py" -m checks.gpu_check ${data:+--data "$data"} --rounds 4 --convex-rounds 1000 --budget "${CHECK_BUDGET:-240}" \
  --out "$out" > "$out/gpu_check.log" 2>&1
check=$?
echo "gpu_check: exit $check"
if [ -n "${CONCURRENT:-}" ]; then
  # shellcheck disable=SC2086  # CONCURRENT is a list of counts
  benchmarks/gpu_concurrent.sh "$out" "$data" 200 $CONCURRENT > "$out/gpu_concurrent.log" 2>&1
  cat "$out/concurrent.txt" 2>/dev/null
fi
if [ -n "${SCALING:-}" ]; then
  # shellcheck disable=SC2086  # SCALING is a list of models
  "$py" -m benchmarks.stacked_scaling ${data:+--data "$data"} --models $SCALING --budget "${SCALING_BUDGET:-300}" \
    --out "$work/scaling" > "$out/stacked_scaling.log" 2>&1
  echo "stacked_scaling: exit $?"
  cp "$work"/scaling/scaling.{md,json} "$out"/ 2>/dev/null
fi
cat "$out"/gpu_equality.md "$out"/gpu_check.md "$out"/scaling.md 2>/dev/null
[ "$equality" = 0 ] && [ "$check" = 0 ]
