#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#define TS_CPU_RELAX() _mm_pause()
#else
#define TS_CPU_RELAX() ((void)0)
#endif

namespace thetaserve::kernels::cpu {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  num_threads = std::max(1, num_threads);
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  while (true) {
    int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= num_chunks_) break;
    int64_t begin = c * chunk_;
    int64_t end = std::min(n_, begin + chunk_);
    (*fn_)(begin, end);
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  while (true) {
    // Spin for a short while (~tens of microseconds), then sleep on the futex.
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < 20000; ++spin) {
      TS_CPU_RELAX();
      g = generation_.load(std::memory_order_acquire);
    }
    while (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load()) return;
    RunChunks();
    active_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t threads = num_threads();
  if (threads == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  // A few chunks per thread so uneven chunks balance out.
  int64_t chunks = std::min<int64_t>((n + grain - 1) / grain, threads * 4);
  fn_ = &fn;
  n_ = n;
  chunk_ = (n + chunks - 1) / chunks;
  num_chunks_ = (n + chunk_ - 1) / chunk_;
  next_chunk_.store(0, std::memory_order_relaxed);
  active_.store(static_cast<int>(workers_.size()), std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  RunChunks();
  while (active_.load(std::memory_order_acquire) != 0) TS_CPU_RELAX();
}

}  // namespace thetaserve::kernels::cpu
