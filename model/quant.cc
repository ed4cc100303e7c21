// Dequantizers for llama.cpp's block formats. The arithmetic matches ggml-quants.c's
// dequantize_row_* (same operation order; the AVX2 Q4_1 path fuses q*d + m into one fma, so
// it can differ from ggml's two roundings by one ulp). The formats the CPU forward pass
// streams most (F16, BF16, Q8_0, Q4_0, Q4_1) have AVX2 paths.
#include "model/quant.h"

#include <cmath>
#include <cstring>

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#define THETASERVE_QUANT_AVX2 1
#endif

namespace thetaserve::model {
namespace {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Blocks in GGUF files are packed back to back (18- or 34-byte strides), so halves inside
// them are not 2-byte aligned: read through memcpy.
inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline float LoadHalf(const uint8_t* p) {
#ifdef THETASERVE_QUANT_AVX2
  return _cvtsh_ss(LoadU16(p));  // one instruction; HalfToFloat is the portable reference
#else
  return HalfToFloat(LoadU16(p));
#endif
}

constexpr int kQK = 32;    // elements per Q8_0 / Q4_0 / Q4_1 block
constexpr int kQKK = 256;  // elements per K-quant super-block

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block; `q` is the
// 12-byte scales array (ggml's get_scale_min_k4).
inline void ScaleMinK4(int j, const uint8_t* q, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void RowF32(const uint8_t* src, float* dst, int64_t n) { std::memcpy(dst, src, n * 4); }

void RowF16(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#ifdef THETASERVE_QUANT_AVX2
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = LoadHalf(src + 2 * i);
}

void RowBF16(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#ifdef THETASERVE_QUANT_AVX2
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
  }
#endif
  for (; i < n; ++i) dst[i] = BF16ToFloat(LoadU16(src + 2 * i));
}

// Q8_0: {f16 d; int8 qs[32]}, y = qs * d.
void RowQ8_0(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, src += 34, dst += kQK) {
    const float d = LoadHalf(src);
    const int8_t* qs = reinterpret_cast<const int8_t*>(src + 2);
#ifdef THETASERVE_QUANT_AVX2
    const __m256 vd = _mm256_set1_ps(d);
    for (int j = 0; j < kQK; j += 8) {
      __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + j));
      __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
      _mm256_storeu_ps(dst + j, _mm256_mul_ps(q, vd));
    }
#else
    for (int j = 0; j < kQK; ++j) dst[j] = qs[j] * d;
#endif
  }
}

#ifdef THETASERVE_QUANT_AVX2
// Widens 16 nibble values (one per byte of `q`) to floats and stores q*d + m to dst[0..15].
inline void StoreNibbles16(__m128i q, __m256 vd, __m256 vm, float* dst) {
  __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
  __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8)));
  _mm256_storeu_ps(dst, _mm256_fmadd_ps(lo, vd, vm));
  _mm256_storeu_ps(dst + 8, _mm256_fmadd_ps(hi, vd, vm));
}
#endif

// Q4_0: {f16 d; uint8 qs[16]}; low nibbles are elements 0..15, high nibbles 16..31;
// y = (nibble - 8) * d.
void RowQ4_0(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, src += 18, dst += kQK) {
    const float d = LoadHalf(src);
    const uint8_t* qs = src + 2;
#ifdef THETASERVE_QUANT_AVX2
    // (q - 8) * d == q*d + (-8d) exactly: q, 8 and the products are small enough that
    // the only rounding is the final one, which fma also does once.
    const __m256 vd = _mm256_set1_ps(d);
    const __m256 vm = _mm256_set1_ps(-8.0f * d);
    const __m128i mask = _mm_set1_epi8(0x0F);
    __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    StoreNibbles16(_mm_and_si128(bytes, mask), vd, vm, dst);
    StoreNibbles16(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), vd, vm, dst + 16);
#else
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = ((qs[j] & 0x0F) - 8) * d;
      dst[j + kQK / 2] = ((qs[j] >> 4) - 8) * d;
    }
#endif
  }
}

// Q4_1: {f16 d; f16 m; uint8 qs[16]}; y = nibble * d + m.
void RowQ4_1(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, src += 20, dst += kQK) {
    const float d = LoadHalf(src);
    const float m = LoadHalf(src + 2);
    const uint8_t* qs = src + 4;
#ifdef THETASERVE_QUANT_AVX2
    const __m256 vd = _mm256_set1_ps(d);
    const __m256 vm = _mm256_set1_ps(m);
    const __m128i mask = _mm_set1_epi8(0x0F);
    __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    StoreNibbles16(_mm_and_si128(bytes, mask), vd, vm, dst);
    StoreNibbles16(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), vd, vm, dst + 16);
#else
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = (qs[j] & 0x0F) * d + m;
      dst[j + kQK / 2] = (qs[j] >> 4) * d + m;
    }
#endif
  }
}

// Q4_K: {f16 d; f16 dmin; uint8 scales[12]; uint8 qs[128]}. Eight sub-blocks of 32; each
// 64-element chunk uses 32 bytes of qs, low nibbles first. y = d*sc * q - dmin*m.
void RowQ4_K(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b, src += 144) {
    const float d = LoadHalf(src);
    const float dmin = LoadHalf(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* q = src + 16;
    for (int j = 0, is = 0; j < kQKK; j += 64, is += 2, q += 32) {
      uint8_t sc, mn;
      ScaleMinK4(is, scales, &sc, &mn);
      const float d1 = d * sc, m1 = dmin * mn;
      ScaleMinK4(is + 1, scales, &sc, &mn);
      const float d2 = d * sc, m2 = dmin * mn;
      for (int l = 0; l < 32; ++l) *dst++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *dst++ = d2 * (q[l] >> 4) - m2;
    }
  }
}

// Q5_K: {f16 d; f16 dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]}; like Q4_K with a
// fifth bit per element from qh (bit 2k for the low nibbles of chunk k, 2k+1 for the high).
void RowQ5_K(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b, src += 176) {
    const float d = LoadHalf(src);
    const float dmin = LoadHalf(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* qh = src + 16;
    const uint8_t* ql = src + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < kQKK; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, mn;
      ScaleMinK4(is, scales, &sc, &mn);
      const float d1 = d * sc, m1 = dmin * mn;
      ScaleMinK4(is + 1, scales, &sc, &mn);
      const float d2 = d * sc, m2 = dmin * mn;
      for (int l = 0; l < 32; ++l) *dst++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *dst++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}

// Q6_K: {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d}. Each half (128 elements)
// uses 64 bytes of ql, 32 of qh and 8 scales (one per 16 elements); y = d * sc * (q - 32).
void RowQ6_K(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b, src += 210) {
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(src + 192);
    const float d = LoadHalf(src + 208);
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, dst += 128) {
      // Scales change every 16 elements; hoisting them lets the compiler vectorize.
      // (d * sc) * q is ggml's evaluation order.
      for (int g = 0; g < 2; ++g) {
        const float s0 = d * sc[g], s2 = d * sc[g + 2], s4 = d * sc[g + 4], s6 = d * sc[g + 6];
        for (int l = 16 * g; l < 16 * g + 16; ++l) {
          const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
          const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
          const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          dst[l] = s0 * q1;
          dst[l + 32] = s2 * q2;
          dst[l + 64] = s4 * q3;
          dst[l + 96] = s6 * q4;
        }
      }
    }
  }
}

}  // namespace

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in f32.
    float f = float(mant) * 5.9604644775390625e-08f;
    return BitsFloat(sign | FloatBits(f));
  }
  if (exp == 31) return BitsFloat(sign | 0x7F800000u | (mant << 13));  // inf / NaN
  return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t FloatToHalf(float f) {
  const uint32_t bits = FloatBits(f);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return sign | 0x7E00 | uint16_t((abs >> 13) & 0x3FF);  // NaN stays NaN
  if (abs >= 0x477FF000u) return sign | 0x7C00;  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {
    // Result is a half subnormal (or zero): scale so the integer part is the mantissa and
    // let the f32 adder round to nearest even (0.5f * 2^-24 is exactly representable).
    float a = BitsFloat(abs);
    float scaled = a * 16777216.0f;  // a / 2^-24
    float rounded = std::nearbyint(scaled);
    return sign | uint16_t(rounded);  // 1024 here correctly becomes the smallest normal
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rest = abs & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // a carry into the exponent is right
  return sign | uint16_t(h);
}

float BF16ToFloat(uint16_t h) { return BitsFloat(uint32_t(h) << 16); }

uint16_t FloatToBF16(float f) {
  const uint32_t bits = FloatBits(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((bits >> 16) | 0x40);  // quiet NaN
  return uint16_t((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

void DequantizeRow(DType t, const void* src, float* dst, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  switch (t) {
    case DType::kF32: return RowF32(p, dst, n);
    case DType::kF16: return RowF16(p, dst, n);
    case DType::kBF16: return RowBF16(p, dst, n);
    case DType::kQ8_0: return RowQ8_0(p, dst, n);
    case DType::kQ4_0: return RowQ4_0(p, dst, n);
    case DType::kQ4_1: return RowQ4_1(p, dst, n);
    case DType::kQ4_K: return RowQ4_K(p, dst, n);
    case DType::kQ5_K: return RowQ5_K(p, dst, n);
    case DType::kQ6_K: return RowQ6_K(p, dst, n);
  }
}

}  // namespace thetaserve::model
