#include "model/tensor.h"

namespace thetaserve::model {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kQ8_0: return "Q8_0";
    case DType::kQ4_0: return "Q4_0";
    case DType::kQ4_1: return "Q4_1";
    case DType::kQ4_K: return "Q4_K";
    case DType::kQ5_K: return "Q5_K";
    case DType::kQ6_K: return "Q6_K";
  }
  return "unknown";
}

int64_t BlockElems(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16: return 1;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1: return 32;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K: return 256;
  }
  return 1;
}

// Block sizes follow ggml-common.h.
int64_t BlockBytes(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kQ8_0: return 34;   // f16 d; int8 qs[32]
    case DType::kQ4_0: return 18;   // f16 d; uint8 qs[16]
    case DType::kQ4_1: return 20;   // f16 d, m; uint8 qs[16]
    case DType::kQ4_K: return 144;  // f16 d, dmin; scales[12]; qs[128]
    case DType::kQ5_K: return 176;  // f16 d, dmin; scales[12]; qh[32]; qs[128]
    case DType::kQ6_K: return 210;  // ql[128]; qh[64]; int8 scales[16]; f16 d
  }
  return 4;
}

}  // namespace thetaserve::model
