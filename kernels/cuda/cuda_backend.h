// The CUDA backend's entry points. Built only when nvcc is found (THETASERVE_HAVE_CUDA=1);
// CUDA errors stay inside kernels/ and come out as absl::Status.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace thetaserve::kernels::cuda {

// Visible CUDA devices; 0 when there is no driver or no device (never an error).
int DeviceCount();

// The CUDA Backend. Until the CUDA forward pass lands this reports UNIMPLEMENTED with the
// device it found, so `--device auto` keeps choosing the CPU.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const model::Model& model);

}  // namespace thetaserve::kernels::cuda
