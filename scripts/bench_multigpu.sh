#!/usr/bin/env bash
# Data-parallel scaling: img/s of `train --gpus N` at per-GPU batch 128 for N = 1, 2, 4, 8 (as many
# as the machine has), against the ordinary one-GPU trainer at batch 128, with the accuracy after
# the same epochs and the all-reduce time per step from the training log.
#   scripts/bench_multigpu.sh [CONFIG ...]     (default: configs/mnist.yaml configs/resnet_fashion.yaml)
# Environment: TRAIN (default .device_bin/train if present, else ./train), EPOCHS (default 2),
#   BATCH (per GPU, default 128), GPUS (the list of N, default "1 2 4 8" up to the GPUs present),
#   OUT (default logs/bench_multigpu), CNN_NCCL_LIBRARY (where libnccl.so.2 is not on the
#   loader's path, e.g. the PyTorch install's nvidia/nccl/lib).
# img/s is the median of the logged training windows after the first (start-up, graph capture)
# of each run, over all GPUs together. Goals (issue 18): >= 1.85x on 2, >= 3.6x on 4, >= 7x on 8
# GPUs, accuracy within 0.3 points of one GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(configs/mnist.yaml configs/resnet_fashion.yaml)
if [ -z "${TRAIN:-}" ]; then
  if [ -x .device_bin/train ]; then TRAIN=.device_bin/train; else TRAIN=./train; fi
fi
[ -x "$TRAIN" ] || { echo "bench_multigpu: no train binary at '$TRAIN' (set TRAIN=...)" >&2; exit 2; }
epochs=${EPOCHS:-2}
batch=${BATCH:-128}
out=${OUT:-logs/bench_multigpu}
present=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$present" -ge 1 ] || { echo "bench_multigpu: no GPU found (nvidia-smi -L)" >&2; exit 2; }
gpus=()
for n in ${GPUS:-1 2 4 8}; do [ "$n" -le "$present" ] && gpus+=("$n"); done
mkdir -p "$out"

# median img/s of the train rows after the first, and the last eval accuracy (percent)
summarize() {
  python3 - "$1" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
ips = [float(r["images_per_s"]) for r in rows if r["phase"] == "train"][1:]
acc = [float(r["accuracy"]) for r in rows if r["phase"] == "eval"]
print(f"{statistics.median(ips) if ips else 0:.0f} {100 * acc[-1] if acc else float('nan'):.2f}")
PY
}

# "allreduce_ms waited_ms" from the last logged step with communication
comm_of() {
  grep -o 'all-reduce [0-9.]* ms/step, backward waited [0-9.]* ms' "$1" | tail -1 |
    awk '{print $2, $6}' || true
}

for config in "${configs[@]}"; do
  name=$(basename "$config" .yaml)
  common=(--config "$config" --set training.batch_size="$batch" --set training.epochs="$epochs"
          --set logging.progress=off --overwrite)
  echo "== $name: per-GPU batch $batch, $epochs epochs (runs in $out/$name-*)"
  "$TRAIN" "${common[@]}" --log-dir "$out/$name-plain" > "$out/$name-plain.out" 2>&1
  read -r base_ips base_acc < <(summarize "$out/$name-plain/metrics.csv")
  printf '%-10s %10s %8s %10s %9s %14s %12s\n' GPUs img/s speedup efficiency accuracy \
    all-reduce_ms waited_ms
  printf '%-10s %10s %8s %10s %9s %14s %12s\n' "1 (plain)" "$base_ips" 1.00 100% "$base_acc" - -
  for n in "${gpus[@]}"; do
    run="$out/$name-g$n"
    if ! "$TRAIN" "${common[@]}" --gpus "$n" --log-dir "$run" > "$run.out" 2>&1; then
      echo "$n GPUs: failed, see $run.out: $(tail -1 "$run.out")"
      continue
    fi
    read -r ips acc < <(summarize "$run/metrics.csv")
    read -r ar waited < <(comm_of "$run/train.log"; echo)
    python3 -c "
b, i, n = float('$base_ips'), float('$ips'), $n
print(f'{n:<10} {i:>10.0f} {i / b:>8.2f} {100 * i / b / n:>9.1f}% {\"$acc\":>9} {\"${ar:--}\":>14} {\"${waited:--}\":>12}')"
  done
done
