// CUDA emulator (tests only): the bf16 type and conversions kernels/cuda uses.
#pragma once

#include <cstdint>
#include <cstring>

#include "cuda_runtime.h"

struct __nv_bfloat16 {
  uint16_t __x;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  __nv_bfloat16 b;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    b.__x = uint16_t((u >> 16) | 0x40u);  // NaN stays NaN (quiet)
  } else {
    b.__x = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // round to nearest even
  }
  return b;
}
inline float __bfloat162float(__nv_bfloat16 b) {
  const uint32_t u = uint32_t(b.__x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short v) { return __nv_bfloat16{v}; }
