// Dot products of quantized weight rows with int8-quantized activation rows, computed on the
// stored blocks with integer SIMD (llama.cpp's vec_dot_q*_q8 scheme). Decode is bound by
// how fast weights stream through the cores; dequantizing every weight to f32 first made it
// compute-bound, so the activations are quantized once per MatMul instead.
//
// Covered weight types: Q8_0, Q4_0, Q4_1 (32-element blocks). The K-quants (Q4_K, Q5_K, Q6_K)
// and float types keep the f32 dequantize-then-FMA path in MatMul.
#pragma once

#include <cstdint>

#include "model/tensor.h"

namespace thetaserve::kernels::cpu {

inline constexpr int64_t kQ8Block = 32;

// Two consecutive blocks b, b+1 of 32 activations as int8, each with one f32 scale:
// x[i] ≈ d * q[i]. s = d * Σ q, which the formats with an offset (Q4_1's min, Q4_0's -8) need:
// Σ (a q_w + m) d q_x = a d Σ q_w q_x + m s. The quants are stored as the weight kernels load
// them, two blocks side by side: `lo` holds elements 0..15 of block b then of block b+1, `hi`
// elements 16..31 of each, so one 256-bit register carries half of two blocks (a 4-bit weight
// block's low nibbles are its elements 0..15). A row with an odd block count ends with a pair
// whose second block is zero.
struct BlockQ8x2 {
  float ds[4];   // d_b, s_b, d_b+1, s_b+1
  int8_t lo[32];
  int8_t hi[32];

  // Element j (0..63) of the pair, block j / 32.
  int quant(int j) const {
    const int u = j / kQ8Block, e = j % kQ8Block;
    return e < 16 ? lo[16 * u + e] : hi[16 * u + e - 16];
  }
  float d(int u) const { return ds[2 * u]; }
  float s(int u) const { return ds[2 * u + 1]; }
};

// Pairs in a quantized row of `n` elements.
inline int64_t Q8PairsPerRow(int64_t n) { return (n / kQ8Block + 1) / 2; }

// True when `t` has an integer dot product here (rows must be a multiple of 32 long).
bool HasQuantizedDot(model::DType t);

// Quantizes `n` (a multiple of 32) floats to n / 32 blocks: d = max|x| / 127, q = round(x / d)
// (ties to even), so |q| <= 127.
void QuantizeRowQ8(const float* x, int64_t n, BlockQ8x2* out);  // out: [Q8PairsPerRow(n)]

// out[r * tt + t] = Σ_k w_r[k] · x_t[k] for `nrows` weight rows w_r = w + r * w_stride (bytes)
// of `nb` blocks of type `t` (HasQuantizedDot(t)), and `tt` activation rows x_t = x + t * ldx
// (1 <= tt <= 4), the Q8 pairs of each (ldx >= Q8PairsPerRow(32 nb)). Each result is bit-identical whatever `tt` is, so a
// sequence gets the same logits alone and in a batch.
void QuantizedDotRows(model::DType t, const uint8_t* w, int64_t w_stride,  // [nrows, w_stride]
                      int64_t nrows, const BlockQ8x2* x,                  // [tt, ldx]
                      int64_t ldx, int tt, int64_t nb, float* out);       // [nrows, tt]

// The build QuantizedDotRows runs, chosen once from the CPU: "avx-vnni", "avx2" or "scalar".
const char* QuantizedDotIsa();
// The AVX2 (or, without AVX2, scalar) build alone, for tests that compare the two.
void QuantizedDotRowsAvx2(model::DType t, const uint8_t* w, int64_t w_stride, int64_t nrows,
                          const BlockQ8x2* x, int64_t ldx, int tt, int64_t nb, float* out);

}  // namespace thetaserve::kernels::cpu
