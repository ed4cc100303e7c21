#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "base/check.h"
#include "kernels/cpu/quant_dot.h"
#include "kernels/cpu/vec.h"
#include "model/quant.h"

namespace thetaserve::kernels::cpu {
namespace {

constexpr int64_t kTileN = 16;  // weight rows dequantized per tile
constexpr int kRegN = 4;        // weight rows per micro-kernel call
constexpr int kRegT = 3;        // activation rows per micro-kernel call: 3×4 accumulators + 4
                                // weight vectors fill AVX2's 16 registers (4×4 would spill)

// out[t][r] = dot(x[t], w[r]) for TT activation rows and 4 weight rows.
template <int TT>
void MicroKernel(const float* x, int64_t ldx, const float* const w[kRegN], int64_t K,
                 float out[kRegT][kRegN]) {
  int64_t k = 0;
#if TS_AVX2
  __m256 acc[TT][kRegN];
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < kRegN; ++r) acc[t][r] = _mm256_setzero_ps();
  for (; k + 8 <= K; k += 8) {
    __m256 wv[kRegN];
    for (int r = 0; r < kRegN; ++r) wv[r] = _mm256_loadu_ps(w[r] + k);
    for (int t = 0; t < TT; ++t) {
      __m256 xv = _mm256_loadu_ps(x + t * ldx + k);
      for (int r = 0; r < kRegN; ++r) acc[t][r] = _mm256_fmadd_ps(xv, wv[r], acc[t][r]);
    }
  }
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < kRegN; ++r) out[t][r] = HorizontalSum(acc[t][r]);
#else
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < kRegN; ++r) out[t][r] = 0.0f;
#endif
  for (; k < K; ++k)
    for (int t = 0; t < TT; ++t)
      for (int r = 0; r < kRegN; ++r) out[t][r] += x[t * ldx + k] * w[r][k];
}

void RunMicroKernel(int tt, const float* x, int64_t ldx, const float* const w[kRegN],
                    int64_t K, float out[kRegT][kRegN]) {
  switch (tt) {
    case 1: MicroKernel<1>(x, ldx, w, K, out); break;
    case 2: MicroKernel<2>(x, ldx, w, K, out); break;
    default: MicroKernel<3>(x, ldx, w, K, out); break;
  }
}

constexpr int kQuantRegT = 4;  // activation rows per QuantizedDotRows call

bool QuantizedPathApplies(const model::TensorView& w, MatMulMode mode) {
  return mode == MatMulMode::kQuantized && HasQuantizedDot(w.dtype) && w.cols() % kQ8Block == 0;
}

// The kQuantized path for products of one x: x is quantized once (on the calling thread's
// buffer), then the tiles of all weights run in one parallel region, each tile of weight rows
// multiplied with every activation row while it is in L1.
void MatMulsQuantized(ThreadPool& pool, const float* x, int64_t T,
                      std::span<const MatMulOut> outs) {
  const int64_t K = outs[0].w->cols();
  const int64_t nb = K / kQ8Block;
  const int64_t np = Q8PairsPerRow(K);
  thread_local std::vector<BlockQ8x2> xq;  // [T, np]
  xq.resize(T * np);
  // The lambdas run on workers too, where `xq` would name the worker's own buffer.
  BlockQ8x2* xqd = xq.data();
  pool.ParallelFor(T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) QuantizeRowQ8(x + t * K, K, xqd + t * np);
  });
  constexpr size_t kMaxOuts = 4;
  CHECK_LE(outs.size(), kMaxOuts);
  int64_t first_tile[kMaxOuts + 1] = {0};  // tiles of outs[i]: [first_tile[i], first_tile[i+1])
  for (size_t i = 0; i < outs.size(); ++i) {
    first_tile[i + 1] = first_tile[i] + (outs[i].w->rows() + kTileN - 1) / kTileN;
  }
  pool.ParallelFor(first_tile[outs.size()], 1, [&](int64_t begin, int64_t end) {
    size_t i = 0;
    for (int64_t tile = begin; tile < end; ++tile) {
      while (tile >= first_tile[i + 1]) ++i;
      const MatMulOut& o = outs[i];
      const int64_t N = o.w->rows();
      const int64_t w_stride = model::RowBytes(o.w->dtype, K);
      const int64_t n0 = (tile - first_tile[i]) * kTileN;
      const int64_t nn = std::min(kTileN, N - n0);
      const uint8_t* w = static_cast<const uint8_t*>(o.w->data) + n0 * w_stride;
      for (int64_t t = 0; t < T; t += kQuantRegT) {
        const int tt = static_cast<int>(std::min<int64_t>(kQuantRegT, T - t));
        float out[kTileN * kQuantRegT];  // [nn, tt]
        QuantizedDotRows(o.w->dtype, w, w_stride, nn, xqd + t * np, np, tt, nb, out);
        for (int64_t r = 0; r < nn; ++r) {
          const int64_t n = n0 + r;
          for (int j = 0; j < tt; ++j) {
            float v = out[r * tt + j] + (o.bias ? o.bias[n] : 0.0f);
            float& dst = o.y[(t + j) * N + n];
            dst = o.accumulate ? dst + v : v;
          }
        }
      }
    }
  });
}

}  // namespace

void MatMul(ThreadPool& pool, const float* x, int64_t T, const model::TensorView& w,
            const float* bias, float* y, bool accumulate, MatMulMode mode) {
  const int64_t N = w.rows();
  const int64_t K = w.cols();
  if (QuantizedPathApplies(w, mode)) {
    const MatMulOut out{&w, bias, y, accumulate};
    return MatMulsQuantized(pool, x, T, std::span<const MatMulOut>(&out, 1));
  }
  const int64_t num_tiles = (N + kTileN - 1) / kTileN;
  pool.ParallelFor(num_tiles, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> tile;
    tile.resize(kTileN * K);
    for (int64_t ti = begin; ti < end; ++ti) {
      const int64_t n0 = ti * kTileN;
      const int64_t nn = std::min(kTileN, N - n0);
      for (int64_t r = 0; r < nn; ++r) {
        model::DequantizeRow(w.dtype, w.row(n0 + r), tile.data() + r * K, K);
      }
      for (int64_t t = 0; t < T; t += kRegT) {
        const int tt = static_cast<int>(std::min<int64_t>(kRegT, T - t));
        for (int64_t r = 0; r < nn; r += kRegN) {
          const float* rows[kRegN];
          for (int j = 0; j < kRegN; ++j) {
            rows[j] = tile.data() + std::min(r + j, nn - 1) * K;  // clamp at the tile edge
          }
          float out[kRegT][kRegN];
          RunMicroKernel(tt, x + t * K, K, rows, K, out);
          for (int i = 0; i < tt; ++i) {
            for (int j = 0; j < kRegN && r + j < nn; ++j) {
              const int64_t n = n0 + r + j;
              float v = out[i][j] + (bias ? bias[n] : 0.0f);
              float& dst = y[(t + i) * N + n];
              dst = accumulate ? dst + v : v;
            }
          }
        }
      }
    }
  });
}

void MatMuls(ThreadPool& pool, const float* x, int64_t T, std::span<const MatMulOut> outs,
             MatMulMode mode) {
  bool fused = !outs.empty();
  for (const MatMulOut& o : outs) {
    fused = fused && QuantizedPathApplies(*o.w, mode) && o.w->cols() == outs[0].w->cols();
  }
  if (fused) return MatMulsQuantized(pool, x, T, outs);
  for (const MatMulOut& o : outs) MatMul(pool, x, T, *o.w, o.bias, o.y, o.accumulate, mode);
}

void RmsNorm(const float* x, const float* weight, int64_t T, int64_t n, float eps, float* y) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * n;
    float* yr = y + t * n;
    double ss = Dot(xr, xr, n);
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * weight[i];
  }
}

void Embed(ThreadPool& pool, const model::TensorView& table, const int32_t* tokens, int64_t T,
           float* out) {
  const int64_t hidden = table.cols();
  pool.ParallelFor(T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      CHECK(tokens[t] >= 0 && tokens[t] < table.rows()) << "token id out of range";
      model::DequantizeRow(table.dtype, table.row(tokens[t]), out + t * hidden, hidden);
    }
  });
}

Rope::Rope(const model::ModelConfig& config)
    : head_dim_(config.head_dim), interleaved_(config.rope_interleaved) {
  const int64_t half = head_dim_ / 2;
  inv_freq_.resize(half);
  for (int64_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(double(config.rope_theta), double(2 * i) / double(head_dim_));
    switch (config.rope_scaling) {
      case model::RopeScaling::kNone:
        break;
      case model::RopeScaling::kLinear:
        f /= config.rope_factor;
        break;
      case model::RopeScaling::kLlama3: {
        // Llama 3.1: long wavelengths are divided by the factor, short ones kept, and the band
        // between is interpolated smoothly.
        const double low_wavelen = config.rope_original_context / config.rope_low_freq_factor;
        const double high_wavelen = config.rope_original_context / config.rope_high_freq_factor;
        const double wavelen = 2.0 * M_PI / f;
        if (wavelen > low_wavelen) {
          f /= config.rope_factor;
        } else if (wavelen >= high_wavelen) {
          double smooth = (config.rope_original_context / wavelen - config.rope_low_freq_factor) /
                          (config.rope_high_freq_factor - config.rope_low_freq_factor);
          f = (1.0 - smooth) * f / config.rope_factor + smooth * f;
        }
        break;
      }
    }
    inv_freq_[i] = static_cast<float>(f);
  }
}

void Rope::Apply(float* x, int64_t num_heads, int64_t pos) const {
  const int64_t half = head_dim_ / 2;
  float cs[256], sn[256];
  CHECK_LE(half, 256);
  for (int64_t i = 0; i < half; ++i) {
    // Angles in double: positions reach 1e5+ where float angles lose digits.
    const double angle = double(pos) * double(inv_freq_[i]);
    cs[i] = static_cast<float>(std::cos(angle));
    sn[i] = static_cast<float>(std::sin(angle));
  }
  for (int64_t h = 0; h < num_heads; ++h) {
    float* v = x + h * head_dim_;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t a = interleaved_ ? 2 * i : i;
      const int64_t b = interleaved_ ? 2 * i + 1 : i + half;
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * cs[i] - x1 * sn[i];
      v[b] = x0 * sn[i] + x1 * cs[i];
    }
  }
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace thetaserve::kernels::cpu
