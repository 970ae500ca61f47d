#!/usr/bin/env bash
# Runs on the GPU machine against binaries built elsewhere (scripts/stage_device.sh puts them in
# .device_bin/): every GPU test, the gradient checks, a short training run and the benchmark.
# Usage: scripts/gpu_check.sh [OUTDIR] [--sanitize] [--quick]   (--quick: no benchmark)
# Logs go to OUTDIR (default: $OUT when set, else logs/gpu_check). Exits non-zero if any GPU test
# fails or is skipped on a machine that has a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-logs/gpu_check}"
sanitize=0
quick=0
for a in "$@"; do
  case "$a" in
    --sanitize) sanitize=1 ;;
    --quick) quick=1 ;;
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

step "GPU tests (CNN_REQUIRE_GPU=1: a skip is a failure)"
CNN_REQUIRE_GPU=1 "$bin/cnn_gpu_tests" 2>&1 > "$out/gpu_tests.log"
rc=$?
grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/gpu_tests.log" || true
grep -E '^\[  FAILED  \]' "$out/gpu_tests.log" | head -20
[ $rc -eq 0 ] || fail "GPU tests exited $rc"
grep -q '^\[  SKIPPED \]' "$out/gpu_tests.log" && fail "GPU tests were skipped on a GPU machine"

step "gradient checks on the GPU"
"$bin/gradcheck" --device cuda > "$out/gradcheck.log" 2>&1 || fail "gradcheck (cuda)"
tail -5 "$out/gradcheck.log"

if [ $sanitize -eq 1 ]; then
  for tool in memcheck racecheck synccheck; do
    step "compute-sanitizer $tool"
    CNN_REQUIRE_GPU=1 compute-sanitizer --tool $tool --error-exitcode 9 \
      "$bin/cnn_gpu_tests" --gtest_filter='-*Large*:*Huge*:*Grid*' > "$out/sanitize_$tool.log" 2>&1 \
      || fail "compute-sanitizer $tool"
    grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$out/sanitize_$tool.log" | tail -3
  done
fi

if [ -f data/mnist/train-images-idx3-ubyte.gz ] || [ -f data/mnist/train-images-idx3-ubyte ]; then
  step "training run (configs/mnist.yaml)"
  "$bin/train" --config configs/mnist.yaml --device cuda --set logging.progress=off \
    --log-dir "$out/mnist" > "$out/train_mnist.log" 2>&1 || fail "mnist training run"
  grep -E "test:|done" "$out/train_mnist.log" | tail -4
fi
if { [ -f data/fashion-mnist/train-images-idx3-ubyte.gz ] || [ -f data/fashion-mnist/train-images-idx3-ubyte ]; }; then
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

echo
[ $status -eq 0 ] && echo "gpu_check: all passed" || echo "gpu_check: FAILED"
exit $status
