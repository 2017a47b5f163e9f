#!/usr/bin/env bash
# Several convex-study runs at once on one machine (GPU or CPU): per-run seconds per round and the aggregate rate,
# which is what `python -m studies.convex_study --jobs N` gets there (docs/benchmarks.md "GPU check").
#   benchmarks/gpu_concurrent.sh OUT DATA [ROUNDS [N ...]]       # default 200 rounds; N = 8 16
# Each run: +sweep=convex_seed000, GHBM at eta = 1, eta_l = 0.001, seed i, eval_gap=false (no f* solve), f(x) every
# 50 rounds, one torch/OpenMP thread per process. First one run alone (it also fills the decode cache), then N at
# once for each N. Appends one line per batch to OUT/concurrent.txt. PYTHON (default python3), DEVICE (engine.device,
# default auto) from the environment.
set -uo pipefail
out=${1:?usage: benchmarks/gpu_concurrent.sh OUT DATA [ROUNDS [N ...]]}
data=${2:?usage: benchmarks/gpu_concurrent.sh OUT DATA [ROUNDS [N ...]]}
[ -e "$data" ] || { echo "gpu_concurrent.sh: no data at '$data'" >&2; exit 2; }
data=$(realpath "$data")
rounds=${3:-200}
shift $(( $# < 3 ? $# : 3 ))
counts=${*:-8 16}
py=${PYTHON:-python3}
for n in "$rounds" $counts; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "gpu_concurrent.sh: ROUNDS and N must be positive integers, got '$n'" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0
one() {  # NAME SEED
  "$py" -m server.run.cli +sweep=convex_seed000 method=ghbm strategy.server_lr=1.0 strategy.client_lr=0.001 \
    eval_gap=false "data.root=$data" "data.cache_dir=$work/cache" "num_rounds=$rounds" eval_every=50 eval_tail=0 \
    "checkpoint_every=$rounds" plots=false "engine.device=${DEVICE:-auto}" "seed=$2" "hydra.run.dir=$work/$1" \
    > "$work/$1.log" 2>&1 || echo "run $1 failed: $(tail -1 "$work/$1.log")" >&2
}
summary() {  # LABEL START DIR...
  "$py" - "$@" <<'PY'
import json, statistics, sys, time
label, wall, dirs = sys.argv[1], time.time() - float(sys.argv[2]), sys.argv[3:]
per, done = [], 0
for d in dirs:
    try:
        rows = [json.loads(line) for line in open(f"{d}/metrics.jsonl")]
    except OSError:
        continue
    per.append(statistics.median(r["seconds"] for r in rows if r["round"] >= 2 and r.get("pop_loss") is None))
    done += max(r["round"] for r in rows)
print(f"{label}: {len(per)}/{len(dirs)} runs, {done} rounds in {wall:.1f} s wall (start-up included): "
      f"{done / wall:.2f} rounds/s; median s/round per run {statistics.median(per):.4f} "
      f"(min {min(per):.4f}, max {max(per):.4f}); steady rate {sum(1 / p for p in per):.1f} rounds/s", flush=True)
PY
}
start=$EPOCHREALTIME
one solo 0
summary solo "$start" "$work/solo" | tee -a "$out/concurrent.txt"
for n in $counts; do
  start=$EPOCHREALTIME
  dirs=()
  for i in $(seq 1 "$n"); do one "c${n}_$i" "$i" & dirs+=("$work/c${n}_$i"); done
  wait
  summary "concurrent $n" "$start" "${dirs[@]}" | tee -a "$out/concurrent.txt"
done
