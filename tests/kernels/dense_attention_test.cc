// CPU attention over paged K/V: a prefill chunk (worked in tiles of tokens) gives each token
// exactly what attending alone gives it — dense, where both also match a float64 softmax
// reference, and Top-θ, with the same hit marks and retained mass. Pages of f16, bf16 or fp8
// give what f32 pages holding the rounded values give, to the bit.
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
namespace {

constexpr int kKvHeads = 2, kBlock = 16;

// One sequence's pages in a shared pool: K and V pages of every KV head, shuffled ids.
struct PagedSeq {
  int32_t start_pos = 0;
  int32_t num_tokens = 0;
  std::vector<int32_t> k_pages, v_pages;  // [kKvHeads, stride]
  int32_t stride = 0;
  // Top-θ's records (hit marks, retained mass per position) and VMC's running V sum.
  bool record = false;
  std::vector<int32_t> hits;  // [kKvHeads, stride * kBlock]
  std::vector<float> mass;    // same shape
  std::vector<float> v_sum;   // [kKvHeads, head_dim] (only its presence matters here)
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
      s.mass.assign(kKvHeads * s.stride * kBlock, 0.0f);
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
    rows_split_ = cpu::PagedAttention(pool, batch, shape, 0, q_.data(),
                                      cpu::StoredLayout<T>(layout_), kv, host,
                                      cfg.active() ? vsum_rows_.data() : nullptr, cfg, out.data(),
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
      // One thread: the retained mass is summed over queries in the same order.
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
  std::vector<std::vector<float>> whole_mass;
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
    EXPECT_TRUE(std::any_of(whole_mass[s].begin(), whole_mass[s].end(), [](float m) { return m > 0; }))
        << "no retained mass recorded for sequence " << s;
    EXPECT_EQ(whole_hits[s], seqs_[s].hits) << "sequence " << s << "; seed " << seed_;
    // Float sums over the queries, added in another order.
    EXPECT_TRUE(testing::AllClose(whole_mass[s], seqs_[s].mass, 1e-6f, 1e-5f)) << "sequence " << s;
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
          ASSERT_EQ(s.mass[at], 0.0f) << "sequence " << si << " table " << lh << " entry " << e;
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
    // One thread wherever retained mass is recorded: its sums over queries then come in the
    // same order.
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
      // Float sums over the prefill chunk's queries, added in another order (units go longest
      // first).
      EXPECT_TRUE(testing::AllClose(seqs_[si].mass, tile_seqs[si].mass, 1e-6f, 1e-5f))
          << "sequence " << si;
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
    for (size_t i = 0; i < ref.out.size(); ++i) {
      if (std::isnan(ref.out[i])) ref.out[i] = split[i];
    }
    EXPECT_TRUE(testing::AllClose(split, ref.out, 2e-6f, 2e-5f));
    for (size_t si = 0; si < seqs_.size(); ++si) {
      // Marks and mass where no key is within rounding of θ (a flipped key moves its
      // position's mark and its mass by about θ).
      std::vector<int32_t> hits = seqs_[si].hits;
      std::vector<float> mass = seqs_[si].mass;
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

// SmolLM2's shape; a head size with a 16-column and no 64-column part; one with a scalar
// tail (100 = 64 + 2·16 + 4) and the largest group a CUDA kernel takes; the CPU's largest
// group (16 tokens × 64 heads = the 1,024-row limit of a tile); Llama's head size.
INSTANTIATE_TEST_SUITE_P(Shapes, DenseAttentionTest,
                         ::testing::Values(std::pair{64, 3}, std::pair{80, 1}, std::pair{100, 8},
                                           std::pair{16, 64}, std::pair{128, 4}));

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

}  // namespace
}  // namespace thetaserve::kernels
