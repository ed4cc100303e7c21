#!/usr/bin/env bash
# Packs the GPU tests and benchmark, built here with nvcc, for a GPU machine that lacks the
# build dependencies (gRPC, Abseil, GoogleTest): DIR/bin holds the binaries, DIR/lib the
# shared libraries they need beyond glibc, libstdc++, the driver and cuBLAS (which the GPU
# machine provides). Then, there: scripts/gpu-check.sh --prebuilt DIR. Through the device tool
# (64 MiB a call) scripts/gpu-stage.sh carries DIR and the model in parts and prints the calls.
#
#   scripts/gpu-pack.sh [DIR]   (default .devbin; git-ignored)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.devbin}
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTHETASERVE_CUDA=ON >/dev/null
cmake --build build -j"$(nproc)" --target gpu_ops_test gpu_attention_test gpu_forward_test device_batch_test gpu_engine_test \
  thetaserve_gpu_bench thetaserve_attention_bench
rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/lib"
cp build/tests/gpu_ops_test build/tests/gpu_attention_test build/tests/gpu_forward_test \
  build/tests/device_batch_test build/tests/gpu_engine_test \
  build/thetaserve_gpu_bench build/thetaserve_attention_bench "$dir/bin/"
for b in "$dir"/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}'
done | sort -u | grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libcublas|libcublasLt|libcuda)\.so' |
  while read -r lib; do cp -L "$lib" "$dir/lib/"; done
strip "$dir"/bin/* "$dir"/lib/* 2>/dev/null || true
du -sh "$dir"
