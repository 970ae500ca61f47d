#!/usr/bin/env bash
# Nsight Compute profile of our kernels at the config's shapes (batch 128), on the GPU machine
# against the staged binaries (.device_bin/, see gpu_check.sh). Each op runs once as ./bench
# validates it and once per graph replay (--warmup 0 --launches 1 --repeats 1, no cuDNN/cuBLAS),
# so every kernel the op launches is profiled a few times; ncu_summary.py keeps the last one.
# Usage: scripts/profile_kernels.sh OUTDIR [OPS (bench --ops filter, default conv1,conv2,fc1)]
# Writes OUTDIR/ncu.csv (details page) and OUTDIR/ncu_summary.md. --clock-control none: the
# GPU machine's clocks are left alone (as for every other measurement there).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: profile_kernels.sh OUTDIR [OPS]}"
ops="${2:-conv1,conv2,fc1}"
mkdir -p "$out"
ncu --clock-control none --graph-profiling node --csv --page details \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
  --section WarpStateStats --section ComputeWorkloadAnalysis \
  --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
  .device_bin/bench --config configs/mnist.yaml --ops "$ops" --algos auto --no-lib --no-step \
  --no-peaks --precision both --warmup 0 --launches 1 --repeats 1 > "$out/ncu.csv" 2> "$out/ncu.err"
rc=$?
python3 scripts/ncu_summary.py "$out/ncu.csv" > "$out/ncu_summary.md"
cat "$out/ncu_summary.md"
exit $rc
