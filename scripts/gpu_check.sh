#!/usr/bin/env bash
# Runs on the GPU machine against binaries built elsewhere (scripts/stage_device.sh puts them in
# .device_bin/): every GPU test, the gradient checks, a short training run and the benchmark.
# Usage: scripts/gpu_check.sh [OUTDIR] [--sanitize[=TOOLS]] [--quick] [--no-train] [--no-tests]
#   --sanitize: compute-sanitizer memcheck, racecheck and synccheck (or only the comma-separated
#   TOOLS) on every GPU test case and a short training run; --sanitize-filter=GTEST_FILTER: only
#   those test cases under the sanitizers; --quick: no benchmark; --no-train: no training runs;
#   --no-tests: no plain GPU test run and no gradient check (for a call that only sanitizes);
#   --profile: last, an ncu profile of one training step's kernels (scripts/profile_kernels.sh).
#   The sanitizers' training runs happen only without --sanitize-filter.
#   SAN_TIMEOUT: seconds per sanitizer run (default 500). A full --sanitize does not fit one
#   10-minute device call; split it by tool, e.g. `--sanitize=racecheck --no-tests --no-train
#   --quick` in one call and `--sanitize=memcheck,synccheck` in the next.
# Logs go to OUTDIR (default: $OUT when set, else logs/gpu_check). Exits non-zero if any GPU test
# fails or is skipped on a machine that has a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-logs/gpu_check}"
sanitize=0
san_tools="memcheck racecheck synccheck"
quick=0
notrain=0
notests=0
profile=0
san_filter="*"
for a in "$@"; do
  case "$a" in
    --sanitize) sanitize=1 ;;
    --sanitize=*) sanitize=1; san_tools="${a#--sanitize=}"; san_tools="${san_tools//,/ }" ;;
    --quick) quick=1 ;;
    --no-train) notrain=1 ;;
    --no-tests) notests=1 ;;
    --profile) profile=1 ;;
    --sanitize-filter=*) san_filter="${a#--sanitize-filter=}" ;;
    *) out="$a" ;;
  esac
done
mkdir -p "$out"
bin=.device_bin
status=0
step() { echo; echo "=== $*"; }
fail() { echo "FAIL: $*"; status=1; }

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$out/device.txt"

# The test binaries were built elsewhere: point them at this checkout and at ./train.
export CNN_SOURCE_DIR="$PWD" CNN_TRAIN_BINARY="$PWD/$bin/train"

# Joins the shard logs "$out/$1_<i>.log" into "$out/$1.log" and removes them.
join_shards() { cat "$out/$1"_[0-9]*.log > "$out/$1.log" && rm -f "$out/$1"_[0-9]*.log; }
# Sums the "[  PASSED  ] N tests." lines of a joined log.
passed_cases() {
  grep -E '^\[  PASSED  \]' "$1" | grep -oE '[0-9]+ test' | awk '{s+=$1} END {print s+0}'
}

if [ $notests -eq 0 ]; then
  # The test cases check GPU results against single-threaded CPU references, so one process
  # spends most of its three minutes on the CPU: gtest shards side by side use the host's cores.
  step "GPU tests (CNN_REQUIRE_GPU=1: a skip is a failure; ${TEST_SHARDS:=8} shards side by side)"
  for ((i = 0; i < TEST_SHARDS; i++)); do
    GTEST_TOTAL_SHARDS=$TEST_SHARDS GTEST_SHARD_INDEX=$i CNN_REQUIRE_GPU=1 \
      "$bin/cnn_gpu_tests" > "$out/gpu_tests_$i.log" 2>&1 &
  done
  test_rc=0
  for job in $(jobs -p); do wait "$job" || test_rc=$?; done
  join_shards gpu_tests
  echo "$(passed_cases "$out/gpu_tests.log") test cases passed in $TEST_SHARDS shards"
  grep -E '^\[  FAILED  \]' "$out/gpu_tests.log" | sort -u | head -20
  [ $test_rc -eq 0 ] || fail "GPU tests exited $test_rc"
  [ "$(grep -cE '^\[  PASSED  \]' "$out/gpu_tests.log")" -eq "$TEST_SHARDS" ] \
    || fail "GPU tests: not every shard passed"
  grep -q '^\[  SKIPPED \]' "$out/gpu_tests.log" && fail "GPU tests were skipped on a GPU machine"

  # The dispatch cases again under a switch's other value (a process reads the CNN_* switches
  # once): the strided input gradients left to the other variants (CNN_WGMMA_NHWC_PHASES=0), as
  # the dispatch, autotune, the scratch sizing and the shared dy copy then see them.
  step "GPU tests of the dispatch with CNN_WGMMA_NHWC_PHASES=0"
  CNN_WGMMA_NHWC_PHASES=0 CNN_REQUIRE_GPU=1 "$bin/cnn_gpu_tests" \
    --gtest_filter='GpuConvWgmmaNhwc*.Dispatch:GpuConvWgmmaNhwc.Refusals:GpuConvSharedDy*:GpuConv2dGroupedDense*:GpuConv2dDilatedDense*:GpuConvNhwcScratch*' \
    > "$out/gpu_tests_switched.log" 2>&1 || fail "GPU tests with CNN_WGMMA_NHWC_PHASES=0"
  echo "$(passed_cases "$out/gpu_tests_switched.log") test cases passed with CNN_WGMMA_NHWC_PHASES=0"

  step "gradient checks on the GPU"
  "$bin/gradcheck" --device cuda > "$out/gradcheck.log" 2>&1 || fail "gradcheck (cuda)"
  tail -5 "$out/gradcheck.log"
fi

have_mnist() { [ -f datasets/mnist/train-images-idx3-ubyte.gz ] || [ -f datasets/mnist/train-images-idx3-ubyte ]; }

if [ $sanitize -eq 1 ]; then
  # compute-sanitizer slows kernels 10-100x (racecheck most), so the whole GPU test binary runs in
  # gtest shards side by side, every test case included, plus a short training run under each
  # tool. The cores are shared out among the chosen tools, racecheck (the slowest) taking twice
  # the share of another.
  step "compute-sanitizer $san_tools (all GPU test cases, sharded)"
  # The reference-network cases run at batch 16 there (tests/test_util.h: network_batch).
  # timeout -k: a trainer takes SIGTERM as "stop after this step", which under racecheck can be a
  # minute away; the KILL that follows makes sure nothing still runs when the benchmark starts.
  san_shards() {  # tool shards
    local tool=$1 n=$2 i
    for ((i = 0; i < n; i++)); do
      GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i CNN_REQUIRE_GPU=1 CNN_TEST_NETWORK_BATCH=16 \
        timeout -k 20 "${SAN_TIMEOUT:-500}" compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/cnn_gpu_tests" \
        --gtest_filter="$san_filter" > "$out/san_${tool}_$i.log" 2>&1 &
    done
  }
  san_full=0; [ "$san_filter" = "*" ] && san_full=1
  # The out-of-memory tests make cudaMalloc fail on purpose, which memcheck reports as API errors.
  case "$san_filter" in
    *-*) ;;
    *) san_filter="$san_filter-GpuFaults.Absurd*:GpuFaults.TooLarge*:GpuFaults.TrainBinaryExits*" ;;
  esac
  cores=$(nproc)
  weight=0
  for tool in $san_tools; do [ "$tool" = racecheck ] && weight=$((weight + 2)) || weight=$((weight + 1)); done
  declare -A shards=()
  for tool in $san_tools; do
    share=$(( (cores - 3) / weight ))  # three cores left for the training runs
    [ "$tool" = racecheck ] && share=$((share * 2))
    shards[$tool]=$(( share < 1 ? 1 : share ))
    san_shards "$tool" "${shards[$tool]}"
  done
  if have_mnist && [ $san_full -eq 1 ]; then
    # A short training run under each tool: batch 32, a 2% validation split, a checkpoint and the
    # final log. memcheck and synccheck run 10 steps with start-up tuning (every variant of every
    # pass); racecheck, which instruments every shared-memory access (~40 s a step), runs 4 steps
    # (plain, capture, two graph replays) on the default variants, tuning off: the test shards
    # cover every variant under it.
    for tool in $san_tools; do
      steps=10 tune=1
      [ "$tool" = racecheck ] && steps=4 tune=0
      CNN_AUTOTUNE=$tune timeout -k 20 "${SAN_TIMEOUT:-500}" compute-sanitizer --tool "$tool" --error-exitcode 9 \
        "$bin/train" --config configs/mnist.yaml --device cuda --set training.max_steps=$steps \
        --set training.batch_size=32 --set data.validation_split=0.02 \
        --set logging.progress=off --log-dir "$out/san_train_$tool" > "$out/san_train_$tool.log" 2>&1 &
    done
  fi
  for job in $(jobs -p); do wait "$job" || true; done
  for tool in $san_tools; do
    join_shards "san_$tool" && mv "$out/san_$tool.log" "$out/sanitize_$tool.log"
    ok=$(grep -cE '^\[  PASSED  \]' "$out/sanitize_$tool.log")
    clean=$(grep -cE '(ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards)' "$out/sanitize_$tool.log")
    echo "$tool: $ok of ${shards[$tool]} shards passed ($(passed_cases "$out/sanitize_$tool.log") test cases), $clean clean summaries"
    grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|FAILED|Timeout|Terminated' "$out/sanitize_$tool.log" | sort | uniq -c
    { [ "$ok" -ge 1 ] && ! grep -qE 'ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: [1-9]|\[  FAILED  \]' "$out/sanitize_$tool.log"; } \
      || fail "compute-sanitizer $tool"
    [ "$ok" -eq "${shards[$tool]}" ] || fail "$tool: not every shard finished"
    [ -f "$out/san_train_$tool.log" ] || continue
    echo "$tool on a training run: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/san_train_$tool.log" | tail -1)"
    grep -qE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' "$out/san_train_$tool.log" \
      || fail "$tool on a training run"
    rm -rf "$out/san_train_$tool"
  done
fi

if [ $notrain -eq 0 ] && have_mnist; then
  step "training run (configs/mnist.yaml)"
  "$bin/train" --config configs/mnist.yaml --device cuda --set logging.progress=off \
    --log-dir "$out/mnist" > "$out/train_mnist.log" 2>&1 || fail "mnist training run"
  grep -E "test:|done" "$out/train_mnist.log" | tail -4
fi
if [ $notrain -eq 0 ] && { [ -f datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || [ -f datasets/fashion-mnist/train-images-idx3-ubyte ]; }; then
  step "training run (configs/fashion_mnist.yaml)"
  "$bin/train" --config configs/fashion_mnist.yaml --device cuda --set logging.progress=off \
    --log-dir "$out/fashion" > "$out/train_fashion.log" 2>&1 || fail "fashion-mnist training run"
  grep -E "test:|done" "$out/train_fashion.log" | tail -4
fi

# cuDNN and cuBLAS for the benchmark's yardstick come from the PyTorch install there.
libs=$(python3 - <<'PY' 2>/dev/null
import importlib, os
dirs = []
for m in ("nvidia.cudnn", "nvidia.cublas", "nvidia.cu13", "nvidia.cuda_runtime"):
    try:
        p = importlib.import_module(m).__path__[0]
        for sub in ("lib", "lib64"):
            if os.path.isdir(os.path.join(p, sub)): dirs.append(os.path.join(p, sub))
    except Exception:
        pass
print(":".join(dirs))
PY
)
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if [ $quick -eq 0 ]; then
  step "benchmark"
  "$bin/bench" --config configs/mnist.yaml --markdown "$out/bench.md" --csv "$out/bench.csv" \
    > "$out/bench.log" 2>&1 || fail "bench"
  cat "$out/bench.md" 2>/dev/null || tail -30 "$out/bench.log"
  step "PyTorch baseline"
  timeout 240 python3 scripts/torch_baseline.py --config configs/mnist.yaml --markdown "$out/torch.md" \
    > "$out/torch.log" 2>&1 || echo "torch baseline failed (not a test failure)"
  cat "$out/torch.md" 2>/dev/null || tail -10 "$out/torch.log"
fi

if [ $profile -eq 1 ]; then
  step "ncu profile of our kernels (not a test)"
  bash scripts/profile_kernels.sh "$out/profile" || echo "profile failed (not a test failure)"
fi

echo
[ $status -eq 0 ] && echo "gpu_check: all passed" || echo "gpu_check: FAILED"
exit $status
