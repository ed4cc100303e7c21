// Small vectorized helpers shared by the CPU kernels (AVX2 + FMA; scalar tails).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cpu/kv_element.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define TS_AVX2 1
#endif

// Forces a function (or a lambda: after its parameter list) inline where the compiler's
// heuristics would call it in a hot loop. GCC and Clang spell it this way; others ignore it.
#if defined(__GNUC__)
#define TS_ALWAYS_INLINE __attribute__((always_inline))
#else
#define TS_ALWAYS_INLINE
#endif

namespace thetaserve::kernels::cpu {

#if TS_AVX2
// Eight elements widened to f32.
inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 Load8(const F16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 Load8(const Bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
// FP8 through f16, exactly. E5M2 is f16's top byte. E4M3's exponent and mantissa, shifted into
// f16's, read as an f16 2^8 too small (bias 15 against 7), subnormals included: the byte is
// sign-extended and shifted left by 7, which puts the sign at bit 15 and a copy at bit 14 that
// the mask clears; S.1111.111 is NaN (made all ones in f16).
inline __m256 Load8(const Fp8E5M2* p) {
  const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_cvtph_ps(_mm_slli_epi16(b, 8));
}
inline __m256 Load8(const Fp8E4M3* p) {
  const __m128i b = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m128i h = _mm_and_si128(_mm_slli_epi16(b, 7), _mm_set1_epi16(int16_t(0xBF80)));
  const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7FFF)),
                                      _mm_set1_epi16(0x3F80));
  return _mm256_mul_ps(_mm256_cvtph_ps(_mm_or_si128(h, nan)), _mm256_set1_ps(256.0f));
}

inline float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 shuf = _mm_movehdup_ps(lo);
  __m128 sums = _mm_add_ps(lo, shuf);
  shuf = _mm_movehl_ps(shuf, sums);
  sums = _mm_add_ss(sums, shuf);
  return _mm_cvtss_f32(sums);
}
#endif

inline float Dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.0f;
#if TS_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  }
  sum = HorizontalSum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// out[u] = a · b[u] for four vectors b[0..3] (a is loaded once for all four), b of any KV
// element type. The same value wherever it is called from; not bit-identical to Dot (another
// summation order).
template <typename T>
void Dot4(const float* a, const T* const b[4], int64_t n, float out[4]) {
  int64_t i = 0;
#if TS_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 va = _mm256_loadu_ps(a + i);
    acc0 = _mm256_fmadd_ps(va, Load8(b[0] + i), acc0);
    acc1 = _mm256_fmadd_ps(va, Load8(b[1] + i), acc1);
    acc2 = _mm256_fmadd_ps(va, Load8(b[2] + i), acc2);
    acc3 = _mm256_fmadd_ps(va, Load8(b[3] + i), acc3);
  }
  // Transposing horizontal sums: lane u of the result is Σ acc_u.
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc0, acc1), _mm256_hadd_ps(acc2, acc3));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
#else
  for (int u = 0; u < 4; ++u) out[u] = 0.0f;
#endif
  for (; i < n; ++i) {
    for (int u = 0; u < 4; ++u) out[u] += a[i] * ToFloat(b[u][i]);
  }
}

// out[0, d) = the d elements of a stored row of T, widened to f32 exactly (q8_0: code · scale).
template <typename T>
void WidenRow(const T* row, int64_t d, float* out) {
  if constexpr (kRowQuantized<T>) {
    for (int64_t b = 0; b < d / kQ8BlockElems; ++b) {
      const float scale = q8::Scale(row, d, b);
      const Q8_0* codes = row + b * kQ8BlockElems;
      float* dst = out + b * kQ8BlockElems;
      int64_t i = 0;
#if TS_AVX2
      const __m256 vs = _mm256_set1_ps(scale);
      for (; i < kQ8BlockElems; i += 8) {
        const __m128i c8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i));
        const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c8));
        _mm256_storeu_ps(dst + i, _mm256_mul_ps(c, vs));
      }
#endif
      for (; i < kQ8BlockElems; ++i) dst[i] = float(q8::Code(codes, i)) * scale;
    }
  } else {
    int64_t i = 0;
#if TS_AVX2
    for (; i + 8 <= d; i += 8) _mm256_storeu_ps(out + i, Load8(row + i));
#endif
    for (; i < d; ++i) out[i] = ToFloat(row[i]);
  }
}

// x[j] = exp(x[j] - m) for j < n, and returns Σ x[j]. With AVX2, eight at a time by the
// Cephes single-precision polynomial (within a few ulp of std::exp; arguments under -88,
// -inf included, give 0; NaN stays NaN) summed in eight lanes, and the last n mod 8 by
// std::exp. Same n, same values.
inline float ExpShiftSum(float* x, int64_t n, float m) {
  int64_t i = 0;
  float sum = 0.0f;
#if TS_AVX2
  const __m256 vm = _mm256_set1_ps(m);
  const __m256 lo = _mm256_set1_ps(-88.3762626647949f), hi = _mm256_set1_ps(88.3762626647949f);
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f), half = _mm256_set1_ps(0.5f);
  const __m256 c1 = _mm256_set1_ps(0.693359375f), c2 = _mm256_set1_ps(-2.12194440e-4f);
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    // Clamped, with NaN passed through (max/min return their second operand when one is NaN).
    __m256 v = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_sub_ps(_mm256_loadu_ps(x + i), vm)));
    // v = k·ln2 + r with k = round(v / ln2), ln2 split in two for precision.
    const __m256 k = _mm256_floor_ps(_mm256_fmadd_ps(v, log2e, half));
    v = _mm256_fnmadd_ps(k, c1, v);
    v = _mm256_fnmadd_ps(k, c2, v);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(v, v), _mm256_add_ps(v, one));
    // × 2^k through the exponent bits (k = -127 gives 0).
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(k), _mm256_set1_epi32(127)), 23);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    _mm256_storeu_ps(x + i, p);
    acc = _mm256_add_ps(acc, p);
  }
  sum = HorizontalSum(acc);
#endif
  for (; i < n; ++i) sum += x[i] = std::exp(x[i] - m);
  return sum;
}

// y += a * x
inline void Axpy(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#if TS_AVX2
  __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
#endif
  for (; i < n; ++i) y[i] += a * x[i];
}

// y += x (a sum of partial sums: the same bits as adding element by element)
inline void AddTo(const float* x, float* y, int64_t n) {
  int64_t i = 0;
#if TS_AVX2
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  }
#endif
  for (; i < n; ++i) y[i] += x[i];
}

inline void Scale(float a, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

}  // namespace thetaserve::kernels::cpu
