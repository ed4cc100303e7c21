// The fixture that dense_attention_test.cc and decode_split_test.cc share: CPU attention over
// paged K/V for a batch of sequences in a shared pool with shuffled page ids, run whole or a
// token at a time, over f32 pages or pages of another element type, with Top-θ's records and
// V stores; and float64 references for dense attention and for Top-θ over the stores; the
// head shapes each test file runs its DenseAttentionTest tests over.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vec.h"
#include "kernels/top_theta.h"
#include "model/theta_table.h"
#include "tests/test_util.h"

namespace thetaserve::kernels {

inline constexpr int kKvHeads = 2, kBlock = 16;

// One sequence's pages in a shared pool: K and V pages of every KV head, shuffled ids.
struct PagedSeq {
  int32_t start_pos = 0;
  int32_t num_tokens = 0;
  std::vector<int32_t> k_pages, v_pages;  // [kKvHeads, stride]
  int32_t stride = 0;
  // Top-θ's records (hit marks, retained mass per position) and VMC's running V sum.
  bool record = false;
  std::vector<int32_t> hits;  // [kKvHeads, stride * kBlock]
  std::vector<MassUnits> mass;  // same shape, in fixed point (kernels/paged_kv.h)
  std::vector<float> v_sum;   // [kKvHeads, head_dim] (only its presence matters here)
  std::vector<float> MassValues() const {
    std::vector<float> values(mass.size());
    for (size_t i = 0; i < mass.size(); ++i) values[i] = float(MassValue(mass[i]));
    return values;
  }
  // Top-θ's V stores (kernels/paged_kv.h), where tail_start > 0 (SetStores): positions below
  // it are in the sparse store, in the host store, or were dropped. A store's row r is row r
  // of the sequence's own V pages, in the pool (sparse) or in the host pool (host_pool_, the
  // pool negated, so that a row read from the wrong one shows).
  int32_t tail_start = 0;
  std::vector<int32_t> sparse_pos, host_pos;      // [kKvHeads, stride * kBlock], ascending
  std::vector<int32_t> sparse_count, host_count;  // [kKvHeads]

  int32_t length() const { return start_pos + num_tokens; }
};

// Parameters: head_dim and query heads per KV head.
class DenseAttentionTest : public ::testing::TestWithParam<std::pair<int, int>> {
 protected:
  // Sequences: a prefill chunk of 37 tokens after 50 cached ones (tiles of 16, 16 and 5 that
  // cross page boundaries), a decode token at 200, and a first chunk of 20 tokens.
  void SetUp() override {
    std::tie(d_, group_) = GetParam();
    heads_ = group_ * kKvHeads;
    seed_ = std::random_device{}();
    Build({{50, 37}, {200, 1}, {0, 20}});
  }

  // Sequences of (tokens cached, new tokens) with random pages, K, V and queries from seed_.
  void Build(const std::vector<std::pair<int32_t, int32_t>>& seqs) {
    const uint32_t seed = seed_;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    seqs_.clear();
    num_tokens_ = 0;
    for (auto [start, n] : seqs) {
      seqs_.emplace_back();
      seqs_.back().start_pos = start;
      seqs_.back().num_tokens = n;
    }
    int32_t pages = 0;
    for (auto& s : seqs_) {
      s.stride = (s.length() + kBlock - 1) / kBlock;
      pages += 2 * kKvHeads * s.stride;
    }
    std::vector<int32_t> ids(pages);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    int32_t next = 0;
    for (auto& s : seqs_) {
      for (int i = 0; i < kKvHeads * s.stride; ++i) s.k_pages.push_back(ids[next++]);
      for (int i = 0; i < kKvHeads * s.stride; ++i) s.v_pages.push_back(ids[next++]);
    }
    layout_ = KvPoolLayout{kBlock, d_, pages};
    pool_.resize(layout_.num_pages * layout_.PageElems());
    // Scores spread over a few units so that the softmax is neither flat nor one-hot.
    for (float& x : pool_) x = uni(rng);
    for (const auto& s : seqs_) num_tokens_ += s.num_tokens;
    q_.resize(size_t(num_tokens_) * heads_ * d_);
    for (float& x : q_) x = 2.0f * uni(rng);
    vsum_rows_.resize(size_t(num_tokens_) * kKvHeads * d_);
    for (float& x : vsum_rows_) x = uni(rng);
  }

  // Gives sequence s (Top-θ only: dense attention reads every V row from the tail) a tail from
  // `tail_start` (a multiple of kBlock) and, for each KV head, positions below it that are in
  // the sparse store (two in five), in the host store (one in five) or dropped, from rng.
  static void SetStores(PagedSeq& s, int32_t tail_start, std::mt19937& rng) {
    ASSERT_EQ(tail_start % kBlock, 0);
    s.tail_start = tail_start;
    const int32_t stride = s.stride * kBlock;
    s.sparse_pos.assign(kKvHeads * stride, -1);
    s.host_pos.assign(kKvHeads * stride, -1);
    s.sparse_count.assign(kKvHeads, 0);
    s.host_count.assign(kKvHeads, 0);
    std::uniform_int_distribution<int> fifth(0, 4);
    for (int g = 0; g < kKvHeads; ++g) {
      for (int32_t p = 0; p < tail_start; ++p) {
        const int u = fifth(rng);
        if (u < 2) {
          s.sparse_pos[g * stride + s.sparse_count[g]++] = p;
        } else if (u == 2) {
          s.host_pos[g * stride + s.host_count[g]++] = p;
        }
      }
    }
  }

  // Chunks of the batch: each sequence whole (split = false), or every token on its own.
  std::vector<SeqChunk> Chunks(bool split) {
    std::vector<SeqChunk> out;
    int32_t offset = 0;
    for (auto& s : seqs_) {
      const int32_t parts = split ? s.num_tokens : 1;
      for (int32_t p = 0; p < parts; ++p) {
        SeqChunk c;
        c.token_offset = offset + (split ? p : 0);
        c.num_tokens = split ? 1 : s.num_tokens;
        c.start_pos = s.start_pos + (split ? p : 0);
        c.pages.k_pages = s.k_pages.data();
        c.pages.v_pages = s.v_pages.data();
        c.pages.stride = s.stride;
        if (s.tail_start > 0) {
          c.pages.v_pages = s.v_pages.data() + s.tail_start / kBlock;
          c.pages.v_tail_start = s.tail_start;
          c.pages.v_sparse_pages = s.v_pages.data();
          c.pages.v_sparse_pos = s.sparse_pos.data();
          c.pages.v_sparse_count = s.sparse_count.data();
          c.pages.sparse_stride = s.stride;
          c.pages.sparse_pos_stride = s.stride * kBlock;
          c.pages.v_host_pages = s.v_pages.data();
          c.pages.v_host_pos = s.host_pos.data();
          c.pages.v_host_count = s.host_count.data();
          c.pages.host_stride = s.stride;
          c.pages.host_pos_stride = s.stride * kBlock;
        }
        if (s.record) {
          c.pages.hits = s.hits.data();
          c.pages.hit_mass = s.mass.data();
          c.pages.hits_stride = s.stride * kBlock;
          c.pages.hits_begin = hits_begin_;
          c.pages.v_sum = s.v_sum.data();
        }
        out.push_back(c);
      }
      offset += s.num_tokens;
    }
    return out;
  }

  // Attention over pool_, or over `pages` (the same layout, elements of T) when given.
  // decode_split: whether long decode rows may be split across threads by key chunks; whether
  // they were is left in rows_split_.
  template <typename T = float>
  std::vector<float> Run(bool split, int threads, AttentionStats* stats,
                         const TopThetaConfig& cfg = {}, const std::vector<T>* pages = nullptr,
                         cpu::DecodeSplit decode_split = cpu::DecodeSplit::kAuto) {
    for (auto& s : seqs_) {
      s.record = cfg.active();
      s.hits.assign(kKvHeads * s.stride * kBlock, -1);
      s.mass.assign(kKvHeads * s.stride * kBlock, 0);
      s.v_sum.assign(kKvHeads * d_, 0.0f);
    }
    const std::vector<SeqChunk> chunks = Chunks(split);
    std::vector<int32_t> tokens(num_tokens_, 0);
    ForwardBatch batch{tokens, chunks, false, stats};
    cpu::AttentionShape shape{1, heads_, kKvHeads, d_, 1.0f / std::sqrt(float(d_))};
    cpu::ThreadPool pool(threads);
    std::vector<float> out(q_.size(), std::numeric_limits<float>::quiet_NaN());
    const T* kv = nullptr;
    const T* host = nullptr;  // the host pool: host_pool_ over pool_, else the pages themselves
    if constexpr (std::is_same_v<T, float>) {
      kv = pages ? pages->data() : pool_.data();
      host = pages || host_pool_.empty() ? kv : host_pool_.data();
    } else {
      kv = host = pages->data();
    }
    rows_split_ = cpu::PagedAttention(
        pool, batch, shape, cfg,
        cpu::LayerAttention<T>{.layer = 0, .q = q_.data(), .layout = cpu::StoredLayout<T>(layout_),
                               .kv_pool = kv, .host_pool = host,
                               .vsum_rows = cfg.active() ? vsum_rows_.data() : nullptr,
                               .o = out.data()},
        decode_split);
    // The rule the benchmark and callers can ask about is the one the kernel followed.
    EXPECT_EQ(cpu::SplitsDecodeRows(batch, shape, threads, decode_split), rows_split_);
    return out;
  }

  // For T = F16, Bf16, an fp8 type or Q8_0: attention over pool_ stored as T (rounded, or
  // quantized by rows) equals attention over f32 pages holding the values read back, to the bit
  // (dense, and Top-θ with its hit marks, retained mass and counters). Dense attention also
  // stays within `tol` (atol = rtol) of attention over pool_ itself (Top-θ need not: a score
  // the rounding moves across θ moves its mass).
  template <typename T>
  void ExpectSameBitsAsF32OnRoundedValues(float tol) {
    const int64_t rows = int64_t(pool_.size()) / d_, units = cpu::RowUnits<T>(d_);
    const std::vector<T> pages = StoredPages<T>();
    std::vector<float> widened(pool_.size());
    for (int64_t r = 0; r < rows; ++r) {
      cpu::WidenRow(pages.data() + r * units, d_, widened.data() + r * d_);
    }
    const model::ThetaTable table = AboveAverageTable();
    for (bool theta : {false, true}) {
      SCOPED_TRACE(theta ? "top-theta" : "dense");
      const TopThetaConfig cfg = theta ? ExactSdcVmc(table) : TopThetaConfig{};
      AttentionStats want_stats, got_stats;
      want_stats.Reset(1);
      got_stats.Reset(1);
      const std::vector<float> exact = Run(false, 1, nullptr, cfg);
      const std::vector<float> want = Run(false, 1, &want_stats, cfg, &widened);
      std::vector<PagedSeq> want_seqs = seqs_;
      const std::vector<float> got = Run<T>(false, 1, &got_stats, cfg, &pages);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_FALSE(std::isnan(got[i])) << "output " << i << " never written; seed " << seed_;
        ASSERT_EQ(got[i], want[i]) << "output " << i << "; seed " << seed_;
      }
      for (size_t s = 0; s < seqs_.size(); ++s) {
        EXPECT_EQ(seqs_[s].hits, want_seqs[s].hits) << "sequence " << s;
        EXPECT_EQ(seqs_[s].mass, want_seqs[s].mass) << "sequence " << s;
      }
      EXPECT_EQ(got_stats.v_rows_read, want_stats.v_rows_read);
      EXPECT_EQ(got_stats.elements_kept, want_stats.elements_kept);
      EXPECT_NE(got, exact) << "rounding changed nothing: were the pages rounded?";
      if (!theta) {
        EXPECT_TRUE(testing::AllClose(got, exact, tol, tol)) << "seed " << seed_;
      }
    }
  }

  // Post-softmax θ (0.004) past k = 8 keys: rows (of up to a few hundred keys) keep their
  // clearly-above-average keys.
  model::ThetaTable AboveAverageTable(float theta = 0.004f) const {
    model::ThetaTable table(1, heads_, model::ThetaTable::DefaultBuckets(4096));
    table.k_per_layer[0] = 8;
    for (int32_t h = 0; h < heads_; ++h) {
      for (size_t b = 0; b < table.buckets().size(); ++b) table.theta_at(0, h, b) = theta;
    }
    table.placement = model::ThetaPlacement::kPostSoftmax;
    table.Finalize();
    return table;
  }
  static TopThetaConfig ExactSdcVmc(const model::ThetaTable& table) {
    TopThetaConfig cfg;
    cfg.table = &table;
    cfg.sdc = SdcMode::kExact;
    cfg.vmc = true;
    return cfg;
  }

  // pool_ stored as pages of T (rounded, or quantized by rows), in the same layout.
  template <typename T>
  std::vector<T> StoredPages() const {
    const int64_t rows = int64_t(pool_.size()) / d_, units = cpu::RowUnits<T>(d_);
    std::vector<T> pages(rows * units);
    for (int64_t r = 0; r < rows; ++r) {
      cpu::StoreRow(pool_.data() + r * d_, d_, pages.data() + r * units);
    }
    return pages;
  }

  // exp(s_j - max s) in float64 for query q (one head) against the first L keys of sequence s's
  // KV head g, s_j = q·k_j/√d; their sum goes to `sum`.
  std::vector<double> Float64Weights(const PagedSeq& s, int g, const float* q, int32_t L,
                                     double& sum) const {
    std::vector<double> e(L);
    double m = -INFINITY;
    for (int32_t j = 0; j < L; ++j) {
      const float* k =
          pool_.data() + layout_.RowOffset(s.k_pages[g * s.stride + j / kBlock], j % kBlock);
      double dot = 0;
      for (int c = 0; c < d_; ++c) dot += double(q[c]) * k[c];
      e[j] = dot / std::sqrt(double(d_));
      m = std::max(m, e[j]);
    }
    sum = 0;
    for (double& x : e) sum += x = std::exp(x - m);
    return e;
  }

  // softmax(q·K/√d)·V in float64, token by token.
  std::vector<float> Reference() const {
    std::vector<float> out(q_.size());
    int32_t row = 0;
    for (const auto& s : seqs_) {
      for (int32_t i = 0; i < s.num_tokens; ++i, ++row) {
        const int32_t L = s.start_pos + i + 1;
        for (int h = 0; h < heads_; ++h) {
          const int g = h / group_;
          const float* q = q_.data() + (size_t(row) * heads_ + h) * d_;
          double den = 0;
          const std::vector<double> sc = Float64Weights(s, g, q, L, den);
          for (int c = 0; c < d_; ++c) {
            double acc = 0;
            for (int32_t j = 0; j < L; ++j) {
              acc += sc[j] * pool_[layout_.RowOffset(s.v_pages[g * s.stride + j / kBlock], j % kBlock) + c];
            }
            out[(size_t(row) * heads_ + h) * d_ + c] = float(acc / den);
          }
        }
      }
    }
    return out;
  }

  // Top-θ in float64 for sequences of one new token, post-softmax θ past k = 8 keys (as
  // AboveAverageTable), exact SDC and VMC (over vsum_rows_), V rows read from the stores
  // SetStores made: each head keeps the stored rows with p > θ, and gives the mass of the
  // dropped rows it keeps, and of the rest, to the mean. A key whose probability lies within
  // 1e-5 (relative) of θ may fall either way in float32: its head's output row is NaN, its
  // position is marked in `unsure` (neither is to be compared), and `ambiguous` counts such
  // keys (by how much the counters may differ).
  struct StoresReference {
    std::vector<float> out;
    AttentionStats stats;  // what the kernel's counters should say
    int64_t ambiguous = 0;
    // Per sequence, as PagedSeq's: the marks (retain factor 1: every retained position from
    // hits_begin_ on), the retained mass (Σ of the keeping heads' probabilities), and whether
    // some key there lies within rounding of θ.
    std::vector<std::vector<int32_t>> hits;
    std::vector<std::vector<float>> mass;
    std::vector<std::vector<bool>> unsure;
  };
  StoresReference TopThetaStoresReference(float theta) const {
    StoresReference ref;
    std::vector<float>& out = ref.out;
    AttentionStats& want = ref.stats;
    int64_t& ambiguous = ref.ambiguous;
    out.resize(q_.size());
    want.Reset(1);
    int32_t row = 0;
    for (const auto& s : seqs_) {
      EXPECT_EQ(s.num_tokens, 1);
      const int32_t L = s.start_pos + 1;
      const int32_t stride = s.stride * kBlock;
      std::vector<int32_t>& hits = ref.hits.emplace_back(kKvHeads * stride, -1);
      std::vector<double> mass(kKvHeads * stride, 0.0);
      std::vector<bool>& unsure_at = ref.unsure.emplace_back(kKvHeads * stride, false);
      for (int g = 0; g < kKvHeads; ++g) {
        // Row `index` of the sequence's V pages, in the pool or in the host pool.
        auto page_row = [&](int32_t index, bool from_host = false) {
          return (from_host ? host_pool_ : pool_).data() +
                 layout_.RowOffset(s.v_pages[g * s.stride + index / kBlock], index % kBlock);
        };
        // Where position j's V row is: the tail, a store, or nowhere (dropped); from the host?
        std::vector<const float*> v_row(L, nullptr);
        std::vector<bool> host(L, false);
        for (int32_t j = s.tail_start; j < L; ++j) v_row[j] = page_row(j);
        for (int32_t r = 0; r < (s.tail_start ? s.sparse_count[g] : 0); ++r) {
          v_row[s.sparse_pos[g * stride + r]] = page_row(r);
        }
        for (int32_t r = 0; r < (s.tail_start ? s.host_count[g] : 0); ++r) {
          v_row[s.host_pos[g * stride + r]] = page_row(r, /*from_host=*/true);
          host[s.host_pos[g * stride + r]] = true;
        }
        std::vector<int> keepers(L, 0);  // query heads of the group keeping position j
        for (int h = g * group_; h < (g + 1) * group_; ++h) {
          const float* q = q_.data() + (size_t(row) * heads_ + h) * d_;
          double d_full = 0;
          const std::vector<double> e = Float64Weights(s, g, q, L, d_full);
          std::vector<double> o(d_, 0.0);
          double d_kept = 0;
          bool unsure = false;
          for (int32_t j = 0; j < L; ++j) {
            const double p = e[j] / d_full;
            if (L > 8 && std::abs(p - theta) <= 1e-5 * theta) {
              unsure = true;
              ++ambiguous;
              if (j >= hits_begin_) unsure_at[g * stride + j - hits_begin_] = true;
            }
            if (L > 8 && !(p > theta)) continue;
            ++keepers[j];
            if (j >= hits_begin_) mass[g * stride + j - hits_begin_] += p;
            if (!v_row[j]) continue;
            d_kept += e[j];
            ++want.elements_kept;
            for (int c = 0; c < d_; ++c) o[c] += e[j] * v_row[j][c];
          }
          const float* vsum = vsum_rows_.data() + (size_t(row) * kKvHeads + g) * d_;
          const double missing = std::max(0.0, 1.0 - d_kept / d_full);
          float* oh = out.data() + (size_t(row) * heads_ + h) * d_;
          for (int c = 0; c < d_; ++c) {
            oh[c] = unsure ? std::numeric_limits<float>::quiet_NaN()
                           : float(o[c] / d_full + missing * vsum[c] / L);
          }
        }
        for (int32_t j = 0; j < L; ++j) {
          if (keepers[j] == 0) continue;
          if (j >= hits_begin_) hits[g * stride + j - hits_begin_] = s.start_pos;
          if (!v_row[j]) {
            ++want.retained_but_evicted;
            continue;
          }
          ++want.v_rows_read;
          want.v_rows_read_host += host[j];
        }
        want.v_rows_read_dense += L;
        want.elements_dense += int64_t(L) * group_;
      }
      ref.mass.emplace_back(mass.begin(), mass.end());
      ++row;
    }
    return ref;
  }

  int d_ = 0, group_ = 0, heads_ = 0;
  int32_t hits_begin_ = 0;  // marks are recorded from this position on
  bool rows_split_ = false;  // the last Run split long decode rows across threads
  uint32_t seed_ = 0;
  std::vector<PagedSeq> seqs_;
  int32_t num_tokens_ = 0;
  KvPoolLayout layout_;
  std::vector<float> pool_;
  std::vector<float> q_;
  std::vector<float> vsum_rows_;  // [tokens, kKvHeads * d_] VMC's running sums, made up
  std::vector<float> host_pool_;  // the host pool (SetStores' host rows), if any
};

// SmolLM2's shape; a head size with a 16-column and no 64-column part; one with a scalar
// tail (100 = 64 + 2·16 + 4) and the largest group a CUDA kernel takes; the CPU's largest
// group (16 tokens × 64 heads = the 1,024-row limit of a tile); Llama's head size. Each test
// file instantiates DenseAttentionTest over them (INSTANTIATE_TEST_SUITE_P(Shapes, ...)).
inline auto DenseAttentionShapes() {
  return ::testing::Values(std::pair{64, 3}, std::pair{80, 1}, std::pair{100, 8},
                           std::pair{16, 64}, std::pair{128, 4});
}

}  // namespace thetaserve::kernels
