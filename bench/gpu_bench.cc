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
#include "bench/gpu_bench_common.h"
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
using namespace thetaserve::bench::gpu;  // the sections' shared pieces (gpu_bench_common.h)
using ts::bench::Median;
using ts::bench::DoubleFlag;
using ts::bench::IntFlag;
using ts::bench::ParseFlags;
using ts::bench::ParseList;

namespace {

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
      Summary().push_back({"prefill attn " + std::to_string(L) + " tokens", buf});
      std::snprintf(buf, sizeof buf, "tiled %.2f ms, split %.2f ms (%.2fx)", tiled, split,
                    split / tiled);
      Summary().push_back({"top-θ prefill " + std::to_string(L) + " tokens", buf});
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
        Summary().push_back({"e2e decode " + names[mode] + ", " +
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
    Summary().push_back({"e2e greedy pick, 128 × " + std::to_string(B), buf});
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
    Summary().push_back({"e2e T 0.7 p 0.9, 128 × " + std::to_string(B) + ", " + std::to_string(threads) + " thr",
                         buf});
  }
}

constexpr char kUsage[] =
    "usage: thetaserve_gpu_bench [--contexts 1024,4096,16384,32768,131072] [--batches 1,8,32,64]\n"
    "    [--prefill 1024,4096,16384] [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]\n"
    "    [--e2e-batches 1,8,32,64] [--e2e-long-prompt 8000] [--e2e-long-batches 8,32]\n"
    "    [--theta thetas.json[,pre.json]] [--offload-contexts 8192,32768]\n"
    "    [--offload-batches 1,8,32] [--by-kernel-context 32768] [--v-target 0.05] [--repeats 5]\n";

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
  ParseFlags(argc, argv, kUsage, [&](const std::string& k, const std::string& v) {
    if (k == "--contexts") contexts = ParseList(v);
    else if (k == "--batches") batches = ParseList(v);
    else if (k == "--prefill") prefill = ParseList(v);
    else if (k == "--offload-contexts") offload_contexts = ParseList(v);
    else if (k == "--offload-batches") offload_batches = ParseList(v);
    else if (k == "--e2e-batches") e2e = ParseList(v);
    else if (k == "--e2e-long-batches") e2e_long = ParseList(v);
    else if (k == "--e2e-long-prompt") long_prompt = IntFlag(k, v);
    else if (k == "--model") model = v;
    else if (k == "--theta") theta = v;
    else if (k == "--repeats") repeats = IntFlag(k, v);
    else if (k == "--by-kernel-context") by_kernel_context = IntFlag(k, v);
    else if (k == "--v-target") v_target = DoubleFlag(k, v);
    else return false;
    return true;
  });
  if (cu::DeviceCount() == 0) {
    std::fprintf(stderr, "no CUDA device is visible\n");
    return 1;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s\n", cu::DeviceDescription().c_str());
  const double bw = CopyBandwidth(repeats);
  std::printf("copy bandwidth: %.0f GB/s (device to device, read + write, median of %d)\n", bw / 1e9, repeats);
  Summary().push_back({"copy bandwidth", std::to_string(int(bw / 1e9)) + " GB/s"});
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
  for (const Row& r : Summary()) std::printf("%-34s %s\n", r.what.c_str(), r.value.c_str());
  return 0;
}
