#include "scheduler/sequence_runner.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "scheduler/sequence.h"

namespace thetaserve::scheduler {

SequenceRunner::SequenceRunner(kernels::Backend& backend, int64_t max_len, cache::KvShape shape,
                               cache::SparsePolicy policy, int64_t num_pages, int64_t host_pages)
    : backend_(&backend),
      max_len_(max_len),
      shape_(shape),
      policy_(policy),
      pool_(std::make_unique<cache::PagePool>(num_pages, shape.block_size)),
      host_pool_(host_pages > 0 ? std::make_unique<cache::PagePool>(host_pages, shape.block_size)
                                : nullptr),
      kv_(std::make_unique<cache::SequenceKv>(shape)) {}

absl::StatusOr<SequenceRunner> SequenceRunner::Create(kernels::Backend& backend, int64_t max_len,
                                                      int32_t block_size,
                                                      cache::SparsePolicy policy) {
  const auto& c = backend.model().config();
  cache::KvShape shape{static_cast<int32_t>(c.num_layers), static_cast<int32_t>(c.num_kv_heads),
                       block_size, static_cast<int32_t>(c.head_dim)};
  const int64_t blocks = (max_len + block_size - 1) / block_size;
  // K and V for every block, plus one spare page per table for the sparse store's last page.
  const int64_t num_pages = (2 * blocks + 1) * shape.tables();
  absl::Status st = backend.AllocateKvPool(num_pages, block_size);
  if (!st.ok()) return st;
  // The offload policy: room in the host pool for every V row (and a part-filled last page
  // per table), so that nothing is dropped.
  const int64_t host_pages = policy.enabled && policy.offload ? (blocks + 1) * shape.tables() : 0;
  if (host_pages > 0) {
    st = backend.AllocateHostPool(host_pages);
    if (!st.ok()) return st;
  }
  return SequenceRunner(backend, max_len, shape, policy, num_pages, host_pages);
}

void SequenceRunner::Reset() {
  kv_->ReleaseAll(*pool_);
  length_ = 0;
  rows_dropped_ = 0;
  rows_offloaded_ = 0;
}

absl::Status SequenceRunner::Compact() {
  std::vector<cache::RowMove> moves;
  cache::SequenceKv::CompactResult result;
  kv_->CompactV(*pool_, length_, policy_, &moves, &result, host_pool_.get());
  rows_dropped_ += result.rows_dropped;
  rows_offloaded_ += result.rows_offloaded;
  return ApplyRowMoves(*backend_, moves);
}

absl::StatusOr<std::vector<float>> SequenceRunner::Append(std::span<const int32_t> tokens,
                                                          bool all_logits, int64_t chunk,
                                                          kernels::AttentionStats* stats) {
  const int64_t vocab = backend_->model().config().vocab_size;
  if (length_ + static_cast<int64_t>(tokens.size()) > max_len_) {
    return absl::OutOfRangeError(absl::StrFormat(
        "sequence of %d tokens exceeds the runner's capacity of %d", length_ + tokens.size(),
        max_len_));
  }
  std::vector<float> out;
  if (all_logits) out.reserve(tokens.size() * vocab);
  std::vector<float> own;  // where the backend has no LogitsBuffer
  for (size_t begin = 0; begin < tokens.size(); begin += chunk) {
    const int64_t n = std::min<int64_t>(chunk, tokens.size() - begin);
    if (!pool_->CanAllocate(kv_->PagesNeeded(length_ + n))) {
      return absl::ResourceExhaustedError("the runner's page pool is full");
    }
    kv_->Grow(*pool_, length_ + n);
    kernels::SeqChunk seq;
    seq.token_offset = 0;
    seq.num_tokens = static_cast<int32_t>(n);
    seq.start_pos = static_cast<int32_t>(length_);
    seq.want_logits = true;
    seq.pages = PageTablesFor(*kv_, policy_);
    seq.tables = TableVersionOf(*kv_);
    kernels::ForwardBatch batch{tokens.subspan(begin, n), std::span<const kernels::SeqChunk>(&seq, 1),
                                all_logits, stats};
    const int64_t num_logits = kernels::NumLogitRows(batch) * vocab;
    float* const logits = backend_->LogitsMemory(num_logits, &own);
    absl::Status st = backend_->Forward(batch, logits);
    if (!st.ok()) return st;
    length_ += n;
    if (policy_.enabled) {
      st = Compact();
      if (!st.ok()) return st;
    }
    // The last chunk's logits, or every chunk's (the backend's buffer is reused each call).
    if (!all_logits) out.clear();
    out.insert(out.end(), logits, logits + num_logits);
  }
  return out;
}

}  // namespace thetaserve::scheduler
