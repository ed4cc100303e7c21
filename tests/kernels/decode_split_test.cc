// CPU attention over paged K/V with long decode rows (2,048 keys or more) split across threads
// by key chunks (flash-decoding): split or whole, a row gives the bits of the row worked whole
// and of the same token inside a prefill tile — dense, and Top-θ with the same hit marks,
// retained mass and counters — over f32, f16 and q8_0 pages, and over Top-θ's sparse and host
// V stores, where it also gives what a float64 reference reading those stores gives; and the
// rule (SplitsDecodeRows) that says when rows split. The fixture and its shapes are in
// dense_attention_case.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kv_element.h"
#include "kernels/kv_dtype.h"
#include "kernels/top_theta.h"
#include "model/theta_table.h"
#include "tests/kernels/dense_attention_case.h"
#include "tests/test_util.h"

namespace thetaserve::kernels {
namespace {

// Rows longer than 512 keys are summed by chunks of 512 keys, and a long decode row (2,048 keys
// or more) may be worked a chunk per task across threads (flash-decoding). Split or whole, a
// row gives the bits the same token gets inside a prefill tile — dense, and Top-θ with the same
// hit marks, retained mass and counters — and dense stays within the float64 reference's
// tolerance (f32 pages); split and whole give the same bits over f16 and q8_0 pages too.
TEST_P(DenseAttentionTest, LongDecodeRowsSplitByKeyChunksGiveTheWholeRowsBits) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_ << ", head_dim " << d_ << ", group " << group_);
  // A prefill chunk whose rows are 2,596–2,601 keys long (the last of six chunks partly
  // filled; a tile that starts mid-page), a decode row of exactly eight chunks, and rows too
  // short to split (a decode row, a prefill chunk) that run whole beside the split ones.
  Build({{2595, 6}, {4095, 1}, {60, 1}, {30, 5}});
  const model::ThetaTable table = AboveAverageTable();
  for (bool theta : {false, true}) {
    SCOPED_TRACE(theta ? "top-theta" : "dense");
    const TopThetaConfig cfg = theta ? ExactSdcVmc(table) : TopThetaConfig{};
    AttentionStats tile_stats, whole_stats, split_stats;
    tile_stats.Reset(1);
    whole_stats.Reset(1);
    split_stats.Reset(1);
    const std::vector<float> tile = Run(/*split=*/false, 1, &tile_stats, cfg);
    EXPECT_FALSE(rows_split_);
    const std::vector<PagedSeq> tile_seqs = seqs_;
    const std::vector<float> whole =
        Run<float>(/*split=*/true, 2, &whole_stats, cfg, nullptr, cpu::DecodeSplit::kNever);
    EXPECT_FALSE(rows_split_);
    const std::vector<float> split =
        Run<float>(/*split=*/true, 2, &split_stats, cfg, nullptr, cpu::DecodeSplit::kAlways);
    ASSERT_TRUE(rows_split_) << "the tokens alone were not split";
    for (size_t i = 0; i < split.size(); ++i) {
      ASSERT_FALSE(std::isnan(split[i])) << "output " << i << " never written; seed " << seed_;
      ASSERT_EQ(split[i], whole[i]) << "output " << i << " (token " << i / (heads_ * d_)
                                    << "); seed " << seed_;
      ASSERT_EQ(split[i], tile[i]) << "output " << i << " (token " << i / (heads_ * d_)
                                   << "); seed " << seed_;
    }
    for (size_t si = 0; si < seqs_.size(); ++si) {
      EXPECT_EQ(seqs_[si].hits, tile_seqs[si].hits) << "sequence " << si;
      // Sums over the prefill chunk's queries, added in another order (units go longest
      // first): the same bits (fixed point).
      EXPECT_EQ(seqs_[si].mass, tile_seqs[si].mass) << "sequence " << si;
    }
    for (const AttentionStats* st : {&whole_stats, &split_stats}) {
      EXPECT_EQ(st->v_rows_read, tile_stats.v_rows_read);
      EXPECT_EQ(st->v_rows_read_dense, tile_stats.v_rows_read_dense);
      EXPECT_EQ(st->elements_kept, tile_stats.elements_kept);
      EXPECT_EQ(st->retained_but_evicted, tile_stats.retained_but_evicted);
    }
    if (theta) {
      EXPECT_LT(split_stats.elements_kept, split_stats.elements_dense) << "θ pruned nothing";
    } else {
      int64_t rows = 0;
      for (const auto& sq : seqs_) {
        for (int32_t i = 0; i < sq.num_tokens; ++i) rows += sq.start_pos + i + 1;
      }
      EXPECT_EQ(split_stats.v_rows_read, kKvHeads * rows);
      EXPECT_TRUE(testing::AllClose(split, Reference(), 2e-6f, 2e-5f)) << "seed " << seed_;
    }
  }

  // The same for pages of f16 and q8_0 (rows widened a block at a time, as whole rows do).
  auto same_split_and_whole = [&]<typename T>(T) {
    const std::vector<T> pages = StoredPages<T>();
    for (bool theta : {false, true}) {
      const TopThetaConfig cfg = theta ? ExactSdcVmc(table) : TopThetaConfig{};
      const std::vector<float> whole =
          Run<T>(true, 2, nullptr, cfg, &pages, cpu::DecodeSplit::kNever);
      const std::vector<float> split =
          Run<T>(true, 2, nullptr, cfg, &pages, cpu::DecodeSplit::kAlways);
      ASSERT_TRUE(rows_split_);
      ASSERT_EQ(split, whole) << (theta ? "top-theta" : "dense") << "; seed " << seed_;
    }
  };
  {
    SCOPED_TRACE("f16");
    same_split_and_whole(cpu::F16{});
  }
  if (d_ % kQ8BlockElems == 0) {
    SCOPED_TRACE("q8_0");
    same_split_and_whole(cpu::Q8_0{});
  }

  // Batch 1 on three threads: kAuto splits the row (the two KV heads' units whole would leave
  // a thread idle), and the bits stay those of each head's row on one thread.
  Build({{4095, 1}});
  for (bool theta : {false, true}) {
    SCOPED_TRACE(theta ? "top-theta, batch 1" : "dense, batch 1");
    const TopThetaConfig cfg = theta ? ExactSdcVmc(table) : TopThetaConfig{};
    const std::vector<float> whole =
        Run<float>(false, 3, nullptr, cfg, nullptr, cpu::DecodeSplit::kNever);
    const std::vector<PagedSeq> whole_seqs = seqs_;
    const std::vector<float> split = Run(false, 3, nullptr, cfg);
    ASSERT_TRUE(rows_split_) << "kAuto did not split batch 1 on three threads";
    for (size_t i = 0; i < split.size(); ++i) {
      ASSERT_FALSE(std::isnan(split[i])) << "output " << i << " never written; seed " << seed_;
      ASSERT_EQ(split[i], whole[i]) << "output " << i << "; seed " << seed_;
    }
    EXPECT_EQ(seqs_[0].hits, whole_seqs[0].hits);
    EXPECT_EQ(seqs_[0].mass, whole_seqs[0].mass);
  }
}

// Top-θ's pass 2 of a split row walks each key chunk's positions in the sparse and host stores
// from where the chunk starts in each: it gives the outputs, hit marks, retained mass and
// counters of the row worked whole — with the table's thresholds, and with exact top-k (whose
// thresholds sort whole rows across the pool) — and, with the table's, what a float64
// reference that reads each position's V row from its store gives.
TEST_P(DenseAttentionTest, TopThetaSplitRowsReadTheSparseAndHostStoresAsWholeRowsDo) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_ << ", head_dim " << d_ << ", group " << group_);
  // Two long decode rows whose tails start mid-chunk, one long enough that its pass 2 splits
  // too (8,192 keys), one whose pass 2 runs whole; and a short row that runs whole.
  Build({{8191, 1}, {2999, 1}, {60, 1}});
  std::mt19937 rng(seed_ ^ 0x5eed);
  SetStores(seqs_[0], 5136, rng);
  SetStores(seqs_[1], 1008, rng);
  hits_begin_ = 1000;  // marks and mass from mid-chunk on
  host_pool_.resize(pool_.size());
  std::transform(pool_.begin(), pool_.end(), host_pool_.begin(), [](float x) { return -x; });
  // θ = 0.0005: two to four times the average probability.
  const model::ThetaTable table = AboveAverageTable(0.0005f);
  for (bool top_k : {false, true}) {
    SCOPED_TRACE(top_k ? "exact top-k" : "θ table");
    TopThetaConfig cfg = ExactSdcVmc(table);
    cfg.top_k = top_k;
    AttentionStats whole_stats, split_stats;
    whole_stats.Reset(1);
    split_stats.Reset(1);
    const std::vector<float> whole =
        Run<float>(/*split=*/true, 2, &whole_stats, cfg, nullptr, cpu::DecodeSplit::kNever);
    const std::vector<PagedSeq> whole_seqs = seqs_;
    const std::vector<float> split =
        Run<float>(/*split=*/true, 2, &split_stats, cfg, nullptr, cpu::DecodeSplit::kAlways);
    ASSERT_TRUE(rows_split_) << "the long rows were not split";
    for (size_t i = 0; i < split.size(); ++i) {
      ASSERT_FALSE(std::isnan(split[i])) << "output " << i << " never written";
      ASSERT_EQ(split[i], whole[i]) << "output " << i << " (token " << i / (heads_ * d_) << ")";
    }
    for (size_t si = 0; si < seqs_.size(); ++si) {
      EXPECT_EQ(seqs_[si].hits, whole_seqs[si].hits) << "sequence " << si;
      EXPECT_EQ(seqs_[si].mass, whole_seqs[si].mass) << "sequence " << si;  // one query each
    }
    EXPECT_EQ(split_stats.v_rows_read, whole_stats.v_rows_read);
    EXPECT_EQ(split_stats.v_rows_read_host, whole_stats.v_rows_read_host);
    EXPECT_EQ(split_stats.v_rows_read_dense, whole_stats.v_rows_read_dense);
    EXPECT_EQ(split_stats.elements_kept, whole_stats.elements_kept);
    EXPECT_EQ(split_stats.elements_dense, whole_stats.elements_dense);
    EXPECT_EQ(split_stats.retained_but_evicted, whole_stats.retained_but_evicted);
    if (top_k) continue;
    // And what a float64 reference reads from the stores, where no key is within rounding of θ
    // (a key that is may flip, and moves the counters by one at most).
    StoresReference ref = TopThetaStoresReference(0.0005f);
    const AttentionStats& want = ref.stats;
    const int64_t ambiguous = ref.ambiguous;
    // Outputs of rows with an ambiguous key are NaN in the reference, and not compared: a
    // few rows, not most of them (else this compared nothing).
    size_t masked = 0;
    for (size_t i = 0; i < ref.out.size(); ++i) {
      if (std::isnan(ref.out[i])) {
        ref.out[i] = split[i];
        ++masked;
      }
    }
    EXPECT_LT(masked, ref.out.size() / 4) << masked << " of " << ref.out.size() << " masked";
    EXPECT_TRUE(testing::AllClose(split, ref.out, 2e-6f, 2e-5f));
    for (size_t si = 0; si < seqs_.size(); ++si) {
      // Marks and mass where no key is within rounding of θ (a flipped key moves its
      // position's mark and its mass by about θ).
      std::vector<int32_t> hits = seqs_[si].hits;
      std::vector<float> mass = seqs_[si].MassValues();
      for (size_t x = 0; x < hits.size(); ++x) {
        if (!ref.unsure[si][x]) continue;
        hits[x] = ref.hits[si][x];
        mass[x] = ref.mass[si][x];
      }
      EXPECT_EQ(hits, ref.hits[si]) << "sequence " << si;
      // (A kept position's mass is at least θ: relative error only.)
      EXPECT_TRUE(testing::AllClose(mass, ref.mass[si], 1e-9f, 1e-5f)) << "sequence " << si;
    }
    auto near = [&](int64_t got, int64_t expected) {
      return std::abs(got - expected) <= ambiguous;
    };
    EXPECT_PRED2(near, split_stats.v_rows_read, want.v_rows_read);
    EXPECT_PRED2(near, split_stats.v_rows_read_host, want.v_rows_read_host);
    EXPECT_PRED2(near, split_stats.retained_but_evicted, want.retained_but_evicted);
    EXPECT_PRED2(near, split_stats.elements_kept, want.elements_kept);
    EXPECT_EQ(split_stats.v_rows_read_dense, want.v_rows_read_dense);
    EXPECT_EQ(split_stats.elements_dense, want.elements_dense);
    // Every store was read from, some retained rows had been dropped, and θ pruned.
    EXPECT_GT(split_stats.v_rows_read_host, 0);
    EXPECT_GT(split_stats.v_rows_read, split_stats.v_rows_read_host);
    EXPECT_GT(split_stats.retained_but_evicted, 0);
    EXPECT_LT(split_stats.elements_kept, split_stats.elements_dense / 4) << "θ pruned little";
    EXPECT_GT(split_stats.elements_kept, 0);
  }

  // Over q8_0 pages (each kept V row widened as it is listed, a chunk per task or whole).
  if (d_ % kQ8BlockElems == 0) {
    SCOPED_TRACE("q8_0");
    const std::vector<cpu::Q8_0> pages = StoredPages<cpu::Q8_0>();
    const TopThetaConfig cfg = ExactSdcVmc(table);
    const std::vector<float> whole =
        Run<cpu::Q8_0>(true, 2, nullptr, cfg, &pages, cpu::DecodeSplit::kNever);
    const std::vector<float> split =
        Run<cpu::Q8_0>(true, 2, nullptr, cfg, &pages, cpu::DecodeSplit::kAlways);
    ASSERT_TRUE(rows_split_);
    ASSERT_EQ(split, whole);
  }
}

// kAuto splits decode rows of 2,048 keys or more, and only where the units handed out whole
// would keep the busiest thread more than a fifth past an even share; kNever never splits and
// kAlways splits every such row.
TEST(SplitsDecodeRowsTest, OnlyLongDecodeRowsAndOnlyWhereWholeUnitsLeaveThreadsIdle) {
  const cpu::AttentionShape shape{1, 9, 3, 64, 0.125f};  // SmolLM2's: 3 KV heads × 3
  // seqs: (tokens cached, new tokens).
  auto splits = [&](const std::vector<std::pair<int32_t, int32_t>>& seqs, int threads,
                    cpu::DecodeSplit mode = cpu::DecodeSplit::kAuto) {
    std::vector<SeqChunk> chunks;
    int32_t offset = 0;
    for (auto [start, n] : seqs) {
      SeqChunk c;
      c.token_offset = offset;
      c.num_tokens = n;
      c.start_pos = start;
      chunks.push_back(c);
      offset += n;
    }
    std::vector<int32_t> tokens(offset, 0);
    return cpu::SplitsDecodeRows(ForwardBatch{tokens, chunks, false, nullptr}, shape, threads,
                                 mode);
  };
  // Batch 1: three units on two threads (one idles for half the step) or on sixteen.
  EXPECT_TRUE(splits({{32767, 1}}, 2));
  EXPECT_TRUE(splits({{2047, 1}}, 16));
  EXPECT_FALSE(splits({{2046, 1}}, 16)) << "a row of 2,047 keys";
  EXPECT_FALSE(splits({{32767, 1}}, 1)) << "one thread";
  EXPECT_FALSE(splits({{32767, 1}}, 3)) << "three units, three threads";
  // Two long sequences on two threads: six equal units, evenly shared.
  EXPECT_FALSE(splits({{8191, 1}, {8191, 1}}, 2));
  // One long sequence beside 40 short ones on eight threads: its three units keep three
  // threads busy half again as long as an even share; on four, the short ones fill the fourth
  // thread and then all four evenly.
  std::vector<std::pair<int32_t, int32_t>> mixed(40, {300, 1});
  mixed.push_back({16383, 1});
  EXPECT_TRUE(splits(mixed, 8));
  EXPECT_FALSE(splits(mixed, 4));
  // A long prefill chunk is not a decode row; beside it, a long decode row may be split.
  EXPECT_FALSE(splits({{32000, 16}}, 16, cpu::DecodeSplit::kAlways));
  EXPECT_TRUE(splits({{32000, 16}, {4095, 1}}, 2, cpu::DecodeSplit::kAlways));
  // Beside a long prefill chunk (16 tokens at 32k) on sixteen threads the threads are
  // unbalanced, but by the chunk's three units, which do not split: splitting the decode row
  // cannot shorten the step.
  EXPECT_FALSE(splits({{32000, 16}, {4095, 1}}, 16));
  EXPECT_FALSE(splits({{32767, 1}}, 2, cpu::DecodeSplit::kNever));
  EXPECT_TRUE(splits({{2047, 1}}, 1, cpu::DecodeSplit::kAlways));
  // Batch 64 at 128k keys: 192 units even over 64 threads; over 128 the busiest thread has two
  // where an even share is one and a half.
  std::vector<std::pair<int32_t, int32_t>> big(64, {131071, 1});
  EXPECT_FALSE(splits(big, 64));
  EXPECT_TRUE(splits(big, 128));
  // Batch 1 at a million keys on two threads: its scores (9 × 2^20 floats) would pass the two
  // threads' score buffers (2 × 4 Mi floats).
  EXPECT_FALSE(splits({{(1 << 20) - 1, 1}}, 2));
  EXPECT_TRUE(splits({{(1 << 19) - 1, 1}}, 2));
}

INSTANTIATE_TEST_SUITE_P(Shapes, DenseAttentionTest, DenseAttentionShapes());

}  // namespace
}  // namespace thetaserve::kernels
