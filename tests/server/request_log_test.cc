// The request and stats log lines (server/request_log.h) and the thread that writes the stats.
#include "server/request_log.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace thetaserve::server {
namespace {

scheduler::FinishInfo Finished() {
  scheduler::FinishInfo info;
  info.reason = scheduler::FinishReason::kLength;
  info.prompt_tokens = 5;
  info.completion_tokens = 16;
  info.queue_seconds = 0.0012;
  info.ttft_seconds = 0.0504;
  info.total_seconds = 0.4119;
  info.preemptions = 1;
  return info;
}

TEST(RequestLogLineTest, OneLogfmtLineWithTheRequestsNumbers) {
  EXPECT_EQ(RequestLogLine("grpc", "req-7", Finished()),
            "request id=req-7 api=grpc outcome=length prompt_tokens=5 completion_tokens=16 "
            "queue_s=0.001 ttft_s=0.050 total_s=0.412 preemptions=1");
}

// A request that ended before its first token (cancelled while it waited) has no time to it:
// the field is left out, as the TTFT histogram observes nothing (it said ttft_s=0.000).
TEST(RequestLogLineTest, NoFirstTokenNoTtft) {
  scheduler::FinishInfo info = Finished();
  info.reason = scheduler::FinishReason::kCancelled;
  info.completion_tokens = 0;
  info.ttft_seconds = 0.0;
  EXPECT_EQ(RequestLogLine("http", "req-8", info),
            "request id=req-8 api=http outcome=cancelled prompt_tokens=5 completion_tokens=0 "
            "queue_s=0.001 total_s=0.412 preemptions=1");
}

// Ids come from clients: one with a space, a quote or a line break must not split the line
// or forge a field.
TEST(RequestLogLineTest, QuotesIdsAndErrorsThatWouldBreakTheLine) {
  scheduler::FinishInfo info = Finished();
  info.reason = scheduler::FinishReason::kCancelled;
  info.status = absl::CancelledError("client \"gone\"\nmid-stream");
  const std::string line = RequestLogLine("http", "a b\" outcome=stop", info);
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_EQ(line.rfind("request id=\"a b\\\" outcome=stop\" api=http outcome=cancelled ", 0), 0u)
      << line;
  EXPECT_NE(line.find(" error=\"CANCELLED: client \\\"gone\\\"\\x0amid-stream\""), std::string::npos)
      << line;
  // Control characters (ESC, NUL, a tab) as \xNN: a terminal shows them, a NUL cuts nothing.
  const std::string escaped = RequestLogLine("grpc", std::string("a\x1b[2Jb\0c\td", 10), Finished());
  EXPECT_EQ(escaped.rfind("request id=\"a\\x1b[2Jb\\x00c\\x09d\" api=grpc ", 0), 0u) << escaped;
  EXPECT_EQ(RequestLogLine("grpc", "", Finished()).rfind("request id=\"\" api=grpc", 0), 0u);
}

scheduler::EngineStats Busy() {
  scheduler::EngineStats s;
  s.pages_total = 200;
  s.pages_free = 150;
  s.running = 3;
  s.waiting = 1;
  s.v_rows_resident = 1000;
  s.v_rows_dense_equivalent = 1000;
  return s;
}

TEST(StatsLogLineTest, RatesOverTheIntervalAndTheStateAtItsEnd) {
  scheduler::EngineStats before = Busy(), now = Busy();
  before.counters.prompt_tokens = 100;
  before.counters.generation_tokens = 40;
  before.counters.preemptions = 2;
  now.counters.prompt_tokens = 600;
  now.counters.generation_tokens = 90;
  now.counters.preemptions = 3;
  EXPECT_EQ(StatsLogLine(before, now, 2.0).value_or("nullopt"),
            "stats prompt_tokens_per_s=250.0 generation_tokens_per_s=25.0 running=3 waiting=1 "
            "kv_pages_used=25.0% preemptions=1");
}

// The V store's share appears only while a sparse policy stores fewer rows than dense; the
// prefix cache's hit rate only when the interval looked anything up.
TEST(StatsLogLineTest, SparseStorageAndPrefixHitsWhenThereAreAny) {
  scheduler::EngineStats before = Busy(), now = Busy();
  now.v_rows_resident = 410;
  now.counters.prefix_query_tokens = 200;
  now.counters.prefix_hit_tokens = 150;
  before.counters.prefix_query_tokens = 100;
  before.counters.prefix_hit_tokens = 100;
  const std::string line = StatsLogLine(before, now, 1.0).value_or("nullopt");
  EXPECT_NE(line.find(" v_rows_stored=41.0%"), std::string::npos) << line;
  EXPECT_NE(line.find(" prefix_cache_hits=50.0%"), std::string::npos) << line;
  EXPECT_EQ(StatsLogLine(Busy(), Busy(), 1.0)->find("v_rows_stored"), std::string::npos);
  EXPECT_EQ(StatsLogLine(Busy(), Busy(), 1.0)->find("prefix_cache_hits"), std::string::npos);
}

TEST(StatsLogLineTest, AnIdleIntervalWritesNothing) {
  scheduler::EngineStats idle;
  idle.pages_total = 200;
  idle.pages_free = 200;
  idle.counters.generation_tokens = 90;
  EXPECT_FALSE(StatsLogLine(idle, idle, 10.0).has_value());
  scheduler::EngineStats waiting = idle;
  waiting.waiting = 1;  // queued behind nothing yet: still worth a line
  EXPECT_TRUE(StatsLogLine(idle, waiting, 10.0).has_value());
  scheduler::EngineStats finished = idle;
  finished.counters.generation_tokens = 91;  // the last token of a request that ended
  EXPECT_TRUE(StatsLogLine(idle, finished, 10.0).has_value());
}

TEST(StatsLoggerTest, WritesEveryIntervalFromItsThreadAndStopsWhenDestroyed) {
  std::atomic<int64_t> tokens{0};
  std::mutex mu;
  std::vector<std::string> lines;
  auto logger = std::make_unique<StatsLogger>(
      [&] {
        scheduler::EngineStats s;
        s.counters.generation_tokens = tokens.fetch_add(5) + 5;
        return s;
      },
      [&](const std::string& line) {
        std::lock_guard<std::mutex> lock(mu);
        lines.push_back(line);
      },
      0.01);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (lines.size() >= 3) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  logger.reset();  // joins
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_GE(lines.size(), 3u);
  for (const auto& line : lines) EXPECT_EQ(line.rfind("stats prompt_tokens_per_s=0.0 ", 0), 0u) << line;
}

// An interval of a day still stops at once: the thread waits on a condition, not a sleep.
TEST(StatsLoggerTest, ALongIntervalDoesNotHoldUpShutdown) {
  const auto start = std::chrono::steady_clock::now();
  {
    StatsLogger logger([] { return scheduler::EngineStats{}; }, [](const std::string&) {}, 86400);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
}  // namespace thetaserve::server
