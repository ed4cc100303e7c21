// Runs one sequence through a Backend outside the engine, with the same paged cache (and
// sparse V policy) the engine uses. For tools and tests that want logits: reference checks,
// perplexity and Top-θ fidelity evaluation, calibration.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/page_pool.h"
#include "cache/sequence_kv.h"
#include "kernels/backend.h"

namespace thetaserve::scheduler {

class SequenceRunner {
 public:
  // Allocates the backend's KV pool for one sequence of up to `max_len` tokens (and, under the
  // offload policy, a host pool with room for every row: unlike a server's, it never fills,
  // so nothing is dropped).
  static absl::StatusOr<SequenceRunner> Create(kernels::Backend& backend, int64_t max_len,
                                               int32_t block_size = 16,
                                               cache::SparsePolicy policy = {});

  // Appends `tokens` (in chunks of at most `chunk` tokens) and returns the logits of the
  // last one, or of every one when `all_logits` ([n, vocab] row-major). Under an enabled
  // sparse policy the cache is compacted after every chunk: appending a prompt in chunks of
  // the server's --max-num-batched-tokens and then one token at a time compacts where the
  // engine does for the prompt alone (and under any load with --fixed-compaction:
  // SparseChunkEnd), and so reproduces what the server stores.
  absl::StatusOr<std::vector<float>> Append(std::span<const int32_t> tokens,
                                            bool all_logits = false, int64_t chunk = 512,
                                            kernels::AttentionStats* stats = nullptr);

  void Reset();
  int64_t length() const { return length_; }
  int64_t max_len() const { return max_len_; }
  int64_t v_rows_resident() const { return kv_->VRowsResident(length_); }
  int64_t v_rows_offloaded() const { return kv_->VRowsOffloaded(); }
  int64_t v_rows_dense() const { return length_ * shape_.tables(); }
  // V rows the sparse policy dropped, and the offload policy moved to the host pool, since
  // Create or the last Reset.
  int64_t rows_dropped() const { return rows_dropped_; }
  int64_t rows_offloaded() const { return rows_offloaded_; }

 private:
  SequenceRunner(kernels::Backend& backend, int64_t max_len, cache::KvShape shape,
                 cache::SparsePolicy policy, int64_t num_pages, int64_t host_pages);
  // Applies the sparse policy: moves retained tail rows to the sparse store, drops the rest
  // (the offload policy: moves them to the host pool).
  absl::Status Compact();

  kernels::Backend* backend_;
  int64_t max_len_;
  cache::KvShape shape_;
  cache::SparsePolicy policy_;
  std::unique_ptr<cache::PagePool> pool_;
  std::unique_ptr<cache::PagePool> host_pool_;  // the offload policy's; null otherwise
  std::unique_ptr<cache::SequenceKv> kv_;
  int64_t length_ = 0;
  int64_t rows_dropped_ = 0;
  int64_t rows_offloaded_ = 0;
};

}  // namespace thetaserve::scheduler
