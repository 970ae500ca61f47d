#!/usr/bin/env bash
# ASan/UBSan and libFuzzer, CPU only. Builds build-asan/ with clang (-DCNN_SANITIZE=ON
# -DCNN_FUZZ=ON), runs the whole CPU test suite there under ASan/UBSan, then runs each fuzz
# target of fuzz/ for SECONDS on a copy of its seed corpus (fuzz/corpus/<target>/, never grown).
# Fails on any test failure, crash, sanitizer report, timeout or oversized allocation; a
# reproducer is left in build-asan/fuzz-work/<target>/ and named in the output.
#
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET]        (default 30)
#   build-asan/bin/fuzz_<target> CRASH_FILE         (replays one input)
#
# Environment: CNN_FUZZ_BUILD (default build-asan), CNN_FUZZ_SKIP_TESTS=1 (fuzz only),
# CNN_FUZZ_SEED (libFuzzer -seed; default 1, 0 = random),
# CNN_FUZZ_JOBS (fuzzers run side by side; default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-30}
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -gt 0 ]] || { echo "usage: $0 [SECONDS_PER_TARGET]" >&2; exit 2; }
build=${CNN_FUZZ_BUILD:-build-asan}
cores=$(nproc 2>/dev/null || echo 2)
jobs=${CNN_FUZZ_JOBS:-$cores}
targets=(idx image config safetensors list folder)
start=$SECONDS

# clang 14 with its compiler-rt (libFuzzer, ASan, UBSan) and llvm-symbolizer for readable
# reports, plus what scripts/setup.sh installs for the project itself.
packages=(clang-14 libclang-rt-14-dev llvm-14 cmake make git libcli11-dev libspdlog-dev libfmt-dev
          libyaml-cpp-dev libstb-dev libgtest-dev zlib1g-dev nlohmann-json3-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "fuzz: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
export PATH="/usr/lib/llvm-14/bin:$PATH"  # llvm-symbolizer

# -O2 keeps the tests' training runs fast enough; line tables make the reports point at lines;
# NDEBUG as in the Release build, so that what is fuzzed is what ships (stb_image's internal
# asserts fire on corrupt JPEGs that the release build refuses cleanly).
cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -gline-tables-only -DNDEBUG" \
  -DCNN_ENABLE_CUDA=OFF -DCNN_SANITIZE=ON -DCNN_FUZZ=ON -DCNN_LINK_PROGRAMS=OFF >/dev/null
# The CPU test executables and the fuzzers only (not ./bench, not the all-in-one GPU test binary).
build_targets=()
for f in tests/test_*.cpp; do
  t=$(basename "$f" .cpp)
  [ "$t" = test_util ] || build_targets+=("$t")
done
for t in "${targets[@]}"; do build_targets+=("fuzz_$t"); done
cmake --build "$build" -j "$cores" --target "${build_targets[@]}"
echo "fuzz: build done after $((SECONDS - start)) s"

export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
if [ "${CNN_FUZZ_SKIP_TESTS:-0}" != 1 ]; then
  t0=$SECONDS
  # Some tests ask for impossible allocations on purpose and expect std::bad_alloc, which ASan
  # only returns (instead of aborting) with allocator_may_return_null. The fuzzers run without it.
  if ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1} \
    ctest --test-dir "$build" -L cpu --output-on-failure -j "$cores"; then
    echo "fuzz: CPU test suite under ASan/UBSan passed ($((SECONDS - t0)) s)"
  else
    echo "fuzz: CPU test suite under ASan/UBSan FAILED" >&2
    status=1
  fi
fi

# libFuzzer's random seed: fixed by default, so that a CI run replays the same mutation sequence
# (a gate that passes today passes tomorrow on the same code); CNN_FUZZ_SEED=0 picks a new one
# each run, for exploring.
fuzz_seed=${CNN_FUZZ_SEED:-1}
# Each fuzzer on a fresh copy of its seeds. -malloc_limit_mb turns one allocation sized from
# untrusted input into a reported failure; -timeout does the same for a hang.
work="$build/fuzz-work"
rm -rf "$work"
run_one() {
  local t=$1 dir="$work/$1"
  mkdir -p "$dir/corpus" "$dir/tmp"
  cp -r "fuzz/corpus/$t/." "$dir/corpus/"
  local dict=()
  [ -f "fuzz/$t.dict" ] && dict=("-dict=fuzz/$t.dict")
  TMPDIR="$dir/tmp" ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "$build/bin/fuzz_$t" "$dir/corpus" "${dict[@]}" \
    -max_total_time="$seconds" -seed="$fuzz_seed" -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=25 \
    -print_final_stats=1 -artifact_prefix="$dir/" >"$dir/log" 2>&1
}
pids=()
names=()
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do sleep 1; done
  echo "fuzz: running fuzz_$t for $seconds s"
  run_one "$t" &
  pids+=($!)
  names+=("$t")
done
for i in "${!pids[@]}"; do
  t=${names[$i]}
  rc=0
  wait "${pids[$i]}" || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t/log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$work/$t/log" | tail -1 || true)
  if [ "$rc" -eq 0 ]; then
    printf 'fuzz: %-12s OK      %10s executions, %s\n' "$t" "${runs:-?}" "${cov:-cov: ?}"
  else
    status=1
    printf 'fuzz: %-12s FAILED  %10s executions (exit %d); log %s\n' "$t" "${runs:-?}" "$rc" \
      "$work/$t/log" >&2
    grep -E 'ERROR: |SUMMARY: |FUZZ INVARIANT|runtime error|Test unit written' "$work/$t/log" \
      | head -20 >&2 || true
  fi
done
echo "fuzz: finished in $((SECONDS - start)) s, status $status"
exit $status
