#!/usr/bin/env bash
# Installs what is missing (Debian/Ubuntu packages), then configures and builds into build/.
# python3-matplotlib is for scripts/plot_metrics.py (the training curves as a PNG).
# Safe to run again: installed packages are skipped and the build is incremental.
# Extra arguments go to CMake's configure step, e.g. -DCMAKE_CUDA_ARCHITECTURES=90.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake git python3 libcli11-dev libspdlog-dev libfmt-dev libyaml-cpp-dev
          libstb-dev libgtest-dev zlib1g-dev nlohmann-json3-dev python3-matplotlib)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all packages present"
fi

jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$jobs"
echo "setup: built ./train ./infer ./bench ./gradcheck"; ./train --version || true
