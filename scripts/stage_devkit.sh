#!/usr/bin/env bash
# Copies the third-party headers and static libraries the build needs (Debian packages here) into
# .devkit/ (git-ignored), so that a GPU machine without them can build the tree there
# (scripts/build_on_device.sh): a 16-core GPU machine compiles in minutes what a 2-core build
# machine takes much longer for. Carry .devkit with the call.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only the copied parts are replaced: other files kept in .devkit/ (scripts for the device) stay.
rm -rf .devkit/include .devkit/lib && mkdir -p .devkit/include .devkit/lib/x86_64-linux-gnu/cmake
for d in CLI spdlog fmt nlohmann yaml-cpp gtest gmock stb; do cp -r "/usr/include/$d" .devkit/include/; done
cp /usr/include/zlib.h /usr/include/zconf.h .devkit/include/
cp /usr/lib/x86_64-linux-gnu/libyaml-cpp.a .devkit/lib/
cp /usr/lib/x86_64-linux-gnu/libg{test,mock}*.a .devkit/lib/x86_64-linux-gnu/
cp -r /usr/lib/x86_64-linux-gnu/cmake/GTest .devkit/lib/x86_64-linux-gnu/cmake/
# The commit being staged, for the binaries' --version (plus "+changes" when the tree is dirty).
h=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || h="$h+changes"
echo "$h" > .devkit/commit
du -sh .devkit
