// ThreadPool::ParallelFor runs every chunk exactly once and returns only when all have
// finished, also with many more threads than cores (where workers run late and interleave
// with the next job's set-up). A stress test: the bug it guards against (a straggler claiming
// a chunk past the end of an exhausted job) showed in a longer run of this loop, about once
// per 60,000 jobs at 16 threads on 2 cores, and crashed the engine at concurrency 64.
#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace thetaserve::kernels::cpu {
namespace {

TEST(ThreadPoolTest, EveryChunkOnceAndNoneRunningAfterReturn) {
  for (int threads : {2, 16}) {
    for (int pools = 0; pools < 4; ++pools) {
      ThreadPool pool(threads);
      for (int it = 0; it < 15000; ++it) {
        // Jobs of few chunks followed by jobs of many: a worker still finishing the small
        // job must not mistake the big job's chunk count for its own.
        const int64_t n = it % 2 ? 2 + it % 3 : 100 + (it * 7919) % 200;
        std::vector<int> hits(n, 0);
        std::atomic<int> running{0};
        pool.ParallelFor(n, 1, [&](int64_t b, int64_t e) {
          running.fetch_add(1);
          for (int64_t i = b; i < e; ++i) hits[i]++;
          if ((b * 31 + it) % 97 == 0) std::this_thread::yield();
          running.fetch_sub(1);
        });
        ASSERT_EQ(running.load(), 0) << threads << " threads, job " << it << ": returned early";
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(hits[i], 1) << threads << " threads, job " << it << ", element " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace thetaserve::kernels::cpu
