// Decode attention on the CPU, dense vs Top-θ, at growing context: one decode token per
// sequence attending over paged K/V of one layer (3 KV heads × 3 query heads, head_dim 64, as
// SmolLM2). Prints the median time of repeated runs of each, their ratio (taken in one run),
// the fraction of V rows Top-θ read, and the bytes/s dense attention reached.
//
//   build/thetaserve_attention_bench [--contexts 1024,4096,16384,32768] [--batch 1] [--repeats 15]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"
#include "model/theta_table.h"

namespace ts = thetaserve;
using ts::bench::Median;
using ts::bench::Now;
using ts::bench::ParseList;
using ts::kernels::cpu::AttentionShape;

int main(int argc, char** argv) {
  std::vector<int> contexts = {1024, 2048, 4096, 8192, 16384, 32768};
  int batch = 1, repeats = 15, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--contexts") {
      contexts = ParseList(v);
    } else if (k == "--batch") {
      batch = std::stoi(v);
    } else if (k == "--repeats") {
      repeats = std::stoi(v);
    } else if (k == "--threads") {
      threads = std::stoi(v);
    }
  }
  const int kv_heads = 3, group = 3, d = 64, bs = 16;
  AttentionShape shape{1, kv_heads * group, kv_heads, d, 1.0f / 8.0f};
  ts::kernels::cpu::ThreadPool pool(threads);
  std::printf("decode attention, batch %d, %d KV heads × %d query heads, head_dim %d, %d threads\n",
              batch, kv_heads, group, d, pool.num_threads());
  std::printf("%-8s %-12s %-12s %-8s %-14s %-12s\n", "context", "dense ms", "top-θ ms", "ratio",
              "V rows read", "dense GB/s");
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
    std::vector<float> q(batch * kv_heads * group * d), o(q.size()), vsum_rows(batch * kv_heads * d, 0.0f);
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
    ts::kernels::TopThetaConfig dense_cfg, theta_cfg;
    theta_cfg.table = &table;
    ts::kernels::AttentionStats stats;
    std::vector<double> td, tt;
    for (int r = 0; r < repeats; ++r) {
      // Alternate the two so that machine noise hits both alike.
      ts::kernels::ForwardBatch bd{tokens, seqs, false, nullptr};
      double t0 = Now();
      ts::kernels::cpu::PagedAttention(pool, bd, shape, 0, q.data(), layout, kv.data(), nullptr, nullptr, dense_cfg, o.data());
      td.push_back(Now() - t0);
      stats.Reset(1);
      ts::kernels::ForwardBatch bt{tokens, seqs, false, &stats};
      t0 = Now();
      ts::kernels::cpu::PagedAttention(pool, bt, shape, 0, q.data(), layout, kv.data(), nullptr, vsum_rows.data(), theta_cfg, o.data());
      tt.push_back(Now() - t0);
    }
    const double md = Median(td), mt = Median(tt);
    const double bytes = 2.0 * L * d * 4 * kv_heads * batch;  // K and V read once
    std::printf("%-8d %-12.3f %-12.3f %-8.2f %-14.3f %-12.2f\n", L, md * 1e3, mt * 1e3, md / mt,
                double(stats.v_rows_read) / stats.v_rows_read_dense, bytes / md / 1e9);
  }
  return 0;
}
