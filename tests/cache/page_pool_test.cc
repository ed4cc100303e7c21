#include "cache/page_pool.h"

#include <set>

#include "gtest/gtest.h"

namespace thetaserve::cache {
namespace {

TEST(PagePoolTest, AllocatesUntilEmptyThenSaysNo) {
  PagePool pool(8, 4);
  EXPECT_TRUE(pool.CanAllocate(8));
  EXPECT_FALSE(pool.CanAllocate(9));
  std::set<int32_t> seen;
  for (int i = 0; i < 8; ++i) seen.insert(pool.Allocate(i % 2 ? PageKind::kV : PageKind::kK));
  EXPECT_EQ(seen.size(), 8u);
  EXPECT_FALSE(pool.CanAllocate(1));
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_EQ(pool.num_used(PageKind::kK), 4);
  EXPECT_EQ(pool.num_used(PageKind::kV), 4);
}

TEST(PagePoolTest, FreedPagesAreReusedFirst) {
  PagePool pool(8, 4);
  int32_t a = pool.Allocate(PageKind::kK);
  int32_t b = pool.Allocate(PageKind::kK);
  pool.Release(a);
  EXPECT_EQ(pool.Allocate(PageKind::kV), a);
  pool.Release(b);
  EXPECT_EQ(pool.Allocate(PageKind::kK), b);
}

TEST(PagePoolTest, SharedPageReturnsOnlyAfterLastRelease) {
  PagePool pool(2, 4);
  int32_t p = pool.Allocate(PageKind::kK);
  pool.Ref(p);
  EXPECT_EQ(pool.refcount(p), 2);
  pool.Release(p);
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_EQ(pool.kind(p), PageKind::kK);
  pool.Release(p);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.kind(p), PageKind::kFree);
  EXPECT_EQ(pool.num_used(PageKind::kK), 0);
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

TEST(PagePoolDeathTest, DoubleReleaseAborts) {
  PagePool pool(2, 4);
  int32_t p = pool.Allocate(PageKind::kK);
  pool.Release(p);
  EXPECT_DEATH(pool.Release(p), "double release");
}

TEST(PagePoolDeathTest, FreeingAPageTheCacheHoldsAborts) {
  PagePool pool(2, 4);
  const int32_t p = pool.Allocate(PageKind::kV);
  pool.RefCached(p);
  pool.Release(p);  // the owner goes; the cache holds it
  EXPECT_DEATH(pool.Release(p), "freed while the prefix cache holds it");
}

}  // namespace
}  // namespace thetaserve::cache
