#include "cache/sequence_kv.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

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

// What preempting sequences frees (the scheduler's room for a request of an earlier priority):
// a page counts when the given sequences are all its holders besides the prefix cache.
TEST(SequenceKvTest, PagesFreedOnReleaseCountsPagesOnlyTheGivenSequencesHold) {
  KvShape shape{1, 1, 4};  // one table: a block is a K page and a V page
  PagePool pool(64, 4);
  SequenceKv a(shape), b(shape), c(shape);
  a.Grow(pool, 8);
  const int32_t k0 = a.k_page(0, 0), v0 = a.v_page(0, 0), k1 = a.k_page(0, 1), v1 = a.v_page(0, 1);
  // b and c adopt a's first block (a prompt's shared blocks), c its second too, which the
  // prefix cache also holds; b computes a second block of its own.
  b.AppendSharedBlock(pool, &k0, &v0);
  c.AppendSharedBlock(pool, &k0, &v0);
  c.AppendSharedBlock(pool, &k1, &v1);
  b.Grow(pool, 8);
  pool.RefCached(k1);
  pool.RefCached(v1);
  using Seqs = std::vector<const SequenceKv*>;
  EXPECT_EQ(SequenceKv::PagesFreedOnRelease(Seqs{&b}, pool), 2) << "its own block";
  EXPECT_EQ(SequenceKv::PagesFreedOnRelease(Seqs{&a}, pool), 0) << "every page shared";
  EXPECT_EQ(SequenceKv::PagesFreedOnRelease(Seqs{&a, &c}, pool), 2) << "the cached block";
  EXPECT_EQ(SequenceKv::PagesFreedOnRelease(Seqs{&a, &b, &c}, pool), 6);
  const int64_t available = pool.num_free() + pool.num_cached_only();
  for (SequenceKv* kv : {&a, &b, &c}) kv->ReleaseAll(pool);
  EXPECT_EQ(pool.num_free() + pool.num_cached_only(), available + 6);
  EXPECT_EQ(pool.num_cached_only(), 2);
}

// Table 0: positions 5, 6, 9 retained by recent queries (>= 20 - 4), position 7 only by an
// old one (query 10); table 1 retained nothing.
void MarkRecentHits(SequenceKv& kv) {
  int32_t* hits = kv.hits();
  hits[5] = 19;
  hits[6] = 16;
  hits[9] = 18;
  hits[7] = 10;
}

TEST(SequenceKvTest, CompactionKeepsHitsAndSinksInPlaceAndFreesTheRest) {
  KvShape shape{1, 2, 4, 8};  // 2 tables, 4 rows a page
  PagePool pool(64, 4);
  SequenceKv kv(shape);
  kv.Grow(pool, 20);  // 5 blocks: K 10 pages + V tail 10 pages
  ASSERT_EQ(pool.num_free(), 64 - 20);
  MarkRecentHits(kv);  // sinks: position 0
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
  // In place and in order: no move writes a slot that a later move still has to read (table
  // 0's rows 5, 6 and 9 at least change places).
  ASSERT_GE(moves.size(), 3u);
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
  MarkRecentHits(kv);
  SparsePolicy policy{true, /*local_window=*/8, /*sink_tokens=*/1, /*obs_window=*/4};
  policy.offload = true;
  const std::vector<int32_t> tail_before(kv.v_table(), kv.v_table() + 2 * kv.stride());
  const int32_t stride = kv.stride();
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
  // Every offloaded row is copied from the tail slot of its position (as the tail was before
  // compaction; ApplyRowMoves runs these copies before the in-place moves could overwrite it)
  // to the host slot listed for that position. The host moves come table by table, in
  // position order.
  std::set<std::pair<int32_t, int32_t>> host_slots;
  int64_t to_host = 0;
  for (const RowMove& m : moves) {
    if (!m.to_host) continue;
    const int32_t t = to_host < kv.host_count()[0] ? 0 : 1;
    const int32_t i = static_cast<int32_t>(t == 0 ? to_host : to_host - kv.host_count()[0]);
    const int32_t p = kv.host_pos()[t * kv.host_pos_stride() + i];
    ++to_host;
    EXPECT_EQ(m.src_page, tail_before[t * stride + p / 4]) << "table " << t << " position " << p;
    EXPECT_EQ(m.src_row, p % 4) << "table " << t << " position " << p;
    EXPECT_EQ(m.dst_page, kv.host_pages()[t * kv.host_stride() + i / 4]);
    EXPECT_EQ(m.dst_row, i % 4);
    EXPECT_EQ(host.refcount(m.dst_page), 1);
    EXPECT_TRUE(host_slots.insert({m.dst_page, m.dst_row}).second) << "two rows in one host slot";
  }
  EXPECT_EQ(to_host, 19);
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

// Random sequences under the offload policy (random chunks, marks, budgets, a small host pool,
// preemptions), with every V row's identity tracked through the pools as the backend would
// move it (host copies first, then the in-place moves in order): after every compaction each
// row of the sparse and host stores holds the position it is listed under, positions are
// ascending and disjoint, every row below the tail is stored or counted as dropped, and the
// pools' use matches what the sequences hold. THETASERVE_SEED replays a run.
TEST(SequenceKvTest, RandomOffloadCompactionsKeepEveryRowWhereItIsListed) {
  const char* env = std::getenv("THETASERVE_SEED");
  const uint64_t seed = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const KvShape shape{2, 2, 4, 8};  // 4 tables, 4 rows a page
  const int64_t tables = shape.tables(), bs = shape.block_size;
  PagePool pool(4000, 4), host(8 + int64_t(rng() % 40), 4);
  // Row identity: (sequence, table, position) + 1, 0 = never written.
  auto tag = [](int64_t s, int64_t t, int64_t p) { return (s << 40 | t << 20 | p) + 1; };
  std::vector<int64_t> kv_rows(pool.num_pages() * bs, 0), host_rows(host.num_pages() * bs, 0);
  struct Seq {
    std::unique_ptr<SequenceKv> kv;
    int64_t len = 0, dropped = 0;
  };
  std::vector<Seq> seqs(3);
  for (Seq& q : seqs) q.kv = std::make_unique<SequenceKv>(shape);
  int64_t compactions = 0, offloaded = 0, dropped = 0;
  for (int step = 0; step < 300; ++step) {
    const int64_t s = int64_t(rng() % seqs.size());
    Seq& q = seqs[s];
    if (rng() % 40 == 0) {  // preempted: everything released
      q.kv->ReleaseAll(pool);
      q.len = q.dropped = 0;
      continue;
    }
    const int64_t n = 1 + int64_t(rng() % 9);
    ASSERT_TRUE(pool.CanAllocate(q.kv->PagesNeeded(q.len + n)));
    q.kv->Grow(pool, q.len + n);
    for (int64_t t = 0; t < tables; ++t) {
      for (int64_t p = q.len; p < q.len + n; ++p) {
        const int32_t page = q.kv->v_table()[t * q.kv->stride() + (p - q.kv->v_tail_start()) / bs];
        kv_rows[page * bs + p % bs] = tag(s, t, p);
        if (rng() % 3 == 0) q.kv->hits()[t * q.kv->hits_stride() + p] = int32_t(q.len + n - 1);
        if (rng() % 2 == 0) {
          q.kv->hit_mass()[t * q.kv->hits_stride() + p] = ToMassUnits(float(rng() % 100) / 50);
        }
      }
    }
    q.len += n;
    SparsePolicy policy{true, /*local_window=*/int32_t(4 + rng() % 12), /*sink_tokens=*/2,
                        /*obs_window=*/int32_t(1 + rng() % 6)};
    policy.keep_fraction = rng() % 2 ? 0.25 : 0.0;
    policy.offload = true;
    std::vector<RowMove> moves;
    SequenceKv::CompactResult r;
    q.kv->CompactV(pool, q.len, policy, &moves, &r, &host);
    compactions += !moves.empty() || r.rows_dropped > 0;
    offloaded += r.rows_offloaded;
    dropped += r.rows_dropped;
    q.dropped += r.rows_dropped;
    for (const RowMove& m : moves) {
      if (m.to_host) host_rows[m.dst_page * bs + m.dst_row] = kv_rows[m.src_page * bs + m.src_row];
    }
    for (const RowMove& m : moves) {
      if (!m.to_host) kv_rows[m.dst_page * bs + m.dst_row] = kv_rows[m.src_page * bs + m.src_row];
    }
    // Every sequence's stores, as listed.
    int64_t kv_pages = 0, host_pages = 0;
    for (int64_t si = 0; si < int64_t(seqs.size()); ++si) {
      const SequenceKv& kv = *seqs[si].kv;
      kv_pages += kv.num_pages();
      host_pages += kv.num_host_pages();
      if (seqs[si].len == 0) continue;
      int64_t stored = 0;
      for (int64_t t = 0; t < tables; ++t) {
        std::set<int32_t> seen;
        auto check = [&](const int32_t* pages, int32_t page_stride, const int32_t* pos,
                         int32_t pos_stride, int32_t count, const std::vector<int64_t>& rows,
                         const char* what) {
          for (int32_t i = 0; i < count; ++i) {
            const int32_t p = pos[t * pos_stride + i];
            ASSERT_LT(p, kv.v_tail_start()) << what;
            if (i > 0) {
              ASSERT_LT(pos[t * pos_stride + i - 1], p) << what << ": positions not ascending";
            }
            ASSERT_TRUE(seen.insert(p).second) << what << ": position " << p << " stored twice";
            const int32_t page = pages[t * page_stride + i / bs];
            ASSERT_EQ(rows[page * bs + i % bs], tag(si, t, p))
                << what << " row " << i << " of table " << t << " does not hold position " << p;
          }
          stored += count;
        };
        check(kv.sparse_pages(), kv.sparse_stride(), kv.sparse_pos(), kv.pos_stride(),
              kv.sparse_count()[t], kv_rows, "sparse store");
        if (kv.has_host_store()) {
          check(kv.host_pages(), kv.host_stride(), kv.host_pos(), kv.host_pos_stride(),
                kv.host_count()[t], host_rows, "host store");
        }
        if (::testing::Test::HasFatalFailure()) return;
      }
      EXPECT_EQ(stored + seqs[si].dropped, kv.v_tail_start() * tables)
          << "a row below the tail is neither stored nor counted as dropped";
    }
    ASSERT_EQ(pool.num_used(), kv_pages);
    ASSERT_EQ(host.num_used(), host_pages);
  }
  EXPECT_GT(compactions, 50);
  EXPECT_GT(offloaded, 0);
  EXPECT_GT(dropped, 0) << "the host pool never filled";
  for (Seq& q : seqs) q.kv->ReleaseAll(pool);
  EXPECT_EQ(pool.num_free(), pool.num_pages());
  EXPECT_EQ(host.num_free(), host.num_pages());
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
  MassUnits* mass = kv.hit_mass();
  mass[1] = ToMassUnits(1.5f);
  mass[3] = ToMassUnits(1.6f);
  mass[4] = ToMassUnits(0.3f);
  mass[6] = ToMassUnits(1.05f);
  mass[7] = ToMassUnits(0.95f);
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
  kv2.hit_mass()[5] = ToMassUnits(0.2f);
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
          kv.hit_mass()[t * kv.hits_stride() + p] = ToMassUnits(1.0f + float(rng >> 16));
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
