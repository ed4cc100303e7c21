// Device helpers shared by the CUDA kernels: bf16 conversion, 16-byte loads, reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/top_theta.h"

// A device function kept out of line (the emulator compiles kernels as host C++).
#if defined(__CUDACC__)
#define TS_NOINLINE __noinline__
#else
#define TS_NOINLINE __attribute__((noinline))
#endif

namespace thetaserve::kernels::cuda {

__device__ __forceinline__ float Bf16ToF32(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}
// Round to nearest even, as model::FloatToBF16 does (NaN stays NaN).
__device__ __forceinline__ uint16_t F32ToBf16(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// Eight bf16 values (16 bytes, e.g. from shared memory) as floats.
__device__ __forceinline__ void Bf16x8ToF32(const uint4& raw, float out[8]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
// Eight bf16 values (one 16-byte load) as floats.
__device__ __forceinline__ void LoadBf16x8(const uint16_t* p, float out[8]) {
  Bf16x8ToF32(*reinterpret_cast<const uint4*>(p), out);
}

// n / d and n % d for n >= 0 and d > 0 (a block size, a chunk of keys): a shift and a mask
// where d is a power of two, as block sizes and chunks are in practice, else the division. The
// attention kernels' loops divide every position by both, and a division by a value known only
// at run time is ~20 instructions (~30 more for 64 bits).
struct Divisor {
  int32_t d;
  int32_t shift;  // log2 d, or -1
  __device__ explicit Divisor(int32_t v) : d(v), shift(-1) {
    if ((v & (v - 1)) == 0) {
      shift = 0;
      while ((1 << shift) < v) ++shift;
    }
  }
  __device__ __forceinline__ int32_t Div(int32_t n) const {
    return shift >= 0 ? n >> shift : n / d;
  }
  __device__ __forceinline__ int32_t Mod(int32_t n) const {
    return shift >= 0 ? n & (d - 1) : n % d;
  }
};

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum / max for blockDim.x a multiple of 32 (<= 1024); `scratch` holds 32 floats.
// Every thread gets the result.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int nw = blockDim.x >> 5;
  v = lane < nw ? scratch[lane] : 0.0f;
  return WarpSum(v);
}
__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int nw = blockDim.x >> 5;
  v = lane < nw ? scratch[lane] : -INFINITY;
  return WarpMax(v);
}

// Top-θ's softmax denominator for a row after its keep test (the CPU's Compensate): D_kept
// over the kept rows, `kept` of the row's L; thr its keep threshold on e (<= 0: keeps all);
// sdc_ratio[at] (the offline ratio of its row and head) is read for SdcMode::kOffline only.
__device__ __forceinline__ float SdcDenominator(SdcMode sdc, float d_kept, float d_full,
                                                float kept, int32_t L, float thr,
                                                const float* sdc_ratio, int64_t at) {
  switch (sdc) {
    case SdcMode::kNone: break;
    case SdcMode::kExact: return d_full;
    case SdcMode::kExpThreshold:
      if (thr > 0) return d_kept + (float(L) - kept) * thr;
      break;
    case SdcMode::kOffline:
      if (thr > 0) return d_kept * (1.0f + sdc_ratio[at]);
      break;
  }
  return d_kept;
}

}  // namespace thetaserve::kernels::cuda
