// GPU benchmarks (built with CUDA only; run by scripts/gpu-check.sh):
//  1. device copy bandwidth (cudaMemcpy device to device, read + write bytes);
//  2. decode attention, dense vs Top-θ, at contexts × batch sizes, each with pass 1 reading K
//     per thread, staged through shared memory (cp.async) and per quad of threads: median times, the ratios
//     measured in the same run, V rows read, and the bytes/s the faster dense kernel reached
//     against the copy bandwidth; Top-θ post-softmax (two kernels, fused) and pre-softmax in
//     one pass, its θ set to read as many V rows as the post-softmax one; and again with both
//     θs set to read a given fraction of the V rows (--v-target: what a calibrated table reads
//     at SmolLM2's longest context);
//  3. Top-θ decode attention over a host store (the offload policy) against the full policy;
//  4. dense prefill attention TFLOP/s;
//  5. end-to-end decode tokens/s on a model through the real engine (when --model exists),
//     after 128-token prompts and after long ones: dense, and Top-θ with each --theta file
//     (post-softmax tables in two passes, pre-softmax ones in one).
//
//   build/thetaserve_gpu_bench [--contexts 1024,4096,16384,32768,131072] [--batches 1,8,32,64]
//       [--prefill 1024,4096,16384] [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
//       [--e2e-batches 1,8,32,64] [--e2e-long-prompt 8000] [--e2e-long-batches 8,32]
//       [--theta thetas.json[,pre.json]] [--offload-contexts 8192,32768] [--offload-batches 1,8,32]
//       [--by-kernel-context 32768] [--v-target 0.05] [--repeats 5]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_batch.h"
#include "model/model.h"
#include "model/theta_table.h"
#include "scheduler/engine.h"

namespace ts = thetaserve;
namespace cu = thetaserve::kernels::cuda;
using ts::bench::Median;
using ts::bench::ParseList;

namespace {

#define CHECK_CUDA(expr)                                                                  \
  do {                                                                                    \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) {                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)
#define CHECK_OK(expr)                                                                    \
  do {                                                                                    \
    if (absl::Status s_ = (expr); !s_.ok()) {                                             \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, std::string(s_.message()).c_str()); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

// Milliseconds per call of fn, median of `repeats` timings of `iters` back-to-back calls.
template <typename Fn>
double TimeMs(Fn&& fn, int iters, int repeats) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  fn();  // warm-up
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    CHECK_CUDA(cudaEventRecord(a));
    for (int i = 0; i < iters; ++i) fn();
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t / iters);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return Median(ms);
}

double CopyBandwidth(int repeats) {
  const size_t bytes = size_t(2) << 30;  // 2 GiB each way: far beyond the 60 MB L2
  void *src, *dst;
  CHECK_CUDA(cudaMalloc(&src, bytes));
  CHECK_CUDA(cudaMalloc(&dst, bytes));
  CHECK_CUDA(cudaMemset(src, 1, bytes));
  const double ms = TimeMs([&] { CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); },
                           5, repeats);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * bytes / (ms / 1e3);
}

struct Row {
  std::string what;
  std::string value;
};
std::vector<Row> g_summary;

// One decode step's inputs and outputs on the device for B rows: peaked queries (3·N(0,1)
// from a fixed generator, as bench/attention_bench.cc), the output, and zeroed V sums.
struct StepInputs {
  float *q = nullptr, *out = nullptr, *vsum = nullptr;
  StepInputs(int B, int H, int kvh, int d) {
    std::vector<float> host(size_t(B) * H * d);
    uint64_t st = 12345;
    for (float& x : host) {
      st = st * 6364136223846793005ull + 1442695040888963407ull;
      const double u1 = ((st >> 11) + 1.0) / 9007199254740993.0;
      st = st * 6364136223846793005ull + 1442695040888963407ull;
      const double u2 = (st >> 11) / 9007199254740992.0;
      x = float(3.0 * std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2));
    }
    CHECK_CUDA(cudaMalloc(&q, host.size() * 4));
    CHECK_CUDA(cudaMalloc(&out, host.size() * 4));
    CHECK_CUDA(cudaMalloc(&vsum, size_t(B) * kvh * d * 4));
    CHECK_CUDA(cudaMemcpy(q, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(vsum, 0, size_t(B) * kvh * d * 4));
  }
  StepInputs(const StepInputs&) = delete;
  StepInputs& operator=(const StepInputs&) = delete;
  ~StepInputs() {
    cudaFree(q);
    cudaFree(out);
    cudaFree(vsum);
  }
};

// One layer of H heads, post-softmax θ = c/L beyond k = 16.
ts::model::ThetaTable InverseLTheta(int H, float c = 1.0f) {
  ts::model::ThetaTable table(1, H, ts::model::ThetaTable::DefaultBuckets(1 << 18));
  table.k_per_layer = {16};
  table.placement = ts::model::ThetaPlacement::kPostSoftmax;
  for (int h = 0; h < H; ++h)
    for (size_t k = 0; k < table.buckets().size(); ++k) table.theta_at(0, h, k) = c / table.buckets()[k];
  table.Finalize();
  return table;
}

// One layer of H heads, pre-softmax θ (a scaled score) the same at every length, beyond k = 16.
ts::model::ThetaTable ConstantPreTheta(int H, float theta) {
  ts::model::ThetaTable table(1, H, ts::model::ThetaTable::DefaultBuckets(1 << 18));
  table.k_per_layer = {16};
  table.placement = ts::model::ThetaPlacement::kPreSoftmax;
  for (int h = 0; h < H; ++h)
    for (size_t k = 0; k < table.buckets().size(); ++k) table.theta_at(0, h, k) = theta;
  table.Finalize();
  return table;
}

// Bisection steps for the pre-softmax θ (each a one-pass launch and its combine: 2 launches
// before the timed runs, which gpu-check.sh's Nsight Compute offsets count).
constexpr int kPreThetaSteps = 20;

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
  float lo = -8.0f, hi = 16.0f;  // log2 c; fewer rows as c rises
  for (int i = 0; i < kPreThetaSteps; ++i) {
    const float mid = 0.5f * (lo + hi);
    const ts::model::ThetaTable t = InverseLTheta(H, std::exp2(mid));
    ts::kernels::TopThetaConfig c;
    c.table = &t;
    (v_read(probe, c) > v_target ? lo : hi) = mid;
  }
  const ts::model::ThetaTable post = InverseLTheta(H, std::exp2(0.5f * (lo + hi)));
  lo = -16.0f, hi = 16.0f;
  for (int i = 0; i < kPreThetaSteps; ++i) {
    const float mid = 0.5f * (lo + hi);
    const ts::model::ThetaTable t = ConstantPreTheta(H, mid);
    ts::kernels::TopThetaConfig c;
    c.table = &t;
    (v_read(probe, c) > v_target ? lo : hi) = mid;
  }
  const ts::model::ThetaTable pre = ConstantPreTheta(H, 0.5f * (lo + hi));
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
    g_summary.push_back({what, line});
  }
  return buf;
}

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
      float pre_lo = -16.0f, pre_hi = 16.0f;
      for (int i = 0; i < kPreThetaSteps; ++i) {
        const float mid = 0.5f * (pre_lo + pre_hi);
        const ts::model::ThetaTable t = ConstantPreTheta(H, mid);
        ts::kernels::TopThetaConfig c;
        c.table = &t;
        (v_read(probe, c) > read ? pre_lo : pre_hi) = mid;
      }
      const ts::model::ThetaTable pre_table = ConstantPreTheta(H, 0.5f * (pre_lo + pre_hi));
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
        g_summary.push_back({"decode attn 32k, batch " + std::to_string(B), buf});
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
        g_summary.push_back({"offload attn 32k, batch " + std::to_string(B), buf});
      }
      cudaFree(pool);
    }
  }
}

void PrefillAttention(const std::vector<int>& lengths, int repeats, int sms) {
  const int kvh = 3, group = 3, H = kvh * group, d = 64, bs = 16;
  std::printf("\n## prefill attention, one sequence, one layer (causal)\n");
  std::printf("dense: mma: PTX mma.sync, fragments in registers (the default); wmma: warp matrix\n"
              "functions, S and P·V through shared memory (both bf16 halves); fma: f32 FMAs;\n"
              "ratios: wmma ÷ mma, fma ÷ mma (time). Top-θ (post-softmax θ = 1/L): θ tiled, the\n"
              "tiled kernel (two walks over the keys on the tensor cores; the default); θ split,\n"
              "the split kernels a row at a time; s÷t: split ÷ tiled (time)\n");
  std::printf("%-8s %-9s %-8s %-9s %-8s %-9s %-8s %-7s %-7s %-10s %-10s %-7s\n", "tokens",
              "mma ms", "TFLOP/s", "wmma ms", "TFLOP/s", "fma ms", "TFLOP/s", "w÷m", "f÷m",
              "θ tiled ms", "θ split ms", "s÷t");
  for (int L : lengths) {
    const int blocks = (L + bs - 1) / bs;
    const ts::kernels::KvPoolLayout layout{bs, d, int64_t(2) * blocks * kvh};
    uint16_t* pool;
    CHECK_CUDA(cudaMalloc(&pool, layout.num_pages * layout.PageElems() * 2));
    CHECK_CUDA(cu::LaunchFillRandomBf16(pool, layout.num_pages * layout.PageElems(), 3, 1.0f, nullptr));
    std::vector<int32_t> kt(kvh * blocks), vt(kvh * blocks), tokens(L, 0);
    for (int i = 0; i < kvh * blocks; ++i) kt[i] = 2 * i, vt[i] = 2 * i + 1;
    std::vector<ts::kernels::SeqChunk> seqs(1);
    seqs[0].num_tokens = L;
    seqs[0].pages = ts::kernels::SeqPageTables{kt.data(), vt.data(), blocks};
    ts::kernels::ForwardBatch batch{tokens, seqs, false, nullptr};
    float *q, *o;
    CHECK_CUDA(cudaMalloc(&q, size_t(L) * H * d * 4));
    CHECK_CUDA(cudaMalloc(&o, size_t(L) * H * d * 4));
    std::vector<float> hq(size_t(L) * H * d);
    uint64_t st = 99;
    for (float& x : hq) {  // uniform in [-1.7, 1.7): unit variance
      st = st * 6364136223846793005ull + 1442695040888963407ull;
      x = float((st >> 40) / 16777216.0 * 3.46 - 1.73);
    }
    CHECK_CUDA(cudaMemcpy(q, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
    cu::DeviceBatch db;
    CHECK_OK(db.Upload(batch, kvh, layout, nullptr));
    const double flops = 2.0 * double(L) * (L + 1) * H * d;  // QKᵀ and PV over the causal half
    double ms[cu::kPrefillWays];
    for (const cu::PrefillWay way :
         {cu::PrefillWay::kMma, cu::PrefillWay::kWmma, cu::PrefillWay::kFma}) {
      cu::CudaAttention att(sms);
      att.set_prefill_way(way);
      CHECK_OK(att.Prepare(batch, db, cu::AttnShape{H, kvh, d, 0.125f}, 1,
                           ts::kernels::TopThetaConfig{}, nullptr));
      ms[int(way)] = TimeMs([&] {
        CHECK_OK(att.Run(0, db, q, H * d, layout, pool, nullptr, o, nullptr));
      }, 3, repeats);
    }
    const ts::model::ThetaTable table = InverseLTheta(H);
    ts::kernels::TopThetaConfig theta;
    theta.table = &table;
    double theta_ms[2];
    for (const cu::ThetaPrefill way : {cu::ThetaPrefill::kTiled, cu::ThetaPrefill::kSplit}) {
      cu::CudaAttention att(sms);
      att.set_theta_prefill(way);
      CHECK_OK(att.Prepare(batch, db, cu::AttnShape{H, kvh, d, 0.125f}, 1, theta, nullptr));
      theta_ms[int(way)] = TimeMs([&] {
        CHECK_OK(att.Run(0, db, q, H * d, layout, pool, nullptr, o, nullptr));
      }, 3, repeats);
    }
    const double mma = ms[int(cu::PrefillWay::kMma)], wmma = ms[int(cu::PrefillWay::kWmma)],
                 fma = ms[int(cu::PrefillWay::kFma)];
    const double tiled = theta_ms[int(cu::ThetaPrefill::kTiled)],
                 split = theta_ms[int(cu::ThetaPrefill::kSplit)];
    auto tflops = [&](double t) { return flops / (t / 1e3) / 1e12; };
    std::printf("%-8d %-9.3f %-8.2f %-9.3f %-8.2f %-9.3f %-8.2f %-7.2f %-7.2f %-10.3f %-10.3f "
                "%-7.2f\n",
                L, mma, tflops(mma), wmma, tflops(wmma), fma, tflops(fma), wmma / mma,
                fma / mma, tiled, split, split / tiled);
    std::fflush(stdout);
    if (L == lengths.back()) {
      char buf[160];
      std::snprintf(buf, sizeof buf,
                    "mma %.2f TFLOP/s (%.2f ms), wmma %.2f (%.2f ms), fma %.2f (%.2f ms)",
                    tflops(mma), mma, tflops(wmma), wmma, tflops(fma), fma);
      g_summary.push_back({"prefill attn " + std::to_string(L) + " tokens", buf});
      std::snprintf(buf, sizeof buf, "tiled %.2f ms, split %.2f ms (%.2fx)", tiled, split,
                    split / tiled);
      g_summary.push_back({"top-θ prefill " + std::to_string(L) + " tokens", buf});
    }
    cudaFree(pool);
    cudaFree(q);
    cudaFree(o);
  }
}

// Decode through the engine: 128-token prompts at every batch in `batches`, then prompts of
// `long_prompt` tokens at `long_batches` (where per-step host work that grows with the context
// would show: page tables, hit marks).
void EndToEnd(const std::string& path, const std::vector<std::string>& theta_paths,
              const std::vector<int>& batches,
              int long_prompt, const std::vector<int>& long_batches, double copy_bw, int repeats) {
  std::printf("\n## end-to-end decode through the engine: %s\n", path.c_str());
  auto model = ts::model::Model::Load(path);
  if (!model.ok()) {
    std::printf("cannot load: %s\n", std::string(model.status().message()).c_str());
    return;
  }
  auto backend = ts::kernels::CreateBackend(**model, ts::kernels::Device::kCuda, 0);
  CHECK_OK(backend.status());
  const auto& c = (*model)->config();
  const double params = double(c.vocab_size) * c.hidden_size * (c.tied_embeddings ? 1 : 2) +
                        double(c.num_layers) * c.hidden_size *
                            (c.q_dim() + 2 * c.kv_dim() + c.q_dim() + 3 * c.intermediate_size);
  const double weight_bytes = 2 * params;  // bf16 on the device; the LM head reads the table
  // Mode 0 is dense; mode i > 0 runs Top-θ with tables[i - 1], named by its placement.
  std::vector<ts::model::ThetaTable> tables;
  std::vector<std::string> names = {"dense"};
  for (const std::string& theta_path : theta_paths) {
    auto t = ts::model::ThetaTable::Load(theta_path);
    if (!t.ok()) {
      std::printf("θ file %s: %s\n", theta_path.c_str(), std::string(t.status().message()).c_str());
      continue;
    }
    std::printf("θ file %s: %s-softmax, k %d (last layer)\n", theta_path.c_str(),
                ts::model::PlacementName(t->placement),
                t->k_per_layer.empty() ? 0 : t->k_per_layer.back());
    names.push_back(t->placement == ts::model::ThetaPlacement::kPreSoftmax ? "θ pre" : "top-θ");
    tables.push_back(std::move(*t));
  }
  std::printf("bf16 weights on the device: %.1f MB\n", weight_bytes / 1e6);
  // graphs: CUDA graphs the first run captured (the step median leaves the captures' steps out;
  // later runs replay the backend's cached graphs where their keys match).
  // fwd ms: the step up to its tokens' logits on the host (the batch's tables, the launches,
  // the GPU, the copy back: greedy rows send back their picks, EngineConfig::backend_argmax);
  // host ms: the rest (sampling, the engine's bookkeeping).
  std::printf("%-8s %-8s %-8s %-12s %-9s %-9s %-12s %-10s %-8s\n", "mode", "prompt", "batch",
              "step ms", "fwd ms", "host ms", "tokens/s", "weights bw", "graphs");
  struct Shape {
    int prompt, max_tokens;
    std::vector<int> batches;
  };
  std::vector<Shape> shapes = {{128, 64, batches}};
  if (long_prompt > 0 && !long_batches.empty()) shapes.push_back({long_prompt, 32, long_batches});
  for (const Shape& shape : shapes) {
    for (size_t mode = 0; mode < names.size(); ++mode) {
      ts::kernels::TopThetaConfig cfg;
      if (mode > 0) cfg.table = &tables[mode - 1];
      (*backend)->SetTopTheta(cfg);
      for (int B : shape.batches) {
        std::vector<double> step_ms, fwd_ms, host_ms;
        int64_t graphs = ts::kernels::cuda::GraphsCaptured();
        // The prompts are prefilled 8192 tokens a step while the first ones already decode: each
        // sequence generates that many steps more, so that max_tokens steps run the whole batch
        // (8000-token prompts at batch 32 take 32 steps to prefill, and 32 tokens used to end
        // the first sequences before the last began: no step ran all 32).
        constexpr int kStepTokens = 8192;
        const int max_tokens = shape.max_tokens + (B * shape.prompt + kStepTokens - 1) / kStepTokens;
        for (int rep = 0; rep < repeats; ++rep) {
          ts::scheduler::EngineConfig config;
          // bf16 K and V of every layer: 4 GiB holds 64 × 192 tokens many times over; the long
          // prompts need their own share.
          const int64_t kv_bytes = int64_t(B) * (shape.prompt + max_tokens + 16) *
                                   c.num_layers * c.kv_dim() * 2 * 2;
          config.kv_cache_bytes = std::max<int64_t>(int64_t(4) << 30, kv_bytes * 5 / 4);
          config.scheduler.max_num_batched_tokens = kStepTokens;
          // Rows sampled on a pool of up to 16 threads, as `serve` does (until 2026-12-04 these
          // rows sampled on the engine thread alone: ~1–2 ms of a batch-64 step).
          config.sampling_threads = std::clamp(int(std::thread::hardware_concurrency()), 1, 16);
          auto times = ts::bench::DecodeStepMedians(config, **backend, **model, B, shape.prompt,
                                                    max_tokens);
          CHECK_OK(times.status());
          step_ms.push_back(times->step_seconds * 1e3);
          fwd_ms.push_back(times->forward_seconds * 1e3);
          host_ms.push_back(times->host_seconds * 1e3);
          if (rep == 0) graphs = ts::kernels::cuda::GraphsCaptured() - graphs;
        }
        const double ms = Median(step_ms), fwd = Median(fwd_ms), host = Median(host_ms);
        const double bw = weight_bytes / (ms / 1e3) / copy_bw;
        std::printf("%-8s %-8d %-8d %-12.3f %-9.3f %-9.3f %-12.0f %-10.3f %-8lld\n",
                    names[mode].c_str(), shape.prompt, B, ms, fwd, host, B / (ms / 1e3), bw,
                    static_cast<long long>(graphs));
        std::fflush(stdout);
        char buf[96];
        std::snprintf(buf, sizeof buf, "%.0f tok/s (%.3f ms/step, weights at %.0f%% of copy bw)", B / (ms / 1e3), ms, 100 * bw);
        g_summary.push_back({"e2e decode " + names[mode] + ", " +
                                 std::to_string(shape.prompt) + " × " + std::to_string(B),
                             buf});
      }
    }
  }
  // The greedy pick at the largest batch (dense, 128-token prompts): on the device, as above,
  // against every row's logits copied back and picked on the sampling pool.
  if (batches.empty()) return;
  (*backend)->SetTopTheta(ts::kernels::TopThetaConfig{});
  const int B = *std::max_element(batches.begin(), batches.end());
  std::printf("greedy, dense, 128-token prompts × %d: the pick on the device or the host\n", B);
  std::printf("%-8s %-12s %-9s %-9s %-12s\n", "pick", "step ms", "fwd ms", "host ms", "tokens/s");
  double pick_ms[2] = {0, 0};
  for (const bool device : {true, false}) {
    std::vector<double> step_ms, fwd_ms, host_ms;
    for (int rep = 0; rep < repeats; ++rep) {
      ts::scheduler::EngineConfig config;
      config.kv_cache_bytes = int64_t(4) << 30;
      config.scheduler.max_num_batched_tokens = 8192;
      config.sampling_threads = std::clamp(int(std::thread::hardware_concurrency()), 1, 16);
      config.backend_argmax = device;
      auto times = ts::bench::DecodeStepMedians(config, **backend, **model, B, 128,
                                                    64 + (B * 128 + 8191) / 8192);
      CHECK_OK(times.status());
      step_ms.push_back(times->step_seconds * 1e3);
      fwd_ms.push_back(times->forward_seconds * 1e3);
      host_ms.push_back(times->host_seconds * 1e3);
    }
    const double ms = Median(step_ms);
    pick_ms[device ? 0 : 1] = ms;
    std::printf("%-8s %-12.3f %-9.3f %-9.3f %-12.0f\n", device ? "device" : "host", ms,
                Median(fwd_ms), Median(host_ms), B / (ms / 1e3));
    std::fflush(stdout);
  }
  {
    char buf[96];
    std::snprintf(buf, sizeof buf, "device %.3f ms/step, host %.3f (host ÷ device %.2f)",
                  pick_ms[0], pick_ms[1], pick_ms[1] / pick_ms[0]);
    g_summary.push_back({"e2e greedy pick, 128 × " + std::to_string(B), buf});
  }

  // Host sampling at the largest batch (dense, 128-token prompts): temperature 0.7, top-p 0.9
  // on the engine thread alone and on the sampling pool, against greedy above.
  const ts::scheduler::SamplingParams typical = ts::bench::TypicalSampling();
  const int pool = std::clamp(int(std::thread::hardware_concurrency()), 1, 16);
  std::printf("sampled (T 0.7, top-p 0.9), dense, 128-token prompts × %d:\n", B);
  std::printf("%-18s %-12s %-12s\n", "sampling threads", "step ms", "tokens/s");
  for (int threads : {1, pool}) {
    std::vector<double> step_ms;
    for (int rep = 0; rep < repeats; ++rep) {
      ts::scheduler::EngineConfig config;
      config.kv_cache_bytes = int64_t(4) << 30;
      config.scheduler.max_num_batched_tokens = 8192;
      config.sampling_threads = threads;
      auto seconds = ts::bench::DecodeStepSeconds(config, **backend, **model, B, 128, 64, &typical);
      CHECK_OK(seconds.status());
      step_ms.push_back(*seconds * 1e3);
    }
    const double ms = Median(step_ms);
    std::printf("%-18d %-12.3f %-12.0f\n", threads, ms, B / (ms / 1e3));
    std::fflush(stdout);
    char buf[96];
    std::snprintf(buf, sizeof buf, "%.0f tok/s (%.3f ms/step)", B / (ms / 1e3), ms);
    g_summary.push_back({"e2e T 0.7 p 0.9, 128 × " + std::to_string(B) + ", " + std::to_string(threads) + " thr",
                         buf});
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> contexts = {1024, 4096, 16384, 32768, 131072};
  std::vector<int> batches = {1, 8, 32, 64};
  std::vector<int> prefill = {1024, 4096, 16384};
  std::vector<int> offload_contexts = {8192, 32768}, offload_batches = {1, 8, 32};
  std::vector<int> e2e = {1, 8, 32, 64};
  std::vector<int> e2e_long = {8, 32};
  int long_prompt = 8000;  // SmolLM2's context is 8,192
  std::string model = "models/SmolLM2-135M-Instruct.Q4_1.gguf", theta;
  int repeats = 5;
  int by_kernel_context = 32768;
  // SmolLM2 with a k = 128 post-softmax table calibrated at 8,192 tokens read 4.7% of the V
  // rows at that context (docs/results.md, the fidelity section); 5% is the second point.
  double v_target = 0.05;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--contexts") contexts = ParseList(v);
    else if (k == "--batches") batches = ParseList(v);
    else if (k == "--prefill") prefill = ParseList(v);
    else if (k == "--offload-contexts") offload_contexts = ParseList(v);
    else if (k == "--offload-batches") offload_batches = ParseList(v);
    else if (k == "--e2e-batches") e2e = ParseList(v);
    else if (k == "--e2e-long-batches") e2e_long = ParseList(v);
    else if (k == "--e2e-long-prompt") long_prompt = std::stoi(v);
    else if (k == "--model") model = v;
    else if (k == "--theta") theta = v;
    else if (k == "--repeats") repeats = std::stoi(v);
    else if (k == "--by-kernel-context") by_kernel_context = std::stoi(v);
    else if (k == "--v-target") v_target = std::stod(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (cu::DeviceCount() == 0) {
    std::fprintf(stderr, "no CUDA device is visible\n");
    return 1;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s\n", cu::DeviceDescription().c_str());
  const double bw = CopyBandwidth(repeats);
  std::printf("copy bandwidth: %.0f GB/s (device to device, read + write, median of %d)\n", bw / 1e9, repeats);
  g_summary.push_back({"copy bandwidth", std::to_string(int(bw / 1e9)) + " GB/s"});
  DecodeAttention(contexts, batches, by_kernel_context, v_target, bw, repeats,
                  prop.multiProcessorCount);
  OffloadDecodeAttention(offload_contexts, offload_batches, repeats, prop.multiProcessorCount);
  PrefillAttention(prefill, repeats, prop.multiProcessorCount);
  if (!model.empty() && std::filesystem::exists(model)) {
    std::vector<std::string> thetas;
    for (size_t at = 0; !theta.empty() && at != std::string::npos;) {
      const size_t comma = theta.find(',', at);
      thetas.push_back(theta.substr(at, comma == std::string::npos ? comma : comma - at));
      at = comma == std::string::npos ? comma : comma + 1;
    }
    EndToEnd(model, thetas, e2e, long_prompt, e2e_long, bw, std::max(1, repeats / 2));
  } else {
    std::printf("\n## end-to-end decode: model %s not found, skipped\n", model.c_str());
  }
  std::printf("\n## summary (%s)\n", cu::DeviceDescription().c_str());
  for (const Row& r : g_summary) std::printf("%-34s %s\n", r.what.c_str(), r.value.c_str());
  return 0;
}
