#include "cache/sequence_kv.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <type_traits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "base/check.h"

namespace thetaserve::cache {

uint64_t SequenceKv::NextId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

int64_t SequenceKv::PagesNeeded(int64_t new_length) const {
  const int64_t blocks = (new_length + shape_.block_size - 1) / shape_.block_size;
  return blocks <= blocks_ ? 0 : 2 * (blocks - blocks_) * shape_.tables();
}

int64_t SequenceKv::PagesToReach(int64_t length, const SparsePolicy& policy, int64_t chunk) const {
  if (!policy.enabled || policy.keep_fraction <= 0) return PagesNeeded(length);
  const int64_t bs = shape_.block_size;
  const int64_t tables = shape_.tables();
  const int64_t blocks = (length + bs - 1) / bs;
  const int64_t k_more = std::max<int64_t>(0, blocks - blocks_) * tables;
  const int64_t tail_blocks = (policy.local_window + chunk + bs - 1) / bs + 1;
  const double sparse_rows = policy.sink_tokens + policy.keep_fraction * double(length) +
                             double(length) / double(bs);
  const int64_t sparse_blocks = static_cast<int64_t>(std::ceil(sparse_rows / double(bs))) + 1;
  const int64_t v_bound = std::min(blocks, tail_blocks + sparse_blocks) * tables;
  const int64_t v_now = num_pages() - blocks_ * tables;
  return k_more + std::max<int64_t>(0, v_bound - v_now);
}

int32_t* SequenceKv::hits() {
  if (hits_.empty()) hits_.assign(shape_.tables() * hits_stride_, -1);
  return hits_.data();
}

MassUnits* SequenceKv::hit_mass() {
  if (hit_mass_.empty()) hit_mass_.assign(shape_.tables() * hits_stride_, 0);
  return hit_mass_.data();
}

void SequenceKv::EnsureStride(int64_t blocks) {
  if (blocks <= stride_) return;
  const int32_t new_stride = static_cast<int32_t>(std::max<int64_t>(blocks, 2 * int64_t(stride_)));
  const int64_t tables = shape_.tables();
  const int64_t tail_blocks = blocks_ - v_tail_start_ / shape_.block_size;
  std::vector<int32_t> k(tables * new_stride, -1), v(tables * new_stride, -1);
  for (int64_t t = 0; t < tables; ++t) {
    std::copy_n(k_table_.begin() + t * stride_, blocks_, k.begin() + t * new_stride);
    std::copy_n(v_table_.begin() + t * stride_, tail_blocks, v.begin() + t * new_stride);
  }
  k_table_.swap(k);
  v_table_.swap(v);
  // Marks and mass are indexed by absolute position (each moved only once made).
  const int32_t new_hits = new_stride * shape_.block_size;
  auto widen = [&](auto& rows, auto unset) {
    if (rows.empty()) return;
    std::remove_reference_t<decltype(rows)> wide(tables * new_hits, unset);
    for (int64_t t = 0; t < tables; ++t) {
      std::copy_n(rows.begin() + t * hits_stride_, hits_stride_, wide.begin() + t * new_hits);
    }
    rows.swap(wide);
  };
  widen(hits_, int32_t{-1});
  widen(hit_mass_, MassUnits{0});
  hits_stride_ = new_hits;
  stride_ = new_stride;
  ++k_epoch_;  // every row of both tables moved
  ++v_epoch_;
  if (v_sum_.empty()) v_sum_.assign(tables * shape_.head_dim, 0.0f);
  if (sparse_.count.empty()) sparse_.count.assign(tables, 0);
}

void SequenceKv::RowStore::Ensure(int64_t rows, int64_t tables, int32_t block_size) {
  if (count.empty()) count.assign(tables, 0);
  const int64_t need_pages = (rows + block_size - 1) / block_size;
  if (rows > pos_stride) {
    const int32_t ns = static_cast<int32_t>(std::max<int64_t>(rows, 2 * int64_t(pos_stride)));
    std::vector<int32_t> p(tables * ns, -1);
    for (int64_t t = 0; t < tables; ++t) {
      std::copy_n(pos.begin() + t * pos_stride, count[t], p.begin() + t * ns);
    }
    pos.swap(p);
    pos_stride = ns;
    ++epoch;
  }
  if (need_pages > page_stride) {
    const int32_t ns = static_cast<int32_t>(std::max<int64_t>(need_pages, 2 * int64_t(page_stride)));
    std::vector<int32_t> sp(tables * ns, -1);
    for (int64_t t = 0; t < tables; ++t) {
      std::copy_n(pages.begin() + t * page_stride, Pages(t, block_size), sp.begin() + t * ns);
    }
    pages.swap(sp);
    page_stride = ns;
    ++epoch;
  }
}

void SequenceKv::RowStore::Release(PagePool& pool, int64_t tables, int32_t block_size) const {
  ForEachPage(tables, block_size, [&](int32_t page) { pool.Release(page); });
}

void SequenceKv::Grow(PagePool& pool, int64_t new_length) {
  const int64_t blocks = (new_length + shape_.block_size - 1) / shape_.block_size;
  if (blocks <= blocks_) return;
  CHECK(pool.CanAllocate(PagesNeeded(new_length))) << "Grow without CanAllocate";
  EnsureStride(blocks);
  const int64_t tail_base = v_tail_start_ / shape_.block_size;
  for (int64_t t = 0; t < shape_.tables(); ++t) {
    for (int64_t b = blocks_; b < blocks; ++b) {
      k_table_[t * stride_ + b] = pool.Allocate(PageKind::kK);
      v_table_[t * stride_ + (b - tail_base)] = pool.Allocate(PageKind::kV);
    }
  }
  blocks_ = blocks;
}

void SequenceKv::AppendSharedBlock(PagePool& pool, const int32_t* k_pages,
                                   const int32_t* v_pages) {
  CHECK(v_tail_start_ == 0) << "shared blocks need the dense V store";
  EnsureStride(blocks_ + 1);
  for (int64_t t = 0; t < shape_.tables(); ++t) {
    pool.Ref(k_pages[t]);
    pool.Ref(v_pages[t]);
    k_table_[t * stride_ + blocks_] = k_pages[t];
    v_table_[t * stride_ + blocks_] = v_pages[t];
  }
  ++blocks_;
}

void SequenceKv::CompactV(PagePool& pool, int64_t length, const SparsePolicy& policy,
                          std::vector<RowMove>* moves, CompactResult* result, PagePool* host) {
  *result = CompactResult();
  const int32_t bs = shape_.block_size;
  // Whole tail blocks that end at or before length - local_window leave the tail.
  const int64_t limit = std::max<int64_t>(0, length - policy.local_window) / bs * bs;
  if (!policy.enabled || limit <= v_tail_start_) return;
  const int64_t n_blocks = (limit - v_tail_start_) / bs;
  const int64_t tables = shape_.tables();

  int64_t max_rows = 0;
  for (int64_t t = 0; t < tables; ++t) {
    max_rows = std::max<int64_t>(max_rows, sparse_.count[t] + n_blocks * bs);
  }
  sparse_.Ensure(max_rows, tables, bs);
  const bool offload = policy.offload && host != nullptr;
  if (offload) {
    CHECK(host_pool_ == nullptr || host_pool_ == host) << "one host pool per sequence";
    host_pool_ = host;
    if (host_.count.empty()) host_.count.assign(tables, 0);
    int64_t max_host = 0;
    for (int64_t t = 0; t < tables; ++t) {
      max_host = std::max<int64_t>(max_host, host_.count[t] + n_blocks * bs);
    }
    host_.Ensure(max_host, tables, bs);
  }

  // Compaction in place: a kept row never needs a fresh page. New sparse pages are the freed
  // tail pages themselves, taken in position order; a row goes to a slot at or before the one
  // it came from, so the moves are safe when run in order (each slot is read before it is
  // overwritten). What is left of the freed tail pages goes back to the pool.
  const int64_t recent = length - policy.obs_window;  // queries at positions >= recent decide
  std::vector<uint8_t> keep(limit - v_tail_start_);
  std::vector<std::pair<double, int64_t>> ranked;
  for (int64_t t = 0; t < tables; ++t) {
    if (policy.keep_fraction > 0) {
      // The mass budget: rank the leaving rows by mean retained probability.
      const MassUnits* mass = hit_mass() + t * hits_stride_;
      ranked.clear();
      for (int64_t p = v_tail_start_; p < limit; ++p) {
        ranked.emplace_back(MassValue(mass[p]) / double(length - p), p);
      }
      const int64_t budget = std::min<int64_t>(
          ranked.size(), static_cast<int64_t>(std::ceil(policy.keep_fraction * double(ranked.size()))));
      std::nth_element(ranked.begin(), ranked.begin() + budget, ranked.end(), std::greater<>());
      std::fill(keep.begin(), keep.end(), 0);
      for (int64_t i = 0; i < budget; ++i) keep[ranked[i].second - v_tail_start_] = ranked[i].first > 0;
    } else {
      const int32_t* hit = hits() + t * hits_stride_;
      for (int64_t p = v_tail_start_; p < limit; ++p) keep[p - v_tail_start_] = hit[p] >= recent;
    }
    int32_t* pages = sparse_.pages.data() + t * sparse_.page_stride;
    int32_t* pos = sparse_.pos.data() + t * sparse_.pos_stride;
    int32_t& count = sparse_.count[t];
    int32_t* tail = v_table_.data() + t * stride_;
    int64_t reused = 0;  // freed tail blocks turned into sparse pages
    for (int64_t p = v_tail_start_; p < limit; ++p) {
      const int64_t block = (p - v_tail_start_) / bs;
      if (!(keep[p - v_tail_start_] || p < policy.sink_tokens)) {
        if (offload && OffloadRow(*host, t, p, tail[block], moves)) {
          ++result->rows_offloaded;
        } else {
          ++result->rows_dropped;
        }
        continue;
      }
      if (count % bs == 0) {
        CHECK_LE(reused, block) << "in-place compaction would overwrite unread rows";
        pages[count / bs] = tail[reused++];
      }
      moves->push_back({tail[block], static_cast<int32_t>(p % bs), pages[count / bs], count % bs});
      pos[count++] = static_cast<int32_t>(p);
      ++result->rows_kept;
    }
    for (int64_t b = reused; b < n_blocks; ++b) pool.Release(tail[b]);
    result->pages_freed += n_blocks - reused;
    std::copy(tail + n_blocks, tail + stride_, tail);
    std::fill(tail + stride_ - n_blocks, tail + stride_, -1);
  }
  v_tail_start_ = limit;
  ++v_epoch_;  // the tail's columns shifted left
}

bool SequenceKv::OffloadRow(PagePool& host, int64_t t, int64_t p, int32_t src_page,
                            std::vector<RowMove>* moves) {
  const int32_t bs = shape_.block_size;
  int32_t& count = host_.count[t];
  int32_t* pages = host_.pages.data() + t * host_.page_stride;
  if (count % bs == 0) {
    if (!host.CanAllocate(1)) return false;
    pages[count / bs] = host.Allocate(PageKind::kV);
  }
  moves->push_back({src_page, static_cast<int32_t>(p % bs), pages[count / bs], count % bs,
                    /*to_host=*/true});
  host_.pos[t * host_.pos_stride + count] = static_cast<int32_t>(p);
  ++count;
  return true;
}

void SequenceKv::ReleaseAll(PagePool& pool) {
  ForEachPoolPage([&](int32_t page) { pool.Release(page); });
  if (host_pool_) host_.Release(*host_pool_, shape_.tables(), shape_.block_size);
  *this = SequenceKv(shape_);
}

int64_t SequenceKv::num_pages() const {
  int64_t n = blocks_ * shape_.tables() + (blocks_ - v_tail_start_ / shape_.block_size) * shape_.tables();
  for (int32_t c : sparse_.count) n += (c + shape_.block_size - 1) / shape_.block_size;
  return n;
}

absl::flat_hash_map<int32_t, int32_t> SequenceKv::PageHolders(
    const std::vector<const SequenceKv*>& seqs) {
  absl::flat_hash_map<int32_t, int32_t> holders;
  for (const SequenceKv* kv : seqs) kv->ForEachPoolPage([&](int32_t page) { ++holders[page]; });
  return holders;
}

int64_t SequenceKv::PagesFreedOnRelease(const std::vector<const SequenceKv*>& seqs,
                                        const PagePool& pool) {
  int64_t n = 0;
  for (const auto& [page, count] : PageHolders(seqs)) {
    n += pool.refcount(page) == count + int(pool.cached(page));
  }
  return n;
}

int64_t SequenceKv::num_host_pages() const {
  int64_t n = 0;
  for (int32_t c : host_.count) n += (c + shape_.block_size - 1) / shape_.block_size;
  return n;
}

int64_t SequenceKv::VRowsResident(int64_t length) const {
  int64_t rows = std::max<int64_t>(0, length - v_tail_start_) * shape_.tables();
  for (int32_t c : sparse_.count) rows += c;
  return rows;
}

int64_t SequenceKv::VRowsOffloaded() const {
  int64_t rows = 0;
  for (int32_t c : host_.count) rows += c;
  return rows;
}

}  // namespace thetaserve::cache
