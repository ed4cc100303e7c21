// Element types of the CPU backend's KV pages (kernels/kv_dtype.h) and their conversions.
#pragma once

#include <bit>
#include <cstdint>

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

inline float ToFloat(float x) { return x; }
inline float ToFloat(F16 x) { return static_cast<float>(std::bit_cast<_Float16>(x.bits)); }
inline float ToFloat(Bf16 x) { return std::bit_cast<float>(uint32_t(x.bits) << 16); }

// Round to nearest, ties to even (f16: past 65504 gives ±inf); NaN stays NaN.
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

// f(T{}) with T the element type of `t` (auto: f16, the CPU backend's own).
template <typename F>
decltype(auto) WithKvElement(KvDtype t, F&& f) {
  switch (t) {
    case KvDtype::kF32: return f(float{});
    case KvDtype::kBf16: return f(Bf16{});
    case KvDtype::kAuto:
    case KvDtype::kF16: break;
  }
  return f(F16{});
}

}  // namespace thetaserve::kernels::cpu
