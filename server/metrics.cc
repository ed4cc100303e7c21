#include "server/metrics.h"

#include <exception>
#include <iterator>
#include <utility>
#include <vector>

#include "prometheus/text_serializer.h"

namespace thetaserve::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// Latency buckets from 1 ms to 2 minutes.
Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5,
          0.75,  1.0,    2.5,   5.0,  10,   20,   40,   80,   120};
}

Histogram::BucketBoundaries CountBuckets() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
}

}  // namespace

Metrics::Metrics(const MetricsInfo& info)
    : registry_(std::make_shared<prometheus::Registry>()),
      process_(std::make_shared<ProcessMetrics>()),
      requests_(BuildCounter()
                    .Name("thetaserve_requests_total")
                    .Help("Requests by outcome: the finish reason, or rejected at submission")
                    .Register(*registry_)),
      rejected_(requests_.Add({{"outcome", "rejected"}})),
      rejected_by_code_(BuildCounter()
                            .Name("thetaserve_requests_rejected_total")
                            .Help("Requests refused at submission, by the gRPC status code "
                                  "they were answered with")
                            .Register(*registry_)),
      http_open_(BuildGauge().Name("thetaserve_http_connections_open")
                     .Help("Connections open on the HTTP API, counted against its limit")
                     .Register(*registry_).Add({})),
      http_limit_(BuildGauge().Name("thetaserve_http_connections_limit")
                      .Help("Connections the HTTP API holds open at most "
                            "(--max-http-connections; 0 without the HTTP API)")
                      .Register(*registry_).Add({})),
      running_(BuildGauge().Name("thetaserve_requests_running")
                   .Help("Requests in the running batch").Register(*registry_).Add({})),
      waiting_(BuildGauge().Name("thetaserve_requests_waiting")
                   .Help("Requests queued or preempted, waiting for pages").Register(*registry_).Add({})),
      ttft_(BuildHistogram().Name("thetaserve_time_to_first_token_seconds")
                .Help("Arrival to first generated token").Register(*registry_)
                .Add({}, LatencyBuckets())),
      itl_(BuildHistogram().Name("thetaserve_inter_token_latency_seconds")
               .Help("Time between consecutive streamed token messages of a request")
               .Register(*registry_).Add({}, LatencyBuckets())),
      e2e_(BuildHistogram().Name("thetaserve_e2e_request_latency_seconds")
               .Help("Arrival to finish").Register(*registry_).Add({}, LatencyBuckets())),
      queue_(BuildHistogram().Name("thetaserve_request_queue_time_seconds")
                 .Help("Arrival to first scheduled step").Register(*registry_)
                 .Add({}, LatencyBuckets())),
      prompt_tokens_(BuildCounter().Name("thetaserve_prompt_tokens_total")
                         .Help("Prompt tokens computed (recomputation after preemption included)")
                         .Register(*registry_).Add({})),
      generation_tokens_(BuildCounter().Name("thetaserve_generation_tokens_total")
                             .Help("Tokens generated").Register(*registry_).Add({})),
      preemptions_(BuildCounter().Name("thetaserve_preemptions_total")
                       .Help("Sequences preempted (pages freed, recomputed later)")
                       .Register(*registry_).Add({})),
      priority_preemptions_(BuildCounter().Name("thetaserve_priority_preemptions_total")
                                .Help("Of the preemptions, those made to let a waiting "
                                      "request of an earlier priority start (--scheduling-policy "
                                      "priority)")
                                .Register(*registry_).Add({})),
      requests_displaced_(BuildCounter().Name("thetaserve_requests_displaced_total")
                              .Help("Waiting requests that never ran, ended with "
                                    "RESOURCE_EXHAUSTED so that a more urgent request could "
                                    "take their place in a full queue (--max-queue, "
                                    "--scheduling-policy priority)")
                              .Register(*registry_).Add({})),
      pages_total_(BuildGauge().Name("thetaserve_kv_pages_capacity")
                       .Help("Pages in the KV page pool").Register(*registry_).Add({})),
      page_bytes_(BuildGauge().Name("thetaserve_kv_page_size_bytes")
                      .Help("Bytes of one KV page: block size x head dim x element bytes "
                            "(--kv-cache-dtype)")
                      .Register(*registry_).Add({})),
      pages_free_(BuildGauge().Name("thetaserve_kv_pages_free")
                      .Help("Free KV pages (including those only the prefix cache holds)")
                      .Register(*registry_).Add({})),
      kv_usage_(BuildGauge().Name("thetaserve_kv_cache_usage_ratio")
                    .Help("Used pages / total pages (0..1)").Register(*registry_).Add({})),
      pages_cached_(BuildGauge().Name("thetaserve_kv_pages_cached")
                        .Help("KV pages only the prefix cache holds (reclaimable; counted as free)")
                        .Register(*registry_).Add({})),
      prefix_query_tokens_(BuildCounter().Name("thetaserve_prefix_cache_query_tokens_total")
                               .Help("Tokens of admitted requests looked up in the prefix cache")
                               .Register(*registry_).Add({})),
      prefix_hit_tokens_(BuildCounter().Name("thetaserve_prefix_cache_hit_tokens_total")
                             .Help("Tokens found in the prefix cache (their K/V not computed)")
                             .Register(*registry_).Add({})),
      prefix_evicted_blocks_(BuildCounter().Name("thetaserve_prefix_cache_evicted_blocks_total")
                                 .Help("Cached blocks freed to make room for new work")
                                 .Register(*registry_).Add({})),
      batch_size_(BuildHistogram().Name("thetaserve_batch_size")
                      .Help("Sequences per engine step").Register(*registry_)
                      .Add({}, CountBuckets())),
      batch_tokens_(BuildHistogram().Name("thetaserve_batch_tokens")
                        .Help("Tokens per engine step").Register(*registry_)
                        .Add({}, CountBuckets())),
      v_rows_resident_(BuildGauge().Name("thetaserve_v_rows_resident")
                           .Help("V rows stored in the KV cache, per (layer, KV head) row")
                           .Register(*registry_).Add({})),
      v_rows_dense_(BuildGauge().Name("thetaserve_v_rows_dense_equivalent")
                        .Help("V rows a dense cache would store for the same sequences")
                        .Register(*registry_).Add({})),
      v_bytes_saved_(BuildGauge().Name("thetaserve_v_bytes_saved")
                         .Help("Bytes of V not stored in the KV cache compared with a dense "
                               "cache (under the offload policy some are in host memory)")
                         .Register(*registry_).Add({})),
      v_rows_read_(BuildCounter().Name("thetaserve_v_rows_read_total")
                       .Help("V rows read by attention").Register(*registry_).Add({})),
      v_rows_read_dense_(BuildCounter().Name("thetaserve_v_rows_read_dense_total")
                             .Help("V rows dense attention would read").Register(*registry_)
                             .Add({})),
      attn_elements_kept_(BuildCounter().Name("thetaserve_attention_elements_kept_total")
                              .Help("Attention (query head, key) elements kept")
                              .Register(*registry_).Add({})),
      attn_elements_dense_(BuildCounter().Name("thetaserve_attention_elements_dense_total")
                               .Help("Attention elements of dense causal attention")
                               .Register(*registry_).Add({})),
      v_rows_evicted_(BuildCounter().Name("thetaserve_v_rows_evicted_total")
                          .Help("V rows dropped from the cache by the sparse policy")
                          .Register(*registry_).Add({})),
      v_rows_retained_but_evicted_(
          BuildCounter().Name("thetaserve_v_rows_retained_but_evicted_total")
              .Help("Dropped V rows that a later query retained (mass moved to compensation)")
              .Register(*registry_).Add({})),
      v_rows_offloaded_(BuildCounter().Name("thetaserve_v_rows_offloaded_total")
                            .Help("V rows moved from the KV cache to host memory by the offload "
                                  "policy")
                            .Register(*registry_).Add({})),
      v_rows_read_host_(BuildCounter().Name("thetaserve_v_rows_read_host_total")
                            .Help("V rows attention read from host memory (offload policy; "
                                  "counted in thetaserve_v_rows_read_total too)")
                            .Register(*registry_).Add({})),
      v_rows_host_resident_(BuildGauge().Name("thetaserve_v_rows_host_resident")
                                .Help("V rows held in host memory by the offload policy, per "
                                      "(layer, KV head) row")
                                .Register(*registry_).Add({})),
      host_pages_total_(BuildGauge().Name("thetaserve_host_pages_capacity")
                            .Help("Pages in the offload policy's host pool (0 without it)")
                            .Register(*registry_).Add({})),
      host_pages_used_(BuildGauge().Name("thetaserve_host_pages_used")
                           .Help("Host pool pages holding offloaded V rows")
                           .Register(*registry_).Add({})) {
  auto& used = BuildGauge()
                   .Name("thetaserve_kv_pages_used")
                   .Help("KV pages in use, by kind (k or v)")
                   .Register(*registry_);
  pages_used_k_ = &used.Add({{"kind", "k"}});
  pages_used_v_ = &used.Add({{"kind", "v"}});
  const char* reasons[5] = {"stop", "length", "eos", "cancelled", "error"};
  for (int i = 0; i < 5; ++i) finished_[i] = &requests_.Add({{"outcome", reasons[i]}});
  // The codes a submission is refused with, there from the start so that rate() over one sees
  // its first refusal (another code gets its series when first used).
  for (absl::StatusCode code :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kUnauthenticated,
        absl::StatusCode::kResourceExhausted, absl::StatusCode::kUnavailable,
        absl::StatusCode::kAlreadyExists}) {
    rejected_by_code_cache_[static_cast<size_t>(code)] =
        &rejected_by_code_.Add({{"code", absl::StatusCodeToString(code)}});
  }
  auto& http_refused = BuildCounter()
                           .Name("thetaserve_http_refused_total")
                           .Help("Connections the HTTP API's transport refused itself, before "
                                 "any request reached the API, by reason: with 503 for "
                                 "connections (over the limit), request_bytes (over the bound on "
                                 "request bytes held), threads (none to be had); bad_request "
                                 "(malformed, too large: 4xx, or 501/505)")
                           .Register(*registry_);
  for (int why = 0; why < kHttpTransportRefusals; ++why) {
    http_refused_[why] = &http_refused.Add(
        {{"reason", HttpTransportRefusalName(static_cast<HttpTransportRefusal>(why))}});
  }
  auto& http_requests = BuildCounter()
                            .Name("thetaserve_http_requests_total")
                            .Help("Requests the HTTP API answered, by route and status class "
                                  "(2xx, 4xx, 5xx)")
                            .Register(*registry_);
  for (size_t r = 0; r < std::size(kHttpRoutes); ++r) {
    const char* classes[3] = {"2xx", "4xx", "5xx"};
    for (int k = 0; k < 3; ++k) {
      http_requests_[r][k] = &http_requests.Add({{"route", kHttpRoutes[r]}, {"status", classes[k]}});
    }
  }
  auto& step_family = BuildHistogram()
                          .Name("thetaserve_step_duration_seconds")
                          .Help("Engine step time (forward + sampling), by phase of the batch")
                          .Register(*registry_);
  const char* phases[3] = {"prefill", "decode", "mixed"};
  for (int i = 0; i < 3; ++i) step_duration_[i] = &step_family.Add({{"phase", phases[i]}}, LatencyBuckets());
  auto& kept = BuildGauge()
                   .Name("thetaserve_attention_kept_ratio")
                   .Help("Fraction of attention elements kept in the last step, by layer "
                         "(1 under dense attention)")
                   .Register(*registry_);
  for (int l = 0; l < info.num_layers; ++l) {
    layer_kept_ratio_.push_back(&kept.Add({{"layer", std::to_string(l)}}));
    layer_kept_ratio_.back()->Set(1.0);
  }
  BuildGauge()
      .Name("thetaserve_build_info")
      .Help("Build and configuration; the value is always 1")
      .Register(*registry_)
      .Add({{"version", info.version}, {"backend", info.backend}, {"model", info.model},
            {"theta_mode", info.theta_mode}, {"kv_policy", info.kv_policy},
            {"kv_cache_dtype", info.kv_cache_dtype},
            {"matmul_activations", info.matmul_activations}})
      .Set(1);
}

bool Metrics::StartExposer(const std::string& address, std::string* error) {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(address);
    for (const auto& c : Collectables()) exposer_->RegisterCollectable(c);
    return true;
  } catch (const std::exception& e) {
    *error = e.what();
    return false;
  }
}

std::string Metrics::Serialize() const {
  prometheus::TextSerializer serializer;
  std::vector<prometheus::MetricFamily> families;
  for (const auto& c : Collectables()) {
    for (prometheus::MetricFamily& f : c->Collect()) families.push_back(std::move(f));
  }
  return serializer.Serialize(families);
}

void Metrics::OnRejected(absl::StatusCode code) {
  rejected_.Increment();
  const auto i = static_cast<size_t>(code);
  if (i >= std::size(rejected_by_code_cache_)) {
    rejected_by_code_.Add({{"code", absl::StatusCodeToString(code)}}).Increment();
    return;
  }
  prometheus::Counter* counter = rejected_by_code_cache_[i].load(std::memory_order_acquire);
  if (counter == nullptr) {  // two threads may both Add: it returns the same counter
    counter = &rejected_by_code_.Add({{"code", absl::StatusCodeToString(code)}});
    rejected_by_code_cache_[i].store(counter, std::memory_order_release);
  }
  counter->Increment();
}

void Metrics::OnHttpConnections(int open) { http_open_.Set(open); }

void Metrics::SetHttpConnectionLimit(int limit) { http_limit_.Set(limit); }

void Metrics::OnHttpRefused(HttpTransportRefusal why) {
  http_refused_[static_cast<int>(why)]->Increment();
}

void Metrics::OnHttpRequest(std::string_view path, int status) {
  const int k = status / 100 == 2 ? 0 : status / 100 == 4 ? 1 : status / 100 == 5 ? 2 : -1;
  if (k < 0) return;
  const std::string_view route = path.starts_with("/v1/models/") ? "/v1/models/{id}" : path;
  size_t r = 0;
  while (r + 1 < std::size(kHttpRoutes) && route != kHttpRoutes[r]) ++r;  // the last: "other"
  http_requests_[r][k]->Increment();
}

void Metrics::OnFinish(const scheduler::FinishInfo& info) {
  finished_[static_cast<int>(info.reason)]->Increment();
  e2e_.Observe(info.total_seconds);
  queue_.Observe(info.queue_seconds);
  if (info.has_ttft()) ttft_.Observe(info.ttft_seconds);
}

void Metrics::OnInterTokenLatency(double seconds) { itl_.Observe(seconds); }

void Metrics::HoldCounts() {
  std::lock_guard<std::mutex> lock(count_mu_);
  counting_ = false;
}

void Metrics::ResumeCounts(const scheduler::EngineCounters& so_far) {
  std::lock_guard<std::mutex> lock(count_mu_);
  baseline_ = so_far;
  counting_ = true;
}

void Metrics::OnEngineStats(const scheduler::EngineStats& s, const scheduler::StepStats* step) {
  running_.Set(double(s.running));
  waiting_.Set(double(s.waiting));
  pages_total_.Set(double(s.pages_total));
  page_bytes_.Set(double(s.page_bytes));
  pages_used_k_->Set(double(s.pages_used_k));
  pages_used_v_->Set(double(s.pages_used_v));
  pages_free_.Set(double(s.pages_free));
  kv_usage_.Set(s.pages_total ? double(s.pages_total - s.pages_free) / s.pages_total : 0.0);
  pages_cached_.Set(double(s.pages_cached));
  v_rows_resident_.Set(double(s.v_rows_resident));
  v_rows_dense_.Set(double(s.v_rows_dense_equivalent));
  v_bytes_saved_.Set(double(s.v_rows_dense_equivalent - s.v_rows_resident) * s.v_row_bytes);
  v_rows_host_resident_.Set(double(s.v_rows_host_resident));
  host_pages_total_.Set(double(s.host_pages_total));
  host_pages_used_.Set(double(s.host_pages_used));

  for (size_t l = 0; l < layer_kept_ratio_.size() && l < s.layer_kept_ratio.size(); ++l) {
    layer_kept_ratio_[l]->Set(s.layer_kept_ratio[l]);
  }
  std::lock_guard<std::mutex> lock(count_mu_);
  if (!counting_) return;
  // Counters follow the engine's totals since ResumeCounts (called on the engine thread only).
  auto advance = [](prometheus::Counter& c, int64_t total, int64_t base) {
    const double delta = double(total - base) - c.Value();
    if (delta > 0) c.Increment(delta);
  };
  const auto& k = s.counters;
  const auto& b = baseline_;
  advance(prompt_tokens_, k.prompt_tokens, b.prompt_tokens);
  advance(generation_tokens_, k.generation_tokens, b.generation_tokens);
  advance(preemptions_, k.preemptions, b.preemptions);
  advance(priority_preemptions_, k.priority_preemptions, b.priority_preemptions);
  advance(requests_displaced_, k.requests_displaced, b.requests_displaced);
  advance(v_rows_read_, k.v_rows_read, b.v_rows_read);
  advance(v_rows_read_dense_, k.v_rows_read_dense, b.v_rows_read_dense);
  advance(attn_elements_kept_, k.attn_elements_kept, b.attn_elements_kept);
  advance(attn_elements_dense_, k.attn_elements_dense, b.attn_elements_dense);
  advance(v_rows_evicted_, k.v_rows_evicted, b.v_rows_evicted);
  advance(v_rows_retained_but_evicted_, k.v_rows_retained_but_evicted,
          b.v_rows_retained_but_evicted);
  advance(v_rows_offloaded_, k.v_rows_offloaded, b.v_rows_offloaded);
  advance(v_rows_read_host_, k.v_rows_read_host, b.v_rows_read_host);
  advance(prefix_query_tokens_, k.prefix_query_tokens, b.prefix_query_tokens);
  advance(prefix_hit_tokens_, k.prefix_hit_tokens, b.prefix_hit_tokens);
  advance(prefix_evicted_blocks_, k.prefix_evicted_blocks, b.prefix_evicted_blocks);

  if (step) {
    const int phase = step->decode_tokens == 0 ? 0 : (step->prefill_tokens == 0 ? 1 : 2);
    step_duration_[phase]->Observe(step->seconds);
    batch_size_.Observe(double(step->num_seqs));
    batch_tokens_.Observe(double(step->num_tokens));
  }
}

}  // namespace thetaserve::server
