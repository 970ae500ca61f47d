#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and synccheck on the GPU tests of the model-zoo kernels:
# grouped/depthwise convolution, batchnorm, average and global average pooling, dropout, the
# residual add, label smoothing, the wgmma GEMM, and the whole step (plain, graph, deterministic)
# of residual and BatchNorm networks. Light sweeps (CNN_TEST_NETWORK_BATCH set: the long shape
# sweeps run a sample of their shapes, every code path still covered; network cases at batch 16).
#
# Usage: scripts/sanitize_kernels.sh OUTDIR [GTEST_FILTER]
#   SAN_TOOLS (memcheck racecheck synccheck), SAN_TIMEOUT (seconds per run, default 270) and
#   SAN_SHARDS (gtest shards per tool; default: the cores shared out, racecheck twice the share).
# Writes OUTDIR/sanitize_<tool>.log (its shards joined) and OUTDIR/sanitize_summary.txt, one line
# per tool with its ERROR SUMMARY / RACECHECK SUMMARY counts; exits 1 unless every tool is clean
# and every shard passed. The three tools run side by side, so the wall time is the slowest one's:
# under 5 minutes on an H200 host (16 cores), bounded by SAN_TIMEOUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/sanitize_kernels.sh OUTDIR [GTEST_FILTER]}"
filter="${2:-GpuConv2dGrouped.*:GpuBatchNorm.*:GpuAvgPool.*:GpuGlobalAvgPool.*:GpuDropout.*:GpuAdd.*:GpuLabelSmoothing.*:GpuGemmWgmma.*:GpuResidual.*:GpuNormNetwork.*}"
tools="${SAN_TOOLS:-memcheck racecheck synccheck}"
mkdir -p "$out"

bin=""
for b in .device_bin/cnn_gpu_tests build/bin/cnn_gpu_tests; do
  [ -x "$b" ] && { bin="$b"; break; }
done
[ -n "$bin" ] || { echo "sanitize_kernels: no cnn_gpu_tests (.device_bin/ or build/bin/)" >&2; exit 2; }
command -v compute-sanitizer > /dev/null \
  || { echo "sanitize_kernels: compute-sanitizer is not on PATH" >&2; exit 2; }
export CNN_SOURCE_DIR="$PWD" CNN_TRAIN_BINARY="$PWD/.device_bin/train"

# Racecheck instruments every shared-memory access and is the slowest: twice the shards.
cores=$(nproc)
weight=0
for tool in $tools; do [ "$tool" = racecheck ] && weight=$((weight + 2)) || weight=$((weight + 1)); done
# A shard past SAN_TIMEOUT is killed by timeout, but compute-sanitizer's target can outlive it and
# keep the GPU busy (it distorted a benchmark run after this script once). Every process started
# here carries this marker in its environment; on exit, whatever still carries it is killed.
marker="sanitize_kernels.$$.$RANDOM"
kill_leftovers() {
  local e pid
  for e in /proc/[0-9]*/environ; do
    pid=${e#/proc/}
    pid=${pid%/environ}
    [ "$pid" = "$$" ] && continue
    grep -qz "^CNN_SANITIZE_MARKER=$marker\$" "$e" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  done
  return 0
}
trap kill_leftovers EXIT

declare -A shards=()
start=$SECONDS
for tool in $tools; do
  n=${SAN_SHARDS:-$(( (cores - 1) / weight ))}
  [ -z "${SAN_SHARDS:-}" ] && [ "$tool" = racecheck ] && n=$((n * 2))
  [ "$n" -ge 1 ] || n=1
  shards[$tool]=$n
  for ((i = 0; i < n; i++)); do
    CNN_SANITIZE_MARKER=$marker GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i CNN_REQUIRE_GPU=1 \
      CNN_TEST_NETWORK_BATCH=16 \
      timeout -k 20 "${SAN_TIMEOUT:-270}" compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$bin" --gtest_filter="$filter" > "$out/san_${tool}_$i.log" 2>&1 &
  done
done
for job in $(jobs -p); do wait "$job" || true; done
kill_leftovers

status=0
: > "$out/sanitize_summary.txt"
for tool in $tools; do
  cat "$out/san_${tool}"_[0-9]*.log > "$out/sanitize_$tool.log" && rm -f "$out/san_${tool}"_[0-9]*.log
  log="$out/sanitize_$tool.log"
  passed=$(grep -cE '^\[  PASSED  \]' "$log")
  cases=$(grep -E '^\[  PASSED  \]' "$log" | grep -oE '[0-9]+ test' | awk '{s+=$1} END {print s+0}')
  errors=$(grep -oE '(ERROR SUMMARY|RACECHECK SUMMARY): [0-9]+' "$log" | awk '{s+=$NF} END {print s+0}')
  summaries=$(grep -cE '(ERROR SUMMARY|RACECHECK SUMMARY):' "$log")
  line="$tool: $errors errors/hazards in $summaries summaries; $passed of ${shards[$tool]} shards passed ($cases test cases)"
  if [ "$errors" -ne 0 ] || [ "$passed" -ne "${shards[$tool]}" ] || grep -qE '^\[  FAILED  \]' "$log"; then
    line="$line: FAIL"
    status=1
  else
    line="$line: clean"
  fi
  echo "$line" | tee -a "$out/sanitize_summary.txt"
  grep -E '^\[  FAILED  \]|^\[  SKIPPED \]|Terminated' "$log" | sort -u | head -10
done
echo "sanitize_kernels: $((SECONDS - start)) s (filter $filter)" | tee -a "$out/sanitize_summary.txt"
exit $status
