// Element types of the CPU backend's KV pages (kernels/kv_dtype.h) and their conversions.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/kv_dtype.h"

namespace thetaserve::kernels::cpu {

// 16-bit elements of the KV cache (kernels/kv_dtype.h), kept as their bits. Widening to f32 is
// exact, so a kernel over them computes what its f32 version computes over the widened values.
struct F16 {
  uint16_t bits;
};
struct Bf16 {
  uint16_t bits;
};
// 8-bit elements (kernels/kv_dtype.h): OCP FP8 E4M3 ("fn": no infinities, S.1111.111 is NaN)
// and E5M2 (IEEE-like, f16's top byte).
struct Fp8E4M3 {
  uint8_t bits;
};
struct Fp8E5M2 {
  uint8_t bits;
};
// One byte of a q8_0 row (kernels/kv_dtype.h): a row of d elements is d int8 codes, then d / 32
// f16 scales. Its elements are not single bytes, so it is read and written a row at a time
// (StoreRow, and WidenRow in vec.h), never by ToFloat / FromFloat.
struct Q8_0 {
  uint8_t byte;
};

// Row-quantized types: a row holds more than its elements (scales), and kernels widen each row
// they read into f32 first.
template <typename T>
inline constexpr bool kRowQuantized = std::is_same_v<T, Q8_0>;

// A stored row of head_dim elements, in units of T (the pool's row stride; a q8_0 unit is a
// byte, so its rows are KvRowBytes long).
template <typename T>
constexpr int64_t RowUnits(int64_t head_dim) {
  if constexpr (kRowQuantized<T>) return KvRowBytes(KvDtype::kQ8_0, head_dim);
  return head_dim;
}

namespace fp8 {

// The value of each of the 256 codes of an 8-bit float with kMan mantissa bits and exponent
// bias kBias; kIeee formats have infinities and NaNs in the top exponent, the others only NaN
// in the top code.
template <int kMan, int kBias, bool kIeee>
constexpr std::array<float, 256> Values() {
  std::array<float, 256> v{};
  for (int code = 0; code < 256; ++code) {
    const int e = (code & 0x7f) >> kMan, m = code & ((1 << kMan) - 1);
    const float sign = (code & 0x80) ? -1.0f : 1.0f;
    float x = 0.0f;
    if (kIeee && e == (0x7f >> kMan)) {
      x = m == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
    } else if (!kIeee && (code & 0x7f) == 0x7f) {
      x = std::numeric_limits<float>::quiet_NaN();
    } else {
      // (e == 0: subnormal) m · 2^(1 − bias − kMan), else (2^kMan + m) · 2^(e − bias − kMan).
      x = float(e == 0 ? m : (1 << kMan) + m);
      for (int p = (e == 0 ? 1 : e) - kBias - kMan; p < 0; ++p) x *= 0.5f;
      for (int p = (e == 0 ? 1 : e) - kBias - kMan; p > 0; --p) x *= 2.0f;
    }
    v[code] = sign * x;
  }
  return v;
}
inline constexpr std::array<float, 256> kE4M3 = Values<3, 7, false>();
inline constexpr std::array<float, 256> kE5M2 = Values<2, 15, true>();

// f32 to the code of an 8-bit float (kMan mantissa bits, bias kBias), rounding to nearest
// even; magnitudes at or past the largest finite value `max_code`'s are held at it (as vLLM's
// and NVIDIA's saturating conversions do: an infinity in a K or V row would poison every
// score it meets); NaN gives `nan_code`.
template <int kMan, int kBias>
uint8_t Round(float x, const std::array<float, 256>& values, uint8_t max_code, uint8_t nan_code) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | nan_code;
  const float ax = std::bit_cast<float>(a);
  if (ax >= values[max_code]) return sign | max_code;
  // Under the smallest normal, 2^(1 − bias): a multiple of the subnormal step
  // 2^(1 − bias − kMan), whose count is the code (a count of 2^kMan is the smallest normal's).
  // The count is f32's significand shifted right, rounded to nearest even in integers (not by
  // the floating-point rounding mode).
  if (a < uint32_t(128 - kBias) << 23) {
    const int exponent = int(a >> 23);
    if (exponent == 0) return sign;  // an f32 subnormal: far under half a step
    const uint32_t significand = (a & 0x7fffffu) | 0x800000u;
    const int shift = 150 - exponent - (kBias - 1 + kMan);  // at least 21 here
    if (shift > 24) return sign;  // under half a step
    const uint32_t count = significand >> shift, rest = significand & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    return sign | uint8_t(count + (rest > half || (rest == half && (count & 1u))));
  }
  // Normal: round f32's mantissa to kMan bits (a carry moves into the exponent), then rebias.
  constexpr int kShift = 23 - kMan;
  const uint32_t r = (a + (1u << (kShift - 1)) - 1u + ((a >> kShift) & 1u)) >> kShift;
  return sign | uint8_t(r - (uint32_t(127 - kBias) << kMan));
}

}  // namespace fp8

inline float ToFloat(float x) { return x; }
inline float ToFloat(F16 x) { return static_cast<float>(std::bit_cast<_Float16>(x.bits)); }
inline float ToFloat(Bf16 x) { return std::bit_cast<float>(uint32_t(x.bits) << 16); }
inline float ToFloat(Fp8E4M3 x) { return fp8::kE4M3[x.bits]; }
inline float ToFloat(Fp8E5M2 x) { return fp8::kE5M2[x.bits]; }

// Round to nearest, ties to even (f16: past 65504 gives ±inf; fp8: past the largest finite
// value gives it); NaN stays NaN.
template <typename T>
T FromFloat(float x);
template <>
inline float FromFloat<float>(float x) { return x; }
template <>
inline F16 FromFloat<F16>(float x) {
  return {std::bit_cast<uint16_t>(static_cast<_Float16>(x))};
}
template <>
inline Bf16 FromFloat<Bf16>(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return {uint16_t(u >> 16)};
}
template <>
inline Fp8E4M3 FromFloat<Fp8E4M3>(float x) {
  return {fp8::Round<3, 7>(x, fp8::kE4M3, /*max_code=*/0x7e, /*nan_code=*/0x7f)};
}
template <>
inline Fp8E5M2 FromFloat<Fp8E5M2>(float x) {
  return {fp8::Round<2, 15>(x, fp8::kE5M2, /*max_code=*/0x7b, /*nan_code=*/0x7e)};
}

namespace q8 {

// The f16 bits of block b's scale in a q8_0 row of d elements (unaligned: memcpy).
inline uint16_t ScaleBits(const Q8_0* row, int64_t d, int64_t b) {
  uint16_t bits;
  std::memcpy(&bits, &row[d + 2 * b].byte, sizeof(bits));
  return bits;
}
inline float Scale(const Q8_0* row, int64_t d, int64_t b) {
  return ToFloat(F16{ScaleBits(row, d, b)});
}
inline int8_t Code(const Q8_0* row, int64_t e) { return std::bit_cast<int8_t>(row[e].byte); }

// Quantizes x[0, d) (d a multiple of 32) into a q8_0 row, with llama.cpp's q8_0 rule: per block
// of 32, scale = max |x| / 127 rounded to f16 (held at f16's largest finite value, 65504), codes
// round(x / scale) (half away from zero) clamped to ±127; an all-zero block has scale 0. (llama.cpp
// multiplies by the inverse of the unrounded scale; dividing by the stored one keeps every code
// the nearest to x for the scale it is read back with: about 1% of codes differ by one.) A
// block holding a NaN gets a NaN scale, so all its elements read back as NaN rather than as
// numbers. Element e reads back as code · scale, exactly (8 × 11 significant bits fit in f32's
// 24), within half a step of x while the scale is an f16 normal (max |x| ≥ 127 · 2^-14 ≈ 0.0078;
// under that the scale, an f16 subnormal, is coarser).
inline void QuantizeRow(const float* x, int64_t d, Q8_0* row) {
  for (int64_t b = 0; b < d / kQ8BlockElems; ++b) {
    const float* xb = x + b * kQ8BlockElems;
    float amax = 0.0f;
    bool nan = false;
    for (int64_t i = 0; i < kQ8BlockElems; ++i) {
      nan |= std::isnan(xb[i]);
      amax = std::max(amax, std::fabs(xb[i]));
    }
    F16 scale_bits = FromFloat<F16>(std::min(amax / 127.0f, 65504.0f));
    if (nan) scale_bits = F16{0x7e00};
    const float scale = ToFloat(scale_bits);
    for (int64_t i = 0; i < kQ8BlockElems; ++i) {
      // A NaN scale: code 0 (the scale carries the NaN); ±inf / scale: ±127.
      const float c = scale > 0.0f ? std::round(xb[i] / scale) : 0.0f;
      const int8_t code = int8_t(std::clamp(c, -127.0f, 127.0f));
      row[b * kQ8BlockElems + i].byte = std::bit_cast<uint8_t>(code);
    }
    std::memcpy(&row[d + 2 * b].byte, &scale_bits.bits, sizeof(scale_bits.bits));
  }
}

}  // namespace q8

// Stores x[0, d) as a row of T (rounding each element, or quantizing the row).
template <typename T>
void StoreRow(const float* x, int64_t d, T* row) {
  if constexpr (kRowQuantized<T>) {
    q8::QuantizeRow(x, d, row);
  } else {
    for (int64_t e = 0; e < d; ++e) row[e] = FromFloat<T>(x[e]);
  }
}

// f(T{}) with T the element type of `t` (auto: f16, the CPU backend's own).
template <typename F>
decltype(auto) WithKvElement(KvDtype t, F&& f) {
  switch (t) {
    case KvDtype::kF32: return f(float{});
    case KvDtype::kBf16: return f(Bf16{});
    case KvDtype::kFp8E4M3: return f(Fp8E4M3{});
    case KvDtype::kFp8E5M2: return f(Fp8E5M2{});
    case KvDtype::kQ8_0: return f(Q8_0{});
    case KvDtype::kAuto:
    case KvDtype::kF16: break;
  }
  return f(F16{});
}

}  // namespace thetaserve::kernels::cpu
