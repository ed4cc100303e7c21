// A fork-join pool for the CPU kernels. Workers spin briefly before sleeping, because a decode
// step runs hundreds of short parallel regions and a condition-variable wake per region would
// cost more than the work. Thread-safety: ParallelFor may be called from one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace thetaserve::kernels::cpu {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread; <= 0 means all hardware threads.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over [0, n) split into chunks of at least `grain`; blocks until done.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop();
  void RunChunks();

  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> next_chunk_{0};
  std::atomic<int> active_{0};
  std::atomic<bool> stop_{false};
  // The current job; written by the caller before generation_ is bumped.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 1;
  int64_t num_chunks_ = 0;
};

}  // namespace thetaserve::kernels::cpu
