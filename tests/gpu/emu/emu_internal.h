// The CUDA emulator's parts shared by emu.cc (fibers, launches) and emu_runtime.cc (memory,
// streams, events, graphs). Not for the emulated code.
#pragma once

#include <chrono>
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

}  // namespace emu
