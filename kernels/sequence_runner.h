// Runs one sequence through a Backend with a private, contiguous page assignment. For tools
// and tests that need a forward pass without the scheduler (reference checks, perplexity).
#pragma once

#include <cstdint>
#include <algorithm>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace thetaserve::kernels {

class SequenceRunner {
 public:
  // Allocates the backend's KV pool for one sequence of up to `max_len` tokens.
  static absl::StatusOr<SequenceRunner> Create(Backend& backend, int64_t max_len,
                                               int32_t block_size = 16);

  // Appends `tokens` (in chunks of at most `chunk` tokens) and returns the logits of the
  // last one, or of every one when `all_logits` ([n, vocab] row-major).
  absl::StatusOr<std::vector<float>> Append(std::span<const int32_t> tokens,
                                            bool all_logits = false, int64_t chunk = 512,
                                            AttentionStats* stats = nullptr);
  void Reset() {
    length_ = 0;
    std::fill(v_sum_.begin(), v_sum_.end(), 0.0f);
  }
  int64_t length() const { return length_; }
  int64_t max_len() const { return max_len_; }

 private:
  SequenceRunner(Backend& backend, int64_t max_len, int32_t stride);
  Backend* backend_;
  int64_t max_len_;
  int64_t length_ = 0;
  int32_t stride_;
  std::vector<int32_t> k_pages_;  // [num_layers * num_kv_heads, stride]
  std::vector<int32_t> v_pages_;  // [num_layers * num_kv_heads, stride]
  std::vector<float> v_sum_;      // [num_layers * num_kv_heads, head_dim] running V sums
};

}  // namespace thetaserve::kernels
