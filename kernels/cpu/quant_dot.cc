// Integer dot products of Q8_0 / Q4_0 / Q4_1 weight blocks with Q8 activation blocks.
// Per block: 32 int8×int8 (or uint4×int8) products summed exactly in int32, then scaled by
// d_w · d_x in f32; the offset formats add m_w · s_x (see BlockQ8x2). AVX2 does the products with
// maddubs (u8 × s8 → s16 pairs; |15·127·2| and |128·127·2| fit in s16) and madd with ones,
// AVX-VNNI with vpdpbusd; the kernels themselves are in quant_dot_kernels.inc.
#include "kernels/cpu/quant_dot.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/vec.h"
#include "model/quant.h"

namespace thetaserve::kernels::cpu {
namespace {

using model::DType;

// Two builds of the kernels: AVX2 (maddubs + madd) and AVX-VNNI (vpdpbusd, one instruction
// for the same exact int32 sums, so both give bit-identical results). The build targets
// x86-64-v3; the VNNI one is compiled for that extension alone and chosen at run time.
namespace avx2 {
#define TS_QUANT_DOT_VNNI_BUILD 0
#include "kernels/cpu/quant_dot_kernels.inc"
#undef TS_QUANT_DOT_VNNI_BUILD
}  // namespace avx2

#if TS_AVX2 && defined(__GNUC__) && !defined(__clang__)
#define TS_QUANT_DOT_VNNI 1
#pragma GCC push_options
#pragma GCC target("avxvnni")
namespace vnni {
#define TS_QUANT_DOT_VNNI_BUILD 1
#include "kernels/cpu/quant_dot_kernels.inc"
#undef TS_QUANT_DOT_VNNI_BUILD
}  // namespace vnni
#pragma GCC pop_options
#endif

bool CpuHasVnni() {
#if TS_QUANT_DOT_VNNI
  static const bool has = __builtin_cpu_supports("avxvnni");
  return has;
#else
  return false;
#endif
}

}  // namespace

bool HasQuantizedDot(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_0 || t == DType::kQ4_1;
}

void QuantizeRowQ8(const float* x, int64_t n, BlockQ8x2* out) {
  CHECK_EQ(n % kQ8Block, 0);
  const int64_t nb = n / kQ8Block;
  if (nb % 2) std::memset(&out[nb / 2], 0, sizeof(BlockQ8x2));  // the absent last block
  for (int64_t b = 0; b < nb; ++b, x += kQ8Block) {
    BlockQ8x2& o = out[b / 2];
    const int u = static_cast<int>(b % 2);
#if TS_AVX2
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(x + 8 * j);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float max_abs = _mm_cvtss_f32(m4);
    const float d = max_abs / 127.0f;
    const __m256 id = _mm256_set1_ps(max_abs != 0.0f ? 127.0f / max_abs : 0.0f);
    __m256i q[4];
    for (int j = 0; j < 4; ++j) {
      q[j] = _mm256_cvtps_epi32(
          _mm256_round_ps(_mm256_mul_ps(v[j], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_hadd_epi32(s4, s4);
    s4 = _mm_hadd_epi32(s4, s4);
    o.ds[2 * u] = d;
    o.ds[2 * u + 1] = d * float(_mm_cvtsi128_si32(s4));
    // packs interleave 128-bit lanes; the permute puts the 32 bytes back in element order.
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o.lo + 16 * u), _mm256_castsi256_si128(p));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o.hi + 16 * u), _mm256_extracti128_si256(p, 1));
#else
    float max_abs = 0.0f;
    for (int i = 0; i < kQ8Block; ++i) max_abs = std::max(max_abs, std::fabs(x[i]));
    const float d = max_abs / 127.0f;
    const float id = max_abs != 0.0f ? 127.0f / max_abs : 0.0f;
    int32_t sum = 0;
    for (int i = 0; i < kQ8Block; ++i) {
      const int8_t q = static_cast<int8_t>(std::nearbyint(x[i] * id));
      (i < 16 ? o.lo : o.hi)[16 * u + i % 16] = q;
      sum += q;
    }
    o.ds[2 * u] = d;
    o.ds[2 * u + 1] = d * float(sum);
#endif
  }
}

const char* QuantizedDotIsa() {
#if TS_AVX2
  return CpuHasVnni() ? "avx-vnni" : "avx2";
#else
  return "scalar";
#endif
}

void QuantizedDotRows(DType t, const uint8_t* w, int64_t w_stride, int64_t nrows,
                      const BlockQ8x2* x, int64_t ldx, int tt, int64_t nb, float* out) {
#if TS_QUANT_DOT_VNNI
  if (CpuHasVnni()) return vnni::DotRowsOfType(t, w, w_stride, nrows, x, ldx, tt, nb, out);
#endif
  avx2::DotRowsOfType(t, w, w_stride, nrows, x, ldx, tt, nb, out);
}

void QuantizedDotRowsAvx2(DType t, const uint8_t* w, int64_t w_stride, int64_t nrows,
                          const BlockQ8x2* x, int64_t ldx, int tt, int64_t nb, float* out) {
  avx2::DotRowsOfType(t, w, w_stride, nrows, x, ldx, tt, nb, out);
}

}  // namespace thetaserve::kernels::cpu
