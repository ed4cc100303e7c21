// Decode attention on the CPU, dense vs Top-θ, at growing context: one decode token per
// sequence attending over paged K/V of one layer (3 KV heads × 3 query heads, head_dim 64, as
// SmolLM2). Prints the median time of repeated runs of each, their ratio (taken in one run),
// the fraction of V rows Top-θ read, and the bytes/s dense attention reached. With --kv-dtype
// other than f32 the pages hold that type (the same values, rounded), and two more columns give
// the dense kernel's time over an f32 pool in the same run and the ratio of the two. Where the
// kernels split the decode rows across threads by key chunks (flash-decoding: batch 1 has
// fewer units of work, KV heads, than most machines have threads), the columns "split÷dense"
// and "split÷θ" give each kernel's speed-up from it: its time with each KV head's row on one
// thread (DecodeSplit::kNever) over its time split, in the same run ("-": no split).
//
//   build/thetaserve_attention_bench [--contexts 1024,4096,16384,32768] [--batch 1]
//       [--repeats 15] [--kv-dtype f32|f16|bf16|fp8_e4m3|fp8_e5m2|q8_0]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kv_element.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kv_dtype.h"
#include "model/theta_table.h"

namespace ts = thetaserve;
using ts::bench::Median;
using ts::bench::Now;
using ts::bench::IntFlag;
using ts::bench::ParseFlags;
using ts::bench::ParseList;
using ts::kernels::cpu::AttentionShape;

namespace {

// Times (seconds) of the dense and Top-θ kernels and the fraction of V rows Top-θ read, over a
// pool of T holding `kv` rounded; with `f32_baseline`, the dense kernel over `kv` itself too.
// The kernels take turns so that machine noise hits all alike.
struct Times {
  std::vector<double> dense, theta, dense_f32;
  std::vector<double> dense_whole, theta_whole;  // DecodeSplit::kNever, where the rows split
  double v_rows_read = 0;
};

template <typename T>
Times Run(ts::kernels::cpu::ThreadPool& pool, const AttentionShape& shape,
          const ts::kernels::KvPoolLayout& layout, const std::vector<float>& kv,
          const std::vector<int32_t>& tokens, const std::vector<ts::kernels::SeqChunk>& seqs,
          const std::vector<float>& q, std::vector<float>& vsum_rows,
          const ts::kernels::TopThetaConfig& theta_cfg, int repeats, bool f32_baseline) {
  // The same rows stored as T (q8_0 rows are longer: StoredLayout).
  const int64_t d = layout.head_dim, units = ts::kernels::cpu::RowUnits<T>(d);
  const ts::kernels::KvPoolLayout stored = ts::kernels::cpu::StoredLayout<T>(layout);
  std::vector<T> pages(kv.size() / d * units);
  for (size_t r = 0; r < kv.size() / d; ++r) {
    ts::kernels::cpu::StoreRow(kv.data() + r * d, d, pages.data() + r * units);
  }
  std::vector<float> o(q.size());
  using ts::kernels::cpu::LayerAttention;
  using ts::kernels::cpu::PagedAttention;
  const LayerAttention<T> dense_io{.layer = 0, .q = q.data(), .layout = stored,
                                   .kv_pool = pages.data(), .o = o.data()};
  LayerAttention<T> theta_io = dense_io;
  theta_io.vsum_rows = vsum_rows.data();
  const LayerAttention<float> f32_io{.layer = 0, .q = q.data(), .layout = layout,
                                     .kv_pool = kv.data(), .o = o.data()};
  ts::kernels::TopThetaConfig dense_cfg;
  ts::kernels::AttentionStats stats;
  Times t;
  using ts::kernels::cpu::DecodeSplit;
  for (int r = 0; r < repeats; ++r) {
    ts::kernels::ForwardBatch bd{tokens, seqs, false, nullptr};
    if (ts::kernels::cpu::SplitsDecodeRows(bd, shape, pool.num_threads())) {
      ts::kernels::ForwardBatch bw{tokens, seqs, false, nullptr};
      double t0 = Now();
      PagedAttention(pool, bw, shape, dense_cfg, dense_io, DecodeSplit::kNever);
      t.dense_whole.push_back(Now() - t0);
      t0 = Now();
      PagedAttention(pool, bw, shape, theta_cfg, theta_io, DecodeSplit::kNever);
      t.theta_whole.push_back(Now() - t0);
    }
    if (f32_baseline) {
      double t0 = Now();
      PagedAttention(pool, bd, shape, dense_cfg, f32_io);
      t.dense_f32.push_back(Now() - t0);
    }
    double t0 = Now();
    PagedAttention(pool, bd, shape, dense_cfg, dense_io);
    t.dense.push_back(Now() - t0);
    stats.Reset(1);
    ts::kernels::ForwardBatch bt{tokens, seqs, false, &stats};
    t0 = Now();
    PagedAttention(pool, bt, shape, theta_cfg, theta_io);
    t.theta.push_back(Now() - t0);
  }
  t.v_rows_read = double(stats.v_rows_read) / stats.v_rows_read_dense;
  return t;
}

constexpr char kUsage[] =
    "usage: thetaserve_attention_bench [--contexts 1024,2048,4096,8192,16384,32768] [--batch 1]\n"
    "    [--repeats 15] [--threads N] [--kv-dtype f32|f16|bf16|fp8_e4m3|fp8_e5m2|q8_0]\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> contexts = {1024, 2048, 4096, 8192, 16384, 32768};
  int batch = 1, repeats = 15, threads = 0;
  ts::kernels::KvDtype dtype = ts::kernels::KvDtype::kF32;
  ParseFlags(argc, argv, kUsage, [&](const std::string& k, const std::string& v) {
    if (k == "--contexts") {
      contexts = ParseList(v);
    } else if (k == "--batch") {
      batch = IntFlag(k, v);
    } else if (k == "--repeats") {
      repeats = IntFlag(k, v);
    } else if (k == "--threads") {
      threads = IntFlag(k, v);
    } else if (k == "--kv-dtype") {
      if (!ts::kernels::ParseKvDtype(v, &dtype)) {
        std::fprintf(stderr, "--kv-dtype must be f32, f16, bf16, fp8_e4m3, fp8_e5m2 or q8_0\n");
        std::exit(2);
      }
      if (dtype == ts::kernels::KvDtype::kAuto) dtype = ts::kernels::KvDtype::kF32;
    } else {
      return false;  // was ignored
    }
    return true;
  });
  const bool narrow = dtype != ts::kernels::KvDtype::kF32;
  const std::string name(ts::kernels::KvDtypeName(dtype));
  const int kv_heads = 3, group = 3, d = 64, bs = 16;
  AttentionShape shape{1, kv_heads * group, kv_heads, d, 1.0f / 8.0f};
  ts::kernels::cpu::ThreadPool pool(threads);
  std::printf("decode attention, batch %d, %d KV heads × %d query heads, head_dim %d, %d threads, "
              "KV pages in %s, median of %d\n",
              batch, kv_heads, group, d, pool.num_threads(), name.c_str(), repeats);
  std::printf("%-8s %-12s %-12s %-8s %-14s %-12s", "context", "dense ms", "top-θ ms", "ratio",
              "V rows read", "dense GB/s");
  std::printf(" %-12s %-8s", "split÷dense", "split÷θ");
  if (narrow) std::printf(" %-14s %-10s", "dense f32 ms", ("f32/" + name).c_str());
  std::printf("\n");
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int L : contexts) {
    const int blocks = (L + bs - 1) / bs;
    ts::kernels::KvPoolLayout layout{bs, d, int64_t(2) * blocks * kv_heads * batch};
    std::vector<float> kv(layout.num_pages * layout.PageElems());
    for (float& x : kv) x = normal(rng);
    std::vector<std::vector<int32_t>> k_tab(batch), v_tab(batch);
    std::vector<std::vector<float>> vsum(batch, std::vector<float>(kv_heads * d, 0.0f));
    std::vector<ts::kernels::SeqChunk> seqs(batch);
    std::vector<int32_t> tokens(batch, 0);
    for (int b = 0; b < batch; ++b) {
      k_tab[b].resize(kv_heads * blocks);
      v_tab[b].resize(kv_heads * blocks);
      for (int i = 0; i < kv_heads * blocks; ++i) {
        k_tab[b][i] = (b * kv_heads * blocks + i) * 2;
        v_tab[b][i] = (b * kv_heads * blocks + i) * 2 + 1;
      }
      auto& s = seqs[b];
      s.token_offset = b;
      s.num_tokens = 1;
      s.start_pos = L - 1;
      s.pages.k_pages = k_tab[b].data();
      s.pages.v_pages = v_tab[b].data();
      s.pages.stride = blocks;
      s.pages.v_sum = vsum[b].data();
    }
    // Queries scaled so the softmax is peaked the way trained attention is (a few keys hold
    // most of the mass); θ post-softmax keeps keys above 1/L of the mass.
    std::vector<float> q(batch * kv_heads * group * d), vsum_rows(batch * kv_heads * d, 0.0f);
    for (float& x : q) x = 3.0f * normal(rng);
    ts::model::ThetaTable table(1, kv_heads * group, ts::model::ThetaTable::DefaultBuckets(65536));
    table.k_per_layer[0] = 16;
    table.placement = ts::model::ThetaPlacement::kPostSoftmax;
    for (int h = 0; h < kv_heads * group; ++h) {
      for (size_t bk = 0; bk < table.buckets().size(); ++bk) {
        table.theta_at(0, h, bk) = 1.0f / table.buckets()[bk];
      }
    }
    table.Finalize();
    ts::kernels::TopThetaConfig theta_cfg;
    theta_cfg.table = &table;
    const Times t = ts::kernels::cpu::WithKvElement(dtype, [&]<typename T>(T) {
      return Run<T>(pool, shape, layout, kv, tokens, seqs, q, vsum_rows, theta_cfg, repeats, narrow);
    });
    const double md = Median(t.dense), mt = Median(t.theta);
    // K and V read once.
    const double bytes = 2.0 * L * ts::kernels::KvRowBytes(dtype, d) * kv_heads * batch;
    std::printf("%-8d %-12.3f %-12.3f %-8.2f %-14.3f %-12.2f", L, md * 1e3, mt * 1e3, md / mt,
                t.v_rows_read, bytes / md / 1e9);
    if (t.dense_whole.empty()) {
      std::printf(" %-12s %-8s", "-", "-");
    } else {
      std::printf(" %-12.2f %-8.2f", Median(t.dense_whole) / md, Median(t.theta_whole) / mt);
    }
    if (narrow) {
      const double mf = Median(t.dense_f32);
      std::printf(" %-14.3f %-10.2f", mf * 1e3, mf / md);
    }
    std::printf("\n");
  }
  return 0;
}
