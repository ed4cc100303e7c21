// The KV pages of one sequence: for every (layer, KV head), a K page list (dense: every score
// needs every key) and a V store. The V store has the design's two parts — a compact sparse
// store of older retained rows (with their positions) and a dense tail from `v_tail_start` —
// and under the dense policy the tail simply starts at 0.
// Thread-safety: none; owned by the engine thread.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/page_pool.h"

namespace thetaserve::cache {

struct KvShape {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t block_size = 16;
  int64_t tables() const { return int64_t(num_layers) * num_kv_heads; }
};

class SequenceKv {
 public:
  explicit SequenceKv(const KvShape& shape) : shape_(shape) {}

  // Tokens whose K/V rows have pages (row storage may still be filled by the next step).
  int64_t capacity_tokens() const { return blocks_ * shape_.block_size; }
  // Pages (K and V together) needed so that positions [0, new_length) have rows.
  int64_t PagesNeeded(int64_t new_length) const;
  // Check, then commit: the caller made sure pool.CanAllocate(PagesNeeded(new_length)).
  void Grow(PagePool& pool, int64_t new_length);
  // Returns every page to the pool (finish, cancel, preemption).
  void ReleaseAll(PagePool& pool);
  int64_t num_pages() const;

  // Page tables in the layout kernels read: [tables, stride], row lh lists the pages of
  // (layer, kv head) lh in position order.
  const int32_t* k_table() const { return k_table_.data(); }
  const int32_t* v_table() const { return v_table_.data(); }
  int32_t stride() const { return stride_; }
  // First position held by the V tail; earlier positions live in the sparse store.
  int64_t v_tail_start() const { return v_tail_start_; }

 private:
  void EnsureStride(int64_t blocks);

  KvShape shape_;
  int64_t blocks_ = 0;        // blocks per table
  int32_t stride_ = 0;        // capacity of a table row, in pages
  std::vector<int32_t> k_table_;  // [tables, stride]
  std::vector<int32_t> v_table_;  // [tables, stride] (the V tail)
  int64_t v_tail_start_ = 0;
};

}  // namespace thetaserve::cache
