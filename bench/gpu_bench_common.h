// What the GPU benchmark's sections share (bench/gpu_bench*.cc): error checks, timing, the
// copy bandwidth, the summary printed last, one decode step's device inputs and the θ tables
// the attention rows run.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/bench_util.h"
#include "model/theta_table.h"

// Exit with the failed expression and CUDA's or the Status's message.
#define CHECK_CUDA(expr)                                                                  \
  do {                                                                                    \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) {                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)
#define CHECK_OK(expr)                                                                    \
  do {                                                                                    \
    if (absl::Status s_ = (expr); !s_.ok()) {                                             \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, std::string(s_.message()).c_str()); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

namespace thetaserve::bench::gpu {

namespace ts = thetaserve;

// Milliseconds per call of fn, median of `repeats` timings of `iters` back-to-back calls.
template <typename Fn>
double TimeMs(Fn&& fn, int iters, int repeats) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  fn();  // warm-up
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    CHECK_CUDA(cudaEventRecord(a));
    for (int i = 0; i < iters; ++i) fn();
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t / iters);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return Median(ms);
}

// The device's copy bandwidth in bytes/s (cudaMemcpy device to device, read + write bytes;
// median of `repeats`).
double CopyBandwidth(int repeats);

// The summary's lines, printed last (a section adds its headline figures).
struct Row {
  std::string what;
  std::string value;
};
std::vector<Row>& Summary();

// One decode step's inputs and outputs on the device for B rows: peaked queries (3·N(0,1)
// from a fixed generator, as bench/attention_bench.cc), the output, and zeroed V sums.
struct StepInputs {
  float *q = nullptr, *out = nullptr, *vsum = nullptr;  // [B, H, d], [B, H, d], [B, kvh, d]
  StepInputs(int B, int H, int kvh, int d);
  StepInputs(const StepInputs&) = delete;
  StepInputs& operator=(const StepInputs&) = delete;
  ~StepInputs();
};

// One layer of H heads, post-softmax θ = c/L beyond k = 16.
ts::model::ThetaTable InverseLTheta(int H, float c = 1.0f);

// One layer of H heads, pre-softmax θ (a scaled score) the same at every length, beyond k = 16.
ts::model::ThetaTable ConstantPreTheta(int H, float theta);

// Bisection steps for a θ that reads a given fraction of V rows (BisectTheta in
// gpu_bench_decode.cc; at the pre-softmax placement each step is a one-pass launch and its
// combine: 2 launches before the timed runs, which gpu-check.sh's Nsight Compute offsets count).
constexpr int kThetaBisectSteps = 20;

// The sections (gpu_bench_decode.cc): decode attention dense vs Top-θ at contexts × batches
// (by_kernel_context: also kernel by kernel; v_target: a second table at that fraction of V
// rows read, 0 for none), and Top-θ over the offload policy's host store.
void DecodeAttention(const std::vector<int>& contexts, const std::vector<int>& batches,
                     int by_kernel_context, double v_target, double copy_bw, int repeats,
                     int sms);
void OffloadDecodeAttention(const std::vector<int>& contexts, const std::vector<int>& batches,
                            int repeats, int sms);

}  // namespace thetaserve::bench::gpu
