#include "cache/sequence_kv.h"

#include <algorithm>
#include <set>

#include "gtest/gtest.h"

namespace thetaserve::cache {
namespace {

TEST(SequenceKvTest, GrowsByWholeBlocksForEveryTable) {
  KvShape shape{2, 3, 4};  // 6 tables, 4 rows a page
  PagePool pool(64, 4);
  SequenceKv kv(shape);
  EXPECT_EQ(kv.PagesNeeded(1), 2 * 6);  // one K and one V page per table
  EXPECT_EQ(kv.PagesNeeded(4), 2 * 6);
  EXPECT_EQ(kv.PagesNeeded(5), 2 * 2 * 6);
  kv.Grow(pool, 5);
  EXPECT_EQ(kv.num_pages(), 24);
  EXPECT_EQ(pool.num_free(), 64 - 24);
  EXPECT_EQ(kv.PagesNeeded(8), 0);
  EXPECT_EQ(kv.PagesNeeded(9), 12);
  EXPECT_EQ(kv.capacity_tokens(), 8);
}

TEST(SequenceKvTest, TablesKeepTheirPagesWhenTheStrideGrows) {
  KvShape shape{1, 2, 4};
  PagePool pool(64, 4);
  SequenceKv kv(shape);
  kv.Grow(pool, 4);
  const int32_t k00 = kv.k_table()[0];
  const int32_t v10 = kv.v_table()[1 * kv.stride()];
  kv.Grow(pool, 40);  // 10 blocks: the stride grows
  EXPECT_GE(kv.stride(), 10);
  EXPECT_EQ(kv.k_table()[0], k00);
  EXPECT_EQ(kv.v_table()[1 * kv.stride()], v10);
  std::set<int32_t> pages;
  for (int t = 0; t < 2; ++t) {
    for (int b = 0; b < 10; ++b) {
      pages.insert(kv.k_table()[t * kv.stride() + b]);
      pages.insert(kv.v_table()[t * kv.stride() + b]);
    }
  }
  EXPECT_EQ(pages.size(), 40u) << "every (table, block) has its own page";
}

TEST(SequenceKvTest, ReleaseAllReturnsEveryPage) {
  KvShape shape{3, 2, 4};
  PagePool pool(100, 4);
  SequenceKv a(shape), b(shape);
  a.Grow(pool, 9);
  b.Grow(pool, 3);
  EXPECT_EQ(pool.num_free(), 100 - 36 - 12);
  a.ReleaseAll(pool);
  EXPECT_EQ(pool.num_free(), 100 - 12);
  b.ReleaseAll(pool);
  EXPECT_EQ(pool.num_free(), 100);
  EXPECT_EQ(pool.num_used(PageKind::kK) + pool.num_used(PageKind::kV), 0);
}

TEST(SequenceKvTest, CompactionKeepsHitsAndSinksInPlaceAndFreesTheRest) {
  KvShape shape{1, 2, 4, 8};  // 2 tables, 4 rows a page
  PagePool pool(64, 4);
  SequenceKv kv(shape);
  kv.Grow(pool, 20);  // 5 blocks: K 10 pages + V tail 10 pages
  ASSERT_EQ(pool.num_free(), 64 - 20);
  // Table 0: positions 5, 6, 9 retained by recent queries (>= 20 - 4), position 7 only by an
  // old one (query 10); table 1 retained nothing. Sinks: position 0.
  int32_t* hits = kv.hits();
  hits[5] = 19;
  hits[6] = 16;
  hits[9] = 18;
  hits[7] = 10;
  SparsePolicy policy{true, /*local_window=*/8, /*sink_tokens=*/1, /*obs_window=*/4};
  std::vector<RowMove> moves;
  SequenceKv::CompactResult r;
  kv.CompactV(pool, 20, policy, &moves, &r);
  // Blocks whose rows end at or before 20 - 8 = 12 leave the tail: positions 0..11.
  EXPECT_EQ(kv.v_tail_start(), 12);
  EXPECT_EQ(r.rows_kept, 4 + 1);          // table 0: 0, 5, 6, 9; table 1: 0
  EXPECT_EQ(r.rows_dropped, 24 - 5);
  EXPECT_EQ(kv.sparse_count()[0], 4);
  EXPECT_EQ(kv.sparse_count()[1], 1);
  EXPECT_EQ(std::vector<int32_t>(kv.sparse_pos(), kv.sparse_pos() + 4), (std::vector<int32_t>{0, 5, 6, 9}));
  // Each table keeps one page (its first freed tail page, reused) and returns two.
  EXPECT_EQ(r.pages_freed, 4);
  EXPECT_EQ(pool.num_free(), 64 - 20 + 4);
  // In place and in order: no move writes a slot that a later move still has to read.
  for (size_t i = 0; i < moves.size(); ++i) {
    for (size_t j = i + 1; j < moves.size(); ++j) {
      EXPECT_FALSE(moves[j].src_page == moves[i].dst_page && moves[j].src_row == moves[i].dst_row)
          << "move " << i << " overwrites the source of move " << j;
    }
  }
  EXPECT_EQ(kv.VRowsResident(20), (20 - 12) * 2 + 5);
  kv.ReleaseAll(pool);
  EXPECT_EQ(pool.num_free(), 64);
}

// The offload policy: the same compaction, but the rows the rule does not keep go to the host
// store (pages of the host pool) in position order instead of being dropped; the KV pool ends
// as under the sparse policy, and ReleaseAll returns the host pages too.
TEST(SequenceKvTest, OffloadMovesTheRowsCompactionDoesNotKeepToTheHostPool) {
  KvShape shape{1, 2, 4, 8};  // 2 tables, 4 rows a page
  PagePool pool(64, 4), host(64, 4);
  SequenceKv kv(shape);
  kv.Grow(pool, 20);
  int32_t* hits = kv.hits();
  hits[5] = 19;
  hits[6] = 16;
  hits[9] = 18;
  hits[7] = 10;
  SparsePolicy policy{true, /*local_window=*/8, /*sink_tokens=*/1, /*obs_window=*/4};
  policy.offload = true;
  std::vector<RowMove> moves;
  SequenceKv::CompactResult r;
  kv.CompactV(pool, 20, policy, &moves, &r, &host);
  EXPECT_EQ(kv.v_tail_start(), 12);
  EXPECT_EQ(r.rows_kept, 5);
  EXPECT_EQ(r.rows_offloaded, 24 - 5);
  EXPECT_EQ(r.rows_dropped, 0);
  // The KV pool as under the sparse policy (the test above).
  EXPECT_EQ(r.pages_freed, 4);
  EXPECT_EQ(pool.num_free(), 64 - 20 + 4);
  EXPECT_EQ(kv.VRowsResident(20), (20 - 12) * 2 + 5);
  // Table 0 offloads 12 - 4 rows (two host pages), table 1 all but its sink: 11 (three).
  ASSERT_TRUE(kv.has_host_store());
  EXPECT_EQ(kv.host_count()[0], 8);
  EXPECT_EQ(kv.host_count()[1], 11);
  EXPECT_EQ(std::vector<int32_t>(kv.host_pos(), kv.host_pos() + 8),
            (std::vector<int32_t>{1, 2, 3, 4, 7, 8, 10, 11}));
  EXPECT_EQ(kv.host_pos()[kv.host_pos_stride()], 1);
  EXPECT_EQ(kv.VRowsOffloaded(), 19);
  EXPECT_EQ(kv.num_host_pages(), 5);
  EXPECT_EQ(host.num_used(), 5);
  // Every offloaded row is copied from the tail slot of its position to its host slot, before
  // the in-place moves (ApplyRowMoves runs them first) could overwrite the tail.
  std::set<std::pair<int32_t, int32_t>> host_slots;
  int64_t to_host = 0;
  for (const RowMove& m : moves) {
    if (!m.to_host) continue;
    ++to_host;
    EXPECT_GE(m.dst_page, 0);
    EXPECT_LT(m.dst_page, host.num_pages());
    EXPECT_EQ(host.refcount(m.dst_page), 1);
    EXPECT_TRUE(host_slots.insert({m.dst_page, m.dst_row}).second) << "two rows in one host slot";
  }
  EXPECT_EQ(to_host, 19);
  const int32_t first = kv.host_pages()[0];
  const RowMove& m0 = *std::find_if(moves.begin(), moves.end(), [](const RowMove& m) { return m.to_host; });
  EXPECT_EQ(m0.dst_page, first);
  EXPECT_EQ(m0.dst_row, 0);
  EXPECT_EQ(m0.src_row, 1);  // position 1 of table 0, in the first tail block
  kv.ReleaseAll(pool);
  EXPECT_EQ(pool.num_free(), 64);
  EXPECT_EQ(host.num_free(), 64);
  EXPECT_FALSE(kv.has_host_store());
}

// A full host pool: rows are offloaded while it has pages (a part-filled page is filled
// first), then dropped as under the sparse policy.
TEST(SequenceKvTest, OffloadDropsRowsOnceTheHostPoolIsFull) {
  KvShape shape{1, 2, 4, 8};
  PagePool pool(64, 4), host(3, 4);
  SequenceKv kv(shape);
  kv.Grow(pool, 20);
  SparsePolicy policy{true, /*local_window=*/8, /*sink_tokens=*/1, /*obs_window=*/4};
  policy.offload = true;
  std::vector<RowMove> moves;
  SequenceKv::CompactResult r;
  kv.CompactV(pool, 20, policy, &moves, &r, &host);
  // Nothing retained: 11 rows per table leave. Table 0 takes two host pages (8 rows) and the
  // third (3 rows); table 1 finds none left.
  EXPECT_EQ(r.rows_kept, 2);
  EXPECT_EQ(r.rows_offloaded, 11);
  EXPECT_EQ(r.rows_dropped, 11);
  EXPECT_EQ(kv.host_count()[0], 11);
  EXPECT_EQ(kv.host_count()[1], 0);
  EXPECT_EQ(host.num_free(), 0);
  EXPECT_EQ(kv.VRowsResident(20) + kv.VRowsOffloaded() + r.rows_dropped, 20 * 2);
  // The next compaction fills table 0's part-filled page, then drops.
  kv.Grow(pool, 24);
  moves.clear();
  kv.CompactV(pool, 24, policy, &moves, &r, &host);
  EXPECT_EQ(r.rows_offloaded, 1);
  EXPECT_EQ(r.rows_dropped, 4 + 3);
  EXPECT_EQ(kv.host_count()[0], 12);
  kv.ReleaseAll(pool);
  EXPECT_EQ(host.num_free(), 3);
  EXPECT_EQ(pool.num_free(), 64);
}

TEST(SequenceKvTest, MassBudgetKeepsTheRowsWithTheHighestMeanRetainedProbability) {
  KvShape shape{1, 1, 4, 8};  // 1 table, 4 rows a page
  PagePool pool(32, 4);
  SequenceKv kv(shape);
  kv.Grow(pool, 16);  // 4 blocks: K 4 pages + V tail 4 pages
  // Positions 0..7 leave the tail (16 - 8). Mean mass = mass / (16 - p): position 1 has
  // 1.5 / 15 = 0.100, 3 has 1.6 / 13 ≈ 0.123, 4 has 0.3 / 12 = 0.025, 6 has 1.05 / 10 = 0.105,
  // 7 has 0.95 / 9 ≈ 0.106: position 1 has less total mass than 3 but more than 6 and 7,
  // and still ranks below them (it was seen by more queries).
  float* mass = kv.hit_mass();
  mass[1] = 1.5f;
  mass[3] = 1.6f;
  mass[4] = 0.3f;
  mass[6] = 1.05f;
  mass[7] = 0.95f;
  SparsePolicy policy{true, /*local_window=*/8, /*sink_tokens=*/1, /*obs_window=*/4};
  policy.keep_fraction = 0.5;  // 4 of the 8 leaving rows at most; row 0 is a sink anyway
  std::vector<RowMove> moves;
  SequenceKv::CompactResult r;
  kv.CompactV(pool, 16, policy, &moves, &r);
  EXPECT_EQ(kv.v_tail_start(), 8);
  // Ranking: 3 (0.123), 7 (0.106), 6 (0.105), 1 (0.100), then 4 (0.025): the top 4 and the sink.
  ASSERT_EQ(kv.sparse_count()[0], 5);
  EXPECT_EQ(std::vector<int32_t>(kv.sparse_pos(), kv.sparse_pos() + 5), (std::vector<int32_t>{0, 1, 3, 6, 7}));
  EXPECT_EQ(r.rows_dropped, 3);

  // A budget larger than the rows with any mass keeps only those: no mass, no row.
  SequenceKv kv2(shape);
  kv2.Grow(pool, 16);
  kv2.hit_mass()[5] = 0.2f;
  policy.keep_fraction = 1.0;
  kv2.CompactV(pool, 16, policy, &moves, &r);
  ASSERT_EQ(kv2.sparse_count()[0], 2);
  EXPECT_EQ(std::vector<int32_t>(kv2.sparse_pos(), kv2.sparse_pos() + 2), (std::vector<int32_t>{0, 5}));
  kv.ReleaseAll(pool);
  kv2.ReleaseAll(pool);
  EXPECT_EQ(pool.num_free(), 32);
}

TEST(SequenceKvTest, PagesToReachBoundsWhatAMassBudgetSequenceEverHolds) {
  KvShape shape{2, 2, 16, 8};  // 4 tables
  SparsePolicy policy{true, /*local_window=*/64, /*sink_tokens=*/4, /*obs_window=*/8};
  SequenceKv probe(shape);
  EXPECT_EQ(probe.PagesToReach(1000, policy, 128), probe.PagesNeeded(1000))
      << "without a budget the V store is unbounded: reserve it dense";
  policy.keep_fraction = 0.1;
  const int64_t bound = probe.PagesToReach(1000, policy, 128);
  EXPECT_LT(bound, probe.PagesNeeded(1000) * 3 / 4);

  // Grow in chunks, with every row given some mass, compacting after each step as the
  // engine does: the pages held never exceed the bound taken at the start.
  for (int64_t chunk : {1, 7, 128}) {
    PagePool pool(4096, 16);
    SequenceKv kv(shape);
    const int64_t start_bound = kv.PagesToReach(1000, policy, chunk);
    uint32_t rng = 12345;
    std::vector<RowMove> moves;
    for (int64_t len = 0; len < 1000;) {
      const int64_t n = std::min<int64_t>(chunk, 1000 - len);
      ASSERT_TRUE(pool.CanAllocate(kv.PagesNeeded(len + n)));
      kv.Grow(pool, len + n);
      for (int64_t t = 0; t < shape.tables(); ++t) {
        for (int64_t p = len; p < len + n; ++p) {
          rng = rng * 1664525u + 1013904223u;
          kv.hit_mass()[t * kv.hits_stride() + p] = 1.0f + float(rng >> 16);
        }
      }
      len += n;
      ASSERT_LE(kv.num_pages(), start_bound) << "chunk " << chunk << " at length " << len;
      SequenceKv::CompactResult r;
      moves.clear();
      kv.CompactV(pool, len, policy, &moves, &r);
      ASSERT_LE(kv.num_pages(), start_bound);
      ASSERT_EQ(kv.num_pages(), pool.num_pages() - pool.num_free());
    }
    kv.ReleaseAll(pool);
    EXPECT_EQ(pool.num_free(), pool.num_pages());
  }
}

}  // namespace
}  // namespace thetaserve::cache
