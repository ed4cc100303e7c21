// The element type of the KV cache's pages.
#pragma once

#include <cstdint>
#include <string_view>

namespace thetaserve::kernels {

enum class KvDtype {
  kAuto,  // the backend's own: f16 on the CPU, bf16 on CUDA
  kF32,
  kF16,   // IEEE half: 10 mantissa bits, |x| ≤ 65504 (larger values become ±inf)
  kBf16,  // bfloat16: 7 mantissa bits, the f32 range
  // 8-bit floats (OCP FP8, the formats of vLLM's --kv-cache-dtype fp8_e4m3 / fp8_e5m2), with no
  // scale: values past the largest finite one are held at it.
  kFp8E4M3,  // 3 mantissa bits, |x| ≤ 448, subnormals down to 2^-9; NaN, no infinities
  kFp8E5M2,  // 2 mantissa bits, |x| ≤ 57344, subnormals down to 2^-16 (f16's top byte)
  // llama.cpp's q8_0 blocks and scale rule, in a layout of our own: each block of 32 elements
  // is 32 int8 codes and one f16 scale (the block's max |x| / 127), and a row of head_dim
  // elements takes head_dim + head_dim / 16 bytes, all its codes then all its scales (llama.cpp
  // puts each block's scale before its codes). head_dim must be a multiple of 32.
  kQ8_0,
};

// Elements per q8_0 block (one scale each).
inline constexpr int64_t kQ8BlockElems = 32;

// Bytes of one stored K or V row of head_dim elements (auto: 2, the 16-bit types of both
// backends). A page is block_size of them.
constexpr int64_t KvRowBytes(KvDtype t, int64_t head_dim) {
  switch (t) {
    case KvDtype::kF32: return 4 * head_dim;
    case KvDtype::kAuto:
    case KvDtype::kF16:
    case KvDtype::kBf16: break;
    case KvDtype::kFp8E4M3:
    case KvDtype::kFp8E5M2: return head_dim;
    case KvDtype::kQ8_0: return head_dim + 2 * (head_dim / kQ8BlockElems);
  }
  return 2 * head_dim;
}

inline std::string_view KvDtypeName(KvDtype t) {
  switch (t) {
    case KvDtype::kAuto: return "auto";
    case KvDtype::kF32: return "f32";
    case KvDtype::kF16: return "f16";
    case KvDtype::kBf16: return "bf16";
    case KvDtype::kFp8E4M3: return "fp8_e4m3";
    case KvDtype::kFp8E5M2: return "fp8_e5m2";
    case KvDtype::kQ8_0: return "q8_0";
  }
  return "?";
}

// "auto", "f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2" or "q8_0" (also "fp32", "fp16",
// "float16", "bfloat16", and "fp8" for fp8_e4m3, as other servers spell them); false for
// anything else.
inline bool ParseKvDtype(std::string_view s, KvDtype* out) {
  if (s == "auto") *out = KvDtype::kAuto;
  else if (s == "f32" || s == "fp32" || s == "float32") *out = KvDtype::kF32;
  else if (s == "f16" || s == "fp16" || s == "float16" || s == "half") *out = KvDtype::kF16;
  else if (s == "bf16" || s == "bfloat16") *out = KvDtype::kBf16;
  else if (s == "fp8" || s == "fp8_e4m3") *out = KvDtype::kFp8E4M3;
  else if (s == "fp8_e5m2") *out = KvDtype::kFp8E5M2;
  else if (s == "q8_0") *out = KvDtype::kQ8_0;
  else return false;
  return true;
}

}  // namespace thetaserve::kernels
