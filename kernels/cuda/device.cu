#include <cuda_runtime.h>

#include <string>

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

std::string DeviceDescription() {
  if (DeviceCount() == 0) return "";
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "";
  return absl::StrFormat("%s (sm_%d%d, %d SMs, %.1f GiB)", prop.name, prop.major, prop.minor,
                         prop.multiProcessorCount, prop.totalGlobalMem / double(1 << 30));
}

}  // namespace thetaserve::kernels::cuda
