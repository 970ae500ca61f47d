#!/usr/bin/env bash
# On the GPU machine: builds the programs and the GPU test binary for sm_90 with the headers and
# static libraries that scripts/stage_devkit.sh put in .devkit/, and puts them where
# scripts/gpu_check.sh expects them (.device_bin/). Usage: scripts/build_on_device.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
b=${1:-build-device}
kit=$PWD/.devkit
# The commit the tree was staged at (the copy's own git history, if any, may be older).
hash=$(cat "$kit/commit" 2>/dev/null || true)
cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  ${hash:+-DCNN_GIT_HASH="$hash"} \
  -DCNN_LINK_PROGRAMS=OFF -DCMAKE_PREFIX_PATH="$kit" \
  -DGTest_DIR="$kit/lib/x86_64-linux-gnu/cmake/GTest" \
  -DZLIB_LIBRARY=/usr/lib/x86_64-linux-gnu/libz.so.1 -DZLIB_INCLUDE_DIR="$kit/include" >/dev/null
ninja -C "$b" -j "$(nproc)" train infer quantize bench gradcheck cnn_gpu_tests
rm -rf .device_bin && mkdir -p .device_bin
for f in train infer quantize bench gradcheck cnn_gpu_tests libcnn.so; do cp "$b/bin/$f" .device_bin/; done
