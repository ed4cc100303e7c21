#include "cache/sequence_kv.h"

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

}  // namespace
}  // namespace thetaserve::cache
