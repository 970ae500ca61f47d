#!/usr/bin/env bash
# The model-zoo step benchmark: the zoo's nets at batch 128, our training step
# (./bench --step: one step per CUDA-graph replay, synthetic data on the device) and PyTorch's
# (scripts/torch_baseline.py: the same net and SGD step, CUDA graph and eager) in the same call,
# one Markdown table: net, precision, ours us/step, PyTorch graph, PyTorch eager, graph/ours.
#
# Usage: scripts/bench_zoo.sh OUTDIR [PRECISIONS] [NET...]
#   PRECISIONS  comma-separated, default fp32,tf32,bf16; each is passed to ./bench --precision
#               and torch_baseline.py --precision as it is (torch_baseline runs bf16 as autocast
#               with FP32 master weights)
#   NET         config names under configs/ (default: mnist fashion_mnist resnet_fashion
#               mobilenet_fashion vgg_cifar), or paths of .yaml files (named by their stem, e.g.
#               configs/probes/resnext_like.yaml); synthetic data, so no dataset is needed
#   BATCH (128), STEP_REPEATS (200, ./bench), TORCH_STEPS (50 steps x 5 windows): environment
#   PASSES=1    also every pass of each net and precision against cuDNN/cuBLAS (./bench
#               --no-step; PASS_BUDGET seconds of timed samples a row, default 0.1), a second
#               table in zoo.md; it validates every variant against the CPU reference, so it
#               takes much longer than the steps
# Writes under OUTDIR: zoo.md (the tables and the commands, by scripts/zoo_table.py),
# ours_<net>_<prec>.{csv,log}, torch_<net>.{csv,log}, passes_<net>_<prec>.{csv,log}. Without
# an importable torch with CUDA it says so in one line and the PyTorch columns read "-". Exits
# non-zero when one of our measurements failed.
# Expected on an H200: ~10 s per net and precision of ours (start-up, autotune, 410 steps), ~15 s
# per net of PyTorch (import, cudnn.benchmark, 2 x 250 steps per precision): ~3 minutes in all.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/bench_zoo.sh OUTDIR [PRECISIONS] [NET...]}"
precs="${2:-fp32,tf32,bf16}"
shift $(($# >= 2 ? 2 : $#))
nets=("$@")
[ ${#nets[@]} -gt 0 ] || nets=(mnist fashion_mnist resnet_fashion mobilenet_fashion vgg_cifar)
batch="${BATCH:-128}"
mkdir -p "$out"

bench=""
for b in .device_bin/bench build/bin/bench ./bench; do
  [ -x "$b" ] && { bench="$b"; break; }
done
[ -n "$bench" ] || { echo "bench_zoo: no bench binary (.device_bin/bench, build/bin/bench or ./bench)" >&2; exit 2; }

have_torch=1
why=$(python3 -c 'import torch; assert torch.cuda.is_available(), "no CUDA device for torch"' 2>&1) \
  || { have_torch=0; echo "bench_zoo: PyTorch not usable ($(echo "$why" | tail -1)); the PyTorch columns are skipped"; }

status=0
start=$SECONDS
names=()
for arg in "${nets[@]}"; do
  if [[ "$arg" == *.yaml ]]; then
    cfg="$arg"
    net="$(basename "$arg" .yaml)"
  else
    cfg="configs/$arg.yaml"
    net="$arg"
  fi
  [ -f "$cfg" ] || { echo "bench_zoo: $cfg not found" >&2; status=1; continue; }
  names+=("$net")
  for p in ${precs//,/ }; do
    echo "bench_zoo: ours $net $p"
    timeout -k 10 "${OURS_TIMEOUT:-120}" "$bench" --config "$cfg" --step --no-lib --no-peaks \
      --precision "$p" --step-batches "$batch" --step-repeats "${STEP_REPEATS:-200}" \
      --csv "$out/ours_${net}_$p.csv" > "$out/ours_${net}_$p.log" 2>&1 \
      || { echo "bench_zoo: ours $net $p failed (exit $?): $(tail -1 "$out/ours_${net}_$p.log")"; status=1; }
    if [ "${PASSES:-0}" = 1 ]; then
      echo "bench_zoo: passes $net $p"
      timeout -k 10 "${PASSES_TIMEOUT:-900}" "$bench" --config "$cfg" --no-step --no-peaks \
        --batch "$batch" --precision "$p" --time-budget "${PASS_BUDGET:-0.1}" \
        --csv "$out/passes_${net}_$p.csv" \
        > "$out/passes_${net}_$p.log" 2>&1 \
        || { echo "bench_zoo: passes $net $p failed (exit $?): $(tail -1 "$out/passes_${net}_$p.log")"; status=1; }
    fi
  done
  if [ $have_torch -eq 1 ]; then
    echo "bench_zoo: torch $net $precs"
    timeout -k 10 "${TORCH_TIMEOUT:-150}" python3 scripts/torch_baseline.py --config "$cfg" --no-ops \
      --batches "$batch" --precision "$precs" --steps "${TORCH_STEPS:-50}" --windows 5 \
      --step-csv "$out/torch_$net.csv" > "$out/torch_$net.log" 2>&1 \
      || echo "bench_zoo: torch $net failed (exit $?; not ours): $(tail -1 "$out/torch_$net.log")"
  fi
done

python3 scripts/zoo_table.py "$out" "$batch" "$precs" "$have_torch" "$bench" "${names[@]}"
echo "bench_zoo: $((SECONDS - start)) s; table in $out/zoo.md"
exit $status
