// Dequantization of llama.cpp block formats and half floats to f32.
#pragma once

#include <cstdint>

#include "model/tensor.h"

namespace thetaserve::model {

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BF16ToFloat(uint16_t h);
uint16_t FloatToBF16(float f);  // round to nearest even

// Dequantizes `n` elements (a multiple of BlockElems(t)) starting at `src` into `dst`.
void DequantizeRow(DType t, const void* src, float* dst, int64_t n);

}  // namespace thetaserve::model
