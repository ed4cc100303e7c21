// The process's own series, under the names Prometheus' client libraries give them (Go's,
// Python's — and so vLLM's —, Java's): process_cpu_seconds_total, process_resident_memory_bytes,
// process_virtual_memory_bytes, process_open_fds, process_max_fds, process_start_time_seconds,
// and process_threads beside them. Dashboards and alerts written for any server read these, and
// they show what the server's own metrics cannot: memory or descriptors that grow while it
// serves. Read from /proc at each scrape (Linux; elsewhere nothing is exported).
// Thread-safety: Collect and ReadProcessSample may run on any threads at once (they only read).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace thetaserve::server {

struct ProcessSample {
  double cpu_seconds = 0;         // user + system time of all threads, dead ones included
  double resident_bytes = 0;      // resident set size
  double virtual_bytes = 0;       // virtual memory size
  double start_time_seconds = 0;  // since the Unix epoch
  int64_t open_fds = 0;           // descriptors open (not counting the one that lists them)
  int64_t max_fds = 0;            // the soft RLIMIT_NOFILE; -1 when unknown (not exported)
  int64_t threads = 0;
};

// One reading of /proc/self (stat, fd/) and /proc/stat (the boot time, read once per process);
// an error names the file it could not read or parse.
absl::StatusOr<ProcessSample> ReadProcessSample();

class ProcessMetrics : public prometheus::Collectable {
 public:
  // The seven families of one ReadProcessSample (six when the descriptor limit is unknown);
  // none when it fails.
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace thetaserve::server
