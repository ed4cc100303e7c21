// Decode benchmark: tokens/s at given batch sizes through the real engine, and the bandwidth
// ratio = (weight bytes as stored ÷ decode step time) ÷ (memory copy bandwidth measured in the
// same run). Also offline generation throughput at given concurrencies.
//
//   build/thetaserve_bench --model models/SmolLM2-135M-Instruct.Q4_1.gguf --batches 1,16
//       --concurrency 1,8,32,64 --repeats 5   (one command)
//   --shared-prefix 1024 [--shared-requests 16] adds requests that share a preamble, timed with
//   the prefix cache on and off; --kv-dtype f32|f16|bf16|fp8_e4m3|fp8_e5m2|q8_0 sets the KV
//   pages' type (default f16)
// At the largest batch it also times decode steps with sampling (temperature 0.7, top-p 0.9)
// against greedy, on one sampling thread and on the pool.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "scheduler/engine.h"

namespace ts = thetaserve;
using ts::bench::Median;
using ts::bench::Now;
using ts::bench::IntFlag;
using ts::bench::ParseFlags;
using ts::bench::ParseList;

namespace {

// Copy bandwidth in bytes/s (read + write traffic) over a buffer far larger than the caches,
// using `threads` threads like the forward pass does.
double CopyBandwidth(int threads) {
  const size_t bytes = size_t(1) << 30;  // 1 GiB each way, > 4x the largest L3 seen here
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    double t0 = Now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        size_t chunk = bytes / threads;
        std::memcpy(b.data() + t * chunk, a.data() + t * chunk, chunk);
      });
    }
    for (auto& th : ts) th.join();
    runs.push_back(2.0 * bytes / (Now() - t0));
  }
  return Median(runs);
}

constexpr char kUsage[] =
    "usage: thetaserve_bench [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--batches 1,16]\n"
    "    [--concurrency 1,8,32,64] [--repeats 5] [--threads N] [--prompt-tokens 32]\n"
    "    [--decode-tokens 32] [--shared-prefix TOKENS [--shared-requests 16]]\n"
    "    [--kv-dtype auto|f32|f16|bf16|fp8_e4m3|fp8_e5m2|q8_0]\n";

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string batches = "1,16", concurrency = "1,8,32,64";
  int repeats = 5, threads = 0, prompt_tokens = 32, decode_tokens = 32;
  int shared_prefix = 0, shared_requests = 16;
  ts::kernels::KvDtype kv_dtype = ts::kernels::KvDtype::kAuto;
  ParseFlags(argc, argv, kUsage, [&](const std::string& k, const std::string& v) {
    if (k == "--model") model_path = v;
    else if (k == "--batches") batches = v;
    else if (k == "--concurrency") concurrency = v;
    else if (k == "--repeats") repeats = IntFlag(k, v);
    else if (k == "--threads") threads = IntFlag(k, v);
    else if (k == "--prompt-tokens") prompt_tokens = IntFlag(k, v);
    else if (k == "--decode-tokens") decode_tokens = IntFlag(k, v);
    else if (k == "--shared-prefix") shared_prefix = IntFlag(k, v);
    else if (k == "--shared-requests") shared_requests = IntFlag(k, v);
    else if (k == "--kv-dtype") {
      if (!ts::kernels::ParseKvDtype(v, &kv_dtype)) {
        std::fprintf(stderr, "--kv-dtype must be auto, f32, f16, bf16, fp8_e4m3, fp8_e5m2 or q8_0, got '%s'\n",
                     v.c_str());
        std::exit(2);
      }
    } else {
      return false;
    }
    return true;
  });
  std::fprintf(stderr, "loading %s ...\n", model_path.c_str());
  auto model = ts::model::Model::Load(model_path);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  auto backend = ts::kernels::CreateBackend(**model, ts::kernels::Device::kCpu, threads,
                                            ts::kernels::MatMulMode::kQuantized, kv_dtype);
  if (!backend.ok()) return 1;
  const int nthreads = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  std::fprintf(stderr, "measuring copy bandwidth (1 GiB buffers, %d threads) ...\n", nthreads);
  const double bw = CopyBandwidth(nthreads);
  const double weight_bytes = double((*model)->weight_bytes());
  std::printf("machine: %u hardware threads; copy bandwidth %.2f GB/s (read+write, median of 5)\n",
              std::thread::hardware_concurrency(), bw / 1e9);
  std::printf("model: %s, %.1f MB of weights as stored; KV pages in %s\n\n",
              (*model)->config().name.c_str(), weight_bytes / 1e6,
              std::string(ts::kernels::KvDtypeName((*backend)->kv_dtype())).c_str());

  ts::scheduler::EngineConfig config;
  config.kv_cache_bytes = int64_t(1) << 30;
  config.scheduler.max_num_batched_tokens = 2048;

  // host ms: each step's time after its logits (sampling, the engine's bookkeeping).
  std::printf("%-8s %-16s %-14s %-16s %-8s\n", "batch", "step ms (median)", "tokens/s", "bandwidth ratio",
              "host ms");
  for (int b : ParseList(batches)) {
    std::vector<double> step_ms, host_ms;
    for (int rep = 0; rep < repeats; ++rep) {
      auto times = ts::bench::DecodeStepMedians(config, **backend, **model, b, prompt_tokens, decode_tokens);
      if (!times.ok()) {
        std::fprintf(stderr, "%s\n", std::string(times.status().message()).c_str());
        return 1;
      }
      step_ms.push_back(times->step_seconds * 1e3);
      host_ms.push_back(times->host_seconds * 1e3);
      std::fprintf(stderr, "\rbatch %d: repeat %d/%d, step %.2f ms   ", b, rep + 1, repeats, step_ms.back());
    }
    std::fprintf(stderr, "\n");
    const double ms = Median(step_ms);
    const double ratio = (weight_bytes / (ms / 1e3)) / bw;
    std::printf("%-8d %-16.2f %-14.1f %-16.3f %-8.3f\n", b, ms, b / (ms / 1e3), ratio, Median(host_ms));
  }

  // What sampling adds to a decode step: greedy against temperature 0.7, top-p 0.9 (seeded),
  // with the rows sampled on the engine thread alone and on the sampling pool; alternated.
  const std::vector<int> batch_list = ParseList(batches);
  if (const int b = batch_list.empty() ? 0 : *std::max_element(batch_list.begin(), batch_list.end()); b > 1) {
    const ts::scheduler::SamplingParams typical = ts::bench::TypicalSampling();
    struct Mode {
      const char* name;
      const ts::scheduler::SamplingParams* sampling;
      int threads;
    };
    const Mode modes[] = {{"greedy", nullptr, 1},
                          {"T 0.7 top-p 0.9, 1 sampling thread", &typical, 1},
                          {"T 0.7 top-p 0.9, sampling pool", &typical, nthreads}};
    std::vector<double> ms[3];
    for (int rep = 0; rep < repeats; ++rep) {
      for (int m = 0; m < 3; ++m) {
        ts::scheduler::EngineConfig sc = config;
        sc.sampling_threads = modes[m].threads;
        auto seconds = ts::bench::DecodeStepSeconds(sc, **backend, **model, b, prompt_tokens, decode_tokens,
                                                    modes[m].sampling);
        if (!seconds.ok()) return 1;
        ms[m].push_back(*seconds * 1e3);
      }
      std::fprintf(stderr, "\rsampling at batch %d: repeat %d/%d   ", b, rep + 1, repeats);
    }
    std::fprintf(stderr, "\n");
    std::printf("\ndecode step at batch %d: greedy vs sampled\n", b);
    std::printf("%-38s %-8s %-16s %-10s\n", "sampling", "threads", "step ms (median)", "÷ greedy");
    for (int m = 0; m < 3; ++m) {
      std::printf("%-38s %-8d %-16.2f %-10.3f\n", modes[m].name, modes[m].threads, Median(ms[m]),
                  Median(ms[m]) / Median(ms[0]));
    }
  }

  // Prefix caching: requests that share a preamble of `shared_prefix` tokens (then 32 tokens of
  // their own, 16 output tokens). One request runs first; then the others arrive together, and
  // their wall time and time to first token are timed with the cache on and off, alternated.
  if (shared_prefix > 0 && shared_requests > 1) {
    auto request = [&](int i) {
      ts::scheduler::Request r = ts::bench::MakeRequest(**model, 0, shared_prefix, 16);
      const ts::scheduler::Request own = ts::bench::MakeRequest(**model, 1000 + 37 * i, 32, 16);
      r.prompt.insert(r.prompt.end(), own.prompt.begin(), own.prompt.end());
      r.id = "shared-" + std::to_string(i);
      return r;
    };
    struct Run {
      double first_s = 0, rest_s = 0, rest_ttft_s = 0;
      int64_t prompt_computed = 0, hits = 0, peak_pages = 0, page_bytes = 0;
    };
    auto run = [&](bool caching) -> absl::StatusOr<Run> {
      ts::scheduler::EngineConfig pc = config;
      pc.prefix_caching = caching;
      pc.scheduler.max_num_seqs = shared_requests;
      auto engine = ts::scheduler::Engine::Create(pc, **backend);
      if (!engine.ok()) return engine.status();
      Run out;
      // Pages held by requests at the fullest step (a shared page counts once).
      std::atomic<int64_t> peak{0};
      (*engine)->SetObserver([&peak](const ts::scheduler::EngineStats& s, const ts::scheduler::StepStats*) {
        peak.store(std::max(peak.load(), s.pages_used_k + s.pages_used_v));
      });
      auto first = std::make_shared<ts::bench::CountingSink>();
      double t0 = Now();
      if (auto st = (*engine)->Submit(request(0), first); !st.ok()) return st;
      first->WaitFor(1);
      out.first_s = Now() - t0;
      auto rest = std::make_shared<ts::bench::CountingSink>();
      t0 = Now();
      for (int i = 1; i < shared_requests; ++i) {
        if (auto st = (*engine)->Submit(request(i), rest); !st.ok()) return st;
      }
      rest->WaitFor(shared_requests - 1);
      out.rest_s = Now() - t0;
      out.rest_ttft_s = rest->MedianTtft();
      (*engine)->Stop();
      const auto stats = (*engine)->Stats();
      out.prompt_computed = stats.counters.prompt_tokens;
      out.hits = stats.counters.prefix_hit_tokens;
      out.peak_pages = peak.load();
      out.page_bytes = stats.page_bytes;
      return out;
    };
    std::vector<double> rest_s[2], ttft_s[2], first_s[2];
    Run last[2];
    for (int rep = 0; rep < repeats; ++rep) {
      for (int caching = 0; caching < 2; ++caching) {
        auto r = run(caching == 1);
        if (!r.ok()) {
          std::fprintf(stderr, "%s\n", std::string(r.status().message()).c_str());
          return 1;
        }
        rest_s[caching].push_back(r->rest_s);
        ttft_s[caching].push_back(r->rest_ttft_s);
        first_s[caching].push_back(r->first_s);
        last[caching] = *r;
      }
      std::fprintf(stderr, "\rshared prefix: repeat %d/%d   ", rep + 1, repeats);
    }
    std::fprintf(stderr, "\n");
    std::printf("\nshared prefix: %d requests of a %d-token preamble + 32 tokens of their own, 16 output "
                "tokens; the first alone, then the other %d at once\n",
                shared_requests, shared_prefix, shared_requests - 1);
    std::printf("%-16s %-16s %-14s %-18s %-18s %-14s %-18s\n", "prefix caching", "prompt computed",
                "tokens found", "first request s", "other requests s", "their TTFT s",
                "peak KV in use MB");
    for (int caching = 0; caching < 2; ++caching) {
      std::printf("%-16s %-16lld %-14lld %-18.3f %-18.3f %-14.3f %-18.1f\n", caching ? "on" : "off",
                  static_cast<long long>(last[caching].prompt_computed),
                  static_cast<long long>(last[caching].hits), Median(first_s[caching]),
                  Median(rest_s[caching]), Median(ttft_s[caching]),
                  double(last[caching].peak_pages) * last[caching].page_bytes / 1e6);
    }
    std::printf("off ÷ on: other requests %.2f×, their median TTFT %.2f×, peak KV in use %.2f×\n",
                Median(rest_s[0]) / Median(rest_s[1]), Median(ttft_s[0]) / Median(ttft_s[1]),
                double(last[0].peak_pages) / double(last[1].peak_pages));
  }

  std::printf("\noffline throughput (all requests queued at once; %d-token prompts, %d output tokens)\n",
              prompt_tokens, decode_tokens * 2);
  std::printf("%-12s %-10s %-16s\n", "concurrency", "requests", "output tok/s (median)");
  for (int c : ParseList(concurrency)) {
    std::vector<double> tps;
    for (int rep = 0; rep < repeats; ++rep) {
      config.scheduler.max_num_seqs = c;
      auto engine = ts::scheduler::Engine::Create(config, **backend);
      if (!engine.ok()) return 1;
      auto sink = std::make_shared<ts::bench::CountingSink>();
      const int n = std::max(c * 2, 4);
      double t0 = Now();
      for (int i = 0; i < n; ++i) {
        auto st = (*engine)->Submit(ts::bench::MakeRequest(**model, i, prompt_tokens, decode_tokens * 2), sink);
        if (!st.ok()) return 1;
      }
      sink->WaitFor(n);
      tps.push_back(sink->tokens() / (Now() - t0));
      (*engine)->Stop();
      std::fprintf(stderr, "\rconcurrency %d: repeat %d/%d, %.1f tok/s   ", c, rep + 1, repeats, tps.back());
    }
    std::fprintf(stderr, "\n");
    std::printf("%-12d %-10d %-16.1f\n", c, std::max(c * 2, 4), Median(tps));
  }
  return 0;
}
