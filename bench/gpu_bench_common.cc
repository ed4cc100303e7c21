#include "bench/gpu_bench_common.h"

#include <cmath>
#include <cstdint>

namespace thetaserve::bench::gpu {

double CopyBandwidth(int repeats) {
  const size_t bytes = size_t(2) << 30;  // 2 GiB each way: far beyond the 60 MB L2
  void *src, *dst;
  CHECK_CUDA(cudaMalloc(&src, bytes));
  CHECK_CUDA(cudaMalloc(&dst, bytes));
  CHECK_CUDA(cudaMemset(src, 1, bytes));
  const double ms = TimeMs([&] { CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); },
                           5, repeats);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * bytes / (ms / 1e3);
}

std::vector<Row>& Summary() {
  static std::vector<Row> rows;
  return rows;
}

StepInputs::StepInputs(int B, int H, int kvh, int d) {
  std::vector<float> host(size_t(B) * H * d);
  uint64_t st = 12345;
  for (float& x : host) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    const double u1 = ((st >> 11) + 1.0) / 9007199254740993.0;
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    const double u2 = (st >> 11) / 9007199254740992.0;
    x = float(3.0 * std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2));
  }
  CHECK_CUDA(cudaMalloc(&q, host.size() * 4));
  CHECK_CUDA(cudaMalloc(&out, host.size() * 4));
  CHECK_CUDA(cudaMalloc(&vsum, size_t(B) * kvh * d * 4));
  CHECK_CUDA(cudaMemcpy(q, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(vsum, 0, size_t(B) * kvh * d * 4));
}

StepInputs::~StepInputs() {
  cudaFree(q);
  cudaFree(out);
  cudaFree(vsum);
}

ts::model::ThetaTable InverseLTheta(int H, float c) {
  ts::model::ThetaTable table(1, H, ts::model::ThetaTable::DefaultBuckets(1 << 18));
  table.k_per_layer = {16};
  table.placement = ts::model::ThetaPlacement::kPostSoftmax;
  for (int h = 0; h < H; ++h)
    for (size_t k = 0; k < table.buckets().size(); ++k) table.theta_at(0, h, k) = c / table.buckets()[k];
  table.Finalize();
  return table;
}

ts::model::ThetaTable ConstantPreTheta(int H, float theta) {
  ts::model::ThetaTable table(1, H, ts::model::ThetaTable::DefaultBuckets(1 << 18));
  table.k_per_layer = {16};
  table.placement = ts::model::ThetaPlacement::kPreSoftmax;
  for (int h = 0; h < H; ++h)
    for (size_t k = 0; k < table.buckets().size(); ++k) table.theta_at(0, h, k) = theta;
  table.Finalize();
  return table;
}

}  // namespace thetaserve::bench::gpu
