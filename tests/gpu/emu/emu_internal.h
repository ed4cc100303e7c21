// The CUDA emulator's parts shared by emu.cc (fibers, launches), emu_runtime.cc (memory,
// streams, events, graphs) and emu_pipeline.cc (cp.async). Not for the emulated code.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <vector>

#include "cuda_runtime.h"

struct CUstream_st {
  bool capturing = false;
  std::vector<std::function<void()>> captured;
};
struct CUevent_st {
  std::chrono::steady_clock::time_point at;
};
struct CUgraph_st {
  std::vector<std::function<void()>> ops;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> ops;
};

namespace emu {

extern thread_local cudaError_t g_last_error;  // what cudaGetLastError returns
// Records `e` as the last error and returns it.
cudaError_t Fail(cudaError_t e);
// The stream `s` names; null: the legacy stream.
CUstream_st& StreamOf(cudaStream_t s);

// A cp.async copy in flight: the bytes it will write at its wait.
struct AsyncCopy {
  unsigned char* dst;
  std::vector<unsigned char> bytes;
};
// An emulated thread's cp.async copies.
struct PipelineState {
  std::vector<AsyncCopy> copies;   // issued, not landed, oldest first
  std::vector<size_t> group_ends;  // committed groups: copies[0, group_ends[i])
};
// The running emulated thread's (emu.cc).
PipelineState& CurrentPipeline();

}  // namespace emu
