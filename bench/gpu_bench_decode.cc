// The GPU benchmark's decode attention sections (gpu_bench.cc runs them): dense vs Top-θ over
// random K/V at SmolLM2's attention shape, every way of reading K, and Top-θ over the offload
// policy's host store.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/gpu_bench_common.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_batch.h"

namespace thetaserve::bench::gpu {

namespace cu = thetaserve::kernels::cuda;

namespace {

// The θ table at which a run on `probe` reads `target` of the V rows: make(x) builds the table
// for a parameter x in [lo, hi], fewer rows read as x rises; kThetaBisectSteps bisection steps, one
// run each (the same launches, in the same order, wherever it is called).
template <typename MakeTable, typename VRead>
ts::model::ThetaTable BisectTheta(const MakeTable& make, float lo, float hi, double target,
                                  VRead& v_read, cu::CudaAttention& probe) {
  for (int i = 0; i < kThetaBisectSteps; ++i) {
    const float mid = 0.5f * (lo + hi);
    const ts::model::ThetaTable t = make(mid);
    ts::kernels::TopThetaConfig c;
    c.table = &t;
    (v_read(probe, c) > target ? lo : hi) = mid;
  }
  return make(0.5f * (lo + hi));
}

// One row of the table at a V-read target: the post-softmax scale c (θ = c/L, two kernels)
// and the pre-softmax θ (one pass) bisected so that each reads v_target of the V rows, then
// dense, Top-θ and one pass timed alternately every way of reading K. Returns the row; at 32k
// also a summary line. v_read(attention, config): the fraction one run reads.
template <typename VRead>
std::string AtVTarget(double v_target, int L, int B, VRead& v_read, cu::CudaAttention& probe,
                      const ts::kernels::ForwardBatch& batch, const cu::DeviceBatch& db,
                      const cu::AttnShape& shape, const ts::kernels::KvPoolLayout& layout,
                      const uint16_t* pool, const StepInputs& in, int repeats, int iters, int sms) {
  const int H = shape.num_heads, d = shape.head_dim;
  // Post-softmax: log2 c in [-8, 16]; pre-softmax: θ in [-16, 16].
  const ts::model::ThetaTable post = BisectTheta(
      [H](float log2_c) { return InverseLTheta(H, std::exp2(log2_c)); }, -8.0f, 16.0f, v_target,
      v_read, probe);
  const ts::model::ThetaTable pre = BisectTheta(
      [H](float theta) { return ConstantPreTheta(H, theta); }, -16.0f, 16.0f, v_target, v_read,
      probe);
  ts::kernels::TopThetaConfig dense_cfg, post_cfg, pre_cfg;
  post_cfg.table = &post;
  pre_cfg.table = &pre;
  constexpr int kWays = 3;
  const cu::KLoad ways[kWays] = {cu::KLoad::kPerThread, cu::KLoad::kStaged, cu::KLoad::kQuad};
  std::vector<std::unique_ptr<cu::CudaAttention>> att;  // [way][dense, two kernels, one pass]
  for (int v = 0; v < kWays; ++v) {
    for (int p = 0; p < 3; ++p) {
      auto& a = *att.emplace_back(std::make_unique<cu::CudaAttention>(sms));
      a.set_k_load(ways[v]);
      a.set_theta_passes(p == 1 ? cu::ThetaPasses::kSplit : cu::ThetaPasses::kAuto);
      CHECK_OK(a.Prepare(batch, db, shape, 1, p == 0 ? dense_cfg : p == 1 ? post_cfg : pre_cfg,
                         nullptr));
      if (p == 2 && !a.plan().one_pass) {
        std::fprintf(stderr, "decode attention %d x %d: no one-pass plan\n", L, B);
        std::exit(1);
      }
    }
  }
  std::vector<double> t[kWays][3];
  for (int r = 0; r < repeats; ++r) {
    for (int v = 0; v < kWays; ++v) {
      for (int p = 0; p < 3; ++p) {
        cu::CudaAttention& a = *att[v * 3 + p];
        float* vsum = p == 0 ? nullptr : in.vsum;
        t[v][p].push_back(TimeMs(
            [&] { CHECK_OK(a.Run(0, db, in.q, H * d, layout, pool, vsum, in.out, nullptr)); },
            iters, 1));
      }
    }
  }
  double m[kWays][3];
  int best[3] = {0, 0, 0};
  for (int v = 0; v < kWays; ++v) {
    for (int p = 0; p < 3; ++p) {
      m[v][p] = Median(t[v][p]) * 1e3;
      if (m[v][p] < m[best[p]][p]) best[p] = v;
    }
  }
  const double read_post = v_read(*att[1], post_cfg), read_pre = v_read(*att[2], pre_cfg);
  const double dense = m[best[0]][0], ratio = dense / m[best[1]][1], ratio1 = dense / m[best[2]][2];
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%-8d %-6d %-8.1f %-8.1f %-8.1f %-8.1f %-8.1f %-8.1f %-8.1f %-8.1f %-8.1f %-7.2f "
                "%-7.2f %-7.3f %-7.3f",
                L, B, m[0][0], m[1][0], m[2][0], m[0][1], m[1][1], m[2][1], m[0][2], m[1][2],
                m[2][2], ratio, ratio1, read_post, read_pre);
  if (L == 32768) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "dense %.1f us (%s), top-θ %.1f us (%s), ratio %.2f; one pass %.1f us (%s), "
                  "ratio %.2f (V read %.3f, 1p %.3f)",
                  dense, cu::KLoadName(ways[best[0]]), m[best[1]][1], cu::KLoadName(ways[best[1]]),
                  ratio, m[best[2]][2], cu::KLoadName(ways[best[2]]), ratio1, read_post, read_pre);
    char what[96];
    std::snprintf(what, sizeof what, "decode attn 32k, batch %d, V %.2f", B, v_target);
    Summary().push_back({what, line});
  }
  return buf;
}

}  // namespace

// SmolLM2's attention shape: 3 KV heads × 3 query heads, head_dim 64, 16-row pages.
// by_kernel_context: the context whose rows are also timed kernel by kernel. v_target (0:
// none): a second operating point, both Top-θ placements' θ bisected to read that fraction of
// the V rows, timed beside dense in a table of its own.
void DecodeAttention(const std::vector<int>& contexts, const std::vector<int>& batches,
                     int by_kernel_context, double v_target, double copy_bw, int repeats,
                     int sms) {
  const int kvh = 3, group = 3, H = kvh * group, d = 64, bs = 16;
  int64_t max_pages = 0;
  for (int L : contexts)
    for (int B : batches) max_pages = std::max<int64_t>(max_pages, int64_t(2) * ((L + bs - 1) / bs) * kvh * B);
  const ts::kernels::KvPoolLayout full{bs, d, max_pages};
  std::printf("\n## decode attention, one layer (%d KV heads × %d query heads, d %d), bf16 K/V\n", kvh, group, d);
  std::printf("pool: %.2f GB of random K/V\n", max_pages * full.PageElems() * 2 / 1e9);
  uint16_t* pool;
  CHECK_CUDA(cudaMalloc(&pool, max_pages * full.PageElems() * 2));
  CHECK_CUDA(cu::LaunchFillRandomBf16(pool, max_pages * full.PageElems(), 7, 1.0f, nullptr));
  std::printf("K per thread (thread), staged through shared memory (staged) or per quad of threads "
              "(quad); top-θ (post-softmax θ = 1/L): two kernels, fused: one launch of thread block "
              "clusters; one pass: pre-softmax θ, one kernel (its θ bisected to read the V rows "
              "post-softmax reads: V read 1p); µs; ratio: the fastest dense ÷ the fastest top-θ or "
              "fused; ratio 1p: ÷ the fastest one pass\n");
  std::printf("%-8s %-6s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-7s %-7s %-7s %-7s %-10s %-8s %-7s\n", "context",
              "batch", "dense", "dense", "dense", "top-θ", "top-θ", "top-θ", "fused", "fused", "fused",
              "1 pass", "1 pass", "1 pass", "ratio", "ratio", "V read", "V read", "best dense", "of copy", "auto");
  std::printf("%-8s %-6s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-7s %-7s %-7s %-7s %-10s %-8s %-7s\n", "", "",
              "thread", "staged", "quad", "thread", "staged", "quad", "thread", "staged", "quad",
              "thread", "staged", "quad", "best", "1p", "", "1p", "GB/s", "bw", "picks");
  // At by_kernel_context, each kernel's time, from the same alternated runs: the launches up
  // to it (the split path cut short with set_kernel_limit) less those before it.
  std::vector<std::string> by_kernel_rows, target_rows;
  for (int L : contexts) {
    for (int B : batches) {
      const int blocks = (L + bs - 1) / bs;
      if (int64_t(2) * blocks * kvh * B > max_pages) continue;
      std::vector<std::vector<int32_t>> kt(B), vt(B);
      std::vector<ts::kernels::SeqChunk> seqs(B);
      std::vector<int32_t> tokens(B, 0);
      for (int b = 0; b < B; ++b) {
        kt[b].resize(kvh * blocks);
        vt[b].resize(kvh * blocks);
        for (int i = 0; i < kvh * blocks; ++i) {
          kt[b][i] = (b * kvh * blocks + i) * 2;
          vt[b][i] = (b * kvh * blocks + i) * 2 + 1;
        }
        seqs[b].token_offset = b;
        seqs[b].num_tokens = 1;
        seqs[b].start_pos = L - 1;
        seqs[b].pages = ts::kernels::SeqPageTables{kt[b].data(), vt[b].data(), blocks};
      }
      const StepInputs in(B, H, kvh, d);
      const ts::model::ThetaTable table = InverseLTheta(H);
      ts::kernels::TopThetaConfig dense_cfg, theta_cfg;
      theta_cfg.table = &table;
      ts::kernels::ForwardBatch batch{tokens, seqs, false, nullptr};
      const ts::kernels::KvPoolLayout layout{bs, d, max_pages};
      const cu::AttnShape shape{H, kvh, d, 0.125f};
      cu::DeviceBatch db;
      CHECK_OK(db.Upload(batch, kvh, layout, nullptr));
      // V rows read (of the dense count) by a Top-θ plan, from one run on fresh counters.
      auto v_read = [&](cu::CudaAttention& att, const ts::kernels::TopThetaConfig& cfg) {
        ts::kernels::AttentionStats stats;
        stats.Reset(1);
        CHECK_OK(att.Prepare(batch, db, shape, 1, cfg, nullptr));
        CHECK_OK(att.Run(0, db, in.q, H * d, layout, pool, in.vsum, in.out, nullptr));
        CHECK_OK(att.Finish(&stats, nullptr));
        return double(stats.v_rows_read) / stats.v_rows_read_dense;
      };
      // The pre-softmax θ (the same for every head) at which one pass reads as many V rows as
      // post-softmax θ = 1/L does: bisected, fewer rows as θ rises.
      cu::CudaAttention probe(sms);
      probe.set_theta_passes(cu::ThetaPasses::kAuto);  // whatever THETASERVE_ATTN_THETA says
      const double read = v_read(probe, theta_cfg);
      const ts::model::ThetaTable pre_table = BisectTheta(
          [H](float theta) { return ConstantPreTheta(H, theta); }, -16.0f, 16.0f, read, v_read,
          probe);
      ts::kernels::TopThetaConfig pre_cfg;
      pre_cfg.table = &pre_table;
      // Ways of reading K: [0] per thread, [1] staged, [2] per quad.
      constexpr int kWays = 3;
      const cu::KLoad ways[kWays] = {cu::KLoad::kPerThread, cu::KLoad::kStaged, cu::KLoad::kQuad};
      cu::CudaAttention dense[kWays] = {cu::CudaAttention(sms), cu::CudaAttention(sms), cu::CudaAttention(sms)};
      cu::CudaAttention theta[kWays] = {cu::CudaAttention(sms), cu::CudaAttention(sms), cu::CudaAttention(sms)};
      cu::CudaAttention fused[kWays] = {cu::CudaAttention(sms), cu::CudaAttention(sms), cu::CudaAttention(sms)};
      cu::CudaAttention one[kWays] = {cu::CudaAttention(sms), cu::CudaAttention(sms), cu::CudaAttention(sms)};
      for (int v = 0; v < kWays; ++v) {
        const cu::KLoad k = ways[v];
        dense[v].set_k_load(k);
        theta[v].set_k_load(k);
        fused[v].set_k_load(k);
        one[v].set_k_load(k);
        theta[v].set_theta_passes(cu::ThetaPasses::kSplit);
        fused[v].set_theta_passes(cu::ThetaPasses::kFused);
        one[v].set_theta_passes(cu::ThetaPasses::kAuto);
        CHECK_OK(dense[v].Prepare(batch, db, shape, 1, dense_cfg, nullptr));
        CHECK_OK(theta[v].Prepare(batch, db, shape, 1, theta_cfg, nullptr));
        CHECK_OK(fused[v].Prepare(batch, db, shape, 1, theta_cfg, nullptr));
        CHECK_OK(one[v].Prepare(batch, db, shape, 1, pre_cfg, nullptr));
        if (!fused[v].plan().fused || !one[v].plan().one_pass) {
          std::fprintf(stderr, "decode attention %d x %d: no fused or one-pass plan\n", L, B);
          std::exit(1);
        }
      }
      // The cut-short launches: [way][part], parts: dense pass 1, Top-θ pass 1, Top-θ passes
      // 1 and 2, the fused kernel, the one-pass kernel.
      constexpr int kParts = 5;
      const bool by_kernel = L == by_kernel_context;
      std::vector<std::unique_ptr<cu::CudaAttention>> cut;
      for (int v = 0; by_kernel && v < kWays; ++v) {
        for (int p = 0; p < kParts; ++p) {
          auto& c = *cut.emplace_back(std::make_unique<cu::CudaAttention>(sms));
          c.set_k_load(ways[v]);
          c.set_theta_passes(p == 3   ? cu::ThetaPasses::kFused
                             : p == 4 ? cu::ThetaPasses::kAuto
                                      : cu::ThetaPasses::kSplit);
          c.set_kernel_limit(p == 2 ? 2 : 1);
          CHECK_OK(c.Prepare(batch, db, shape, 1,
                             p == 0 ? dense_cfg : p == 4 ? pre_cfg : theta_cfg, nullptr));
        }
      }
      std::vector<double> td[kWays], tt[kWays], tf[kWays], to[kWays], tp[kWays][kParts];
      const int iters = L * B >= (1 << 20) ? 5 : 20;
      for (int r = 0; r < repeats; ++r) {  // alternate: noise hits all alike
        for (int v = 0; v < kWays; ++v) {
          td[v].push_back(TimeMs([&] { CHECK_OK(dense[v].Run(0, db, in.q, H * d, layout, pool, nullptr, in.out, nullptr)); }, iters, 1));
          tt[v].push_back(TimeMs([&] { CHECK_OK(theta[v].Run(0, db, in.q, H * d, layout, pool, in.vsum, in.out, nullptr)); }, iters, 1));
          tf[v].push_back(TimeMs([&] { CHECK_OK(fused[v].Run(0, db, in.q, H * d, layout, pool, in.vsum, in.out, nullptr)); }, iters, 1));
          to[v].push_back(TimeMs([&] { CHECK_OK(one[v].Run(0, db, in.q, H * d, layout, pool, in.vsum, in.out, nullptr)); }, iters, 1));
        }
        // After every way's full runs (gpu-check's Nsight Compute offsets count those).
        for (int v = 0; by_kernel && v < kWays; ++v) {
          for (int p = 0; p < kParts; ++p) {
            cu::CudaAttention& c = *cut[v * kParts + p];
            const float* vsum = p == 0 ? nullptr : in.vsum;
            tp[v][p].push_back(TimeMs(
                [&] { CHECK_OK(c.Run(0, db, in.q, H * d, layout, pool, vsum, in.out, nullptr)); },
                iters, 1));
          }
        }
      }
      // The one-pass plan's V rows read, on fresh counters.
      const double read_one = v_read(one[0], pre_cfg);
      // mt: top-θ, two kernels [0, kWays) then fused [kWays, 2·kWays); mo: one pass.
      double md[kWays], mt[2 * kWays], mo[kWays];
      int bd = 0, bt = 0, bo = 0;  // the fastest of each
      for (int v = 0; v < kWays; ++v) {
        md[v] = Median(td[v]);
        mt[v] = Median(tt[v]);
        mt[kWays + v] = Median(tf[v]);
        mo[v] = Median(to[v]);
        if (md[v] < md[bd]) bd = v;
        if (mo[v] < mo[bo]) bo = v;
      }
      for (int v = 0; v < 2 * kWays; ++v) {
        if (mt[v] < mt[bt]) bt = v;
      }
      const std::string best_theta =
          std::string(cu::KLoadName(ways[bt % kWays])) + (bt >= kWays ? ", fused" : "");
      const double bytes = 2.0 * L * d * 2 * kvh * B;  // K and V, bf16, read once
      const double gbs = bytes / (md[bd] / 1e3) / 1e9;
      // The way the server takes by default here (THETASERVE_ATTN_K_LOAD unset).
      const char* picks = cu::KLoadName(cu::PlanSplits(B, shape, L, sms, cu::KLoad::kAuto).k_load);
      std::printf("%-8d %-6d %-8.1f %-8.1f %-8.1f %-8.1f %-8.1f %-8.1f %-8.1f %-8.1f %-8.1f %-8.1f %-8.1f %-8.1f %-7.2f %-7.2f %-7.3f %-7.3f %-10.0f %-8.2f %-7s\n",
                  L, B, md[0] * 1e3, md[1] * 1e3, md[2] * 1e3, mt[0] * 1e3, mt[1] * 1e3, mt[2] * 1e3,
                  mt[3] * 1e3, mt[4] * 1e3, mt[5] * 1e3, mo[0] * 1e3, mo[1] * 1e3, mo[2] * 1e3,
                  md[bd] / mt[bt], md[bd] / mo[bo], read, read_one, gbs, gbs * 1e9 / copy_bw, picks);
      std::fflush(stdout);
      if (L == 32768) {
        char buf[384];
        std::snprintf(buf, sizeof buf, "dense %.1f us (%s), top-θ %.1f us (%s), ratio %.2f; one pass (pre) %.1f us (%s), ratio %.2f; dense at %.0f%% of copy bw (V read %.2f, 1p %.2f; auto: %s)",
                      md[bd] * 1e3, cu::KLoadName(ways[bd]), mt[bt] * 1e3, best_theta.c_str(), md[bd] / mt[bt],
                      mo[bo] * 1e3, cu::KLoadName(ways[bo]), md[bd] / mo[bo],
                      100 * gbs * 1e9 / copy_bw, read, read_one, picks);
        Summary().push_back({"decode attn 32k, batch " + std::to_string(B), buf});
      }
      for (int v = 0; by_kernel && v < kWays; ++v) {
        double m[kParts];
        for (int p = 0; p < kParts; ++p) m[p] = Median(tp[v][p]) * 1e3;
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "%-6d %-7s %-9.1f %-8.1f %-9.1f %-8.1f %-8.1f %-8.1f %-8.1f %-8.1f %-8.1f", B,
                      cu::KLoadName(ways[v]), m[0], md[v] * 1e3 - m[0], m[1], m[2] - m[1],
                      mt[v] * 1e3 - m[2], m[3], mt[kWays + v] * 1e3 - m[3], m[4], mo[v] * 1e3 - m[4]);
        by_kernel_rows.push_back(buf);
      }
      if (v_target > 0) {
        target_rows.push_back(AtVTarget(v_target, L, B, v_read, probe, batch, db, shape, layout,
                                        pool, in, repeats, iters, sms));
      }
    }
  }
  if (!target_rows.empty()) {
    std::printf("\n## decode attention at V read %.3f (θ bisected to it: post-softmax θ = c/L in "
                "two kernels, pre-softmax in one pass; dense timed again beside them; µs)\n",
                v_target);
    std::printf("%-8s %-6s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-7s %-7s %-7s %-7s\n",
                "context", "batch", "dense", "dense", "dense", "top-θ", "top-θ", "top-θ", "1 pass",
                "1 pass", "1 pass", "ratio", "ratio", "V read", "V read");
    std::printf("%-8s %-6s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-8s %-7s %-7s %-7s %-7s\n", "",
                "", "thread", "staged", "quad", "thread", "staged", "quad", "thread", "staged",
                "quad", "best", "1p", "", "1p");
    for (const std::string& row : target_rows) std::printf("%s\n", row.c_str());
  }
  if (!by_kernel_rows.empty()) {
    std::printf("\n## decode attention at %d keys by kernel (µs; from the runs above: the launches "
                "up to a kernel less those before it)\n", by_kernel_context);
    std::printf("%-6s %-7s %-9s %-8s %-9s %-8s %-8s %-8s %-8s %-8s %-8s\n", "batch", "K load", "dense p1",
                "combine", "top-θ p1", "pass 2", "combine", "fused", "combine", "1 pass", "combine");
    for (const std::string& row : by_kernel_rows) std::printf("%s\n", row.c_str());
  }
  cudaFree(pool);
}

// Top-θ decode attention under the offload policy against the full policy, same K: the V
// rows below a 512-row tail are split between the sparse store on the device (every fourth
// row, and the first four) and the host store in mapped pinned memory (the rest), so that
// pass 2 reads the retained ones of those over the bus. Prints both times, the rows read from
// host memory per L, and their bytes over the whole kernel's time (a lower bound on the rate
// the bus delivered them at).
void OffloadDecodeAttention(const std::vector<int>& contexts, const std::vector<int>& batches,
                            int repeats, int sms) {
  const int kvh = 3, group = 3, H = kvh * group, d = 64, bs = 16, tail_rows = 512;
  std::printf("\n## decode attention over a host store (policy offload), one layer, Top-θ\n");
  std::printf("V rows below the last %d: a quarter in the device's sparse store, the rest in "
              "mapped host memory\n", tail_rows);
  std::printf("%-8s %-6s %-10s %-10s %-8s %-9s %-10s %-9s\n", "context", "batch", "full us",
              "offload us", "ratio", "V read", "host read", "host GB/s");
  for (int L : contexts) {
    for (int B : batches) {
      const int blocks = (L + bs - 1) / bs;
      const int tail_start = std::max(0, (L - tail_rows) / bs * bs);
      std::vector<int32_t> sparse_positions, host_positions;
      for (int j = 0; j < tail_start; ++j) (j < 4 || j % 4 == 0 ? sparse_positions : host_positions).push_back(j);
      const int ns = int(sparse_positions.size()), nh = int(host_positions.size());
      const int sp_pages = std::max(1, (ns + bs - 1) / bs), h_pages = std::max(1, (nh + bs - 1) / bs);
      const int tail_blocks = blocks - tail_start / bs;
      // Device pages per sequence and table: K, the full policy's V, the offload tail, sparse.
      const int64_t per_table = 2 * blocks + tail_blocks + sp_pages;
      const int64_t num_pages = per_table * kvh * B;
      const int64_t host_pages = int64_t(h_pages) * kvh * B;
      const ts::kernels::KvPoolLayout layout{bs, d, num_pages, host_pages};
      uint16_t* pool;
      if (cudaMalloc(&pool, num_pages * layout.PageElems() * 2) != cudaSuccess) {
        cudaGetLastError();
        std::printf("%-8d %-6d (pool of %.1f GB does not fit)\n", L, B, num_pages * layout.PageElems() * 2 / 1e9);
        continue;
      }
      CHECK_CUDA(cu::LaunchFillRandomBf16(pool, num_pages * layout.PageElems(), 11, 1.0f, nullptr));
      cu::MappedHostBuffer host;
      CHECK_OK(host.Allocate(size_t(host_pages) * layout.PageElems() * 2));
      CHECK_CUDA(cu::LaunchFillRandomBf16(host.device<uint16_t>(), host_pages * layout.PageElems(), 13, 1.0f, nullptr));
      std::vector<std::vector<int32_t>> kt(B), vfull(B), vtail(B), spg(B), spos(B), scount(B), hpg(B), hpos(B), hcount(B);
      std::vector<ts::kernels::SeqChunk> full_seqs(B), off_seqs(B);
      int32_t next = 0, next_host = 0;
      for (int b = 0; b < B; ++b) {
        kt[b].resize(kvh * blocks);
        vfull[b].resize(kvh * blocks);
        vtail[b].resize(kvh * blocks, -1);
        spg[b].resize(kvh * sp_pages);
        hpg[b].resize(kvh * h_pages);
        for (int t = 0; t < kvh; ++t) {
          for (int i = 0; i < blocks; ++i) kt[b][t * blocks + i] = next++;
          for (int i = 0; i < blocks; ++i) vfull[b][t * blocks + i] = next++;
          for (int i = 0; i < tail_blocks; ++i) vtail[b][t * blocks + i] = next++;
          for (int i = 0; i < sp_pages; ++i) spg[b][t * sp_pages + i] = next++;
          for (int i = 0; i < h_pages; ++i) hpg[b][t * h_pages + i] = next_host++;
          spos[b].insert(spos[b].end(), sparse_positions.begin(), sparse_positions.end());
          hpos[b].insert(hpos[b].end(), host_positions.begin(), host_positions.end());
        }
        scount[b].assign(kvh, ns);
        hcount[b].assign(kvh, nh);
        for (auto* s : {&full_seqs[b], &off_seqs[b]}) {
          s->token_offset = b;
          s->num_tokens = 1;
          s->start_pos = L - 1;
        }
        full_seqs[b].pages = ts::kernels::SeqPageTables{kt[b].data(), vfull[b].data(), blocks};
        ts::kernels::SeqPageTables& p = off_seqs[b].pages;
        p = ts::kernels::SeqPageTables{kt[b].data(), vtail[b].data(), blocks, tail_start};
        if (tail_start > 0) {
          p.v_sparse_pages = spg[b].data();
          p.v_sparse_pos = spos[b].data();
          p.v_sparse_count = scount[b].data();
          p.sparse_stride = sp_pages;
          p.sparse_pos_stride = std::max(1, ns);
          p.v_host_pages = hpg[b].data();
          p.v_host_pos = hpos[b].data();
          p.v_host_count = hcount[b].data();
          p.host_stride = h_pages;
          p.host_pos_stride = std::max(1, nh);
        }
      }
      const StepInputs in(B, H, kvh, d);
      const ts::model::ThetaTable table = InverseLTheta(H);
      ts::kernels::TopThetaConfig cfg;
      cfg.table = &table;
      const std::vector<int32_t> tokens(B, 0);
      const ts::kernels::ForwardBatch full_batch{tokens, full_seqs, false, nullptr};
      const ts::kernels::ForwardBatch off_batch{tokens, off_seqs, false, nullptr};
      const cu::AttnShape shape{H, kvh, d, 0.125f};
      cu::DeviceBatch full_db, off_db;
      CHECK_OK(full_db.Upload(full_batch, kvh, layout, nullptr));
      CHECK_OK(off_db.Upload(off_batch, kvh, layout, nullptr));
      cu::CudaAttention full(sms), off(sms);
      off.set_host_pool(host.device<uint16_t>());
      CHECK_OK(full.Prepare(full_batch, full_db, shape, 1, cfg, nullptr));
      CHECK_OK(off.Prepare(off_batch, off_db, shape, 1, cfg, nullptr));
      std::vector<double> tf, to;
      const int iters = L * B >= (1 << 20) ? 5 : 20;
      for (int r = 0; r < repeats; ++r) {  // alternate: noise hits both alike
        tf.push_back(TimeMs([&] { CHECK_OK(full.Run(0, full_db, in.q, H * d, layout, pool, in.vsum, in.out, nullptr)); }, iters, 1));
        to.push_back(TimeMs([&] { CHECK_OK(off.Run(0, off_db, in.q, H * d, layout, pool, in.vsum, in.out, nullptr)); }, iters, 1));
      }
      ts::kernels::AttentionStats stats;
      stats.Reset(1);
      CHECK_OK(off.Prepare(off_batch, off_db, shape, 1, cfg, nullptr));
      CHECK_OK(off.Run(0, off_db, in.q, H * d, layout, pool, in.vsum, in.out, nullptr));
      CHECK_OK(off.Finish(&stats, nullptr));
      const double mf = Median(tf), mo = Median(to);
      const double read = double(stats.v_rows_read) / stats.v_rows_read_dense;
      const double host_read = double(stats.v_rows_read_host) / stats.v_rows_read_dense;
      const double host_gbs = double(stats.v_rows_read_host) * d * 2 / (mo / 1e3) / 1e9;
      std::printf("%-8d %-6d %-10.1f %-10.1f %-8.2f %-9.4f %-10.4f %-9.2f\n", L, B, mf * 1e3, mo * 1e3,
                  mo / mf, read, host_read, host_gbs);
      std::fflush(stdout);
      if (L == 32768) {
        char buf[200];
        std::snprintf(buf, sizeof buf, "top-θ full %.1f us, offload %.1f us (%.2fx), host reads %.4f of L at %.2f GB/s",
                      mf * 1e3, mo * 1e3, mo / mf, host_read, host_gbs);
        Summary().push_back({"offload attn 32k, batch " + std::to_string(B), buf});
      }
      cudaFree(pool);
    }
  }
}

}  // namespace thetaserve::bench::gpu
