// The prefix cache on its own: which blocks a sequence adopts, that shared pages are counted
// once and reclaimed only when no sequence holds them (least recently used leaves first), and
// that a hash collision is a miss, never a block computed after other tokens.
#include "cache/prefix_cache.h"

#include <numeric>
#include <string_view>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace thetaserve::cache {
namespace {

constexpr KvShape kShape{2, 3, 4};  // 6 tables, 4 rows a page
constexpr int64_t kTables = 6;
constexpr int64_t kBlockPages = 2 * kTables;

std::vector<int32_t> Tokens(int n, int first = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A sequence's pages and its place in the cache; Release does what the scheduler does when a
// sequence finishes.
struct Holder {
  Holder(PrefixCache& cache, PagePool& pool, PrefixCache::Cursor cursor = {})
      : kv(kShape), cursor(std::move(cursor)), cache(&cache), pool(&pool) {}
  void Release() {
    kv.ReleaseAll(*pool);
    cache->Released(*pool, &cursor);
  }
  SequenceKv kv;
  PrefixCache::Cursor cursor;
  PrefixCache* cache;
  PagePool* pool;
};

// A sequence that computes `tokens` and offers its full blocks to the cache, as the engine
// does: all at once, or (`one_by_one`) a block per call, as while decoding.
struct Seq : Holder {
  Seq(PrefixCache& cache, PagePool& pool, const std::vector<int32_t>& tokens, bool one_by_one = false,
      std::string_view salt = {})
      : Holder(cache, pool, cache.Start(salt)) {
    kv.Grow(pool, static_cast<int64_t>(tokens.size()));
    const int64_t full = static_cast<int64_t>(tokens.size()) / kShape.block_size;
    if (one_by_one) {
      for (int64_t b = 0; b < full; ++b) cache.Insert(tokens, b, b + 1, kv, pool, &cursor);
    } else {
      cache.Insert(tokens, 0, full, kv, pool, &cursor);
    }
  }
};

// Adopts what `tokens` find, into a fresh sequence.
struct Adopter : Holder {
  Adopter(PrefixCache& cache, PagePool& pool, const std::vector<int32_t>& tokens, int64_t max_blocks = 100,
          std::string_view salt = {})
      : Holder(cache, pool) {
    const PrefixCache::Match m = cache.Find(tokens, max_blocks, pool, salt);
    cache.Adopt(m, kv, pool, &cursor);
    blocks = m.blocks();
  }
  int64_t blocks = 0;
};

// The pool's count of pages only the cache holds is exactly the cache's reclaimable blocks.
void ExpectReclaimableMatchesPool(const PrefixCache& cache, const PagePool& pool) {
  EXPECT_EQ(pool.num_cached_only(), cache.num_reclaimable_blocks() * kBlockPages);
}

TEST(PrefixCacheTest, ASequenceAdoptsTheBlocksItsTokensBeginWith) {
  PagePool pool(256, 4);
  PrefixCache cache(kShape);
  std::vector<int32_t> a = Tokens(14);  // 3 full blocks and 2 tokens
  Seq first(cache, pool, a);
  EXPECT_EQ(cache.num_blocks(), 3);
  EXPECT_EQ(pool.num_cached_only(), 0) << "the first sequence still holds its pages";

  // Same first 9 tokens, then different: blocks 0 and 1 match, block 2 does not.
  std::vector<int32_t> b = a;
  b[9] = 7;
  EXPECT_EQ(cache.Find(b, 100, pool).pinned_pages, 0) << "held by the first sequence";
  Adopter got(cache, pool, b);
  EXPECT_EQ(got.blocks, 2);
  EXPECT_EQ(got.kv.blocks(), 2);
  for (int64_t t = 0; t < kTables; ++t) {
    for (int64_t blk = 0; blk < 2; ++blk) {
      EXPECT_EQ(got.kv.k_page(t, blk), first.kv.k_page(t, blk));
      EXPECT_EQ(got.kv.v_page(t, blk), first.kv.v_page(t, blk));
      EXPECT_EQ(pool.refcount(got.kv.k_page(t, blk)), 3);  // first, cache, got
    }
  }
  Adopter capped(cache, pool, a, 1);
  EXPECT_EQ(capped.blocks, 1) << "max_blocks caps it";
  std::vector<int32_t> c = a;
  c[0] = 1;
  Adopter none(cache, pool, c);
  EXPECT_EQ(none.blocks, 0);
  EXPECT_EQ(none.kv.blocks(), 0);

  got.Release();
  capped.Release();
  EXPECT_EQ(pool.num_cached_only(), 0) << "the first sequence still holds them";
  first.Release();
  // Only the cache holds the 3 blocks now: reclaimable, and released by Clear.
  ExpectReclaimableMatchesPool(cache, pool);
  EXPECT_EQ(pool.num_cached_only(), 3 * kBlockPages);
  EXPECT_EQ(pool.num_cached_only(PageKind::kK), 3 * kTables);
  EXPECT_EQ(pool.num_free(), 256 - 3 * kBlockPages);
  EXPECT_EQ(cache.Find(a, 100, pool).pinned_pages, 3 * kBlockPages);
  cache.Clear(pool);
  EXPECT_EQ(pool.num_cached_only(), 0);
  EXPECT_EQ(cache.num_blocks(), 0);
}

TEST(PrefixCacheTest, AdoptedBlocksContinueTheChain) {
  PagePool pool(512, 4);
  PrefixCache cache(kShape);
  std::vector<int32_t> a = Tokens(8);
  Seq(cache, pool, a).Release();

  // A longer sequence adopts both blocks, computes two more and offers them after its adopted
  // ones; a third sequence then finds all four.
  std::vector<int32_t> b = Tokens(17);
  Adopter longer(cache, pool, b, 4);
  ASSERT_EQ(longer.blocks, 2);
  longer.kv.Grow(pool, 17);
  cache.Insert(b, 2, 4, longer.kv, pool, &longer.cursor);
  EXPECT_EQ(cache.num_blocks(), 4);
  Adopter third(cache, pool, b);
  EXPECT_EQ(third.blocks, 4);
  // Offering an already cached block keeps the cached pages.
  Seq again(cache, pool, a);
  EXPECT_EQ(cache.num_blocks(), 4);
  EXPECT_NE(again.kv.k_page(0, 0), third.kv.k_page(0, 0));
  EXPECT_EQ(pool.refcount(again.kv.k_page(0, 0)), 1) << "a duplicate is not cached";
  ExpectReclaimableMatchesPool(cache, pool);
}

TEST(PrefixCacheTest, MakeRoomFreesLeastRecentlyUsedLeavesThatNoSequenceHolds) {
  // Room for 10 blocks.
  PagePool pool(10 * kBlockPages, 4);
  PrefixCache cache(kShape);
  std::vector<int32_t> a = Tokens(12, 100), b = Tokens(12, 200);
  Seq sa(cache, pool, a, /*one_by_one=*/true);  // 3 blocks, offered as while decoding
  Seq sb(cache, pool, b);                      // 3 blocks
  sa.Release();
  ExpectReclaimableMatchesPool(cache, pool);
  // b is still held: only a's blocks can go, its last block first.
  EXPECT_EQ(pool.num_free(), 4 * kBlockPages);
  EXPECT_TRUE(cache.MakeRoom(pool, 5 * kBlockPages));
  EXPECT_EQ(pool.num_free(), 5 * kBlockPages);
  EXPECT_EQ(cache.num_evicted(), 1);
  {
    Adopter probe(cache, pool, a);
    EXPECT_EQ(probe.blocks, 2) << "the leaf went first";
    probe.Release();
  }
  ExpectReclaimableMatchesPool(cache, pool);
  // Asking for more than can be freed frees what it can and says no.
  EXPECT_FALSE(cache.MakeRoom(pool, 10 * kBlockPages));
  EXPECT_EQ(cache.num_blocks(), 3) << "b's blocks are in use";
  EXPECT_EQ(pool.num_free(), 7 * kBlockPages);
  sb.Release();
  EXPECT_TRUE(cache.MakeRoom(pool, 10 * kBlockPages));
  EXPECT_EQ(cache.num_blocks(), 0);
  EXPECT_EQ(pool.num_cached_only(), 0);
}

TEST(PrefixCacheTest, RecentlyReleasedPrefixesOutliveOlderOnes) {
  PagePool pool(240, 4);
  PrefixCache cache(kShape);
  std::vector<int32_t> a = Tokens(8, 100), b = Tokens(8, 200);
  Seq(cache, pool, a).Release();
  Seq(cache, pool, b).Release();
  Adopter(cache, pool, a).Release();  // a is used again: b is now the least recently used
  ASSERT_TRUE(cache.MakeRoom(pool, pool.num_free() + 2 * kBlockPages));
  EXPECT_EQ(Adopter(cache, pool, a).blocks, 2);
  EXPECT_EQ(Adopter(cache, pool, b).blocks, 0);
}

// The key of the empty prefix in the tests that choose their keys.
constexpr uint64_t kTestRoot = 1;

// A request that ends on a block boundary adopts all but its last block and recomputes that
// one: the recomputed duplicate and the adopted blocks are used now, and outlive older ones.
TEST(PrefixCacheTest, APrefixUsedAgainOutlivesOlderBlocksEvenWhenItsTailWasRecomputed) {
  PagePool pool(64 * kBlockPages, 4);
  PrefixCache cache(kShape);
  const std::vector<int32_t> pc = Tokens(8, 1), q = Tokens(4, 900);
  Seq(cache, pool, pc).Release();
  Seq(cache, pool, q).Release();
  {
    Adopter again(cache, pool, pc, (8 - 1) / 4);  // the engine's cap: all but the last token
    ASSERT_EQ(again.blocks, 1);
    again.kv.Grow(pool, 8);
    cache.Insert(pc, 1, 2, again.kv, pool, &again.cursor);  // its own copy of the second block
    again.Release();
  }
  ExpectReclaimableMatchesPool(cache, pool);
  ASSERT_TRUE(cache.MakeRoom(pool, pool.num_free() + 1));
  EXPECT_EQ(cache.Find(q, 1, pool).blocks(), 0) << "the least recently used block goes first";
  EXPECT_EQ(cache.Find(pc, 2, pool).blocks(), 2);
  ASSERT_TRUE(cache.MakeRoom(pool, pool.num_free() + 1));
  EXPECT_EQ(cache.Find(pc, 2, pool).blocks(), 1) << "then the prefix's tail";
}

// Only blocks that begin a prefix with token 100 or 200 collide, on one key.
uint64_t CollidingFirstBlocks(uint64_t parent, std::span<const int32_t> t) {
  if (parent == kTestRoot && (t[0] == 100 || t[0] == 200)) return 7;
  return PrefixCache::BlockKey(parent, t);
}

TEST(PrefixCacheTest, AHashCollisionIsAMissNotAWrongMatch) {
  PagePool pool(240, 4);
  PrefixCache cache(kShape, &CollidingFirstBlocks, kTestRoot);
  const std::vector<int32_t> x = {100, 1, 2, 3};
  const std::vector<int32_t> y = {200, 1, 2, 3, 50, 51, 52, 53, 9};
  Seq sx(cache, pool, x);
  Seq sy(cache, pool, y);  // its first block collides with x's: it offers nothing
  EXPECT_TRUE(sy.cursor.stopped);
  EXPECT_EQ(cache.num_blocks(), 1);
  // x's first block, then y's second: y's K/V rows there were computed after y's tokens, so a
  // match would be wrong. Only x's block is found.
  const std::vector<int32_t> z = {100, 1, 2, 3, 50, 51, 52, 53, 9};
  Adopter gz(cache, pool, z);
  EXPECT_EQ(gz.blocks, 1);
  EXPECT_EQ(gz.kv.k_page(0, 0), sx.kv.k_page(0, 0));
  // y's own tokens find nothing (the block under their key holds x's tokens).
  EXPECT_EQ(Adopter(cache, pool, y).blocks, 0);
}

TEST(PrefixCacheTest, EveryKeyCollidingStillMatchesOnlyTheRightChain) {
  PagePool pool(240, 4);
  PrefixCache cache(kShape, [](uint64_t, std::span<const int32_t>) { return uint64_t{42}; },
                    kTestRoot);
  std::vector<int32_t> a = Tokens(8);
  Seq sa(cache, pool, a);
  EXPECT_EQ(cache.num_blocks(), 1) << "a's second block collides with its first";
  EXPECT_EQ(Adopter(cache, pool, a, 2).blocks, 1);
  EXPECT_EQ(Adopter(cache, pool, Tokens(8, 500), 2).blocks, 0);
  // a's second block's tokens as a first block: same key, other tokens.
  EXPECT_EQ(Adopter(cache, pool, std::vector<int32_t>(a.begin() + 4, a.end()), 1).blocks, 0);
  // a's first block's tokens twice: the second finds the same block (same key and tokens),
  // whose rows were computed at positions 0-3, not 4-7; its parent tells them apart.
  const std::vector<int32_t> twice = {100, 101, 102, 103, 100, 101, 102, 103};
  EXPECT_EQ(Adopter(cache, pool, twice, 2).blocks, 1);
}

// Two sequences with the same prompt admitted together each compute block 0; the second's
// block 1 follows the first's cached block 0. When the first finishes its block 0 is held by
// no sequence but is followed by a block in use: MakeRoom may free it (after every leaf), so
// what the pool counts as reclaimable is what MakeRoom can free.
TEST(PrefixCacheTest, ABlockFollowedByOneInUseIsStillReclaimable) {
  PagePool pool(8 * kBlockPages, 4);
  PrefixCache cache(kShape);
  const std::vector<int32_t> a = Tokens(8, 1), b = {1, 2, 3, 4, 9, 9, 9, 9};
  Seq sa(cache, pool, a);
  Seq sb(cache, pool, b);  // block 0 already cached (a's): b keeps its own copy
  EXPECT_FALSE(sb.cursor.stopped);
  EXPECT_EQ(cache.num_blocks(), 3);
  Seq other(cache, pool, Tokens(4, 500));
  other.Release();
  sa.Release();  // a's block 1 is a leaf; a's block 0 is followed by b's block 1, in use
  ExpectReclaimableMatchesPool(cache, pool);
  EXPECT_EQ(pool.num_cached_only(), 3 * kBlockPages);
  const int64_t want = pool.num_free() + pool.num_cached_only();
  EXPECT_TRUE(cache.MakeRoom(pool, want));
  EXPECT_EQ(cache.num_blocks(), 1) << "only b's block 1 is left";
  EXPECT_EQ(pool.num_cached_only(), 0);
  // b's block 1 followed a block that is gone: nothing reaches it.
  EXPECT_EQ(Adopter(cache, pool, b).blocks, 0);
  // b goes on decoding: its next block follows b's block 1, still cached (though unreachable),
  // and is reclaimed in turn once b is done.
  sb.kv.Grow(pool, 12);
  std::vector<int32_t> longer = b;
  longer.insert(longer.end(), {5, 5, 5, 5});
  cache.Insert(longer, 2, 3, sb.kv, pool, &sb.cursor);
  EXPECT_EQ(cache.num_blocks(), 2);
  sb.Release();
  ExpectReclaimableMatchesPool(cache, pool);
  EXPECT_TRUE(cache.MakeRoom(pool, 8 * kBlockPages));
  EXPECT_EQ(cache.num_blocks(), 0);
}

// A sequence that computed its own copy of cached blocks follows them without holding them;
// once they are evicted it stops offering blocks (nothing could reach them).
TEST(PrefixCacheTest, ASequenceStopsOfferingBlocksOnceTheBlockItFollowsIsGone) {
  PagePool pool(8 * kBlockPages, 4);
  PrefixCache cache(kShape);
  const std::vector<int32_t> a = Tokens(8, 1);
  Seq sa(cache, pool, a);
  Seq sc(cache, pool, a);  // same tokens, its own pages
  EXPECT_EQ(cache.num_blocks(), 2);
  EXPECT_TRUE(sc.cursor.held.empty());
  sa.Release();
  ExpectReclaimableMatchesPool(cache, pool);
  ASSERT_TRUE(cache.MakeRoom(pool, pool.num_free() + pool.num_cached_only()));
  EXPECT_EQ(cache.num_blocks(), 0);
  sc.kv.Grow(pool, 12);
  std::vector<int32_t> longer = a;
  longer.insert(longer.end(), {5, 5, 5, 5});
  cache.Insert(longer, 2, 3, sc.kv, pool, &sc.cursor);
  EXPECT_TRUE(sc.cursor.stopped);
  EXPECT_EQ(cache.num_blocks(), 0);
  sc.Release();
  EXPECT_EQ(pool.num_free(), pool.num_pages());
}

// A chain offered a block at a time (decode; each block is newer than its parent): eviction
// still takes it from its tail.
TEST(PrefixCacheTest, ADecodedChainIsEvictedTailFirst) {
  PagePool pool(64 * kBlockPages, 4);
  PrefixCache cache(kShape);
  const std::vector<int32_t> a = Tokens(40);  // 10 blocks
  Seq(cache, pool, a, /*one_by_one=*/true).Release();
  ExpectReclaimableMatchesPool(cache, pool);
  for (int64_t left = 9; left >= 0; --left) {
    ASSERT_TRUE(cache.MakeRoom(pool, pool.num_free() + 1));
    EXPECT_EQ(cache.num_blocks(), left);
    Adopter probe(cache, pool, a);
    EXPECT_EQ(probe.blocks, left);
    probe.Release();
  }
  EXPECT_EQ(cache.num_evicted(), 10);
}

TEST(PrefixCacheTest, BlocksAreSharedOnlyWithinASalt) {
  PagePool pool(64 * kBlockPages, 4);
  PrefixCache cache(kShape);
  const std::vector<int32_t> a = Tokens(8);
  Seq(cache, pool, a, false, "tenant-a").Release();
  EXPECT_EQ(Adopter(cache, pool, a, 2, "tenant-a").blocks, 2);
  EXPECT_EQ(Adopter(cache, pool, a, 2, "tenant-b").blocks, 0);
  EXPECT_EQ(Adopter(cache, pool, a, 2).blocks, 0) << "unsalted requests share among themselves";
  // The same tokens without a salt are cached separately, and continue from their own root.
  Seq(cache, pool, a).Release();
  EXPECT_EQ(cache.num_blocks(), 4);
  EXPECT_EQ(Adopter(cache, pool, a, 2).blocks, 2);
  // A sequence that adopted under a salt offers its further blocks under that salt.
  std::vector<int32_t> longer = Tokens(12);
  Adopter b(cache, pool, longer, 2, "tenant-a");
  ASSERT_EQ(b.blocks, 2);
  b.kv.Grow(pool, 12);
  cache.Insert(longer, 2, 3, b.kv, pool, &b.cursor);
  EXPECT_EQ(Adopter(cache, pool, longer, 3, "tenant-a").blocks, 3);
  EXPECT_EQ(Adopter(cache, pool, longer, 3).blocks, 2);
}

TEST(PrefixCacheTest, EachCacheDrawsItsOwnRootKey) {
  // Keys chain from the root: another process's cache keys the same tokens differently.
  const PrefixCache a(kShape), b(kShape);
  EXPECT_NE(a.root_key(), b.root_key());
  EXPECT_EQ(PrefixCache(kShape, &PrefixCache::BlockKey, 5).root_key(), 5u);
}

}  // namespace
}  // namespace thetaserve::cache
