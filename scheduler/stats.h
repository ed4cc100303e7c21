// Plain stats structs the metrics layer reads (no Prometheus types here).
#pragma once

#include <cstdint>
#include <vector>

namespace thetaserve::scheduler {

// Totals since start (monotonic).
struct EngineCounters {
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t priority_preemptions = 0;  // of those: for a waiting request of an earlier priority
  int64_t prompt_tokens = 0;      // prompt tokens computed (recomputation included)
  int64_t generation_tokens = 0;  // tokens sampled
  int64_t argmax_tokens = 0;  // of those, picked by the backend (EngineConfig::backend_argmax)
  int64_t requests_finished = 0;
  // Waiting requests that never ran, ended with RESOURCE_EXHAUSTED to make room in a full
  // queue (EngineConfig::max_queue) for a more urgent one (priority policy only).
  int64_t requests_displaced = 0;
  // Attention savings (Top-θ). Rows are counted per (layer, KV head); under dense attention
  // read == read_dense and kept == dense.
  int64_t v_rows_read = 0;
  int64_t v_rows_read_dense = 0;
  int64_t attn_elements_kept = 0;   // (query head, key) pairs kept
  int64_t attn_elements_dense = 0;
  int64_t v_rows_evicted = 0;               // dropped by the sparse policy
  int64_t v_rows_retained_but_evicted = 0;
  int64_t v_rows_offloaded = 0;  // moved to the host pool by the offload policy
  int64_t v_rows_read_host = 0;  // of v_rows_read: read from the host pool
  // Prefix caching: tokens of admitted sequences looked up, and those found cached.
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t prefix_evicted_blocks = 0;  // cached blocks freed for new work
};

// One step, reported to the step observer.
struct StepStats {
  double seconds = 0;         // forward, sampling, the sparse V store's compaction
  double forward_seconds = 0;
  int64_t num_seqs = 0;       // sequences in the batch
  int64_t num_tokens = 0;     // tokens in the batch
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
};

struct EngineStats {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t pages_total = 0;
  int64_t pages_free = 0;    // free, or held only by the prefix cache (reclaimable)
  int64_t pages_used_k = 0;  // held by sequences (a shared page once)
  int64_t pages_used_v = 0;
  int64_t pages_cached = 0;  // held only by the prefix cache (counted in pages_free)
  int64_t prefix_cache_blocks = 0;  // blocks in the prefix cache (in use or not)
  int32_t block_size = 0;
  int64_t page_bytes = 0;
  int64_t v_rows_resident = 0;          // V rows stored in the KV pool, all running sequences
  int64_t v_rows_host_resident = 0;     // V rows in the host pool now (the offload policy)
  int64_t host_pages_total = 0;         // the offload policy's host pool; 0 without it
  int64_t host_pages_used = 0;
  int64_t v_rows_dense_equivalent = 0;  // V rows a dense cache would store
  int64_t v_row_bytes = 0;
  std::vector<double> layer_kept_ratio;  // [num_layers]; empty until Top-θ reports it
  EngineCounters counters;
  StepStats last_step;
};

}  // namespace thetaserve::scheduler
