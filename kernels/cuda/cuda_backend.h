// The CUDA backend: the LLaMA-family forward pass on one GPU. Weights live on the device in
// bf16 (GGUF blocks dequantized at load), GEMMs go through cuBLAS (bf16 in, f32 accumulate),
// the residual stream stays f32, K/V pages are bf16, attention is paged (dense or Top-θ).
// Built only when nvcc is found (THETASERVE_HAVE_CUDA=1); CUDA errors come out as Status.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace thetaserve::kernels::cuda {

// Visible CUDA devices; 0 when there is no driver or no device (never an error).
int DeviceCount();

// Name, compute capability and memory of device 0, for logs ("" when none).
std::string DeviceDescription();

// The CUDA Backend on device 0: uploads the weights (bf16) and creates the cuBLAS handle.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const model::Model& model);

// CUDA graphs of decode steps captured so far by this process's CUDA backends (tests and
// benchmarks: a capture costs far more than a replay).
int64_t GraphsCaptured();

}  // namespace thetaserve::kernels::cuda
