#include "server/request_log.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace thetaserve::server {
namespace {

bool IsControl(char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }

// A logfmt value in double quotes: backslashes and quotes escaped, control characters (line
// breaks, ESC, NUL, ...) as \xNN, so one request stays one line, and a terminal shows what the
// client sent rather than obeying it, whatever an id or an error holds.
std::string Quoted(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (IsControl(c)) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Ids come from clients (gRPC's request_id): quoted unless plainly safe.
std::string Value(std::string_view text) {
  const bool plain = !text.empty() && text.find_first_of(" \"=\\") == std::string_view::npos &&
                     std::none_of(text.begin(), text.end(), IsControl);
  return plain ? std::string(text) : Quoted(text);
}

std::string Percent(double part, double whole) {
  return absl::StrFormat("%.1f%%", whole > 0 ? 100.0 * part / whole : 0.0);
}

}  // namespace

std::string RequestLogLine(std::string_view api, std::string_view request_id,
                           const scheduler::FinishInfo& info) {
  // No first token (cancelled or failed before one, or prompt logprobs alone): no ttft_s, as
  // the TTFT histogram observes none; 0.000 read as an instant one.
  const std::string ttft = info.has_ttft()
                               ? absl::StrFormat(" ttft_s=%.3f", info.ttft_seconds)
                               : std::string();
  std::string line = absl::StrFormat(
      "request id=%s api=%s outcome=%s prompt_tokens=%d completion_tokens=%d queue_s=%.3f%s "
      "total_s=%.3f preemptions=%d",
      Value(request_id), api, scheduler::FinishReasonName(info.reason), info.prompt_tokens,
      info.completion_tokens, info.queue_seconds, ttft, info.total_seconds, info.preemptions);
  if (!info.status.ok()) absl::StrAppend(&line, " error=", Quoted(info.status.ToString()));
  return line;
}

std::optional<std::string> StatsLogLine(const scheduler::EngineStats& before,
                                        const scheduler::EngineStats& now, double seconds) {
  const auto& b = before.counters;
  const auto& n = now.counters;
  const int64_t prompt = n.prompt_tokens - b.prompt_tokens;
  const int64_t generated = n.generation_tokens - b.generation_tokens;
  if (prompt == 0 && generated == 0 && now.running == 0 && now.waiting == 0) return std::nullopt;
  const double s = seconds > 0 ? seconds : 1;
  std::string line = absl::StrFormat(
      "stats prompt_tokens_per_s=%.1f generation_tokens_per_s=%.1f running=%d waiting=%d "
      "kv_pages_used=%s preemptions=%d",
      prompt / s, generated / s, now.running, now.waiting,
      Percent(double(now.pages_total - now.pages_free), double(now.pages_total)),
      n.preemptions - b.preemptions);
  if (now.v_rows_dense_equivalent > 0 && now.v_rows_resident < now.v_rows_dense_equivalent) {
    absl::StrAppend(&line, " v_rows_stored=",
                    Percent(double(now.v_rows_resident), double(now.v_rows_dense_equivalent)));
  }
  const int64_t looked_up = n.prefix_query_tokens - b.prefix_query_tokens;
  if (looked_up > 0) {
    absl::StrAppend(&line, " prefix_cache_hits=",
                    Percent(double(n.prefix_hit_tokens - b.prefix_hit_tokens), double(looked_up)));
  }
  return line;
}

void WriteLogLine(const std::string& line) {
  const std::string whole = line + "\n";
  std::fwrite(whole.data(), 1, whole.size(), stderr);
}

StatsLogger::StatsLogger(std::function<scheduler::EngineStats()> read,
                         std::function<void(const std::string&)> write, double interval_seconds)
    : read_(std::move(read)), write_(std::move(write)), interval_seconds_(interval_seconds) {
  thread_ = std::thread([this] { Run(); });
}

StatsLogger::~StatsLogger() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StatsLogger::Run() {
  using Clock = std::chrono::steady_clock;
  const auto interval = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(interval_seconds_));
  scheduler::EngineStats before = read_();
  Clock::time_point since = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_until(lock, since + interval, [this] { return stop_; })) {
    lock.unlock();
    const scheduler::EngineStats now = read_();
    const Clock::time_point at = Clock::now();
    if (auto line = StatsLogLine(before, now, std::chrono::duration<double>(at - since).count())) {
      write_(*line);
    }
    before = now;
    since = at;
    lock.lock();
  }
}

}  // namespace thetaserve::server
