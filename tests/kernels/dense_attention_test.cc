// CPU attention over paged K/V: a prefill chunk (worked in tiles of tokens) gives each token
// exactly what attending alone gives it — dense, where both also match a float64 softmax
// reference, and Top-θ, with the same hit marks and retained mass (and marks only from
// hits_begin on). Pages of f16, bf16, fp8 or q8_0 give what f32 pages holding the values read
// back give, to the bit. ExpShiftSum, the exponentials a row sums, stays within a few ulp of
// std::exp. The fixture and its shapes are in dense_attention_case.h; long decode rows split
// across threads are decode_split_test.cc's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/kv_element.h"
#include "kernels/cpu/vec.h"
#include "kernels/kv_dtype.h"
#include "kernels/top_theta.h"
#include "model/theta_table.h"
#include "tests/kernels/dense_attention_case.h"
#include "tests/test_util.h"

namespace thetaserve::kernels {
namespace {

TEST_P(DenseAttentionTest, PrefillChunkEqualsItsTokensAloneBitForBitAndTheFloat64Reference) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_ << ", head_dim " << d_ << ", group " << group_);
  AttentionStats whole_stats, split_stats;
  whole_stats.Reset(1);
  split_stats.Reset(1);
  const std::vector<float> whole = Run(/*split=*/false, /*threads=*/2, &whole_stats);
  const std::vector<float> alone = Run(/*split=*/true, /*threads=*/1, &split_stats);
  ASSERT_EQ(whole.size(), alone.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    ASSERT_FALSE(std::isnan(whole[i])) << "output " << i << " never written; seed " << seed_;
    // The same arithmetic per query row, whatever the tile: equal to the last bit.
    ASSERT_EQ(whole[i], alone[i]) << "output " << i << " (token " << i / (heads_ * d_)
                                  << "); seed " << seed_;
  }
  EXPECT_TRUE(testing::AllClose(whole, Reference(), 2e-6f, 2e-5f)) << "seed " << seed_;

  // Every token reads its whole row in every KV head.
  int64_t rows = 0;
  for (const auto& s : seqs_) {
    for (int32_t i = 0; i < s.num_tokens; ++i) rows += s.start_pos + i + 1;
  }
  EXPECT_EQ(whole_stats.v_rows_read, kKvHeads * rows);
  EXPECT_EQ(whole_stats.elements_dense, kKvHeads * group_ * rows);
  EXPECT_EQ(split_stats.v_rows_read, whole_stats.v_rows_read);
  EXPECT_EQ(split_stats.elements_kept, whole_stats.elements_kept);
}

TEST_P(DenseAttentionTest, TopThetaPrefillChunkEqualsItsTokensAloneWithTheSameRecords) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_ << ", head_dim " << d_ << ", group " << group_);
  const model::ThetaTable table = AboveAverageTable();
  const TopThetaConfig cfg = ExactSdcVmc(table);

  AttentionStats whole_stats, alone_stats;
  whole_stats.Reset(1);
  alone_stats.Reset(1);
  const std::vector<float> whole = Run(/*split=*/false, /*threads=*/2, &whole_stats, cfg);
  std::vector<std::vector<int32_t>> whole_hits;
  std::vector<std::vector<MassUnits>> whole_mass;
  for (const auto& s : seqs_) {
    whole_hits.push_back(s.hits);
    whole_mass.push_back(s.mass);
  }
  const std::vector<float> alone = Run(/*split=*/true, /*threads=*/1, &alone_stats, cfg);
  for (size_t i = 0; i < whole.size(); ++i) {
    ASSERT_FALSE(std::isnan(whole[i])) << "output " << i << " never written; seed " << seed_;
    ASSERT_EQ(whole[i], alone[i]) << "output " << i << "; seed " << seed_;
  }
  for (size_t s = 0; s < seqs_.size(); ++s) {
    EXPECT_TRUE(std::any_of(whole_hits[s].begin(), whole_hits[s].end(), [](int32_t h) { return h >= 0; }))
        << "no hit marks recorded for sequence " << s;
    EXPECT_TRUE(std::any_of(whole_mass[s].begin(), whole_mass[s].end(),
                            [](MassUnits m) { return m > 0; }))
        << "no retained mass recorded for sequence " << s;
    EXPECT_EQ(whole_hits[s], seqs_[s].hits) << "sequence " << s << "; seed " << seed_;
    // Sums over the queries, added by other threads in another order: the same bits (fixed
    // point; float sums differed in their last bits).
    EXPECT_EQ(whole_mass[s], seqs_[s].mass) << "sequence " << s << "; seed " << seed_;
  }
  EXPECT_EQ(whole_stats.v_rows_read, alone_stats.v_rows_read);
  EXPECT_EQ(whole_stats.elements_kept, alone_stats.elements_kept);
  // θ prunes: heads keep fewer (key, head) elements than dense, but some. (With 64 heads a
  // group reads nearly every V row: some head keeps it.)
  EXPECT_GT(whole_stats.elements_kept, 0);
  EXPECT_LT(whole_stats.elements_kept, whole_stats.elements_dense);
}

TEST_P(DenseAttentionTest, TopThetaRecordsOnlyFromHitsBeginAndTheSameAsAWholeRecord) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_ << ", head_dim " << d_ << ", group " << group_);
  const model::ThetaTable table = AboveAverageTable();
  const TopThetaConfig cfg = ExactSdcVmc(table);

  AttentionStats stats;
  stats.Reset(1);
  // One thread: the mass sums over queries are added in the same order in both runs.
  const std::vector<float> full_out = Run(/*split=*/false, /*threads=*/1, &stats, cfg);
  std::vector<PagedSeq> full = seqs_;
  // The window starts inside the first sequence's cached rows, past the whole of the last
  // sequence (20 tokens: it records nothing) and well below the decode row at 200.
  hits_begin_ = 48;
  const std::vector<float> window_out = Run(/*split=*/false, /*threads=*/1, &stats, cfg);
  EXPECT_EQ(window_out, full_out) << "the window changed the attention output";
  for (size_t si = 0; si < seqs_.size(); ++si) {
    const PagedSeq& s = seqs_[si];
    const int32_t W = s.stride * kBlock;  // hits_stride
    int64_t recorded = 0;
    for (int32_t lh = 0; lh < kKvHeads; ++lh) {
      for (int32_t e = 0; e < W; ++e) {
        const int32_t j = e + hits_begin_;  // the position entry e holds
        const size_t at = size_t(lh) * W + e;
        if (j < W && j < s.length()) {
          ASSERT_EQ(s.hits[at], full[si].hits[size_t(lh) * W + j])
              << "sequence " << si << " table " << lh << " position " << j << "; seed " << seed_;
          ASSERT_EQ(s.mass[at], full[si].mass[size_t(lh) * W + j])
              << "sequence " << si << " table " << lh << " position " << j << "; seed " << seed_;
          recorded += s.hits[at] >= 0;
        } else {
          // Past the window: nothing below hits_begin may land here (the entry j - hits_begin
          // of a position j < hits_begin would be the previous table's end).
          ASSERT_EQ(s.hits[at], -1) << "sequence " << si << " table " << lh << " entry " << e;
          ASSERT_EQ(s.mass[at], 0u) << "sequence " << si << " table " << lh << " entry " << e;
        }
      }
    }
    if (s.length() > hits_begin_ + 8) {
      EXPECT_GT(recorded, 0) << "sequence " << si << " recorded no marks in its window";
    }
  }
}

TEST_P(DenseAttentionTest, SixteenBitPagesGiveTheF32KernelsBitsOnTheRoundedValues) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_ << ", head_dim " << d_ << ", group " << group_);
  {
    SCOPED_TRACE("f16");
    ExpectSameBitsAsF32OnRoundedValues<cpu::F16>(4e-3f);
  }
  {
    SCOPED_TRACE("bf16");
    ExpectSameBitsAsF32OnRoundedValues<cpu::Bf16>(3e-2f);
  }
}

// 8-bit pages: the same kernels, the same bits as f32 pages holding the rounded values. Against
// the unrounded values (|V| ≤ 1), each V element moves by up to 2^-4 (e4m3) or 2^-3 (e5m2) of
// itself, an output is a weighted mean of V rows, and the weights move with K's rounding: over
// 12 seeds × 4 shapes the largest difference was 0.056 and 0.106, and a review's 3,000 runs
// found 0.0685 for e4m3 once; the bounds leave room past that.
TEST_P(DenseAttentionTest, Fp8PagesGiveTheF32KernelsBitsOnTheRoundedValues) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_ << ", head_dim " << d_ << ", group " << group_);
  {
    SCOPED_TRACE("fp8_e4m3");
    ExpectSameBitsAsF32OnRoundedValues<cpu::Fp8E4M3>(0.1f);
  }
  {
    SCOPED_TRACE("fp8_e5m2");
    ExpectSameBitsAsF32OnRoundedValues<cpu::Fp8E5M2>(0.2f);
  }
}

// q8_0 pages (int8 codes, an f16 scale per 32 elements): the same kernels on the rows widened,
// the same bits as f32 pages holding those values. Each element is within half a step
// (max |x| of its block / 254 ≤ 1/254) of the value it stores: over 360 seeds of each shape the
// largest difference from attention over the unquantized values (as AllClose measures it) was
// 0.0075, against fp8_e4m3's 0.069; the bound leaves room past that.
TEST_P(DenseAttentionTest, Q8_0PagesGiveTheF32KernelsBitsOnTheValuesReadBack) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_ << ", head_dim " << d_ << ", group " << group_);
  if (d_ % kQ8BlockElems != 0) GTEST_SKIP() << "q8_0 needs head_dim a multiple of 32, not " << d_;
  ExpectSameBitsAsF32OnRoundedValues<cpu::Q8_0>(0.02f);
}

TEST(ExpShiftSumTest, WithinAFewUlpOfStdExpAndSumsWhatItWrites) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-95.0f, 0.0f);
  for (int64_t n : {1, 7, 8, 9, 64, 1001}) {
    std::vector<float> x(n);
    const float m = 3.5f;
    for (float& v : x) v = uni(rng) + m;
    x[0] = m;  // exp(0) = 1 exactly
    if (n > 2) x[n / 2] = -200.0f;  // far below -88: 0
    std::vector<float> got = x;
    const float sum = cpu::ExpShiftSum(got.data(), n, m);
    double want_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double want = std::exp(double(x[i]) - double(m));
      want_sum += want;
      if (double(x[i]) - m < -87.0) {
        ASSERT_LE(got[i], 2e-38f) << "x " << x[i] << "; seed " << seed;
      } else {
        ASSERT_NEAR(got[i], want, want * 4e-7) << "x " << x[i] << " n " << n << "; seed " << seed;
      }
    }
    EXPECT_EQ(got[0], 1.0f);
    double written = 0;
    for (float v : got) written += v;
    EXPECT_NEAR(sum, written, written * 1e-6) << "n " << n;
    EXPECT_NEAR(sum, want_sum, want_sum * 1e-6) << "n " << n;
  }
}

TEST(ExpShiftSumTest, MinusInfinityGivesZeroAndNaNStaysNaN) {
  // Sixteen elements: both in the eight-wide part, and the same again in the scalar tail.
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n : {16, 19}) {
    std::vector<float> x(n, 0.0f);
    x[3] = -inf;
    x[n - 1] = -inf;
    std::vector<float> a = x;
    const float sum = cpu::ExpShiftSum(a.data(), n, 0.0f);
    EXPECT_EQ(a[3], 0.0f);
    EXPECT_EQ(a[n - 1], 0.0f);
    EXPECT_EQ(a[0], 1.0f);
    EXPECT_FLOAT_EQ(sum, float(n - 2)) << "n " << n;
    for (int64_t at : {int64_t(5), n - 2}) {
      std::vector<float> b = x;
      b[at] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_TRUE(std::isnan(cpu::ExpShiftSum(b.data(), n, 0.0f))) << "NaN at " << at << " of " << n;
      EXPECT_TRUE(std::isnan(b[at])) << "NaN at " << at << " of " << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, DenseAttentionTest, DenseAttentionShapes());

}  // namespace
}  // namespace thetaserve::kernels
