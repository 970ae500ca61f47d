#!/usr/bin/env bash
# Builds everything for the H200 (sm_90) on this machine and stages what the GPU machine needs
# in .device_bin/ (git-ignored): the programs, libcnn.so beside them and the all-in-one GPU test
# binary, stripped.
# The GPU machine compiles nothing; scripts/gpu_check.sh runs there against these files.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCNN_LINK_PROGRAMS=OFF "$@" >/dev/null
cmake --build build-gpu -j "$(nproc)" --target train infer bench gradcheck cnn_gpu_tests
rm -rf .device_bin && mkdir -p .device_bin
for f in train infer bench gradcheck cnn_gpu_tests libcnn.so; do
  cp "build-gpu/bin/$f" .device_bin/
done
cp -L "$(dirname "$(readlink -f /usr/local/cuda/bin/nvcc)")/../lib64/libcudart.so.13" .device_bin/  # beside them ($ORIGIN)
strip .device_bin/*
du -sh .device_bin
