// The prefix cache on its own: which blocks a sequence adopts, that shared pages are counted
// once and reclaimed only when no sequence holds them, least recently used leaves first.
#include "cache/prefix_cache.h"

#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace thetaserve::cache {
namespace {

constexpr KvShape kShape{2, 3, 4};  // 6 tables, 4 rows a page
constexpr int64_t kTables = 6;

std::vector<int32_t> Tokens(int n, int first = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A sequence that computed `tokens` (pages for all of them) and registered its full blocks.
struct Computed {
  Computed(PrefixCache& cache, PagePool& pool, const std::vector<int32_t>& tokens) : kv(kShape) {
    kv.Grow(pool, static_cast<int64_t>(tokens.size()));
    const int64_t full = static_cast<int64_t>(tokens.size()) / kShape.block_size;
    key = cache.Insert(tokens, 0, full, PrefixCache::kRoot, kv, pool);
  }
  SequenceKv kv;
  uint64_t key = 0;
};

TEST(PrefixCacheTest, ASequenceAdoptsTheBlocksItsTokensBeginWith) {
  PagePool pool(256, 4);
  PrefixCache cache(kShape);
  std::vector<int32_t> a = Tokens(14);  // 3 full blocks and 2 tokens
  Computed first(cache, pool, a);
  EXPECT_EQ(cache.num_blocks(), 3);
  EXPECT_EQ(pool.num_cached_only(), 0) << "the first sequence still holds its pages";

  // Same first 9 tokens, then different: blocks 0 and 1 match, block 2 does not.
  std::vector<int32_t> b = a;
  b[9] = 7;
  SequenceKv kv(kShape);
  uint64_t key = 0;
  EXPECT_EQ(cache.Adopt(b, 100, kv, pool, &key), 2);
  EXPECT_EQ(kv.blocks(), 2);
  for (int64_t t = 0; t < kTables; ++t) {
    for (int64_t blk = 0; blk < 2; ++blk) {
      EXPECT_EQ(kv.k_page(t, blk), first.kv.k_page(t, blk));
      EXPECT_EQ(kv.v_page(t, blk), first.kv.v_page(t, blk));
      EXPECT_EQ(pool.refcount(kv.k_page(t, blk)), 3);  // first, cache, kv
    }
  }
  EXPECT_EQ(key, PrefixCache::BlockKey(PrefixCache::BlockKey(PrefixCache::kRoot,
                                                             std::span(a).subspan(0, 4)),
                                       std::span(a).subspan(4, 4)));
  // max_blocks caps it.
  SequenceKv capped(kShape);
  EXPECT_EQ(cache.Adopt(a, 1, capped, pool, &key), 1);
  // A different first token matches nothing.
  std::vector<int32_t> c = a;
  c[0] = 1;
  SequenceKv none(kShape);
  EXPECT_EQ(cache.Adopt(c, 100, none, pool, &key), 0);
  EXPECT_EQ(key, PrefixCache::kRoot);
  EXPECT_EQ(none.blocks(), 0);

  kv.ReleaseAll(pool);
  capped.ReleaseAll(pool);
  first.kv.ReleaseAll(pool);
  // Only the cache holds the 3 blocks now: reclaimable, and released by Clear.
  EXPECT_EQ(pool.num_cached_only(), 3 * 2 * kTables);
  EXPECT_EQ(pool.num_cached_only(PageKind::kK), 3 * kTables);
  EXPECT_EQ(pool.num_free(), 256 - 3 * 2 * kTables);
  cache.Clear(pool);
  EXPECT_EQ(pool.num_free(), 256);
  EXPECT_EQ(pool.num_cached_only(), 0);
  EXPECT_EQ(cache.num_blocks(), 0);
}

TEST(PrefixCacheTest, AdoptedBlocksContinueTheChainOfKeys) {
  PagePool pool(512, 4);
  PrefixCache cache(kShape);
  std::vector<int32_t> a = Tokens(8);
  Computed first(cache, pool, a);
  first.kv.ReleaseAll(pool);

  // A longer sequence adopts both blocks, computes two more and registers them after its
  // adopted ones; a third sequence then finds all four.
  std::vector<int32_t> b = Tokens(17);
  SequenceKv kv(kShape);
  uint64_t key = 0;
  ASSERT_EQ(cache.Adopt(b, 4, kv, pool, &key), 2);
  kv.Grow(pool, 17);
  key = cache.Insert(b, 2, 4, key, kv, pool);
  EXPECT_EQ(cache.num_blocks(), 4);
  SequenceKv third(kShape);
  EXPECT_EQ(cache.Adopt(b, 100, third, pool, &key), 4);
  // Registering an already cached block keeps the cached pages.
  Computed again(cache, pool, a);
  EXPECT_EQ(cache.num_blocks(), 4);
  EXPECT_NE(again.kv.k_page(0, 0), third.k_page(0, 0));
  EXPECT_EQ(pool.refcount(again.kv.k_page(0, 0)), 1) << "a duplicate is not cached";
}

TEST(PrefixCacheTest, MakeRoomFreesLeastRecentlyUsedLeavesThatNoSequenceHolds) {
  // Room for 10 blocks (12 pages each).
  PagePool pool(120, 4);
  PrefixCache cache(kShape);
  std::vector<int32_t> a = Tokens(12, 100), b = Tokens(12, 200);
  Computed ca(cache, pool, a);  // 3 blocks
  Computed cb(cache, pool, b);  // 3 blocks
  ca.kv.ReleaseAll(pool);
  // b is still held: only a's blocks can go.
  EXPECT_EQ(pool.num_free(), 120 - 6 * 12);
  EXPECT_TRUE(cache.MakeRoom(pool, 120 - 6 * 12 + 12));
  EXPECT_EQ(pool.num_free(), 120 - 5 * 12);
  EXPECT_EQ(cache.num_evicted(), 1);
  // The leaf went first: a's first two blocks still match.
  SequenceKv probe(kShape);
  uint64_t key = 0;
  EXPECT_EQ(cache.Adopt(a, 100, probe, pool, &key), 2);
  probe.ReleaseAll(pool);
  // Asking for more than can be freed frees what it can and says no.
  EXPECT_FALSE(cache.MakeRoom(pool, 120));
  EXPECT_EQ(cache.num_blocks(), 3) << "b's blocks are in use";
  EXPECT_EQ(pool.num_free(), 120 - 3 * 12);
  cb.kv.ReleaseAll(pool);
  EXPECT_TRUE(cache.MakeRoom(pool, 120));
  EXPECT_EQ(cache.num_blocks(), 0);
  EXPECT_EQ(pool.num_cached_only(), 0);
}

TEST(PrefixCacheTest, RecentlyAdoptedPrefixesOutliveOlderOnes) {
  PagePool pool(240, 4);
  PrefixCache cache(kShape);
  std::vector<int32_t> a = Tokens(8, 100), b = Tokens(8, 200);
  Computed(cache, pool, a).kv.ReleaseAll(pool);
  Computed(cache, pool, b).kv.ReleaseAll(pool);
  // Touch a: b becomes the least recently used.
  SequenceKv touch(kShape);
  uint64_t key = 0;
  ASSERT_EQ(cache.Adopt(a, 100, touch, pool, &key), 2);
  touch.ReleaseAll(pool);
  ASSERT_TRUE(cache.MakeRoom(pool, pool.num_free() + 2 * 12));
  SequenceKv pa(kShape), pb(kShape);
  EXPECT_EQ(cache.Adopt(a, 100, pa, pool, &key), 2);
  EXPECT_EQ(cache.Adopt(b, 100, pb, pool, &key), 0);
}

TEST(PrefixCacheTest, AHashCollisionIsAMissNotAWrongMatch) {
  // Every block gets the same key: only the token and parent checks tell blocks apart.
  PagePool pool(240, 4);
  PrefixCache cache(kShape, [](uint64_t, std::span<const int32_t>) { return uint64_t{42}; });
  std::vector<int32_t> a = Tokens(8);
  Computed ca(cache, pool, a);
  EXPECT_EQ(cache.num_blocks(), 1) << "a's second block collides with its first";
  SequenceKv kv(kShape);
  uint64_t key = 0;
  // a's first block matches; its second finds a block with another parent and other tokens.
  EXPECT_EQ(cache.Adopt(a, 2, kv, pool, &key), 1);
  kv.ReleaseAll(pool);
  // Other tokens under the same key: no match.
  std::vector<int32_t> b = Tokens(8, 500);
  EXPECT_EQ(cache.Adopt(b, 2, kv, pool, &key), 0);
  // a's second block's tokens as a first block: same key, same tokens as nothing cached.
  std::vector<int32_t> c(a.begin() + 4, a.end());
  EXPECT_EQ(cache.Adopt(c, 1, kv, pool, &key), 0);
  // Registering b under the taken key changes nothing.
  Computed cb(cache, pool, b);
  EXPECT_EQ(cache.num_blocks(), 1);
  EXPECT_EQ(cache.Adopt(a, 1, kv, pool, &key), 1);
  EXPECT_EQ(kv.k_page(0, 0), ca.kv.k_page(0, 0));
}

TEST(PagePoolTest, CachedOnlyCountFollowsEveryReference) {
  PagePool pool(8, 4);
  const int32_t p = pool.Allocate(PageKind::kV);
  pool.RefCached(p);
  EXPECT_EQ(pool.num_cached_only(), 0);
  pool.Ref(p);      // a second sequence
  pool.Release(p);  // it goes
  EXPECT_EQ(pool.num_cached_only(), 0);
  pool.Release(p);  // the owner goes: only the cache is left
  EXPECT_EQ(pool.num_cached_only(PageKind::kV), 1);
  EXPECT_EQ(pool.num_cached_only(PageKind::kK), 0);
  pool.Ref(p);  // adopted
  EXPECT_EQ(pool.num_cached_only(), 0);
  pool.Release(p);
  pool.ReleaseCached(p);
  EXPECT_EQ(pool.num_cached_only(), 0);
  EXPECT_EQ(pool.num_free(), 8);
  EXPECT_EQ(pool.kind(p), PageKind::kFree);
}

}  // namespace
}  // namespace thetaserve::cache
