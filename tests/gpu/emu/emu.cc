// CUDA emulator (tests only): fibers for the threads of a block, and kernel launches on them
// (the runtime API over host memory: emu_runtime.cc). See cuda_runtime_api.h for what it is for
// and README.md for its limits.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include "cuda_pipeline.h"
#include "cuda_runtime.h"
#include "emu_internal.h"

// Fiber switch (x86-64 System V): saves the callee-saved registers and the FP control words on
// the current stack, stores the stack pointer in *save_sp and continues on new_sp.
extern "C" void EmuSwitchContext(void** save_sp, void* new_sp);
asm(R"(
  .text
  .globl EmuSwitchContext
  .type EmuSwitchContext, @function
EmuSwitchContext:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size EmuSwitchContext, .-EmuSwitchContext
  .section .note.GNU-stack,"",@progbits
  .text
)");

namespace emu {
namespace {

constexpr size_t kStackBytes = size_t(256) << 10;
constexpr size_t kGuardBytes = 4096;
constexpr size_t kMaxDynamicShared = 48 << 10;  // without the opt-in attribute
constexpr size_t kMaxDynamicSharedOptIn = 227 << 10;  // an H200's, with it
constexpr unsigned kMaxClusterBlocks = 8;  // the portable cluster size

enum class FiberState { kReady, kAtBlockBarrier, kAtWarpBarrier, kAtClusterBarrier, kDone };

struct Fiber {
  void* sp = nullptr;
  FiberState state = FiberState::kReady;
  uint3 tid{};
  int warp = 0;
  PipelineState pipeline;          // its cp.async copies (emu_pipeline.cc)
  uint64_t gathers = 0;            // GatherInWarp calls so far
};

// Dynamic shared memory starts 128-byte aligned, as the kernels' __align__(128) declarations
// ask and as a GPU places it (warp matrix loads need 32 bytes).
template <typename T>
struct Aligned128 {
  using value_type = T;
  Aligned128() = default;
  template <typename U>
  Aligned128(const Aligned128<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(128)));
  }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(128)); }
  template <typename U>
  bool operator==(const Aligned128<U>&) const { return true; }
};

struct Block {
  std::vector<Fiber> fibers;
  void* sched_sp = nullptr;
  int current = 0;
  int step = 1;  // +1: threads start in index order; -1: in reverse (ScheduleOrder)
  int live = 0;
  int block_arrived = 0;
  std::vector<int> warp_arrived, warp_live;
  std::vector<uint64_t> slots;  // [warps, 32] values being exchanged
  std::vector<unsigned char> gathered;  // [warps, 32, kGatherSlot] (GatherInWarp)
  const std::function<void()>* body = nullptr;
  std::vector<unsigned char, Aligned128<unsigned char>> smem;
  // Clusters (cooperative_groups.h): the block's index and rank, and its threads waiting at
  // cluster.sync().
  uint3 idx{};
  unsigned rank = 0;
  int cluster_arrived = 0;
};

thread_local Block* g_block = nullptr;
unsigned g_cluster_blocks = 1;  // blocks per cluster of the running launch (1: no clusters)
// One launch at a time: static __shared__ variables are global here, one copy per kernel (the
// blocks of a cluster take turns, each up to its next cluster.sync(), so a kernel must not keep
// a static __shared__ value across that barrier).
std::mutex g_launch_mutex;

// Stacks with a guard page below each, kept for later launches.
std::vector<char*>& Stacks() {
  static std::vector<char*> stacks;
  return stacks;
}
char* StackTop(size_t i) {
  std::vector<char*>& s = Stacks();
  while (s.size() <= i) {
    void* p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "emu: cannot map a fiber stack\n");
      std::abort();
    }
    mprotect(p, kGuardBytes, PROT_NONE);
    s.push_back(static_cast<char*>(p));
  }
  return s[i] + kGuardBytes + kStackBytes;
}

Fiber& Current() { return g_block->fibers[g_block->current]; }

// Switches from the running fiber (saving its stack pointer in *save_sp) straight to the next
// ready one, or back to the scheduler when none is ready (all done, or a deadlock). A ready
// lane of the running warp goes first, so a warp runs as far ahead of the others as it can
// before the next block barrier: a warp that reads what another writes (or overwrites what
// another still reads) without a barrier between them shows, as it can on a GPU, where
// warps drift apart. "Next" is the next higher thread index, or, in a block run in reverse
// order (b.step = -1), the next lower one.
void RunFiber(int i, void** save_sp) {
  Block& b = *g_block;
  b.current = i;
  threadIdx = b.fibers[i].tid;
  EmuSwitchContext(save_sp, b.fibers[i].sp);
}

void SwitchToNextReady(void** save_sp) {
  Block& b = *g_block;
  const int n = int(b.fibers.size());
  const int w0 = b.current / 32 * 32, wn = std::min(n, w0 + 32) - w0;
  auto run = [&](int i) { RunFiber(i, save_sp); };
  for (int k = 1; k <= wn; ++k) {
    const int i = w0 + ((b.current - w0 + b.step * k) % wn + wn) % wn;
    if (b.fibers[i].state == FiberState::kReady) return run(i);
  }
  for (int k = 1; k <= n; ++k) {
    const int i = ((b.current + b.step * k) % n + n) % n;
    if (b.fibers[i].state == FiberState::kReady) return run(i);
  }
  EmuSwitchContext(save_sp, b.sched_sp);
}

// The running fiber waits: whoever resumes it has set current and threadIdx back.
void Yield() { SwitchToNextReady(&Current().sp); }

// After a barrier releases, the block's order starts again from its first thread (index 0, or
// the last index in a reversed block), or for a warp exchange from the warp's first lane, so
// that between two barriers threads run in clean index order in some blocks and clean reverse
// order in the others, whichever thread happened to arrive last. The running fiber, if still
// live, stays ready and runs again when its turn comes.
void RestartOrder(void** save_sp, int warp /* -1: the whole block */) {
  Block& b = *g_block;
  const int n = int(b.fibers.size());
  const int w0 = warp < 0 ? 0 : warp * 32, wn = warp < 0 ? n : std::min(n, w0 + 32) - w0;
  for (int k = 0; k < wn; ++k) {
    const int i = w0 + (b.step > 0 ? k : wn - 1 - k);
    if (b.fibers[i].state != FiberState::kReady) continue;
    if (i != b.current) RunFiber(i, save_sp);  // else already first: keep running
    return;
  }
  SwitchToNextReady(save_sp);
}

bool ReleaseBlockBarrierIfComplete(Block& b) {
  if (b.block_arrived == 0 || b.block_arrived < b.live) return false;
  for (Fiber& f : b.fibers) {
    if (f.state == FiberState::kAtBlockBarrier) f.state = FiberState::kReady;
  }
  b.block_arrived = 0;
  return true;
}

bool ReleaseWarpBarrierIfComplete(Block& b, int w) {
  if (b.warp_arrived[w] == 0 || b.warp_arrived[w] < b.warp_live[w]) return false;
  const int end = std::min(int(b.fibers.size()), (w + 1) * 32);
  for (int i = w * 32; i < end; ++i) {
    if (b.fibers[i].state == FiberState::kAtWarpBarrier) b.fibers[i].state = FiberState::kReady;
  }
  b.warp_arrived[w] = 0;
  return true;
}

void WarpBarrier() {
  Block& b = *g_block;
  Fiber& f = Current();
  ++b.warp_arrived[f.warp];
  if (b.warp_arrived[f.warp] == b.warp_live[f.warp]) {
    ReleaseWarpBarrierIfComplete(b, f.warp);
    RestartOrder(&f.sp, f.warp);
    return;
  }
  f.state = FiberState::kAtWarpBarrier;
  Yield();
}

void FiberEntry() {
  Block& b = *g_block;
  (*b.body)();
  Fiber& f = Current();
  if (!f.pipeline.copies.empty()) {  // on a GPU they may land after the block's memory is reused
    std::fprintf(stderr, "emu: thread (%u, %u, %u) of block (%u, %u, %u) exits with %zu cp.async copies never waited for\n",
                 threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z, f.pipeline.copies.size());
    std::abort();
  }
  f.state = FiberState::kDone;
  --b.live;
  --b.warp_live[f.warp];
  // Threads that exit no longer count at barriers (as on the GPU).
  const bool block_released = ReleaseBlockBarrierIfComplete(b);
  const bool warp_released = ReleaseWarpBarrierIfComplete(b, f.warp);
  void* unused;
  if (block_released) {
    RestartOrder(&unused, -1);
  } else if (warp_released) {
    RestartOrder(&unused, f.warp);
  } else {
    SwitchToNextReady(&unused);
  }
  std::abort();  // never resumed
}

void* PrepareStack(char* top) {
#if defined(__SANITIZE_ADDRESS__)
  // The stack's last fiber never returned from its frames, so AddressSanitizer's shadow still
  // marks their redzones: clear it before the stack is reused (scripts/sanitize.sh).
  __asan_unpoison_memory_region(top - kStackBytes, kStackBytes);
#endif
  auto* s = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(top) & ~uintptr_t(15));
  *--s = 0;                                        // FiberEntry's return address (never used)
  *--s = reinterpret_cast<uint64_t>(&FiberEntry);  // where the first switch returns to
  for (int i = 0; i < 6; ++i) *--s = 0;            // rbp rbx r12 r13 r14 r15
  *--s = 0x1F80ull | (0x037Full << 32);            // default MXCSR and x87 control word
  return s;
}

const char* WaitSummary(const Block& b, char* buf, size_t n) {
  int at_block = 0, at_warp = 0, at_cluster = 0, done = 0;
  for (const Fiber& f : b.fibers) {
    at_block += f.state == FiberState::kAtBlockBarrier;
    at_warp += f.state == FiberState::kAtWarpBarrier;
    at_cluster += f.state == FiberState::kAtClusterBarrier;
    done += f.state == FiberState::kDone;
  }
  std::snprintf(buf, n,
                "%d threads at __syncthreads, %d at a warp exchange, %d at cluster.sync(), %d exited",
                at_block, at_warp, at_cluster, done);
  return buf;
}

// Sets up the block's threads (fibers on stacks first_stack, first_stack + 1, ...), none run.
void StartBlock(Block& b, dim3 block, bool reverse, size_t first_stack) {
  const int n = int(block.x * block.y * block.z);
  const int warps = (n + 31) / 32;
  b.fibers.assign(n, Fiber{});
  b.live = n;
  b.block_arrived = 0;
  b.cluster_arrived = 0;
  b.warp_arrived.assign(warps, 0);
  b.warp_live.assign(warps, 0);
  b.slots.assign(size_t(warps) * 32, 0);
  b.gathered.assign(size_t(warps) * 32 * kGatherSlot, 0);
  std::fill(b.smem.begin(), b.smem.end(), 0xFF);  // NaN bytes: unwritten shared memory shows
  for (int i = 0; i < n; ++i) {
    Fiber& f = b.fibers[i];
    f.tid = uint3{unsigned(i) % block.x, unsigned(i) / block.x % block.y,
                  unsigned(i) / (block.x * block.y)};
    f.warp = i / 32;
    ++b.warp_live[f.warp];
    f.sp = PrepareStack(StackTop(first_stack + i));
  }
  b.step = reverse ? -1 : 1;
}

// Runs the block's ready threads (the first in its order first) until none is ready: all
// exited, waiting at cluster.sync(), or deadlocked.
void ResumeBlock(Block& b) {
  const int n = int(b.fibers.size());
  for (int k = 0; k < n; ++k) {
    const int i = b.step > 0 ? k : n - 1 - k;
    if (b.fibers[i].state != FiberState::kReady) continue;
    // The fibers pass control among themselves and come back here only when none is ready.
    b.current = i;
    threadIdx = b.fibers[i].tid;
    EmuSwitchContext(&b.sched_sp, b.fibers[i].sp);
    return;
  }
}

bool WaitsAtClusterBarrier(const Block& b) {
  return b.live > 0 && b.cluster_arrived == b.live;
}

void Enter(Block& b) {
  g_block = &b;
  blockIdx = b.idx;
}

// Runs a cluster's blocks (a launch without clusters: one block) to their ends, in phases: each
// block up to cluster.sync() (or its end), in rank order or (reverse_ranks) the reverse, then,
// once every block's live threads wait there, the next phase. Stops the test on a deadlock
// inside a block, or when some of the cluster's blocks end while the others wait at the barrier.
void RunCluster(std::vector<Block>& blocks, bool reverse_ranks) {
  const size_t n = blocks.size();
  for (;;) {
    for (size_t k = 0; k < n; ++k) {
      Block& b = blocks[reverse_ranks ? n - 1 - k : k];
      Enter(b);
      ResumeBlock(b);
    }
    size_t done = 0;
    for (Block& b : blocks) {
      if (b.live == 0) {
        ++done;
      } else if (!WaitsAtClusterBarrier(b)) {
        char buf[200];
        std::fprintf(stderr,
                     "emu: deadlock in block (%u, %u, %u): %s. A barrier or warp exchange is not "
                     "reached by every live thread (threads started in %s order).\n",
                     b.idx.x, b.idx.y, b.idx.z, WaitSummary(b, buf, sizeof buf),
                     b.step < 0 ? "reverse" : "index");
        std::abort();
      }
    }
    if (done == blocks.size()) return;
    if (done > 0) {
      std::fprintf(stderr,
                   "emu: %zu of a cluster's %zu blocks (block (%u, %u, %u) first) ended while the "
                   "others wait at cluster.sync()\n",
                   done, blocks.size(), blocks[0].idx.x, blocks[0].idx.y, blocks[0].idx.z);
      std::abort();
    }
    for (Block& b : blocks) {
      for (Fiber& f : b.fibers) {
        if (f.state == FiberState::kAtClusterBarrier) f.state = FiberState::kReady;
      }
      b.cluster_arrived = 0;
    }
  }
}

// The order of the blocks' threads (ScheduleOrder): THETASERVE_EMU_ORDER=forward|reverse
// pins it, else every other block runs in reverse, counted across launches.
ScheduleOrder InitialOrder() {
  const char* v = std::getenv("THETASERVE_EMU_ORDER");
  if (v && std::strcmp(v, "forward") == 0) return ScheduleOrder::kForward;
  if (v && std::strcmp(v, "reverse") == 0) return ScheduleOrder::kReverse;
  if (v && *v && std::strcmp(v, "alternate") != 0) {
    std::fprintf(stderr, "emu: THETASERVE_EMU_ORDER=%s: expected forward, reverse or alternate\n", v);
    std::abort();
  }
  return ScheduleOrder::kAlternate;
}
ScheduleOrder g_order = InitialOrder();
uint64_t g_blocks_run = 0;    // under g_launch_mutex
uint64_t g_clusters_run = 0;  // of more than one block; under g_launch_mutex
std::atomic<uint64_t> g_cluster_launches{0};
std::atomic<uint64_t> g_kernel_launches{0};  // every accepted launch (recorded ones included)

cudaError_t Execute(dim3 grid, dim3 block, dim3 cluster, size_t smem,
                    const std::function<void()>& body) {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  const unsigned blocks_per_cluster = cluster.x * cluster.y * cluster.z;
  const size_t threads = size_t(block.x) * block.y * block.z;
  std::vector<Block> blocks(blocks_per_cluster);
  for (Block& b : blocks) {
    b.body = &body;
    b.smem.resize(smem);
  }
  Block* outer = g_block;
  const unsigned outer_cluster = g_cluster_blocks;
  g_cluster_blocks = blocks_per_cluster;
  gridDim = grid;
  blockDim = block;
  for (unsigned z = 0; z < grid.z; z += cluster.z) {
    for (unsigned y = 0; y < grid.y; y += cluster.y) {
      for (unsigned x = 0; x < grid.x; x += cluster.x) {
        for (unsigned r = 0; r < blocks_per_cluster; ++r) {
          Block& b = blocks[r];
          b.rank = r;
          b.idx = uint3{x + r % cluster.x, y + r / cluster.x % cluster.y,
                        z + r / (cluster.x * cluster.y)};
          const bool reverse = g_order == ScheduleOrder::kReverse ||
                               (g_order == ScheduleOrder::kAlternate && g_blocks_run % 2 == 1);
          ++g_blocks_run;
          Enter(b);
          StartBlock(b, block, reverse, r * threads);
        }
        // Clusters alternate rank orders as blocks alternate thread orders (ScheduleOrder), so
        // a missing cluster barrier shows whichever of two blocks runs first.
        const bool reverse_ranks =
            blocks_per_cluster > 1 &&
            (g_order == ScheduleOrder::kReverse ||
             (g_order == ScheduleOrder::kAlternate && g_clusters_run++ % 2 == 1));
        RunCluster(blocks, reverse_ranks);
      }
    }
  }
  g_block = outer;
  g_cluster_blocks = outer_cluster;
  return cudaSuccess;
}

std::mutex g_attr_mutex;
std::map<const void*, size_t>& MaxDynamicShared() {  // cudaFuncSetAttribute's opt-ins
  static std::map<const void*, size_t> m;
  return m;
}

}  // namespace

void SyncThreads() {
  Block& b = *g_block;
  ++b.block_arrived;
  if (b.block_arrived == b.live) {
    ReleaseBlockBarrierIfComplete(b);
    RestartOrder(&Current().sp, -1);
    return;
  }
  Current().state = FiberState::kAtBlockBarrier;
  Yield();
}

void SyncWarp() { WarpBarrier(); }

int LaneId() { return g_block->current % 32; }

uint64_t ExchangeInWarp(uint64_t bits, int src_lane) {
  Block& b = *g_block;
  const int w = Current().warp;
  b.slots[size_t(w) * 32 + LaneId()] = bits;
  WarpBarrier();
  const int src = w * 32 + src_lane;
  // A lane past the block's last thread reads as 0; reading a lane that has exited is
  // undefined on a GPU, and here it stops the test.
  uint64_t v = 0;
  if (src_lane >= 0 && src_lane < 32 && src < int(b.fibers.size())) {
    if (b.fibers[src].state == FiberState::kDone) {
      std::fprintf(stderr, "emu: a warp exchange in block (%u, %u, %u) reads lane %d of warp %d, which has exited\n",
                   blockIdx.x, blockIdx.y, blockIdx.z, src_lane, w);
      std::abort();
    }
    v = b.slots[size_t(w) * 32 + src_lane];
  }
  WarpBarrier();  // nobody overwrites a slot before every lane has read
  return v;
}

void GatherInWarp(const void* mine, size_t bytes, void* all, const std::function<void()>& then) {
  Block& b = *g_block;
  Fiber& f = Current();
  const int w = f.warp;
  if (bytes > kGatherBytes) {
    std::fprintf(stderr, "emu: a warp gather of %zu bytes a lane (at most %zu)\n", bytes,
                 kGatherBytes);
    std::abort();
  }
  // A slot: the lane's count of gathers so far, then its bytes. Lanes that meet at the warp
  // barrier from different places (one at a gather, another at __syncwarp or a shuffle) leave
  // different counts.
  unsigned char* slots = b.gathered.data() + size_t(w) * 32 * kGatherSlot;
  const uint64_t count = ++f.gathers;
  std::memcpy(slots + size_t(LaneId()) * kGatherSlot, &count, sizeof count);
  std::memcpy(slots + size_t(LaneId()) * kGatherSlot + sizeof count, mine, bytes);
  WarpBarrier();
  for (int l = 0; l < 32; ++l) {
    const int i = w * 32 + l;
    uint64_t theirs = 0;
    const bool exists = i < int(b.fibers.size());
    if (exists) std::memcpy(&theirs, slots + size_t(l) * kGatherSlot, sizeof theirs);
    const bool exited = exists && b.fibers[i].state == FiberState::kDone;
    if (!exists || exited || theirs != count) {
      std::fprintf(stderr,
                   "emu: a warp-wide matrix instruction in block (%u, %u, %u), warp %d, finds "
                   "lane %d %s; every lane must execute it, together\n",
                   blockIdx.x, blockIdx.y, blockIdx.z, w, l,
                   !exists  ? "missing"
                   : exited ? "exited"
                            : "elsewhere (at another warp exchange or barrier)");
      std::abort();
    }
    std::memcpy(static_cast<unsigned char*>(all) + size_t(l) * bytes,
                slots + size_t(l) * kGatherSlot + sizeof count, bytes);
  }
  if (then) then();
  WarpBarrier();  // nobody overwrites a slot (or memory `then` reads) before every lane has read
}

void* DynamicShared() { return g_block->smem.data(); }

void ClusterSync() {
  Block& b = *g_block;
  Current().state = FiberState::kAtClusterBarrier;
  ++b.cluster_arrived;
  Yield();  // RunCluster releases the barrier when every block's live threads wait at it
}

unsigned ClusterBlockRank() { return g_block->rank; }
void CountClusterLaunch() { ++g_cluster_launches; }
cudaError_t SetLastError(cudaError_t e) { return Fail(e); }
uint64_t ClusterLaunches() { return g_cluster_launches.load(); }
uint64_t KernelLaunches() { return g_kernel_launches.load(); }
unsigned ClusterNumBlocks() { return g_cluster_blocks; }

PipelineState& CurrentPipeline() { return Current().pipeline; }

cudaError_t SetMaxDynamicShared(const void* kernel, int bytes) {
  if (bytes < 0 || size_t(bytes) > kMaxDynamicSharedOptIn) return Fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(g_attr_mutex);
  MaxDynamicShared()[kernel] = size_t(bytes);
  return cudaSuccess;
}

}  // namespace emu

namespace emu {

void SetScheduleOrder(ScheduleOrder order) {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  g_order = order;
  g_blocks_run = 0;
  g_clusters_run = 0;
}

ScheduleOrder GetScheduleOrder() {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  return g_order;
}

cudaError_t RunKernel(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const void* kernel,
                      dim3 cluster, std::function<void()> body) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.y > 65535 || grid.z > 65535 || block.z > 64) {
    return Fail(cudaErrorInvalidConfiguration);
  }
  // Clusters: at most 8 blocks (the portable size), dividing the grid in each dimension.
  const uint64_t cluster_blocks = uint64_t(cluster.x) * cluster.y * cluster.z;
  if (cluster_blocks == 0 || cluster_blocks > kMaxClusterBlocks || grid.x % cluster.x != 0 ||
      grid.y % cluster.y != 0 || grid.z % cluster.z != 0) {
    return Fail(cudaErrorInvalidValue);
  }
  size_t limit = kMaxDynamicShared;
  {
    std::lock_guard<std::mutex> lock(g_attr_mutex);
    auto it = MaxDynamicShared().find(kernel);
    if (it != MaxDynamicShared().end()) limit = std::max(limit, it->second);
  }
  if (smem > limit) return Fail(cudaErrorInvalidValue);
  ++g_kernel_launches;
  EnqueueOnStream(stream, [grid, block, cluster, smem, body = std::move(body)] {
    Execute(grid, block, cluster, smem, body);
  });
  return cudaSuccess;
}

}  // namespace emu
