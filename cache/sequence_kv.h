// The KV pages of one sequence: for every (layer, KV head), a K page list (dense: every score
// needs every key) and a V store in the design's two parts — a dense tail of recent rows from
// `v_tail_start`, and a compact, append-only sparse store of older rows that attention
// retained, with their positions. Under the dense ("full") policy the tail starts at 0 and
// the sparse store stays empty. Under the offload policy the rows the sparse store does not
// keep go to a third part, the host store: the same layout, its pages from a second pool in
// host memory, so that attention still finds every row. Also per (layer, KV head): the
// running fp32 V sum (for VMC) and hit bits (which positions a query retained).
// Thread-safety: none; owned by the engine thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cache/page_pool.h"
#include "base/mass_units.h"

namespace thetaserve::cache {

struct KvShape {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t block_size = 16;
  int32_t head_dim = 64;
  int64_t tables() const { return int64_t(num_layers) * num_kv_heads; }
};

// The sparse V policy (DESIGN.md §5). Disabled = "full": every V row stays stored.
struct SparsePolicy {
  bool enabled = false;
  int32_t local_window = 256;  // the dense tail keeps at least this many recent rows
  int32_t sink_tokens = 4;     // the first rows are always kept
  // A row leaving the tail is kept when one of the last `obs_window` queries retained it
  // (at the end of prefill: the prompt's last queries, as in SnapKV).
  int32_t obs_window = 32;
  // Mass budget instead of the rule above when > 0: of the rows leaving the tail together,
  // keep this fraction (rounded up), those with the highest mean retained probability
  // (hit mass / queries that have seen the row; H2O-like, per table). Bounds what is stored.
  double keep_fraction = 0.0;
  // The offload policy: rows leaving the tail that the rule above does not keep move to the
  // host pool instead of being dropped (dropped only when the host pool is full). Device
  // memory as under the sparse policy; every row stays readable by attention, as under full.
  bool offload = false;
  // serve --fixed-compaction: the engine compacts a prompt only at multiples of the step's
  // token budget and at its end, and cuts its chunks there (scheduler::SparseChunkEnd), so
  // what is kept does not depend on the load; otherwise after every chunk.
  bool fixed_compaction = false;
};

// A V row to copy from a tail page into the sparse store, or into the host store when
// `to_host` (done by the backend; host copies first: they read tail rows that the in-place
// sparse moves of the same compaction may overwrite).
struct RowMove {
  int32_t src_page, src_row, dst_page, dst_row;
  bool to_host = false;
};

class SequenceKv {
 public:
  explicit SequenceKv(const KvShape& shape) : shape_(shape) {}
  // Not copyable: a copy would share the id (id()) that a device's copy of the tables is
  // keyed by, and the two could diverge.
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;
  SequenceKv(SequenceKv&&) = default;
  SequenceKv& operator=(SequenceKv&&) = default;

  const KvShape& shape() const { return shape_; }
  // Tokens whose K/V rows have pages.
  int64_t capacity_tokens() const { return blocks_ * shape_.block_size; }
  // Pages (K and V together) needed so that positions [0, new_length) have rows.
  int64_t PagesNeeded(int64_t new_length) const;
  // An upper bound on the further pages this sequence needs to reach `length` when it is
  // compacted under `policy` at least once every `chunk` tokens (the engine: after every chunk,
  // at most its step's budget, or with fixed_compaction at the budget's multiples and after
  // every decode step): with a mass budget
  // (keep_fraction > 0) the V store is bounded — tail ≤ local_window + chunk + a block, sparse
  // rows ≤ sinks + keep_fraction·L + one rounding row per compacted block — so admission can
  // reserve less than the dense V; otherwise it is PagesNeeded(length).
  int64_t PagesToReach(int64_t length, const SparsePolicy& policy, int64_t chunk) const;
  // Check, then commit: the caller made sure pool.CanAllocate(PagesNeeded(new_length)).
  void Grow(PagePool& pool, int64_t new_length);
  // Appends one block whose K and V pages another sequence computed (a cached prefix): one
  // page per table each, [tables]; takes a reference to each. Only while the V store is the
  // dense tail from 0 (no compaction has run) — the prefix cache runs under the full policy.
  void AppendSharedBlock(PagePool& pool, const int32_t* k_pages, const int32_t* v_pages);
  // The K and V pages of block `block` of table `table` (V: needs v_tail_start() == 0).
  int32_t k_page(int64_t table, int64_t block) const { return k_table_[table * stride_ + block]; }
  int32_t v_page(int64_t table, int64_t block) const { return v_table_[table * stride_ + block]; }
  // Returns every page to the pool (and the host store's to the host pool it came from) and
  // forgets all rows (finish, cancel, preemption).
  void ReleaseAll(PagePool& pool);
  // Pages held in the KV pool (K and V), and in the host pool.
  int64_t num_pages() const;
  // The pages releasing all of `seqs` surely makes available (free, or held only by the
  // prefix cache, which frees them on demand): those no other sequence holds. A page they
  // share among themselves (a group's prompt blocks) counts once.
  static int64_t PagesFreedOnRelease(const std::vector<const SequenceKv*>& seqs,
                                     const PagePool& pool);
  // Each KV-pool page any of `seqs` holds -> how many of them hold it.
  static absl::flat_hash_map<int32_t, int32_t> PageHolders(
      const std::vector<const SequenceKv*>& seqs);
  int64_t num_host_pages() const;

  // Moves V rows of whole tail blocks that ended more than `local_window` rows before
  // `length` out of the tail: the sinks and the rows the policy keeps (retained by one of the
  // last `obs_window` queries, or the top `keep_fraction` by mean retained mass) are appended
  // to the sparse store; the others go to the host store under policy.offload while `host`
  // has pages, else are dropped; the tail pages return to the pool. `moves` lists the row
  // copies the backend must do before the next forward pass (ApplyRowMoves: host copies
  // first, then the rest in order). Compaction happens in place (the freed tail pages become
  // the sparse pages), so it needs no free pages in the KV pool.
  struct CompactResult {
    int64_t rows_kept = 0;
    int64_t rows_offloaded = 0;
    int64_t rows_dropped = 0;
    int64_t pages_freed = 0;  // net
  };
  void CompactV(PagePool& pool, int64_t length, const SparsePolicy& policy,
                std::vector<RowMove>* moves, CompactResult* result, PagePool* host = nullptr);

  // Page tables in the layout kernels read: [tables, stride], row lh lists the pages of
  // (layer, kv head) lh in position order (for V: the tail, from v_tail_start).
  const int32_t* k_table() const { return k_table_.data(); }
  const int32_t* v_table() const { return v_table_.data(); }
  int32_t stride() const { return stride_; }
  int64_t v_tail_start() const { return v_tail_start_; }
  // The sparse store: [tables, sparse_stride] pages, [tables, pos_stride] positions.
  const int32_t* sparse_pages() const { return sparse_.pages.data(); }
  const int32_t* sparse_pos() const { return sparse_.pos.data(); }
  const int32_t* sparse_count() const { return sparse_.count.data(); }
  int32_t sparse_stride() const { return sparse_.page_stride; }
  int32_t pos_stride() const { return sparse_.pos_stride; }
  // The host store, the same layout (pages in the host pool); empty unless rows were offloaded.
  const int32_t* host_pages() const { return host_.pages.data(); }
  const int32_t* host_pos() const { return host_.pos.data(); }
  const int32_t* host_count() const { return host_.count.data(); }
  int32_t host_stride() const { return host_.page_stride; }
  int32_t host_pos_stride() const { return host_.pos_stride; }
  bool has_host_store() const { return !host_.count.empty(); }
  // Running V sums [tables, head_dim]; per row the latest retaining query [tables, hits_stride].
  // The marks and the retained mass below are made on first use: a sequence whose policy
  // records neither (dense V) holds neither (12 bytes a position and table: ~35 MB for one
  // 32k-token sequence of SmolLM2's 90 tables).
  float* v_sum() { return v_sum_.data(); }
  int32_t* hits();
  int32_t hits_stride() const { return hits_stride_; }
  // Retained mass per row [tables, hits_stride] (see SeqPageTables::hit_mass), fixed point.
  MassUnits* hit_mass();

  // V rows stored in the KV pool (tail + sparse), summed over tables, for `length` computed
  // tokens; and V rows in the host store.
  int64_t VRowsResident(int64_t length) const;
  int64_t VRowsOffloaded() const;

  // For a device's copy of the tables (kernels::TableVersion): an id no other SequenceKv
  // ever has (ReleaseAll gives a new one), and epochs that change whenever entries of an array
  // already set change or move (a new stride, the V tail shifting at compaction). Between
  // changes the arrays only grow: K and V-tail columns by Grow, sparse and host rows by
  // CompactV.
  uint64_t id() const { return id_; }
  uint64_t k_epoch() const { return k_epoch_; }
  uint64_t v_epoch() const { return v_epoch_; }
  uint64_t sparse_epoch() const { return sparse_.epoch; }
  uint64_t host_epoch() const { return host_.epoch; }
  int64_t blocks() const { return blocks_; }

 private:
  // A compact store of V rows in position order (the sparse store, the host store): row r of
  // table t at page pages[t * page_stride + r / block_size], slot r % block_size.
  struct RowStore {
    std::vector<int32_t> pages;  // [tables, page_stride]
    std::vector<int32_t> pos;    // [tables, pos_stride]
    std::vector<int32_t> count;  // [tables]
    int32_t page_stride = 0;
    int32_t pos_stride = 0;
    uint64_t epoch = 0;  // changes when the strides do (every row moves)
    // Room for `rows` rows in every table.
    void Ensure(int64_t rows, int64_t tables, int32_t block_size);
    int64_t Pages(int64_t t, int32_t block_size) const {
      return (count[t] + block_size - 1) / block_size;
    }
    // fn(page) for every page the store holds, table by table.
    template <typename Fn>
    void ForEachPage(int64_t tables, int32_t block_size, Fn fn) const {
      if (count.empty()) return;
      for (int64_t t = 0; t < tables; ++t) {
        const int64_t n = Pages(t, block_size);
        for (int64_t b = 0; b < n; ++b) fn(pages[t * page_stride + b]);
      }
    }
    void Release(PagePool& pool, int64_t tables, int32_t block_size) const;
  };
  // fn(page) for every KV-pool page the sequence holds: each table's K blocks and V tail
  // blocks, then the sparse store's (ReleaseAll's order, which the pool's free list keeps).
  template <typename Fn>
  void ForEachPoolPage(Fn fn) const {
    const int64_t tail_blocks = blocks_ - v_tail_start_ / shape_.block_size;
    for (int64_t t = 0; t < shape_.tables(); ++t) {
      for (int64_t b = 0; b < blocks_; ++b) fn(k_table_[t * stride_ + b]);
      for (int64_t b = 0; b < tail_blocks; ++b) fn(v_table_[t * stride_ + b]);
    }
    sparse_.ForEachPage(shape_.tables(), shape_.block_size, fn);
  }

  static uint64_t NextId();

  void EnsureStride(int64_t blocks);
  // Appends the row at position p of table t (in tail page src_page) to the host store; false
  // when it needs a page and the host pool has none.
  bool OffloadRow(PagePool& host, int64_t t, int64_t p, int32_t src_page, std::vector<RowMove>* moves);

  KvShape shape_;
  uint64_t id_ = NextId();
  uint64_t k_epoch_ = 0, v_epoch_ = 0;
  int64_t blocks_ = 0;            // K blocks per table (positions [0, blocks_ * bs))
  int32_t stride_ = 0;            // capacity of a table row, in pages
  std::vector<int32_t> k_table_;  // [tables, stride]
  std::vector<int32_t> v_table_;  // [tables, stride]: tail pages from v_tail_start
  int64_t v_tail_start_ = 0;      // multiple of block_size

  RowStore sparse_;
  RowStore host_;
  PagePool* host_pool_ = nullptr;  // where host_'s pages came from (set by the first offload)

  std::vector<float> v_sum_;     // [tables, head_dim]
  std::vector<int32_t> hits_;    // [tables, hits_stride], -1 = never retained; or empty
  int32_t hits_stride_ = 0;
  std::vector<MassUnits> hit_mass_;  // [tables, hits_stride]; or empty
};

}  // namespace thetaserve::cache
