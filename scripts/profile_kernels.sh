#!/usr/bin/env bash
# Nsight Compute profile of the kernels of one training step of configs/mnist.yaml (batch 128),
# FP32 and TF32, on the GPU machine against the staged binaries (.device_bin/, see gpu_check.sh).
# The step runs with training.algo=fast: start-up tuning would launch every variant of every
# pass dozens of times, and ncu replays each launch ~40 times; fast is the variant `auto` picks
# for conv2 and fc1 on this network (./bench's summary). The first 40 launches are the first
# (plain, uncaptured) step.
# Usage: scripts/profile_kernels.sh OUTDIR    (CONFIG=configs/vgg_cifar.yaml, PRECISIONS="tf32 bf16",
#   LAUNCHES=60 profile another net, other precisions or more launches; the defaults are the above)
# Writes OUTDIR/ncu_{fp32,tf32}.csv (details page) and OUTDIR/ncu_summary.md (one row per
# kernel). --clock-control none: the GPU machine's clocks are left alone.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: profile_kernels.sh OUTDIR}"
mkdir -p "$out"
rc=0
: > "$out/ncu_summary.md"
config=${CONFIG:-configs/mnist.yaml}
for prec in ${PRECISIONS:-fp32 tf32}; do
  CNN_CUDA_GRAPH=0 timeout -k 10 "${PROFILE_TIMEOUT:-150}" ncu --clock-control none --csv --page details --launch-count "${LAUNCHES:-40}" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
    --section WarpStateStats --section ComputeWorkloadAnalysis \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    .device_bin/train --config "$config" --device cuda --set training.algo=fast \
    --set training.precision=$prec --set training.max_steps=2 --set logging.progress=off \
    --log-dir "$out/run_$prec" > "$out/ncu_$prec.csv" 2> "$out/ncu_$prec.err" || rc=$?
  rm -rf "$out/run_$prec"
  { echo "## $config, $prec, first training step"; echo
    python3 scripts/ncu_summary.py "$out/ncu_$prec.csv"; echo; } >> "$out/ncu_summary.md"
done
cat "$out/ncu_summary.md"
exit $rc
