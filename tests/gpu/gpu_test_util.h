// Helpers of the GPU tests: skip without a device, fresh seeds (printed, or THETASERVE_SEED),
// device arrays poisoned with NaN bytes and guarded on both sides, bf16 rounding.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/quant.h"

namespace thetaserve::testing {

#define SKIP_WITHOUT_CUDA_DEVICE()                                                        \
  do {                                                                                    \
    if (::thetaserve::kernels::cuda::DeviceCount() == 0)                                  \
      GTEST_SKIP() << "no CUDA device is visible: GPU tests need one (scripts/gpu-check.sh)"; \
  } while (0)

#define CUDA_ASSERT(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(expr)

// A fresh seed per test (THETASERVE_SEED overrides), shown on failure through SCOPED_TRACE.
inline uint64_t TestSeed() {
  if (const char* s = std::getenv("THETASERVE_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}

inline float RoundBf16(float f) { return model::BF16ToFloat(model::FloatToBF16(f)); }

// n elements of T in device memory between two guard regions; everything starts as 0xFF
// bytes (NaN for f32 and bf16), so unwritten outputs and stray writes are both visible.
template <typename T>
class GuardedArray {
 public:
  static constexpr size_t kGuard = 256;
  explicit GuardedArray(size_t n) : n_(n) {
    total_ = (n + 2 * kGuard) * sizeof(T);
    if (cudaMalloc(&base_, total_) != cudaSuccess) base_ = nullptr;
    if (base_) cudaMemset(base_, 0xFF, total_);
  }
  ~GuardedArray() { if (base_) cudaFree(base_); }
  GuardedArray(const GuardedArray&) = delete;
  GuardedArray& operator=(const GuardedArray&) = delete;

  bool ok() const { return base_ != nullptr; }
  T* get() const { return reinterpret_cast<T*>(static_cast<uint8_t*>(base_) + kGuard * sizeof(T)); }
  size_t size() const { return n_; }
  void Upload(const std::vector<T>& v) {
    cudaMemcpy(get(), v.data(), std::min(v.size(), n_) * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> Download() const {
    std::vector<T> v(n_);
    cudaMemcpy(v.data(), get(), n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
  // True when both guard regions still hold 0xFF bytes.
  ::testing::AssertionResult GuardsIntact() const {
    std::vector<uint8_t> all(total_);
    cudaMemcpy(all.data(), base_, total_, cudaMemcpyDeviceToHost);
    const size_t g = kGuard * sizeof(T);
    for (size_t i = 0; i < g; ++i) {
      if (all[i] != 0xFF) return ::testing::AssertionFailure() << "write before the array at byte -" << (g - i);
      if (all[total_ - g + i] != 0xFF) return ::testing::AssertionFailure() << "write past the array at byte +" << i;
    }
    return ::testing::AssertionSuccess();
  }

 private:
  void* base_ = nullptr;
  size_t n_ = 0, total_ = 0;
};

// Worst |a - b| / (atol + rtol·|b|) > 1 fails; NaN never passes.
inline ::testing::AssertionResult Close(const std::vector<float>& a, const std::vector<float>& b,
                                        float atol, float rtol, const char* what = "") {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << what << ": sizes " << a.size() << " vs " << b.size();
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) {
      return ::testing::AssertionFailure() << what << ": NaN at " << i << " (got " << a[i] << ", want " << b[i] << ")";
    }
    const double r = std::abs(double(a[i]) - b[i]) / (atol + rtol * std::abs(double(b[i])));
    if (r > worst) worst = r, at = i;
  }
  if (worst > 1.0) {
    return ::testing::AssertionFailure() << what << ": element " << at << " got " << a[at] << " want " << b[at]
                                         << " (" << worst << "x the tolerance)";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace thetaserve::testing
