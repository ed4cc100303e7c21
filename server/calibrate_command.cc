// `thetaserve calibrate`: runs calibration text through the model with exact top-k attention
// and records, per (layer, query head, row length), the (k+1)-th largest value of each row;
// writes a θ file (mean + 0.1·std per log-spaced length bucket).
#include <chrono>
#include <cstdio>
#include <map>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/theta_calibrator.h"
#include "scheduler/sequence_runner.h"
#include "server/cli_args.h"
#include "server/commands.h"
#include "server/model_loading.h"

namespace thetaserve::server {
namespace {

constexpr char kUsage[] =
    "usage: thetaserve calibrate --model PATH --corpus FILE --out FILE [flags]\n"
    "  --k N                 survivors per row in calibrated layers (default 64)\n"
    "  --k-schedule L:K,...  k growing with the row length instead of one --k: K at length L,\n"
    "                        log-log interpolated between points, held outside (e.g.\n"
    "                        2048:64,8192:128); the θ file records it\n"
    "  --dense-layers N      first layers kept (nearly) dense (default 2)\n"
    "  --dense-k N           k of those layers (default 512)\n"
    "  --placement pre|post  threshold scores (pre) or probabilities (post; default)\n"
    "  --context N           window length in tokens (default 2048)\n"
    "  --max-tokens N        calibration tokens (default 32768)\n"
    "  --std-factor F        θ = mean + F·std (default 0.1)\n"
    "  --threads N --device cpu|cuda|auto (default cpu: exact top-k runs on the CPU)\n"
    "  --kv-cache-dtype auto|f32|f16|bf16|fp8|fp8_e4m3|fp8_e5m2|q8_0   the KV pages' element\n"
    "                        type the scores are computed over: the one the server will use\n"
    "                        (default auto: f16 on the CPU)\n"
    "  --exact-matmul        CPU: f32 activations for quantized weights, as `serve\n"
    "                        --exact-matmul` runs them (default: int8, faster)\n";

// "2048:64,8192:128" -> {(2048, 64), (8192, 128)}, validated.
absl::StatusOr<model::ThetaTable::KSchedule> ParseKSchedule(const std::string& text) {
  model::ThetaTable::KSchedule schedule;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    // A vector, not a pair: a pair drops a third field ("64:8:9" read as 64:8).
    const std::vector<absl::string_view> lk = absl::StrSplit(part, ':');
    int64_t L = 0;
    int32_t k = 0;
    if (lk.size() != 2 || !absl::SimpleAtoi(lk[0], &L) || !absl::SimpleAtoi(lk[1], &k)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--k-schedule: '", part, "' is not LENGTH:K (e.g. 2048:64,8192:128)"));
    }
    schedule.emplace_back(L, k);
  }
  absl::Status st = model::ThetaTable::ValidateKSchedule(schedule);
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("--k-schedule: ", st.message()));
  return schedule;
}

}  // namespace

int RunCalibrate(const std::vector<std::string>& argv) {
  const std::map<std::string, bool> known = {
      {"model", true},      {"corpus", true},  {"out", true},          {"k", true},
      {"k-schedule", true}, {"dense-layers", true}, {"dense-k", true}, {"placement", true},
      {"context", true},    {"max-tokens", true}, {"std-factor", true}, {"threads", true},
      {"device", true},     {"kv-cache-dtype", true}, {"exact-matmul", false}};
  CliArgs args;
  if (auto exit = ParseCommandLine("calibrate", argv, known, kUsage, &args)) return *exit;
  auto usage = [](const absl::Status& st) { return ReportFailure("calibrate", st, kExitUsage); };
  auto fail = [](const absl::Status& st) { return ReportFailure("calibrate", st, kExitFailed); };
  auto k = args.GetInt("k", 64, 1, kMaxCountFlag);
  auto dense_layers = args.GetInt("dense-layers", 2, 0, kMaxCountFlag);
  auto dense_k = args.GetInt("dense-k", 512, 1, kMaxCountFlag);
  auto context = args.GetInt("context", 2048, 2, kMaxCountFlag);
  auto max_tokens = args.GetInt("max-tokens", 32768, 1, kMaxCountFlag);
  auto std_factor = args.GetDouble("std-factor", 0.1, -100, 100);
  auto threads = args.GetInt("threads", 0, 0, kMaxThreadsFlag);
  auto device = ParseDevice(args.GetString("device", "cpu"));
  auto kv_dtype = ParseKvDtypeFlag(args.GetString("kv-cache-dtype", "auto"));
  for (const absl::Status& st : {k.status(), dense_layers.status(), dense_k.status(), context.status(),
                                 max_tokens.status(), std_factor.status(), threads.status(),
                                 device.status(), kv_dtype.status()}) {
    if (!st.ok()) return usage(st);
  }
  const std::string placement = args.GetString("placement", "post");
  if (placement != "pre" && placement != "post") {
    return usage(absl::InvalidArgumentError("--placement must be pre or post"));
  }
  if (!args.Has("out") || !args.Has("corpus")) {
    return usage(absl::InvalidArgumentError("--corpus and --out are required"));
  }
  model::ThetaTable::KSchedule schedule;
  if (args.Has("k-schedule")) {
    if (args.Has("k")) {
      return usage(absl::InvalidArgumentError("give --k or --k-schedule, not both"));
    }
    auto parsed = ParseKSchedule(args.GetString("k-schedule"));
    if (!parsed.ok()) return usage(parsed.status());
    schedule = std::move(*parsed);
    *k = schedule.front().second;
    // θ past --context is extrapolated from shorter rows, not calibrated with the schedule's
    // larger k: a schedule reaching past the windows would silently not apply there.
    if (*context < schedule.back().first) {
      return usage(absl::InvalidArgumentError(absl::StrCat(
          "--context ", *context, " is shorter than the k schedule's last length ",
          schedule.back().first, ": calibrate with --context >= it")));
    }
  }
  if (*k < 1 || *context <= *k) {
    return usage(absl::InvalidArgumentError("need 1 <= --k < --context"));
  }
  if (*max_tokens < *context) {  // as eval: said before the model loads, not after
    return usage(absl::InvalidArgumentError(absl::StrCat(
        "--max-tokens ", *max_tokens, " is less than one --context window of ", *context)));
  }
  if (absl::Status st = CheckModelFlag(args.GetString("model")); !st.ok()) return usage(st);
  // The file is written at the end: a path that cannot be written fails now, not after the run.
  if (absl::Status st = CheckWritable("out", args.GetString("out")); !st.ok()) return fail(st);
  auto text = ReadCorpus("corpus", args.GetString("corpus"));
  if (!text.ok()) return fail(text.status());

  auto loaded = LoadModelForCli(args.GetString("model"), *device, static_cast<int>(*threads),
                                MatMulFlag(args), *kv_dtype);
  if (!loaded.ok()) return fail(loaded.status());
  const auto& c = loaded->model->config();
  if (*dense_layers >= c.num_layers) {
    // Every layer dense: a file of no thresholds (it was written, every θ null).
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "--dense-layers ", *dense_layers, " leaves none of the model's ", c.num_layers,
        " layers to calibrate")));
  }
  if (*context > c.max_context) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "--context ", *context, " is longer than the model's context of ", c.max_context,
        " tokens")));
  }
  const std::vector<int32_t> ids = TokenizePrefix(loaded->model->tokenizer(), *text, *max_tokens);
  const int64_t windows = int64_t(ids.size()) / *context;
  if (windows == 0) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(args.GetString("corpus"), " holds ", ids.size(),
                     " tokens, fewer than one --context window of ", *context)));
  }

  model::ThetaTable shape(static_cast<int32_t>(c.num_layers), static_cast<int32_t>(c.num_heads),
                          model::ThetaTable::DefaultBuckets(static_cast<int32_t>(*context)));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    shape.k_per_layer[l] = static_cast<int32_t>(l < *dense_layers ? *dense_k : *k);
  }
  shape.k_schedule = schedule;
  shape.placement = placement == "pre" ? model::ThetaPlacement::kPreSoftmax
                                       : model::ThetaPlacement::kPostSoftmax;
  shape.model_fingerprint = loaded->model->fingerprint();
  shape.model_name = c.name;
  shape.corpus = args.GetString("corpus");
  kernels::ThetaCalibrator calibrator(shape);
  kernels::TopThetaConfig cfg;
  cfg.table = &shape;  // k per layer and placement; θ values come from exact top-k
  cfg.recorder = &calibrator;
  cfg.sdc = kernels::SdcMode::kExact;
  cfg.vmc = true;
  loaded->backend->SetTopTheta(cfg);

  auto runner = scheduler::SequenceRunner::Create(*loaded->backend, *context);
  if (!runner.ok()) return fail(runner.status());
  const auto start = std::chrono::steady_clock::now();
  for (int64_t w = 0; w < windows; ++w) {
    runner->Reset();
    auto out = runner->Append(std::span<const int32_t>(ids.data() + w * *context, *context));
    if (!out.ok()) return fail(out.status());
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const int width = 30, done = static_cast<int>(width * (w + 1) / windows);
    std::fprintf(stderr, "\rcalibrating [%s%s] %lld/%lld windows, %lld rows, %.0f s, eta %.0f s   ",
                 std::string(done, '#').c_str(), std::string(width - done, '.').c_str(),
                 (long long)(w + 1), (long long)windows, (long long)calibrator.rows(), secs,
                 secs / (w + 1) * (windows - w - 1));
  }
  std::fprintf(stderr, "\n");
  model::ThetaTable table = calibrator.Build(*std_factor);
  table.calibration_tokens = windows * *context;
  absl::Status st = table.Save(args.GetString("out"));
  if (!st.ok()) return fail(st);
  std::printf("wrote %s: %s placement, k=%s (first %lld layers k=%lld), %lld tokens, %lld rows, fingerprint %s\n",
              args.GetString("out").c_str(), placement.c_str(),
              schedule.empty() ? absl::StrCat(*k).c_str() : args.GetString("k-schedule").c_str(),
              (long long)*dense_layers,
              (long long)*dense_k, (long long)table.calibration_tokens, (long long)calibrator.rows(),
              table.fingerprint.c_str());
  return 0;
}

}  // namespace thetaserve::server
