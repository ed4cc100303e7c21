// CUDA emulator (tests only): the host side of the CUDA runtime API that kernels/cuda and the
// GPU tests use, backed by host memory. "Device" pointers are host pointers; every call runs
// to completion when made (streams are in order anyway), except inside a stream capture, where
// launches, copies and memsets are recorded and run when the graph is launched.
//
// It exists so that the CUDA kernels' own source runs in CI on machines without a GPU: the
// emulated tests (CTest label `emu`) run kernels/cuda's kernels, launch code and DeviceBatch
// through the GPU tests against the CPU reference. It checks logic — indexing, barriers, warp
// exchanges, what is written where — not timing, occupancy or the memory model of a real GPU.
// tests/gpu/emu/README.md says how it works and what it cannot catch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorUnknown = 999,
};
using cudaError = cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
constexpr unsigned int cudaStreamDefault = 0;
constexpr unsigned int cudaStreamNonBlocking = 1;

struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;
struct CUgraph_st;
using cudaGraph_t = CUgraph_st*;
struct CUgraphExec_st;
using cudaGraphExec_t = CUgraphExec_st*;

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int major;
  int minor;
  int multiProcessorCount;
  int maxThreadsPerBlock;
  size_t sharedMemPerBlock;
  int warpSize;
};

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
};

// Kernel attributes (cudaFuncSetAttribute): the opt-in above 48 KB of dynamic shared memory
// (at most 227 KB, an H200's) is the only one the emulator keeps.
enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};
// Extended launches (cudaLaunchKernelEx): thread block clusters are the only attribute here.
enum cudaLaunchAttributeID {
  cudaLaunchAttributeClusterDimension = 4,
};
union cudaLaunchAttributeValue {
  struct {
    unsigned int x, y, z;
  } clusterDim;
};
struct cudaLaunchAttribute {
  cudaLaunchAttributeID id;
  cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
  dim3 gridDim;
  dim3 blockDim;
  size_t dynamicSmemBytes;
  cudaStream_t stream;
  cudaLaunchAttribute* attrs;
  unsigned int numAttrs;
};
namespace emu {
cudaError_t SetMaxDynamicShared(const void* kernel, int bytes);
}  // namespace emu
template <typename T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
  return emu::SetMaxDynamicShared(reinterpret_cast<const void*>(kernel), value);
}

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);

cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocHost(void** ptr, size_t bytes);
cudaError_t cudaFreeHost(void* ptr);
// Mapped pinned memory: the device pointer is the host pointer (as under UVA).
#define cudaHostAllocMapped 0x02
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags);
cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned int flags);
// The emulated device has 4 GiB; free is what live cudaMalloc allocations leave.
cudaError_t cudaMemGetInfo(size_t* free, size_t* total);
template <typename T>
cudaError_t cudaMalloc(T** ptr, size_t bytes) { return cudaMalloc(reinterpret_cast<void**>(ptr), bytes); }
template <typename T>
cudaError_t cudaMallocHost(T** ptr, size_t bytes) { return cudaMallocHost(reinterpret_cast<void**>(ptr), bytes); }

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* ptr, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream = nullptr);

cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);

namespace emu {
// Runs op in stream order: now, or when the graph runs if the stream is being captured.
void EnqueueOnStream(cudaStream_t stream, std::function<void()> op);
}  // namespace emu
