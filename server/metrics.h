// Prometheus metrics of the server (prefix thetaserve_, units in names, counters end in
// _total). Thread-safety: every method may be called from any thread (prometheus-cpp metrics
// are atomic; the Counter/Gauge/Histogram references are resolved once at construction).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "scheduler/request.h"
#include "scheduler/stats.h"
#include "server/http_server.h"
#include "server/process_metrics.h"

namespace thetaserve::server {

struct MetricsInfo {
  std::string version;
  std::string backend;
  std::string model;
  std::string theta_mode;  // "dense" until Top-θ is configured
  std::string kv_policy;   // "full" / "sparse" / "offload"
  int num_layers = 0;      // for the per-layer kept-ratio gauges
  std::string kv_cache_dtype = "f32";
  std::string matmul_activations = "int8";  // Backend::matmul_activations
};

class Metrics {
 public:
  explicit Metrics(const MetricsInfo& info);

  // Serves /metrics on `address` ("0.0.0.0:9090"); throws nothing, returns false on failure.
  bool StartExposer(const std::string& address, std::string* error);

  // Refused at submission (bad input, a wrong API key, a full queue, draining), by the gRPC
  // code it was answered with (the HTTP API's errors map onto the same codes).
  void OnRejected(absl::StatusCode code);
  // The HTTP API's transport: the connections open, the limit on them (--max-http-connections
  // as the descriptor limit left it; 0 without the HTTP API), and its own refusals, by why.
  void OnHttpConnections(int open);
  void SetHttpConnectionLimit(int limit);
  void OnHttpRefused(HttpTransportRefusal why);
  // A request the HTTP API's handlers answered: its path, counted under its route (one of
  // kHttpRoutes: /v1/models/<id> under "/v1/models/{id}", a path no route serves under "other"),
  // and the status sent (2xx, 4xx, 5xx; none other is sent).
  void OnHttpRequest(std::string_view path, int status);
  static constexpr const char* kHttpRoutes[] = {
      "/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/models/{id}", "/tokenize",
      "/detokenize",     "/health",              "/ping",      "/metrics",   "/version",
      "other"};
  void OnFinish(const scheduler::FinishInfo& info);
  void OnInterTokenLatency(double seconds);
  void OnEngineStats(const scheduler::EngineStats& stats, const scheduler::StepStats* step);
  // Around the server's warm-up generation: while held, engine reports set the gauges only (no
  // counter moves, no step in the histograms); once resumed, the counters follow the engine's
  // totals less `so_far` (its totals when the warm-up ended), so a fresh server reports no
  // tokens, steps or attention reads that no client asked for.
  void HoldCounts();
  void ResumeCounts(const scheduler::EngineCounters& so_far);

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  // The text exposition (what /metrics serves: the registry's series, then the process_* ones),
  // for the HTTP API's /metrics, tests and tools.
  std::string Serialize() const;

 private:
  // What the metrics port and Serialize expose, in that order.
  std::vector<std::shared_ptr<prometheus::Collectable>> Collectables() const {
    return {registry_, process_};
  }

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<ProcessMetrics> process_;  // read at each scrape
  std::unique_ptr<prometheus::Exposer> exposer_;
  // HoldCounts/ResumeCounts (the main thread) against OnEngineStats (the engine's).
  std::mutex count_mu_;
  bool counting_ = true;
  scheduler::EngineCounters baseline_;

  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Counter& rejected_;
  prometheus::Family<prometheus::Counter>& rejected_by_code_;
  // Its counters by absl::StatusCode, each added on first use (Family::Add is slow, and a
  // rejection storm is when this runs most).
  std::atomic<prometheus::Counter*> rejected_by_code_cache_[17] = {};
  prometheus::Counter* finished_[5];  // by scheduler::FinishReason
  prometheus::Gauge& http_open_;
  prometheus::Gauge& http_limit_;
  prometheus::Counter* http_refused_[kHttpTransportRefusals];  // by HttpTransportRefusal
  prometheus::Counter* http_requests_[std::size(kHttpRoutes)][3];  // [route][2xx, 4xx, 5xx]
  prometheus::Gauge& running_;
  prometheus::Gauge& waiting_;
  prometheus::Histogram& ttft_;
  prometheus::Histogram& itl_;
  prometheus::Histogram& e2e_;
  prometheus::Histogram& queue_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& generation_tokens_;
  prometheus::Counter& preemptions_;
  prometheus::Counter& priority_preemptions_;
  prometheus::Counter& requests_displaced_;
  prometheus::Gauge& pages_total_;
  prometheus::Gauge& page_bytes_;
  prometheus::Gauge* pages_used_k_;
  prometheus::Gauge* pages_used_v_;
  prometheus::Gauge& pages_free_;
  prometheus::Gauge& kv_usage_;
  prometheus::Gauge& pages_cached_;
  prometheus::Counter& prefix_query_tokens_;
  prometheus::Counter& prefix_hit_tokens_;
  prometheus::Counter& prefix_evicted_blocks_;
  prometheus::Histogram* step_duration_[3];  // prefill, decode, mixed
  prometheus::Histogram& batch_size_;
  prometheus::Histogram& batch_tokens_;
  // Top-θ savings. Under dense attention resident == dense equivalent and read == dense.
  prometheus::Gauge& v_rows_resident_;
  prometheus::Gauge& v_rows_dense_;
  prometheus::Gauge& v_bytes_saved_;
  prometheus::Counter& v_rows_read_;
  prometheus::Counter& v_rows_read_dense_;
  prometheus::Counter& attn_elements_kept_;
  prometheus::Counter& attn_elements_dense_;
  prometheus::Counter& v_rows_evicted_;
  prometheus::Counter& v_rows_retained_but_evicted_;
  // The offload policy.
  prometheus::Counter& v_rows_offloaded_;
  prometheus::Counter& v_rows_read_host_;
  prometheus::Gauge& v_rows_host_resident_;
  prometheus::Gauge& host_pages_total_;
  prometheus::Gauge& host_pages_used_;
  std::vector<prometheus::Gauge*> layer_kept_ratio_;  // [num_layers]

};

}  // namespace thetaserve::server
