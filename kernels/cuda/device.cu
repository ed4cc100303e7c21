#include <cuda_runtime.h>

#include "absl/strings/str_format.h"
#include "kernels/cuda/cuda_backend.h"

namespace thetaserve::kernels::cuda {

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const model::Model& model) {
  const int count = DeviceCount();
  if (count == 0) {
    return absl::UnavailableError("no CUDA device is visible; use --device cpu");
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  return absl::UnimplementedError(absl::StrFormat(
      "found %s (sm_%d%d) but the CUDA forward pass is not built yet; use --device cpu",
      prop.name, prop.major, prop.minor));
}

}  // namespace thetaserve::kernels::cuda
