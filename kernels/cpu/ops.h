// CPU building blocks of the forward pass. Every function is multithreaded through the pool
// where the work is large enough.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/matmul_mode.h"
#include "model/config.h"
#include "model/tensor.h"

namespace thetaserve::kernels::cpu {

// y[t, n] = sum_k x[t, k] * w[n, k] (+ bias[n]) (+ y[t, n] when `accumulate`).
// w is {N, K} in any stored type, read from memory in its stored (quantized) size. In
// kQuantized mode, Q8_0/Q4_0/Q4_1 weights are multiplied with x quantized to Q8 blocks
// (quant_dot.h); other types, and every type in kExact mode, are dequantized on the fly into
// a per-thread f32 tile.
void MatMul(ThreadPool& pool, const float* x,  // [T, K]
            int64_t T, const model::TensorView& w,  // [N, K]
            const float* bias,                      // [N] or nullptr
            float* y,                               // [T, N]
            bool accumulate = false, MatMulMode mode = MatMulMode::kQuantized);

// One product of MatMuls: y = x · wᵀ (+ bias) (+ y when `accumulate`), as MatMul.
struct MatMulOut {
  const model::TensorView* w;  // [N, K]
  const float* bias;           // [N] or nullptr
  float* y;                    // [T, N]
  bool accumulate = false;
};

// Up to 4 products of the same x (Q, K and V; gate and up) at once: in kQuantized mode, when
// all weights take the quantized path, x is quantized once and all tiles share one parallel
// region (a decode step otherwise pays a fork-join per matrix). Same results as MatMul each.
void MatMuls(ThreadPool& pool, const float* x,  // [T, K]
             int64_t T, std::span<const MatMulOut> outs, MatMulMode mode = MatMulMode::kQuantized);

// y[t] = x[t] / rms(x[t]) * weight, rows of `n`.
void RmsNorm(const float* x,  // [T, n]
             const float* weight, int64_t T, int64_t n, float eps,
             float* y);  // [T, n]

// Gathers embedding rows (dequantized) for `tokens`.
void Embed(ThreadPool& pool, const model::TensorView& table,  // [vocab, hidden]
           const int32_t* tokens, int64_t T, float* out);       // [T, hidden]

// Rotary embedding for one model: inverse frequencies with the model's scaling.
class Rope {
 public:
  explicit Rope(const model::ModelConfig& config);
  // Rotates `num_heads` heads of head_dim in place at position `pos`.
  void Apply(float* x, int64_t num_heads, int64_t pos) const;
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  bool interleaved() const { return interleaved_; }

 private:
  int64_t head_dim_;
  bool interleaved_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
};

// out = silu(gate) * up, elementwise.
void SiluMul(const float* gate, const float* up, int64_t n, float* out);

}  // namespace thetaserve::kernels::cpu
