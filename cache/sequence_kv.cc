#include "cache/sequence_kv.h"

#include <algorithm>

#include "base/check.h"

namespace thetaserve::cache {

int64_t SequenceKv::PagesNeeded(int64_t new_length) const {
  const int64_t blocks = (new_length + shape_.block_size - 1) / shape_.block_size;
  return blocks <= blocks_ ? 0 : 2 * (blocks - blocks_) * shape_.tables();
}

void SequenceKv::EnsureStride(int64_t blocks) {
  if (blocks <= stride_) return;
  const int32_t new_stride = static_cast<int32_t>(std::max<int64_t>(blocks, 2 * int64_t(stride_)));
  const int64_t tables = shape_.tables();
  std::vector<int32_t> k(tables * new_stride, -1), v(tables * new_stride, -1);
  for (int64_t t = 0; t < tables; ++t) {
    std::copy_n(k_table_.begin() + t * stride_, blocks_, k.begin() + t * new_stride);
    std::copy_n(v_table_.begin() + t * stride_, blocks_, v.begin() + t * new_stride);
  }
  k_table_.swap(k);
  v_table_.swap(v);
  stride_ = new_stride;
}

void SequenceKv::Grow(PagePool& pool, int64_t new_length) {
  const int64_t blocks = (new_length + shape_.block_size - 1) / shape_.block_size;
  if (blocks <= blocks_) return;
  CHECK(pool.CanAllocate(PagesNeeded(new_length))) << "Grow without CanAllocate";
  EnsureStride(blocks);
  for (int64_t t = 0; t < shape_.tables(); ++t) {
    for (int64_t b = blocks_; b < blocks; ++b) {
      k_table_[t * stride_ + b] = pool.Allocate(PageKind::kK);
      v_table_[t * stride_ + b] = pool.Allocate(PageKind::kV);
    }
  }
  blocks_ = blocks;
}

void SequenceKv::ReleaseAll(PagePool& pool) {
  for (int64_t t = 0; t < shape_.tables(); ++t) {
    for (int64_t b = 0; b < blocks_; ++b) {
      pool.Release(k_table_[t * stride_ + b]);
      pool.Release(v_table_[t * stride_ + b]);
    }
  }
  blocks_ = 0;
  stride_ = 0;
  k_table_.clear();
  v_table_.clear();
  v_tail_start_ = 0;
}

int64_t SequenceKv::num_pages() const { return 2 * blocks_ * shape_.tables(); }

}  // namespace thetaserve::cache
