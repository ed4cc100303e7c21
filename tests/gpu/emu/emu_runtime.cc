// CUDA emulator (tests only): the runtime API over host memory (device memory, copies,
// streams, events, graphs); kernels run in emu.cc.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <utility>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include "cuda_runtime.h"
#include "emu_internal.h"

namespace emu {

thread_local cudaError_t g_last_error = cudaSuccess;

cudaError_t Fail(cudaError_t e) {
  g_last_error = e;
  return e;
}

CUstream_st& StreamOf(cudaStream_t s) {
  static CUstream_st legacy;
  return s ? *s : legacy;
}

void EnqueueOnStream(cudaStream_t stream, std::function<void()> op) {
  CUstream_st& s = StreamOf(stream);
  if (s.capturing) {
    s.captured.push_back(std::move(op));
  } else {
    op();
  }
}

namespace {

std::mutex g_alloc_mutex;
std::map<void*, size_t>& Allocations() {
  static std::map<void*, size_t> m;
  return m;
}
size_t Rounded(size_t bytes) { return (std::max<size_t>(bytes, 1) + 255) / 256 * 256; }
// Under AddressSanitizer a freed block stays poisoned until it is handed out again, so a read
// after cudaFree still shows.
void PoisonFreed(void* p, size_t bytes, bool poison) {
#if defined(__SANITIZE_ADDRESS__)
  if (poison) ASAN_POISON_MEMORY_REGION(p, Rounded(bytes));
  else ASAN_UNPOISON_MEMORY_REGION(p, Rounded(bytes));
#else
  (void)p, (void)bytes, (void)poison;
#endif
}
// Freed device blocks, most recent last: cudaMalloc hands the latest one of the asked size back,
// as a device allocator tends to hand back a freed range, so that code which keys anything by a
// device address (CUDA graphs) meets a new buffer at an old address here too. The blocks still
// kept at exit are released then: LeakSanitizer checks after static destructors, and would
// report them once the list holding them was gone.
struct FreedBlockList {
  std::deque<std::pair<void*, size_t>> q;
  ~FreedBlockList() {
    for (const auto& [p, bytes] : q) {
      PoisonFreed(p, bytes, false);
      std::free(p);
    }
  }
};
std::deque<std::pair<void*, size_t>>& FreedBlocks() {
  static FreedBlockList list;
  return list.q;
}
constexpr size_t kMaxFreedBlocks = 16;

}  // namespace
}  // namespace emu

using emu::Fail;

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return Fail(cudaErrorInvalidValue);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "thetaserve CUDA emulator");
  prop->totalGlobalMem = size_t(4) << 30;  // as cudaMemGetInfo reports
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;  // an H200's, so split plans match the real card's
  prop->maxThreadsPerBlock = 1024;
  prop->sharedMemPerBlock = 48 << 10;
  prop->warpSize = 32;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : Fail(cudaErrorInvalidValue); }
cudaError_t cudaGetLastError() { return std::exchange(emu::g_last_error, cudaSuccess); }
cudaError_t cudaPeekAtLastError() { return emu::g_last_error; }
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    default: return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }

// 256-byte aligned host memory filled with NaN bytes: a GPU does not clear what it allocates,
// and NaN makes a read of memory nobody wrote show, where the host heap's leftovers would pass
// or fail by chance.
static void* PoisonedAlloc(size_t bytes) {
  const size_t rounded = emu::Rounded(bytes);
  void* p = std::aligned_alloc(256, rounded);
  if (p) std::memset(p, 0xFF, rounded);
  return p;
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(emu::g_alloc_mutex);
  void* p = nullptr;
  auto& freed = emu::FreedBlocks();
  for (auto it = freed.rbegin(); it != freed.rend(); ++it) {
    if (it->second == bytes) {  // reused: NaN bytes again, as fresh memory is
      p = it->first;
      emu::PoisonFreed(p, bytes, false);
      std::memset(p, 0xFF, emu::Rounded(bytes));
      freed.erase(std::next(it).base());
      break;
    }
  }
  if (!p) p = PoisonedAlloc(bytes);
  if (!p) return Fail(cudaErrorMemoryAllocation);
  emu::Allocations()[p] = bytes;
  *ptr = p;
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(emu::g_alloc_mutex);
  auto it = emu::Allocations().find(ptr);
  if (it == emu::Allocations().end()) return Fail(cudaErrorInvalidValue);
  auto& freed = emu::FreedBlocks();
  freed.emplace_back(ptr, it->second);
  emu::PoisonFreed(ptr, it->second, true);
  emu::Allocations().erase(it);
  if (freed.size() > emu::kMaxFreedBlocks) {
    emu::PoisonFreed(freed.front().first, freed.front().second, false);
    std::free(freed.front().first);
    freed.pop_front();
  }
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  std::lock_guard<std::mutex> lock(emu::g_alloc_mutex);
  size_t used = 0;
  for (const auto& [p, bytes] : emu::Allocations()) used += bytes;
  *total = size_t(4) << 30;
  *free = used < *total ? *total - used : 0;
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  void* p = PoisonedAlloc(bytes);  // host memory: not counted as device memory
  if (!p) return Fail(cudaErrorMemoryAllocation);
  *ptr = p;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int) {
  return cudaMallocHost(ptr, bytes);
}
cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned int) {
  *device = host;
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t stream) {
  emu::EnqueueOnStream(stream, [=] { if (bytes) std::memmove(dst, src, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  std::memset(ptr, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  emu::EnqueueOnStream(stream, [=] { std::memset(ptr, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = new CUstream_st;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) { return cudaStreamCreate(stream); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return emu::StreamOf(stream).capturing ? Fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  event->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  if (!stream) return Fail(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot
  stream->capturing = true;
  stream->captured.clear();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (!stream || !stream->capturing) return Fail(cudaErrorInvalidValue);
  stream->capturing = false;
  *graph = new CUgraph_st{std::move(stream->captured)};
  stream->captured.clear();
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = new CUgraphExec_st{graph->ops};
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (emu::StreamOf(stream).capturing) return Fail(cudaErrorStreamCaptureUnsupported);
  for (const auto& op : exec->ops) op();
  return cudaSuccess;
}
