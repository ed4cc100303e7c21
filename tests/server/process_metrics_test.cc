// The process_* series (server/process_metrics.h): each reading against what the test itself
// changes in the process (a descriptor, a thread, CPU time), and the exposition promtool takes.
#include "server/process_metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "server/metrics.h"
#include "tests/server/e2e_util.h"
#include "tests/test_util.h"

namespace thetaserve::server {
namespace {

ProcessSample Sample() {
  absl::StatusOr<ProcessSample> s = ReadProcessSample();
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : ProcessSample{};
}

TEST(ProcessMetricsTest, OpenDescriptorsCountOneMoreWhileAFileIsOpen) {
  const ProcessSample before = Sample();
  const int fd = open("/proc/self/stat", O_RDONLY);
  ASSERT_GE(fd, 0);
  const ProcessSample during = Sample();
  close(fd);
  const ProcessSample after = Sample();
  EXPECT_EQ(during.open_fds, before.open_fds + 1);
  EXPECT_EQ(after.open_fds, before.open_fds);
  EXPECT_GT(before.open_fds, 2);  // stdin, stdout, stderr at least
  EXPECT_GE(before.max_fds, during.open_fds);
}

TEST(ProcessMetricsTest, ThreadsCountOneMoreWhileAThreadRuns) {
  const ProcessSample before = Sample();
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread waiter([&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  });
  const ProcessSample during = Sample();
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_one();
  waiter.join();
  // The kernel may count a joined thread for a moment longer (join returns early in its exit).
  ProcessSample after = Sample();
  for (int i = 0; i < 500 && after.threads != before.threads; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    after = Sample();
  }
  EXPECT_GE(before.threads, 1);
  EXPECT_EQ(during.threads, before.threads + 1);
  EXPECT_EQ(after.threads, before.threads);
}

TEST(ProcessMetricsTest, MemoryStartTimeAndCpuTimeAreThisProcesss) {
  const ProcessSample first = Sample();
  // Touch 64 MiB: resident memory counts it while it is held.
  constexpr size_t kBytes = size_t(64) << 20;
  std::unique_ptr<char[]> block(new char[kBytes]);
  for (size_t i = 0; i < kBytes; i += 4096) block[i] = char(i >> 12);
  // Spin until the kernel has charged some CPU time (its clock ticks at 1/CLK_TCK s).
  volatile uint64_t spin = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  ProcessSample second = Sample();
  while (second.cpu_seconds <= first.cpu_seconds &&
         std::chrono::steady_clock::now() < deadline) {
    for (int i = 0; i < 1000000; ++i) spin = spin + i;
    second = Sample();
  }
  EXPECT_GT(second.cpu_seconds, first.cpu_seconds);
  EXPECT_GE(second.resident_bytes, first.resident_bytes + 0.9 * kBytes)
      << "first " << first.resident_bytes << ", second " << second.resident_bytes;
  EXPECT_GE(second.virtual_bytes, second.resident_bytes);
  // Read the block back, so that no compiler drops the writes (and the block with them).
  uint64_t sum = 0;
  for (size_t i = 0; i < kBytes; i += 4096) sum += uint8_t(block[i]);
  EXPECT_EQ(sum, uint64_t(255) * 128 * 64);  // 16,384 pages: bytes 0..255, 64 times each
  block.reset();
  // Started before now, and not before this test binary could have been started (an hour ago).
  const double now = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_LE(first.start_time_seconds, now + 1);
  EXPECT_GT(first.start_time_seconds, now - 3600);
  EXPECT_EQ(second.start_time_seconds, first.start_time_seconds);
}

// Every family of Metrics' exposition, the process ones included, as promtool reads it.
TEST(ProcessMetricsTest, TheServersExpositionCarriesThemAndPassesPromtool) {
  MetricsInfo info;
  info.version = "test";
  info.backend = "cpu";
  info.model = "m";
  const Metrics metrics(info);
  const std::string text = metrics.Serialize();
  for (const char* name :
       {"process_cpu_seconds_total", "process_open_fds", "process_max_fds",
        "process_virtual_memory_bytes", "process_resident_memory_bytes",
        "process_start_time_seconds", "process_threads"}) {
    EXPECT_NE(text.find(std::string("\n") + name + " "), std::string::npos) << name << "\n" << text;
    EXPECT_NE(text.find(std::string("# TYPE ") + name + " "), std::string::npos) << name;
  }
  EXPECT_NE(text.find("\nthetaserve_requests_running "), std::string::npos);
  const testing::ScopedTempDir tmp("process_metrics_test");
  const std::string path = tmp.File("metrics.txt");
  std::ofstream(path) << text;
  int rc = 0;
  const std::string out = testing::RunCommand("promtool check metrics < " + path + " 2>&1", &rc);
  EXPECT_EQ(rc, 0) << "promtool check metrics failed:\n" << out;
}

}  // namespace
}  // namespace thetaserve::server
