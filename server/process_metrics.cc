#include "server/process_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_type.h"

namespace thetaserve::server {
namespace {

absl::StatusOr<std::string> ReadFile(const char* path) {
  std::ifstream in(path);
  if (!in) return absl::UnavailableError(std::string("cannot read ") + path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<double> ReadBootTime() {
  absl::StatusOr<std::string> stat = ReadFile("/proc/stat");
  if (!stat.ok()) return stat.status();
  std::istringstream lines(*stat);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("btime ")) continue;
    char* end = nullptr;
    const double btime = std::strtod(line.c_str() + 6, &end);
    if (end != line.c_str() + 6) return btime;
  }
  return absl::InternalError("no btime line in /proc/stat");
}

// Read once: the kernel derives btime from the clock less the uptime, and it can move by a
// second between reads on some hosts, which would move the start time with it.
absl::StatusOr<double> BootTimeSeconds() {
  static const absl::StatusOr<double> boot = ReadBootTime();
  return boot;
}

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type,
                                double value) {
  prometheus::MetricFamily family{name, help, type, {}};
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(metric);
  return family;
}

}  // namespace

absl::StatusOr<ProcessSample> ReadProcessSample() {
  absl::StatusOr<std::string> stat = ReadFile("/proc/self/stat");
  if (!stat.ok()) return stat.status();
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so the fields are
  // counted from the last ')'; fields[0] is the state, field n of proc(5) is fields[n - 3].
  const size_t close = stat->rfind(')');
  if (close == std::string::npos) return absl::InternalError("cannot parse /proc/self/stat");
  std::istringstream rest(stat->substr(close + 1));
  std::vector<std::string> fields;
  for (std::string f; rest >> f;) fields.push_back(f);
  if (fields.size() < 22) return absl::InternalError("cannot parse /proc/self/stat");
  const double ticks = double(sysconf(_SC_CLK_TCK));
  const double page = double(sysconf(_SC_PAGESIZE));
  absl::StatusOr<double> boot = BootTimeSeconds();
  if (!boot.ok()) return boot.status();
  ProcessSample s;
  try {
    s.cpu_seconds = (std::stod(fields[11]) + std::stod(fields[12])) / ticks;  // utime, stime
    s.threads = std::stoll(fields[17]);                                        // num_threads
    s.start_time_seconds = *boot + std::stod(fields[19]) / ticks;             // starttime
    s.virtual_bytes = std::stod(fields[20]);                                   // vsize
    s.resident_bytes = std::stod(fields[21]) * page;                           // rss (pages)
  } catch (const std::exception&) {
    return absl::InternalError("cannot parse /proc/self/stat");
  }
  std::error_code error;
  std::filesystem::directory_iterator fds("/proc/self/fd", error);
  if (error) return absl::UnavailableError("cannot list /proc/self/fd: " + error.message());
  for (; !error && fds != std::filesystem::directory_iterator(); fds.increment(error)) {
    ++s.open_fds;
  }
  if (error) return absl::UnavailableError("cannot list /proc/self/fd: " + error.message());
  --s.open_fds;  // the descriptor the listing itself holds open
  rlimit limit{};
  s.max_fds = getrlimit(RLIMIT_NOFILE, &limit) == 0 ? int64_t(limit.rlim_cur) : -1;
  return s;
}

std::vector<prometheus::MetricFamily> ProcessMetrics::Collect() const {
  absl::StatusOr<ProcessSample> s = ReadProcessSample();
  if (!s.ok()) return {};
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> families = {
      Family("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
             MetricType::Counter, s->cpu_seconds),
      Family("process_open_fds", "Number of open file descriptors.", MetricType::Gauge,
             double(s->open_fds)),
      Family("process_virtual_memory_bytes", "Virtual memory size in bytes.", MetricType::Gauge,
             s->virtual_bytes),
      Family("process_resident_memory_bytes", "Resident memory size in bytes.",
             MetricType::Gauge, s->resident_bytes),
      Family("process_start_time_seconds",
             "Start time of the process since unix epoch in seconds.", MetricType::Gauge,
             s->start_time_seconds),
      Family("process_threads", "Number of OS threads in the process.", MetricType::Gauge,
             double(s->threads)),
  };
  if (s->max_fds >= 0) {  // unknown: no series (a 0 would make open / max infinite)
    families.push_back(Family("process_max_fds", "Maximum number of open file descriptors.",
                              MetricType::Gauge, double(s->max_fds)));
  }
  return families;
}

}  // namespace thetaserve::server
