// CUDA emulator (tests only): the device side. kernels/cuda/*.cu compile as host C++ against
// this header. Every CUDA thread of a block is a fiber on the calling host thread;
// __syncthreads and the warp exchanges are scheduling points, so barriers and shuffles behave as
// on a GPU, a barrier some threads never reach is reported as a deadlock, and shared memory
// starts as NaN bytes in every block. Launch syntax (`k<<<grid, block, smem, stream>>>(args)`)
// is rewritten to emu::Launch by the build (tests/gpu/emu/CMakeLists.txt).
#pragma once

#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict

struct uint3 {
  unsigned int x, y, z;
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
  return uint4{x, y, z, w};
}
struct alignas(8) uint2 {
  unsigned int x, y;
};
inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }
struct alignas(8) float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

// The running thread's coordinates (set by the scheduler before it resumes a fiber).
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
constexpr int warpSize = 32;

namespace emu {

// Scheduling points of the running block (emu.cc).
void SyncThreads();
void SyncWarp();
uint64_t ExchangeInWarp(uint64_t bits, int src_lane);  // every lane of the warp must call it
// Every lane of the warp gives `bytes` (at most kGatherBytes) at `mine`, and receives all 32
// lanes' at `all`, lane by lane (warp_mma.h's instructions); a lane missing, exited, or at
// another warp exchange or barrier when the others gather stops the test.
// `then` runs in each lane before any lane goes on, so what it reads of memory no lane has
// written since the warp met (an instruction's reads happen at once for the warp).
constexpr size_t kGatherBytes = 64;
constexpr size_t kGatherSlot = 8 + kGatherBytes;  // a lane's count of gathers, then its bytes
void GatherInWarp(const void* mine, size_t bytes, void* all,
                  const std::function<void()>& then = nullptr);
void* DynamicShared();
int LaneId();

// The order a block's threads start in, and take turns in after each wait (emu.cc,
// SwitchToNextReady): index order, reverse index order, or (the default) every other block
// reversed, counted across launches, so a missing barrier shows whichever thread of the pair
// a GPU happens to run first. The environment variable THETASERVE_EMU_ORDER
// (forward|reverse|alternate) sets the default; this call overrides it and restarts the count.
enum class ScheduleOrder { kForward, kReverse, kAlternate };
void SetScheduleOrder(ScheduleOrder order);
ScheduleOrder GetScheduleOrder();

// Runs (or, on a capturing stream, records) a launch of `kernel` (for its attributes) in
// clusters of `cluster` blocks ((1, 1, 1): none).
cudaError_t RunKernel(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const void* kernel,
                      dim3 cluster, std::function<void()> body);

// `kernel<<<grid, block, smem, stream>>>(args...)` becomes
// `emu::Launch(grid, block, smem, stream)(kernel, args...)`.
struct Launch {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  dim3 cluster{1, 1, 1};
  Launch(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr) : grid(g), block(b), smem(s), stream(st) {}
  template <typename... P, typename... A>
  cudaError_t operator()(void (*kernel)(P...), A&&... args) const {
    // Arguments are converted to the parameter types once, as a real launch copies them.
    std::function<void()> body = [kernel, tup = std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)] {
      std::apply(kernel, tup);
    };
    return RunKernel(grid, block, smem, stream, reinterpret_cast<const void*>(kernel), cluster,
                     std::move(body));
  }
};

// The running block's place in its cluster (cooperative_groups.h) and the cluster barrier.
void ClusterSync();
unsigned ClusterBlockRank();
unsigned ClusterNumBlocks();
// Records e as the last error (cudaGetLastError) and returns it.
cudaError_t SetLastError(cudaError_t e);
// Launches made with a cluster dimension so far (tests: that a kernel ran as clusters).
void CountClusterLaunch();
uint64_t ClusterLaunches();
// Kernel launches accepted so far, recorded ones included (tests: how many kernels a call ran).
uint64_t KernelLaunches();

template <typename T>
uint64_t ToBits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
T FromBits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

}  // namespace emu

// An extended launch: its cluster dimension attribute is kept, any other attribute refused.
template <typename... P, typename... A>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* config, void (*kernel)(P...), A&&... args) {
  emu::Launch launch(config->gridDim, config->blockDim, config->dynamicSmemBytes, config->stream);
  bool clusters = false;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    const cudaLaunchAttribute& at = config->attrs[i];
    if (at.id != cudaLaunchAttributeClusterDimension) return emu::SetLastError(cudaErrorInvalidValue);
    launch.cluster = dim3(at.val.clusterDim.x, at.val.clusterDim.y, at.val.clusterDim.z);
    clusters = true;
  }
  const cudaError_t e = launch(kernel, std::forward<A>(args)...);
  if (e == cudaSuccess && clusters) emu::CountClusterLaunch();
  return e;
}

inline void __syncthreads() { emu::SyncThreads(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::SyncWarp(); }

template <typename T>
T __shfl_sync(unsigned, T v, int src, int width = 32) {
  const int lane = emu::LaneId();
  return emu::FromBits<T>(emu::ExchangeInWarp(emu::ToBits(v), (lane & ~(width - 1)) + (src % width)));
}
template <typename T>
T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  const int lane = emu::LaneId();
  return emu::FromBits<T>(emu::ExchangeInWarp(emu::ToBits(v), lane ^ (mask & (width - 1))));
}
template <typename T>
T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  const int lane = emu::LaneId();
  const int in = lane % width + int(delta);
  return emu::FromBits<T>(emu::ExchangeInWarp(emu::ToBits(v), in < width ? lane + int(delta) : lane));
}
inline unsigned __ballot_sync(unsigned, int pred) {
  // One exchange per source lane: slow, but these are tests.
  unsigned out = 0;
  for (int l = 0; l < 32; ++l) {
    if (emu::ExchangeInWarp(pred ? 1 : 0, l)) out |= 1u << l;
  }
  return out;
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int __ffsll(long long v) { return __builtin_ffsll(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz(unsigned(v)); }

inline float __uint_as_float(unsigned v) { return emu::FromBits<float>(v); }
inline unsigned __float_as_uint(float v) { return unsigned(emu::ToBits(v)); }
inline float __int_as_float(int v) { return emu::FromBits<float>(uint32_t(v)); }
inline int __float_as_int(float v) { return int(uint32_t(emu::ToBits(v))); }
inline float cospif(float x) { return std::cos(float(M_PI) * x); }
inline float sinpif(float x) { return std::sin(float(M_PI) * x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }

// Device min/max take mixed integer types, as CUDA's overloads do.
template <typename A, typename B>
constexpr std::common_type_t<A, B> min(A a, B b) { return b < a ? b : a; }
template <typename A, typename B>
constexpr std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }

// Fibers of one host thread never interleave inside these: plain read-modify-writes are atomic.
template <typename T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <typename T>
T atomicMax(T* p, T v) {
  const T old = *p;
  if (v > old) *p = v;
  return old;
}
template <typename T>
T atomicMin(T* p, T v) {
  const T old = *p;
  if (v < old) *p = v;
  return old;
}
template <typename T>
T atomicOr(T* p, T v) {
  const T old = *p;
  *p = old | v;
  return old;
}
template <typename T>
T atomicCAS(T* p, T cmp, T v) {
  const T old = *p;
  if (old == cmp) *p = v;
  return old;
}
template <typename T>
T atomicExch(T* p, T v) {
  const T old = *p;
  *p = v;
  return old;
}

#include "warp_mma.h"  // kernels/cuda/warp_mma.cuh's PTX, in host C++
