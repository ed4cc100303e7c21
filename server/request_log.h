// What the server writes to its log while it serves, besides start-up and shutdown: a line per
// request the engine took (--log-requests) and, every --log-stats-interval seconds that saw
// work, a line of throughput and occupancy. Both are logfmt (space-separated key=value), which
// grep reads and log pipelines (Loki, Fluent Bit, Vector) parse without a custom pattern.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "scheduler/request.h"
#include "scheduler/stats.h"

namespace thetaserve::server {

// `request id=... api=grpc outcome=length prompt_tokens=5 completion_tokens=16 queue_s=0.001
// ttft_s=0.050 total_s=0.412 preemptions=0`, then `error="..."` when the status is not OK
// (cancellations included: why it was cancelled). No prompt or output text.
std::string RequestLogLine(std::string_view api, std::string_view request_id,
                           const scheduler::FinishInfo& info);

// The interval from `before` to `now` (`seconds` long): prompt and generated tokens per second,
// running and waiting requests, the KV pool's pages in use, preemptions; the share of V rows
// stored (of a dense cache's) while a sparse policy stores fewer, and the prefix cache's hit
// rate over the interval when it looked anything up. nullopt when the interval saw no work
// (no tokens, nothing running or waiting): an idle server writes nothing.
std::optional<std::string> StatsLogLine(const scheduler::EngineStats& before,
                                        const scheduler::EngineStats& now, double seconds);

// Writes one line (and its newline) to stderr whole: fwrite, so a NUL in it cuts nothing.
void WriteLogLine(const std::string& line);

// Writes StatsLogLine every `interval_seconds` from its own thread until destroyed. `read`
// (the engine's Stats(), which is thread-safe) and `write` are called on that thread only.
class StatsLogger {
 public:
  StatsLogger(std::function<scheduler::EngineStats()> read,
              std::function<void(const std::string&)> write, double interval_seconds);
  ~StatsLogger();  // stops the thread; returns within one wake-up
  StatsLogger(const StatsLogger&) = delete;
  StatsLogger& operator=(const StatsLogger&) = delete;

 private:
  void Run();

  const std::function<scheduler::EngineStats()> read_;
  const std::function<void(const std::string&)> write_;
  const double interval_seconds_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace thetaserve::server
