// `thetaserve serve`: the gRPC server. Loads the model, warms up, serves Generate with health,
// reflection and /metrics, and drains on SIGTERM/SIGINT.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "scheduler/engine.h"
#include "server/cli_args.h"
#include "server/commands.h"
#include "server/generation_service.h"
#include "server/http_server.h"
#include "server/kv_cache_size.h"
#include "server/metrics.h"
#include "server/model_loading.h"
#include "server/openai_http.h"
#include "server/request_log.h"
#include "server/shutdown_signals.h"
#include "server/theta_options.h"

namespace thetaserve::server {
namespace {

constexpr char kUsage[] =
    "usage: thetaserve serve --model PATH [flags]\n"
    "  --model PATH                 GGUF file or Hugging Face directory\n"
    "  --host ADDR                  listen address (default 0.0.0.0)\n"
    "  --port N                     gRPC port (default 50051; 0: any free port, logged)\n"
    "  --metrics-port N             Prometheus /metrics port (default 9090; 0 = off)\n"
    "  --http-port N                OpenAI-compatible HTTP API (/v1/completions,\n"
    "                               /v1/chat/completions, /v1/models) on this port\n"
    "                               (default 0 = off; vLLM's is 8000)\n"
    "  --served-model-name NAME[,ALIAS...]\n"
    "                               the model name the HTTP API answers to (default: the\n"
    "                               --model file's name without .gguf); aliases are taken\n"
    "                               too and listed by /v1/models (vLLM's several names)\n"
    "  --allowed-origins LIST       origins whose browser pages may call the HTTP API (CORS):\n"
    "                               * (default, as vLLM), none, or a comma-separated list\n"
    "                               such as https://app.example.com\n"
    "  --max-http-connections N     HTTP API connections open at once; more get 503 (default\n"
    "                               4096; an idle or arriving one holds no thread, but a\n"
    "                               descriptor: the process's limit is raised to allow them)\n"
    "  --stream-head-timeout S      seconds a stream's response head waits for its first\n"
    "                               event, so a request that fails while queued gets its\n"
    "                               HTTP status (429, 503) (default 15; 0: at once, as vLLM)\n"
    "  --max-model-len N            context served, prompt and output together, at most the\n"
    "                               model's (default: the model's); shortens the longest\n"
    "                               request and the CPU's default KV cache with it\n"
    "  --max-num-seqs N             running sequences at once (default 64)\n"
    "  --max-num-batched-tokens N   token budget per engine step (default 512)\n"
    "  --long-prefill-tokens N      while a step is shared (another request runs or waits\n"
    "                               to start), a prompt computes at most N tokens of it\n"
    "                               until the others have theirs, so a long prompt does not\n"
    "                               hold later requests' tokens, first or later, behind its\n"
    "                               whole prefill (the budget they leave goes back to it);\n"
    "                               0 (or N >= the budget): no limit (default: a quarter of\n"
    "                               --max-num-batched-tokens)\n"
    "  --scheduling-policy P        fcfs (default): requests start in arrival order; or\n"
    "                               priority (vLLM's): by each request's priority, lower\n"
    "                               first, and a waiting request with no slot or no KV room\n"
    "                               preempts running ones of a strictly later priority when\n"
    "                               that lets it start\n"
    "  --priority-aging R           with --scheduling-policy priority: priority levels a\n"
    "                               request gains per second since it arrived, so work kept\n"
    "                               waiting by more urgent requests is not starved: a request\n"
    "                               of priority p goes before those of priority q < p that\n"
    "                               arrive more than (p - q) / R seconds after it (default 0:\n"
    "                               strict priorities, as vLLM's)\n"
    "  --kv-cache-memory SIZE|PCT%  KV page pool size, e.g. 512M, or a share of the memory\n"
    "                               free once the model is loaded, less 1 GiB for per-step\n"
    "                               buffers, e.g. 90% (default 90% on a GPU; on the CPU\n"
    "                               256M, or one full-context sequence if more)\n"
    "  --kv-cache-dtype auto|f32|f16|bf16|fp8|fp8_e4m3|fp8_e5m2|q8_0\n"
    "                               element type of the KV cache's pages: f16 and bf16 hold\n"
    "                               twice the tokens of f32, fp8 (= fp8_e4m3) four times, q8_0\n"
    "                               (int8 codes, an f16 scale per 32) 3.76 times, at some cost\n"
    "                               in accuracy (docs/results.md) (default auto: f16 on the\n"
    "                               CPU, bf16 on a GPU, which stores only bf16)\n"
    "  --exact-matmul               CPU: multiply the quantized weights with f32 activations\n"
    "                               (the reference tests' path: closer logits, a slower\n"
    "                               decode) instead of int8 ones (docs/results.md); the\n"
    "                               CUDA backend multiplies in bf16 either way\n"
    "  --block-size N               rows per KV page (default 16)\n"
    "  --max-queue N                waiting requests before RESOURCE_EXHAUSTED (default 1024);\n"
    "                               by priority, a request finding it full takes the place of\n"
    "                               a less urgent one waiting that has not started\n"
    "  --threads N                  CPU threads: the CPU backend's, and up to 16 that sample a\n"
    "                               step's rows in parallel (default: all cores)\n"
    "  --device cpu|cuda|auto       (default auto)\n"
    "  --prefix-caching on|off      keep computed prompt blocks for requests that begin the\n"
    "                               same way (default on; off under --policy sparse|offload)\n"
    "  --offload-memory SIZE        --policy offload: host memory for the V rows moved out of\n"
    "                               the KV cache, e.g. 8G (default 4G; when it is full, rows\n"
    "                               are dropped as under --policy sparse)\n"
    "  --fixed-compaction           --policy sparse|offload: compact a prompt's V rows only at\n"
    "                               multiples of --max-num-batched-tokens and at its end, so\n"
    "                               a greedy request's output does not depend on the load\n"
    "                               (beside decoding requests a long prompt then takes up to\n"
    "                               twice the steps to its first token; default: after every\n"
    "                               chunk)\n"
    "  --drain-timeout SECONDS      grace period for in-flight requests on SIGTERM (default 30)\n"
    "  --log-requests               log a line per finished request: id, API, outcome, token\n"
    "                               counts, queue time, time to first token, total time (no\n"
    "                               text)\n"
    "  --log-stats-interval SECONDS log throughput, running and waiting requests and KV cache\n"
    "                               use every SECONDS that saw work (default 10; 0 = off)\n"
    "  --tls-cert FILE --tls-key FILE   serve TLS\n"
    "  --api-key KEY                require 'authorization: Bearer KEY' (or THETASERVE_API_KEY)\n";

// The name the HTTP API answers to by default: the model file's or directory's name without
// ".gguf" ("SmolLM2-135M-Instruct.Q4_1"), as a client would write it.
std::string DefaultServedModelName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (const size_t slash = path.rfind('/'); slash != std::string::npos) path.erase(0, slash + 1);
  if (path.size() > 5 && path.ends_with(".gguf")) path.resize(path.size() - 5);
  return path.empty() ? "default" : path;
}

std::string ReadFile(const std::string& path, bool* ok) {
  std::ifstream in(path, std::ios::binary);
  *ok = static_cast<bool>(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// protobuf logs a request whose string fields are not UTF-8 (proto3) at ERROR before its parse
// fails. The client is answered INVALID_ARGUMENT with the reason; a log line per such request
// would let any client write the server's log. The rest of what protobuf says goes to stderr
// in its own format.
void ProtobufLog(google::protobuf::LogLevel level, const char* file, int line,
                 const std::string& message) {
  if (absl::StrContains(message, "contains invalid UTF-8 data when parsing")) return;
  static constexpr const char* kLevels[] = {"INFO", "WARNING", "ERROR", "FATAL"};
  const int l = std::clamp(static_cast<int>(level), 0, 3);
  std::fprintf(stderr, "[libprotobuf %s %s:%d] %s\n", kLevels[l], file, line, message.c_str());
}

// Waits for one generation to finish (the warm-up).
class WarmupSink : public scheduler::TokenSink {
 public:
  void OnTokens(const scheduler::TokenDelta&) override {}
  void OnFinish(const scheduler::FinishInfo& info) override { done.set_value(info); }
  std::promise<scheduler::FinishInfo> done;
};

// Raises the process's descriptor limit (RLIMIT_NOFILE) to its hard limit, as Go's runtime
// does: the soft limit is often 1024, which `want` HTTP connections would exceed. Returns how
// many connections the limit allows, keeping 256 descriptors for the rest (gRPC, the model's
// file, logs) and what the HTTP server holds beside its connections (refused ones being
// drained, its own), and says so when that is fewer than `want`.
int HttpConnectionsAllowed(int want) {
  constexpr rlim_t kReserve = 256 + HttpServer::kMaxLingering + 4;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return want;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= static_cast<rlim_t>(want) + kReserve) {
    return want;
  }
  const int allowed =
      static_cast<int>(std::max<rlim_t>(16, lim.rlim_cur > kReserve ? lim.rlim_cur - kReserve : 0));
  std::fprintf(stderr,
               "serve: --max-http-connections %d lowered to %d: the process may open %llu "
               "descriptors (ulimit -n), %llu of them kept for the rest\n",
               want, allowed, static_cast<unsigned long long>(lim.rlim_cur),
               static_cast<unsigned long long>(kReserve));
  return allowed;
}

}  // namespace

int RunServe(const std::vector<std::string>& argv) {
  google::protobuf::SetLogHandler(&ProtobufLog);
  std::map<std::string, bool> known = {
      {"model", true}, {"host", true}, {"port", true}, {"metrics-port", true},
      {"http-port", true}, {"served-model-name", true}, {"allowed-origins", true},
      {"max-http-connections", true}, {"stream-head-timeout", true}, {"max-model-len", true},
      {"max-num-seqs", true}, {"max-num-batched-tokens", true}, {"long-prefill-tokens", true},
      {"scheduling-policy", true}, {"priority-aging", true},
      {"kv-cache-memory", true},
      {"block-size", true}, {"max-queue", true}, {"threads", true}, {"device", true},
      {"drain-timeout", true}, {"tls-cert", true}, {"tls-key", true}, {"api-key", true},
      {"prefix-caching", true}, {"offload-memory", true}, {"kv-cache-dtype", true},
      {"log-requests", false}, {"log-stats-interval", true}, {"exact-matmul", false},
      {"fixed-compaction", false}};
  for (const auto& [name, v] : ThetaFlags()) known[name] = v;
  CliArgs args;
  if (auto exit = ParseCommandLine("serve", argv, known, std::string(kUsage) + kThetaUsage,
                                   &args)) {
    return *exit;
  }
  auto usage = [](const absl::Status& st) { return ReportFailure("serve", st, kExitUsage); };
  auto fail = [](const absl::Status& st) { return ReportFailure("serve", st, kExitFailed); };
  auto port = args.GetInt("port", 50051, 0, 65535);                  // 0 = any free port
  auto metrics_port = args.GetInt("metrics-port", 9090, 0, 65535);  // 0 = off
  auto http_port = args.GetInt("http-port", 0, 0, 65535);            // 0 = off
  auto max_http = args.GetInt("max-http-connections", 4096, 1, 1'000'000);
  auto stream_head = args.GetDouble("stream-head-timeout", 15, 0, 3600);
  auto max_model_len = args.GetInt("max-model-len", 1, 1, kMaxCountFlag);  // used when given
  auto max_seqs = args.GetInt("max-num-seqs", 64, 1, kMaxCountFlag);
  auto max_tokens = args.GetInt("max-num-batched-tokens", 512, 1, kMaxCountFlag);
  auto long_prefill = args.GetInt(
      "long-prefill-tokens", max_tokens.ok() ? std::max<int64_t>(1, *max_tokens / 4) : 0, 0,
      kMaxCountFlag);
  // Checked now; a share is resolved once the model is on its device.
  auto kv_spec = args.Has("kv-cache-memory")
                     ? ParseKvCacheSpec(args.GetString("kv-cache-memory"))
                     : absl::StatusOr<KvCacheSpec>(KvCacheSpec{});
  // A page's rows; past 65,536 a page outgrows any context (and int32 row arithmetic).
  auto block_size = args.GetInt("block-size", 16, 1, 65536);
  auto max_queue = args.GetInt("max-queue", 1024, 1, kMaxCountFlag);
  auto threads = args.GetInt("threads", 0, 0, kMaxThreadsFlag);
  auto drain = args.GetDouble("drain-timeout", 30, 0, 86400);
  // Levels per second; a million: any wait of a microsecond outranks a level.
  auto aging = args.GetDouble("priority-aging", 0, 0, 1e6);
  auto stats_interval = args.GetDouble("log-stats-interval", 10, 0, 86400);  // 0 = off
  if (stats_interval.ok() && *stats_interval > 0 && *stats_interval < 0.1) {
    stats_interval = absl::InvalidArgumentError(absl::StrCat(
        "--log-stats-interval is ", *stats_interval, "; it must be 0 (off) or at least 0.1"));
  }
  auto device = ParseDevice(args.GetString("device", "auto"));
  auto kv_dtype = ParseKvDtypeFlag(args.GetString("kv-cache-dtype", "auto"));
  for (const absl::Status& st :
       {port.status(), metrics_port.status(), http_port.status(), max_http.status(),
        stream_head.status(), max_model_len.status(),
        max_seqs.status(),
        max_tokens.status(), long_prefill.status(), kv_spec.status(), block_size.status(),
        max_queue.status(), threads.status(), drain.status(), aging.status(),
        stats_interval.status(), device.status(), kv_dtype.status()}) {
    if (!st.ok()) return usage(st);
  }
  for (const char* flag : {"served-model-name", "max-http-connections", "stream-head-timeout"}) {
    if (args.Has(flag) && *http_port == 0) {
      return usage(absl::InvalidArgumentError(absl::StrCat("--", flag, " needs --http-port")));
    }
  }
  std::vector<std::string> origins = {"*"};
  if (args.Has("allowed-origins")) {
    if (*http_port == 0) {
      return usage(absl::InvalidArgumentError("--allowed-origins needs --http-port"));
    }
    const std::string list = args.GetString("allowed-origins");
    origins.clear();
    if (list != "none") {
      for (absl::string_view o : absl::StrSplit(list, ',')) {
        if (o.empty() || (o != "*" && !absl::StartsWith(o, "http://") &&
                          !absl::StartsWith(o, "https://"))) {
          return usage(absl::InvalidArgumentError(absl::StrCat(
              "--allowed-origins takes *, none, or origins such as https://app.example.com, "
              "separated by commas; not '", o, "'")));
        }
        origins.emplace_back(o);
      }
    }
  }
  std::vector<std::string> served_names;
  if (args.Has("served-model-name")) {
    for (absl::string_view name : absl::StrSplit(args.GetString("served-model-name"), ',')) {
      if (name.empty() || std::find(served_names.begin(), served_names.end(), name) !=
                              served_names.end()) {
        return usage(absl::InvalidArgumentError(absl::StrCat(
            "--served-model-name takes names separated by commas, each once and none empty; "
            "got '", args.GetString("served-model-name"), "'")));
      }
      served_names.emplace_back(name);
    }
  }
  const std::optional<scheduler::SchedulingPolicy> policy =
      scheduler::ParseSchedulingPolicy(args.GetString("scheduling-policy", "fcfs"));
  if (!policy) {
    return usage(absl::InvalidArgumentError(absl::StrCat(
        "--scheduling-policy is '", args.GetString("scheduling-policy"),
        "'; it must be fcfs or priority")));
  }
  if (absl::Status st = scheduler::CheckPriorityAging(*policy, *aging); !st.ok()) {
    return usage(st);
  }
  const std::string prefix_caching = args.GetString("prefix-caching", "on");
  if (prefix_caching != "on" && prefix_caching != "off") {
    return usage(absl::InvalidArgumentError(absl::StrCat(
        "--prefix-caching is '", prefix_caching, "'; it must be on or off")));
  }
  // The offload policy's host memory: checked now, before the model loads.
  int64_t offload_bytes = 0;
  if (args.GetString("policy") == "offload") {
    auto offload = ParseKvCacheSpec(args.GetString("offload-memory", "4G"));
    if (!offload.ok() || offload->bytes <= 0) {
      return usage(absl::InvalidArgumentError(absl::StrCat(
          "--offload-memory must be a size such as 512M or 8G, got '",
          args.GetString("offload-memory"), "'")));
    }
    offload_bytes = offload->bytes;
  } else if (args.Has("offload-memory")) {
    return usage(absl::InvalidArgumentError("--offload-memory needs --policy offload"));
  }
  if (absl::Status st = CheckModelFlag(args.GetString("model")); !st.ok()) return usage(st);
  auto theta = ParseThetaOptions(args, {"fixed-compaction"});
  if (!theta.ok()) return usage(theta.status());
  theta->sparse.fixed_compaction = args.Has("fixed-compaction");
  if (absl::Status st = LoadThetaFile(*theta); !st.ok()) return fail(st);

  // TLS files are read now: a typo fails in a moment, not after the model loads.
  if (args.Has("tls-cert") != args.Has("tls-key")) {
    return usage(absl::InvalidArgumentError("--tls-cert and --tls-key go together"));
  }
  const bool tls = args.Has("tls-cert") || args.Has("tls-key");
  std::string tls_cert, tls_key;
  if (tls) {
    bool ok_cert = false, ok_key = false;
    tls_cert = ReadFile(args.GetString("tls-cert"), &ok_cert);
    tls_key = ReadFile(args.GetString("tls-key"), &ok_key);
    if (!ok_cert || !ok_key) {
      return fail(absl::InvalidArgumentError(
          "--tls-cert and --tls-key must both name readable PEM files"));
    }
  }
  const std::string api_key = ApiKeyFlag(args);

  // Before any thread starts (they inherit the blocked signals).
  ShutdownSignals& signals = ShutdownSignals::Install();

  auto loaded = LoadModelForCli(args.GetString("model"), *device, static_cast<int>(*threads),
                                MatMulFlag(args), *kv_dtype);
  if (!loaded.ok()) return fail(loaded.status());

  if (args.Has("max-model-len")) {
    const int64_t model_len = loaded->model->config().max_context;
    if (!loaded->model->LimitContext(*max_model_len).ok()) {
      return usage(absl::InvalidArgumentError(
          absl::StrCat("--max-model-len ", *max_model_len, " is longer than the model's context of ",
                       model_len, " tokens; give at most ", model_len)));
    }
  }
  if (absl::Status st = CheckThetaForModel(*theta, *loaded->model); !st.ok()) return fail(st);
  loaded->backend->SetTopTheta(theta->config);

  scheduler::EngineConfig ec;
  ec.sparse = theta->sparse;
  ec.scheduler.max_num_seqs = *max_seqs;
  ec.scheduler.max_num_batched_tokens = *max_tokens;
  ec.scheduler.long_prefill_tokens = *long_prefill;
  ec.scheduler.policy = *policy;
  ec.scheduler.priority_aging = *aging;
  // Defaults: 90% of a GPU's free memory; on the CPU, enough for one full-context sequence.
  const std::optional<int64_t> free_bytes = loaded->backend->FreeMemoryBytes();
  std::optional<int64_t> max_bytes;  // whole pages of at most MaxPoolRows rows
  if (const std::optional<int64_t> rows = loaded->backend->MaxPoolRows()) {
    max_bytes = *rows / *block_size * *block_size * loaded->backend->kv_row_bytes();
  }
  absl::StatusOr<KvCacheSize> kv;
  if (args.Has("kv-cache-memory")) {
    kv = ResolveKvCacheSize(*kv_spec, free_bytes, max_bytes);
  } else if (loaded->backend->name() == "cuda") {
    kv = ResolveKvCacheSize(KvCacheSpec{.percent = 90.0}, free_bytes, max_bytes);
  } else {
    kv = DefaultCpuKvCacheSize(
        scheduler::Engine::KvBytesForSequence(*loaded->backend, static_cast<int32_t>(*block_size),
                                              loaded->model->config().max_context),
        free_bytes);
  }
  if (!kv.ok()) return fail(kv.status());
  // One page of K and one of V per (layer, KV head) hold block_size tokens: the tokens are
  // those of whole blocks (bytes short of a block hold no token of any request).
  const int64_t block_bytes =
      scheduler::Engine::KvBytesForSequence(*loaded->backend, static_cast<int32_t>(*block_size),
                                            static_cast<int32_t>(*block_size));
  std::fprintf(stderr, "KV cache: %s%s; %s, %lld tokens of K and V\n", kv->description.c_str(),
               args.Has("kv-cache-memory") ? "" : ", the default (--kv-cache-memory sets it)",
               std::string(kernels::KvDtypeName(loaded->backend->kv_dtype())).c_str(),
               static_cast<long long>(kv->bytes / block_bytes * *block_size));
  ec.kv_cache_bytes = kv->bytes;
  ec.block_size = static_cast<int32_t>(*block_size);
  ec.max_queue = *max_queue;
  // Sampling shares the --threads budget (the CPU backend's forward pass and sampling never
  // run at once); more than 16 threads would mostly wait at batch sizes up to 64.
  ec.sampling_threads = std::clamp(
      *threads > 0 ? int(*threads) : int(std::thread::hardware_concurrency()), 1, 16);
  ec.prefix_caching = prefix_caching == "on";
  if (ec.prefix_caching && ec.sparse.enabled) {
    std::fprintf(stderr, "prefix caching: off (--policy %s rewrites V pages in place)\n",
                 theta->policy.c_str());
  }
  if (ec.sparse.fixed_compaction) {
    std::fprintf(stderr, "V store: compacted at every %lld prompt tokens and after decode steps "
                 "(--fixed-compaction: outputs do not depend on the load)\n",
                 static_cast<long long>(*max_tokens));
  }
  if (ec.sparse.offload) {
    ec.offload_bytes = offload_bytes;
    std::fprintf(stderr, "offload: %s of host memory for V rows%s%s\n",
                 BytesText(offload_bytes).c_str(),
                 loaded->backend->name() == "cuda" ? ", pinned now" : "",
                 args.Has("offload-memory") ? "" : ", the default (--offload-memory sets it)");
  }
  auto engine = scheduler::Engine::Create(ec, *loaded->backend);
  if (!engine.ok()) return fail(engine.status());

  MetricsInfo mi{THETASERVE_VERSION, loaded->backend->name(), loaded->model->config().name,
                 theta->mode(), theta->policy,
                 static_cast<int>(loaded->model->config().num_layers),
                 std::string(kernels::KvDtypeName(loaded->backend->kv_dtype())),
                 loaded->backend->matmul_activations()};
  Metrics metrics(mi);
  metrics.HoldCounts();  // until the warm-up below has run
  (*engine)->SetObserver([&metrics](const scheduler::EngineStats& s,
                                    const scheduler::StepStats* step) {
    metrics.OnEngineStats(s, step);
  });
  // Every return from here stops the engine before `metrics` goes: the engine's thread calls the
  // observer, which points at it. A failure to listen returned with the engine running: a heap
  // corruption abort, or a segfault. (No request is in flight on those paths; the normal exit
  // stops the engine itself, before the service and its streams go.)
  absl::Cleanup stop_engine = [&engine] { (*engine)->Stop(); };
  if (*metrics_port > 0) {
    std::string error;
    const std::string addr = absl::StrCat(args.GetString("host", "0.0.0.0"), ":", *metrics_port);
    if (!metrics.StartExposer(addr, &error)) {
      return fail(absl::UnavailableError(absl::StrCat("cannot serve /metrics on ", addr, ": ", error)));
    }
    std::fprintf(stderr, "metrics on http://%s/metrics\n", addr.c_str());
  }

  ServiceOptions options;
  options.api_key = api_key;
  options.theta_mode = theta->mode();
  options.kv_policy = theta->policy;
  options.kv_cache_dtype = kernels::KvDtypeName(loaded->backend->kv_dtype());
  options.matmul_activations = loaded->backend->matmul_activations();
  options.calibration_fingerprint = theta->table ? theta->table->fingerprint : "";
  options.log_requests = args.Has("log-requests");
  GenerationService service(**engine, *loaded->model, loaded->backend->name(), &metrics, options);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second server on a port in use started and shared it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (tls) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({tls_key, tls_cert});
    creds = grpc::SslServerCredentials(ssl);
  }
  const std::string address = absl::StrCat(args.GetString("host", "0.0.0.0"), ":", *port);
  int bound_port = 0;
  builder.AddListeningPort(address, creds, &bound_port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound_port == 0) {
    return fail(absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address,
        tls ? " (in use, or the TLS certificate and key are not PEM)" : " (in use?)")));
  }
  std::unique_ptr<OpenAiHttpServer> http;
  if (*http_port > 0) {
    OpenAiHttpOptions ho;
    ho.host = args.GetString("host", "0.0.0.0");
    ho.port = static_cast<int>(*http_port);
    ho.api_key = api_key;
    ho.allowed_origins = origins;
    ho.stream_head_timeout_s = *stream_head;
    ho.max_connections = HttpConnectionsAllowed(static_cast<int>(*max_http));
    ho.served_model_name = served_names.empty()
                               ? DefaultServedModelName(args.GetString("model"))
                               : served_names.front();
    if (served_names.size() > 1) {
      ho.served_model_aliases.assign(served_names.begin() + 1, served_names.end());
    }
    auto started = OpenAiHttpServer::Start(service, *loaded->model, ho);
    if (!started.ok()) {
      server->Shutdown();
      (*engine)->Stop();
      return fail(started.status());
    }
    http = std::move(*started);
    std::fprintf(stderr, "OpenAI-compatible HTTP API on http://%s:%d/v1 (model %s)\n",
                 ho.host.c_str(), http->port(),
                 ServedModel(served_names.empty() ? std::vector<std::string>{ho.served_model_name}
                                                  : served_names)
                     .Described()
                     .c_str());
  }
  auto* health = server->GetHealthCheckService();
  const std::string kService = "thetaserve.v1.Generation";
  health->SetServingStatus("", false);
  health->SetServingStatus(kService, false);

  // Warm up: one short generation through the whole engine before declaring SERVING.
  {
    auto sink = std::make_shared<WarmupSink>();
    auto done = sink->done.get_future();
    scheduler::Request warm;
    warm.id = "warmup";
    warm.prompt = loaded->model->tokenizer().Encode("Hello", true, false);
    warm.sampling.temperature = 0;
    warm.stopping.max_tokens = 2;
    warm.stopping.ignore_eos = true;
    absl::Status st = (*engine)->Submit(std::move(warm), sink);
    if (!st.ok()) return fail(st);
    scheduler::FinishInfo info = done.get();
    if (!info.status.ok()) return fail(info.status);
    (*engine)->WaitIdle(10);
    metrics.ResumeCounts((*engine)->Stats().counters);
  }
  service.SetReady(true);
  health->SetServingStatus("", true);
  health->SetServingStatus(kService, true);
  std::fprintf(stderr, "serving thetaserve.v1.Generation on %s:%d (%s)\n",
               args.GetString("host", "0.0.0.0").c_str(), bound_port,
               tls ? "TLS" : "plaintext");
  std::unique_ptr<StatsLogger> stats_log;
  if (*stats_interval > 0) {
    stats_log = std::make_unique<StatsLogger>([&engine] { return (*engine)->Stats(); },
                                              WriteLogLine, *stats_interval);
  }

  signals.Serving();
  const int sig = signals.WaitForFirst();
  std::fprintf(stderr, "received %s: draining (up to %.0f s; again to exit now)\n",
               ShutdownSignalName(sig), *drain);
  health->SetServingStatus("", false);
  health->SetServingStatus(kService, false);
  (*engine)->StartDrain();
  const bool idle = (*engine)->WaitIdle(*drain);
  if (!idle) std::fprintf(stderr, "drain timeout: cancelling the remaining requests\n");
  (*engine)->Stop();  // cancels whatever is left; their streams finish with UNAVAILABLE
  stats_log.reset();
  if (http) http->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  std::fprintf(stderr, "stopped\n");
  return 0;
}

}  // namespace thetaserve::server
