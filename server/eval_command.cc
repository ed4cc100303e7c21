// `thetaserve eval`: perplexity of a model on a text file in windows of `--context` tokens,
// and, with --theta, the fidelity of Top-θ against dense attention on the same windows:
// perplexity (and its change), next-token agreement, mean KL(dense ‖ Top-θ), V rows read and
// stored per L, attention elements kept.
//
// Each window: the first half is a prompt (prefill), the second half is teacher-forced
// decoding. Under policy full a row's attention is the same whether prefilled or decoded, so
// the second half runs as one more prefill chunk; under policy sparse or offload the cache is compacted
// after every 512-token prompt chunk (as the server does) and the second half is decoded token
// by token, compacted after each.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/backend.h"
#include "nlohmann/json.hpp"
#include "scheduler/sequence_runner.h"
#include "server/cli_args.h"
#include "server/commands.h"
#include "server/model_loading.h"
#include "server/theta_options.h"

namespace thetaserve::server {
namespace {

constexpr char kUsage[] =
    "usage: thetaserve eval --model PATH --text FILE [flags]\n"
    "  --context N       window length in tokens (default 2048)\n"
    "  --max-tokens N    tokens of the text to evaluate (default 65536)\n"
    "  --threads N --device cpu|cuda|auto\n"
    "  --exact-matmul    CPU: f32 activations for quantized weights (default: int8, faster)\n"
    "  --kv-cache-dtype auto|f32|f16|bf16|fp8|fp8_e4m3|fp8_e5m2|q8_0   the KV pages' element\n"
    "                    type (default auto: f16 on the CPU). With Top-θ the run is compared\n"
    "                    against dense attention over the same KV type; without, a type other\n"
    "                    than f32 given here is compared against f32 pages (CPU only)\n"
    "  --out FILE        append one JSON line with the result\n";

struct RowStats {
  double nll = 0, nll_ref = 0, kl = 0;
  int64_t n = 0, agree = 0;
  // The decoded half of each window alone (rows after the prompt): what the sparse policy's
  // dropped rows can affect; the prompt half's rows see every V row.
  double decode_nll = 0, decode_nll_ref = 0;
  int64_t decode_n = 0;
};

// log-softmax of a row into `out`.
void LogSoftmax(const float* row, int64_t vocab, std::vector<double>& out) {
  out.resize(vocab);
  float m = row[0];
  for (int64_t v = 1; v < vocab; ++v) m = std::max(m, row[v]);
  double s = 0;
  for (int64_t v = 0; v < vocab; ++v) s += std::exp(double(row[v]) - m);
  const double lse = m + std::log(s);
  for (int64_t v = 0; v < vocab; ++v) out[v] = row[v] - lse;
}

}  // namespace

int RunEval(const std::vector<std::string>& argv) {
  std::map<std::string, bool> known = {{"model", true}, {"text", true}, {"context", true},
                                       {"max-tokens", true}, {"threads", true}, {"device", true},
                                       {"out", true}, {"exact-matmul", false},
                                       {"kv-cache-dtype", true}};
  for (const auto& [name, v] : ThetaFlags()) known[name] = v;
  CliArgs args;
  if (auto exit = ParseCommandLine("eval", argv, known, std::string(kUsage) + kThetaUsage,
                                   &args)) {
    return *exit;
  }
  auto usage = [](const absl::Status& st) { return ReportFailure("eval", st, kExitUsage); };
  auto fail = [](const absl::Status& st) { return ReportFailure("eval", st, kExitFailed); };
  auto context = args.GetInt("context", 2048, 4, kMaxCountFlag);
  auto max_tokens = args.GetInt("max-tokens", 65536, 1, kMaxCountFlag);
  auto threads = args.GetInt("threads", 0, 0, kMaxThreadsFlag);
  auto device = ParseDevice(args.GetString("device", "auto"));
  auto kv_dtype = ParseKvDtypeFlag(args.GetString("kv-cache-dtype", "auto"));
  for (const absl::Status& st : {context.status(), max_tokens.status(), threads.status(),
                                 device.status(), kv_dtype.status()}) {
    if (!st.ok()) return usage(st);
  }
  if (*max_tokens < *context) {
    return usage(absl::InvalidArgumentError(absl::StrCat(
        "--max-tokens ", *max_tokens, " is less than one --context window of ", *context)));
  }
  if (!args.Has("text")) return usage(absl::InvalidArgumentError("--text is required"));
  if (absl::Status st = CheckModelFlag(args.GetString("model")); !st.ok()) return usage(st);
  auto theta = ParseThetaOptions(args);
  if (!theta.ok()) return usage(theta.status());
  if (absl::Status st = LoadThetaFile(*theta); !st.ok()) return fail(st);
  // --out is appended to at the end: a path that cannot be written fails now, not after the run
  // (it was silent then).
  if (args.Has("out")) {
    if (absl::Status st = CheckWritable("out", args.GetString("out")); !st.ok()) return fail(st);
  }
  const std::string text_path = args.GetString("text");
  auto text = ReadCorpus("text", text_path);
  if (!text.ok()) return fail(text.status());

  const kernels::MatMulMode matmul = MatMulFlag(args);
  auto loaded = LoadModelForCli(args.GetString("model"), *device, static_cast<int>(*threads),
                                matmul, *kv_dtype);
  if (!loaded.ok()) return fail(loaded.status());
  if (absl::Status st = CheckThetaForModel(*theta, *loaded->model); !st.ok()) return fail(st);
  if (*context > loaded->model->config().max_context) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--context ", *context, " is longer than the model's context of ",
                     loaded->model->config().max_context, " tokens")));
  }
  const std::vector<int32_t> ids = TokenizePrefix(loaded->model->tokenizer(), *text, *max_tokens);
  const int64_t windows = static_cast<int64_t>(ids.size()) / *context;
  if (windows == 0) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(text_path, " holds ", ids.size(),
                     " tokens, fewer than one --context window of ", *context)));
  }
  const int64_t vocab = loaded->model->config().vocab_size;
  const int64_t P = *context / 2;  // prompt part of each window

  // The dense reference runs on a second backend over the same weights: over the same KV
  // type as the run when Top-θ is on (so that it measures Top-θ alone), else, when a narrower
  // type was asked for on the CPU, over f32 pages (so that the type is measured). A difference of a few thousandths of a
  // nat of KL is what any change to the activations costs under int8 matmul: measure a KV
  // type with --exact-matmul (docs/results.md).
  std::unique_ptr<kernels::Backend> dense_backend;
  std::optional<scheduler::SequenceRunner> dense_runner;
  const kernels::KvDtype kv = loaded->backend->kv_dtype();
  const bool on_cpu = loaded->backend->name() == "cpu";
  const bool compare = theta->table != nullptr ||
                       (on_cpu && args.Has("kv-cache-dtype") && kv != kernels::KvDtype::kF32);
  if (compare) {
    auto reference = kernels::CreateBackend(
        *loaded->model, *device, static_cast<int>(*threads), matmul,
        theta->table != nullptr ? kv : kernels::KvDtype::kF32);
    if (!reference.ok()) return fail(reference.status());
    dense_backend = std::move(*reference);
    auto r = scheduler::SequenceRunner::Create(*dense_backend, *context);
    if (!r.ok()) return fail(r.status());
    dense_runner.emplace(std::move(*r));
    loaded->backend->SetTopTheta(theta->config);
  }
  auto runner = scheduler::SequenceRunner::Create(*loaded->backend, *context, 16, theta->sparse);
  if (!runner.ok()) return fail(runner.status());

  RowStats rows;
  kernels::AttentionStats prefill_stats, decode_stats;
  prefill_stats.Reset(loaded->model->config().num_layers);
  decode_stats.Reset(loaded->model->config().num_layers);
  double stored_ratio_sum = 0, host_ratio_sum = 0;
  int64_t evicted = 0;
  std::vector<double> lp, lq;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t w = 0; w < windows; ++w) {
    std::span<const int32_t> window(ids.data() + w * *context, *context);
    runner->Reset();
    // Logits for every position, [context, vocab]: the prompt in the server's 512-token
    // chunks; then, under policy sparse or offload, one token at a time as decoding would (the runner
    // compacts after each chunk). Under policy full a row's attention is the same prefilled
    // or decoded, so the rest goes in 512-token chunks.
    auto logits = runner->Append(window.subspan(0, P), true, 512, &prefill_stats);
    if (!logits.ok()) return fail(logits.status());
    auto tail = runner->Append(window.subspan(P), true, theta->sparse.enabled ? 1 : 512,
                               &decode_stats);
    if (!tail.ok()) return fail(tail.status());
    logits->insert(logits->end(), tail->begin(), tail->end());
    evicted += runner->rows_dropped();
    stored_ratio_sum += double(runner->v_rows_resident()) / runner->v_rows_dense();
    host_ratio_sum += double(runner->v_rows_offloaded()) / runner->v_rows_dense();

    std::vector<float> ref;
    if (compare) {
      dense_runner->Reset();
      auto r = dense_runner->Append(window, true);
      if (!r.ok()) return fail(r.status());
      ref = std::move(*r);
    }
    for (int64_t i = 0; i + 1 < *context; ++i) {
      LogSoftmax(logits->data() + i * vocab, vocab, lq);
      rows.nll -= lq[window[i + 1]];
      ++rows.n;
      const bool decoded = i >= P;
      if (decoded) {
        rows.decode_nll -= lq[window[i + 1]];
        ++rows.decode_n;
      }
      if (compare) {
        LogSoftmax(ref.data() + i * vocab, vocab, lp);
        rows.nll_ref -= lp[window[i + 1]];
        if (decoded) rows.decode_nll_ref -= lp[window[i + 1]];
        double kl = 0;
        int64_t a = 0, b = 0;
        for (int64_t v = 0; v < vocab; ++v) {
          kl += std::exp(lp[v]) * (lp[v] - lq[v]);
          if (lp[v] > lp[a]) a = v;
          if (lq[v] > lq[b]) b = v;
        }
        rows.kl += kl;
        rows.agree += a == b;
      }
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "\r[%lld/%lld windows] ppl %.4f%s, %.0f s, eta %.0f s   ", (long long)(w + 1),
                 (long long)windows, std::exp(rows.nll / rows.n),
                 compare ? absl::StrFormat(" (dense %.4f)", std::exp(rows.nll_ref / rows.n)).c_str() : "",
                 secs, secs / (w + 1) * (windows - w - 1));
    std::fflush(stderr);
  }
  std::fprintf(stderr, "\n");
  const double ppl = std::exp(rows.nll / rows.n);
  auto ratio = [](int64_t a, int64_t b) { return b ? double(a) / b : 1.0; };
  // Names and paths as JSON strings (a path may hold a quote or a backslash; bytes that are
  // not UTF-8 become U+FFFD).
  auto quoted = [](const std::string& s) {
    return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  std::string json = absl::StrFormat(
      "{\"model\":%s,\"text\":%s,\"context\":%d,\"tokens\":%d,\"mode\":\"%s\","
      "\"policy\":\"%s\",\"sdc\":\"%s\",\"vmc\":%s,\"theta_file\":%s,\"perplexity\":%.5f,"
      "\"matmul\":\"%s\",\"kv_cache_dtype\":\"%s\"",
      quoted(loaded->model->config().name), quoted(text_path), *context, rows.n, theta->mode(),
      theta->policy, kernels::SdcModeName(theta->config.sdc), theta->config.vmc ? "true" : "false",
      quoted(args.GetString("theta")), ppl, matmul == kernels::MatMulMode::kExact ? "f32" : "int8",
      kernels::KvDtypeName(loaded->backend->kv_dtype()));
  if (compare) {
    const double ref_ppl = std::exp(rows.nll_ref / rows.n);
    const std::vector<int32_t> no_k;
    const auto& k = theta->table ? theta->table->k_per_layer : no_k;
    json += absl::StrFormat(
        ",\"k\":%d,\"dense_perplexity\":%.5f,\"ppl_change_pct\":%.3f,\"agreement\":%.5f,"
        "\"mean_kl\":%.6f,\"decode_v_rows_read_per_L\":%.5f,\"prefill_v_rows_read_per_L\":%.5f,"
        "\"v_rows_stored_per_L\":%.5f,\"prefill_elements_kept\":%.5f,"
        "\"decode_elements_kept\":%.5f,\"retained_but_evicted_per_decode_row\":%.6f,"
        "\"rows_evicted\":%d,\"decode_perplexity\":%.5f,\"dense_decode_perplexity\":%.5f,"
        "\"decode_ppl_change_pct\":%.3f,\"retain_factor\":%g,\"local_window\":%d,\"obs_window\":%d,"
        "\"keep_fraction\":%g,\"v_rows_host_per_L\":%.5f,\"decode_v_rows_read_host_per_L\":%.6f",
        k.empty() ? 0 : k.back(), ref_ppl, 100.0 * (ppl / ref_ppl - 1.0),
        double(rows.agree) / rows.n, rows.kl / rows.n,
        ratio(decode_stats.v_rows_read, decode_stats.v_rows_read_dense),
        ratio(prefill_stats.v_rows_read, prefill_stats.v_rows_read_dense),
        stored_ratio_sum / windows,
        ratio(prefill_stats.elements_kept, prefill_stats.elements_dense),
        ratio(decode_stats.elements_kept, decode_stats.elements_dense),
        ratio(decode_stats.retained_but_evicted, decode_stats.v_rows_read_dense), evicted,
        std::exp(rows.decode_nll / rows.decode_n), std::exp(rows.decode_nll_ref / rows.decode_n),
        100.0 * (std::exp((rows.decode_nll - rows.decode_nll_ref) / rows.decode_n) - 1.0),
        theta->config.retain_factor, theta->sparse.local_window, theta->sparse.obs_window,
        theta->sparse.keep_fraction, host_ratio_sum / windows,
        ratio(decode_stats.v_rows_read_host, decode_stats.v_rows_read_dense));
    if (theta->table && !theta->table->k_schedule.empty()) {
      std::vector<std::string> points;
      for (const auto& [L, kk] : theta->table->k_schedule) points.push_back(absl::StrCat(L, ":", kk));
      json += absl::StrCat(",\"k_schedule\":\"", absl::StrJoin(points, ","), "\"");
    }
  }
  json += "}";
  std::printf("perplexity %.4f over %lld predicted tokens (%lld windows of %lld) on %s\n", ppl,
              (long long)rows.n, (long long)windows, (long long)*context, text_path.c_str());
  std::printf("%s\n", json.c_str());
  if (args.Has("out")) {
    std::ofstream out(args.GetString("out"), std::ios::app);
    out << json << "\n";
    out.flush();
    if (!out) {
      return fail(absl::InternalError(absl::StrCat("cannot write ", args.GetString("out"))));
    }
  }
  return 0;
}

}  // namespace thetaserve::server
