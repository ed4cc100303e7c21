// A fork-join pool for the CPU kernels. The caller takes part in its own job and waits only for
// chunks that were claimed, never for a worker to wake up: on a busy or oversubscribed machine
// a sleeping worker costs nothing, and a decode step's hundreds of short parallel regions do
// not each pay a wake-up. Workers spin briefly, then sleep on a futex.
// Thread-safety: ParallelFor may be called from one thread at a time.
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
  // Claims and runs chunks of job `job` until none are left.
  void RunChunks(uint32_t job);

  std::vector<std::thread> workers_;
  // Bits 63-32: job id; 31-16: the job's chunk count; 15-0: next chunk to claim. Claims are
  // CAS on the whole word, so a worker that wakes late can never claim a chunk of a newer job,
  // nor one past the end of its own.
  std::atomic<uint64_t> work_{0};
  std::atomic<int64_t> done_{0};      // chunks finished of the current job
  std::atomic<uint64_t> generation_{0};  // bumped per job; workers wait on it
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  uint32_t job_ = 0;
  // The current job; written before work_ is published.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 1;
  int64_t num_chunks_ = 0;
};

}  // namespace thetaserve::kernels::cpu
