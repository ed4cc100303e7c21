#include "kernels/sequence_runner.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_format.h"

namespace thetaserve::kernels {

SequenceRunner::SequenceRunner(Backend& backend, int64_t max_len, int32_t stride)
    : backend_(&backend), max_len_(max_len), stride_(stride) {}

absl::StatusOr<SequenceRunner> SequenceRunner::Create(Backend& backend, int64_t max_len,
                                                      int32_t block_size) {
  const auto& c = backend.model().config();
  const int32_t stride = static_cast<int32_t>((max_len + block_size - 1) / block_size);
  const int64_t tables = c.num_layers * c.num_kv_heads;
  absl::Status st = backend.AllocateKvPool(2 * tables * stride, block_size);
  if (!st.ok()) return st;
  SequenceRunner runner(backend, max_len, stride);
  runner.k_pages_.resize(tables * stride);
  runner.v_pages_.resize(tables * stride);
  std::iota(runner.k_pages_.begin(), runner.k_pages_.end(), 0);
  std::iota(runner.v_pages_.begin(), runner.v_pages_.end(), int32_t(tables * stride));
  runner.v_sum_.assign(tables * c.head_dim, 0.0f);
  return runner;
}

absl::StatusOr<std::vector<float>> SequenceRunner::Append(std::span<const int32_t> tokens,
                                                          bool all_logits, int64_t chunk,
                                                          AttentionStats* stats) {
  const int64_t vocab = backend_->model().config().vocab_size;
  if (length_ + static_cast<int64_t>(tokens.size()) > max_len_) {
    return absl::OutOfRangeError(absl::StrFormat(
        "sequence of %d tokens exceeds the runner's capacity of %d", length_ + tokens.size(),
        max_len_));
  }
  std::vector<float> out;
  if (all_logits) out.reserve(tokens.size() * vocab);
  std::vector<float> logits;
  for (size_t begin = 0; begin < tokens.size(); begin += chunk) {
    const int64_t n = std::min<int64_t>(chunk, tokens.size() - begin);
    SeqChunk seq;
    seq.token_offset = 0;
    seq.num_tokens = static_cast<int32_t>(n);
    seq.start_pos = static_cast<int32_t>(length_);
    seq.want_logits = true;
    seq.pages.k_pages = k_pages_.data();
    seq.pages.v_pages = v_pages_.data();
    seq.pages.stride = stride_;
    seq.pages.v_sum = v_sum_.data();
    ForwardBatch batch{tokens.subspan(begin, n), std::span<const SeqChunk>(&seq, 1), all_logits,
                       stats};
    logits.resize(NumLogitRows(batch) * vocab);
    absl::Status st = backend_->Forward(batch, logits.data());
    if (!st.ok()) return st;
    length_ += n;
    if (all_logits) out.insert(out.end(), logits.begin(), logits.end());
  }
  if (!all_logits) out = std::move(logits);
  return out;
}

}  // namespace thetaserve::kernels
