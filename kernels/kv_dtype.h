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
};

inline int64_t KvDtypeBytes(KvDtype t) { return t == KvDtype::kF32 ? 4 : 2; }

inline std::string_view KvDtypeName(KvDtype t) {
  switch (t) {
    case KvDtype::kAuto: return "auto";
    case KvDtype::kF32: return "f32";
    case KvDtype::kF16: return "f16";
    case KvDtype::kBf16: return "bf16";
  }
  return "?";
}

// "auto", "f32", "f16" or "bf16" (also "fp32", "fp16", "float16", "bfloat16", as other
// servers spell them); false for anything else.
inline bool ParseKvDtype(std::string_view s, KvDtype* out) {
  if (s == "auto") *out = KvDtype::kAuto;
  else if (s == "f32" || s == "fp32" || s == "float32") *out = KvDtype::kF32;
  else if (s == "f16" || s == "fp16" || s == "float16" || s == "half") *out = KvDtype::kF16;
  else if (s == "bf16" || s == "bfloat16") *out = KvDtype::kBf16;
  else return false;
  return true;
}

}  // namespace thetaserve::kernels
