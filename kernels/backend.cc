#include "kernels/backend.h"

#include "absl/strings/str_format.h"
#include "kernels/cpu/cpu_backend.h"

#if THETASERVE_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace thetaserve::kernels {

int64_t NumLogitRows(const ForwardBatch& batch) {
  int64_t rows = 0;
  for (const SeqChunk& seq : batch.seqs) {
    if (batch.all_logits) {
      rows += seq.num_tokens;
    } else if (seq.want_logits && seq.num_tokens > 0) {
      rows += 1;
    }
  }
  return rows;
}

bool CudaAvailable() {
#if THETASERVE_HAVE_CUDA
  return cuda::DeviceCount() > 0;
#else
  return false;
#endif
}

// The only place that asks whether CUDA is built in.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const model::Model& model, Device device,
                                                       int threads, MatMulMode matmul) {
  if (device == Device::kAuto) device = CudaAvailable() ? Device::kCuda : Device::kCpu;
  if (device == Device::kCuda) {
#if THETASERVE_HAVE_CUDA
    return cuda::CreateCudaBackend(model);
#else
    return absl::UnimplementedError(
        "this build has no CUDA backend (nvcc was not found at configure time); use --device cpu");
#endif
  }
  return std::unique_ptr<Backend>(new cpu::CpuBackend(model, threads, matmul));
}

}  // namespace thetaserve::kernels
