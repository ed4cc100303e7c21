#!/usr/bin/env bash
# Configures and builds thetaserve into build/ (Release). The CUDA backend is built when nvcc is
# on PATH (or in /usr/local/cuda/bin); pass -DTHETASERVE_CUDA=OFF to skip it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j"$jobs"
echo "build: done -> build/thetaserve"
