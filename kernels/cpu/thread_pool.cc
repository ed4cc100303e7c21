#include "kernels/cpu/thread_pool.h"

#include <algorithm>

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

void ThreadPool::RunChunks(uint32_t job) {
  uint64_t w = work_.load(std::memory_order_acquire);
  while (true) {
    if (static_cast<uint32_t>(w >> 32) != job) return;
    // The chunk count comes from the same word as the index: the num_chunks_ member may
    // already hold the next job's count (the caller writes it before publishing work_), and a
    // worker comparing an exhausted job's index against it used to claim a chunk that did
    // not exist, run it with the next job's fields and count it done: the next ParallelFor
    // could then return while one of its chunks still ran.
    const int64_t chunks = static_cast<int64_t>((w >> 16) & 0xffffu);
    const int64_t idx = static_cast<int64_t>(w & 0xffffu);
    if (idx >= chunks) return;
    if (!work_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel)) continue;
    // Claimed: the caller cannot finish (or start another job) before this chunk is done,
    // so the job's fields stay valid.
    const int64_t begin = idx * chunk_;
    const int64_t end = std::min(n_, begin + chunk_);
    (*fn_)(begin, end);
    done_.fetch_add(1, std::memory_order_acq_rel);
    w = work_.load(std::memory_order_acquire);
  }
}

void ThreadPool::WorkerLoop() {
  // Generation 0 is the one before any job, not the one current when this thread first runs:
  // a worker that starts after the destructor's bump would otherwise wait for another forever.
  uint64_t seen = 0;
  while (true) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < 4000; ++spin) {
      TS_CPU_RELAX();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      sleepers_.fetch_add(1);
      generation_.wait(seen, std::memory_order_acquire);
      sleepers_.fetch_sub(1);
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load()) return;
    RunChunks(static_cast<uint32_t>(work_.load(std::memory_order_acquire) >> 32));
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
  // A few chunks per thread so uneven chunks (and late workers) balance out.
  const int64_t chunks = std::min<int64_t>({(n + grain - 1) / grain, threads * 4, 0xffff});
  fn_ = &fn;
  n_ = n;
  chunk_ = (n + chunks - 1) / chunks;
  num_chunks_ = (n + chunk_ - 1) / chunk_;
  done_.store(0, std::memory_order_relaxed);
  const uint32_t job = ++job_;
  work_.store((uint64_t(job) << 32) | (uint64_t(num_chunks_) << 16), std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  if (sleepers_.load() > 0) generation_.notify_all();
  RunChunks(job);
  while (done_.load(std::memory_order_acquire) < num_chunks_) TS_CPU_RELAX();
}

}  // namespace thetaserve::kernels::cpu
