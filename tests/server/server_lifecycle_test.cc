// The `thetaserve serve` process over its life: startup flags (KV cache size and type, prefix
// caching, API key, TLS), failures to listen, a full queue, and draining on SIGTERM.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/server/e2e_util.h"
#include "tests/server/http_client.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace thetaserve::testing {
namespace {

TEST(ServerLifecycleTest, DrainsOnSigtermWithHealthNotServing) {
  ServerProcess server({"--drain-timeout", "60"});
  ASSERT_TRUE(server.started());
  // Long enough to still be running 200 ms after the signal: at ~4 ms per decode step, 48
  // tokens were not.
  constexpr uint32_t kTokens = 400;
  StreamResult r;
  std::thread t([&] {
    auto s = server.stub();
    auto req = Prompt("A long time ago", kTokens);
    req.mutable_stopping()->set_ignore_eos(true);
    r = Generate(*s, req);
  });
  // Wait until the request runs, then signal (a failure still joins the thread).
  auto stub = server.stub();
  EXPECT_TRUE(WaitForRunning(*stub, 1, 60)) << "the request never ran";
  server.Signal(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(server.HealthStatus(), "NOT_SERVING");
  StreamResult late = Generate(*stub, Prompt("Hello", 2));
  EXPECT_EQ(late.status.error_code(), grpc::StatusCode::UNAVAILABLE) << late.status.error_message();
  t.join();
  EXPECT_TRUE(r.status.ok()) << "in-flight request should finish during drain: " << r.status.error_message();
  EXPECT_EQ(r.complete.usage().completion_tokens(), kTokens);
  EXPECT_EQ(server.Wait(60), 0);
}

// A second signal during the drain ends the process at once (it waited out --drain-timeout,
// or needed SIGKILL), with 128 + the signal; the in-flight stream is cut.
TEST(ServerLifecycleTest, ASecondSignalEndsTheDrain) {
  ServerProcess server({"--drain-timeout", "120"});
  ASSERT_TRUE(server.started());
  StreamResult r;
  std::thread t([&] {
    auto s = server.stub();
    auto req = Prompt("A long time ago", 4000);
    req.mutable_stopping()->set_ignore_eos(true);
    r = Generate(*s, req);
  });
  auto stub = server.stub();
  EXPECT_TRUE(WaitForRunning(*stub, 1, 60)) << "the request never ran";
  server.Signal(SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(server.HealthStatus(), "NOT_SERVING");  // draining, the stream still running
  const auto start = std::chrono::steady_clock::now();
  server.Signal(SIGINT);
  EXPECT_EQ(server.Wait(20), 128 + SIGINT);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  t.join();
  // Cut after it had streamed: the connection went with the process.
  EXPECT_GT(r.chunks, 0);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << "the stream was cut, not finished: " << r.status.error_message();
  const std::string log = ReadFileOrDie(server.log_path());
  EXPECT_NE(log.find("received SIGINT: draining (up to 120 s; again to exit now)"),
            std::string::npos) << log;
  EXPECT_NE(log.find("received SIGINT again: exiting without waiting for the drain"),
            std::string::npos) << log;
}

TEST(ServerLifecycleTest, TheCpuDefaultKvCacheHoldsTheWholeContext) {
  ServerProcess server({"--device", "cpu"});
  ASSERT_TRUE(server.started());
  // "KV cache: 0.25 GiB, the default (...); f16, 11648 tokens of K and V"
  const std::string text = ReadFileOrDie(server.log_path());
  const size_t line = text.find("KV cache: ");
  ASSERT_NE(line, std::string::npos) << text;
  const size_t held = text.find("f16, ", line);
  ASSERT_NE(held, std::string::npos) << text;
  EXPECT_GE(std::atoll(text.c_str() + held + 5), 8192) << text;
  // Prompt + max_tokens = the 8,192-token context less 15: accepted (256 MiB of f32 pages, the
  // first default, refused it), and decoding; cancelled after its first tokens.
  auto stub = server.stub();
  auto req = Prompt("Hello", 8192 - 16);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  int tokens = 0;
  while (tokens < 2 && reader->Read(&resp)) tokens += resp.chunk().token_ids_size();
  ctx.TryCancel();
  const grpc::Status st = reader->Finish();
  EXPECT_GE(tokens, 2) << st.error_message();
  EXPECT_NE(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
}

// --kv-cache-dtype reaches ModelInfo, the page size, the startup log and build_info; a server
// on f32, fp8 or q8_0 pages streams what `generate` computes on them. A value that is no type, or one the
// CUDA backend does not store, is refused at startup.
TEST(ServerLifecycleTest, KvCacheDtypeIsUsedAndReported) {
  int rc = 0;
  std::string out = RunCommand(BinaryPath() + " serve --model " + DefaultModelPath() +
                               " --kv-cache-dtype f8 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--kv-cache-dtype must be auto, f32, f16, bf16, fp8 (= fp8_e4m3), "
                     "fp8_e5m2 or q8_0, got 'f8'"),
            std::string::npos) << out;
  out = RunCommand(BinaryPath() + " serve --model " + DefaultModelPath() +
                   " --device cuda --kv-cache-dtype f32 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--kv-cache-dtype f32: the CUDA backend stores the KV cache in bf16 only"),
            std::string::npos) << out;

  // f32, fp8 and q8_0 (rows of head_dim 64 in 256, 64 and 64 + 2 scales × 2 bytes): what each
  // page holds, what the log, ModelInfo and the build metric say, and the server's text equal
  // to `thetaserve generate`'s over the same type.
  struct Case {
    const char* flag;
    const char* name;
    uint32_t row_bytes;
    // Whole blocks of 16 in 64 MiB: 64 MiB / (30 layers × 3 KV heads × K and V × 16 rows ×
    // row_bytes), rounded down, × 16 (what one request can reach).
    const char* tokens;
  };
  for (const Case& k : {Case{"f32", "f32", 256, "1456"}, Case{"fp8", "fp8_e4m3", 64, "5824"},
                        Case{"q8_0", "q8_0", 68, "5472"}}) {
    SCOPED_TRACE(k.flag);
    ServerProcess server({"--device", "cpu", "--kv-cache-dtype", k.flag, "--kv-cache-memory", "64M"});
    ASSERT_TRUE(server.started());
    auto stub = server.stub();
    {
      grpc::ClientContext c;
      v1::ModelInfo info;
      ASSERT_TRUE(stub->GetModelInfo(&c, {}, &info).ok());
      EXPECT_EQ(info.kv_cache_dtype(), k.name);
      EXPECT_EQ(info.matmul_activations(), "int8") << "the CPU's default";
    }
    {
      grpc::ClientContext c;
      v1::ServerStatus st;
      ASSERT_TRUE(stub->GetServerStatus(&c, {}, &st).ok());
      EXPECT_EQ(st.pages().page_bytes(), 16u * k.row_bytes);  // 16 rows
    }
    const std::string log = ReadFileOrDie(server.log_path());
    EXPECT_NE(log.find(absl::StrCat("KV cache: 64.0 MiB; ", k.name, ", ", k.tokens, " tokens of K and V")),
              std::string::npos) << log;
    EXPECT_NE(log.find(absl::StrCat("backend cpu (KV cache in ", k.name, ")")), std::string::npos) << log;
    const std::string metrics = server.ScrapeMetrics();
    const size_t info = metrics.find("\nthetaserve_build_info{");
    ASSERT_NE(info, std::string::npos) << metrics;
    const std::string build_info = metrics.substr(info, metrics.find('\n', info + 1) - info);
    EXPECT_NE(build_info.find(absl::StrCat("kv_cache_dtype=\"", k.name, "\"")), std::string::npos)
        << metrics;
    EXPECT_NE(build_info.find("matmul_activations=\"int8\""), std::string::npos) << metrics;
    EXPECT_EQ(MetricValue(metrics, "thetaserve_kv_page_size_bytes"), 16.0 * k.row_bytes) << metrics;

    auto req = Prompt("Once upon a time", 20);
    req.mutable_stopping()->set_ignore_eos(true);
    StreamResult r = Generate(*stub, req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.text + "\n",
              RunGenerateBinary(absl::StrCat("--prompt 'Once upon a time' --max-tokens 20 --ignore-eos "
                                             "--device cpu --kv-cache-dtype ", k.flag)));
  }
}

TEST(ServerLifecycleTest, PrefixCachingFlagTakesOnOrOff) {
  int rc = 0;
  const std::string out = RunCommand(BinaryPath() + " serve --model " + DefaultModelPath() +
                                     " --prefix-caching maybe 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--prefix-caching is 'maybe'; it must be on or off"), std::string::npos) << out;
}

// The warm-up generation before SERVING is no client's: a fresh server reported a prompt token,
// two generated tokens, V reads and two steps with every requests_total at 0. Now its counters
// and step histograms start at the warm-up's end.
TEST(ServerLifecycleTest, AFreshServerCountsNothingOfItsWarmUp) {
  ServerProcess server;
  ASSERT_TRUE(server.started());
  const std::string fresh = server.ScrapeMetrics();
  for (const char* series :
       {"thetaserve_prompt_tokens_total", "thetaserve_generation_tokens_total",
        "thetaserve_v_rows_read_total", "thetaserve_batch_size_count",
        "thetaserve_step_duration_seconds_count{phase=\"prefill\"}",
        "thetaserve_step_duration_seconds_count{phase=\"decode\"}"}) {
    EXPECT_EQ(MetricValue(fresh, series), 0) << series;
  }
  EXPECT_GT(MetricValue(fresh, "thetaserve_kv_pages_capacity"), 0) << "gauges are set";
  auto stub = server.stub();
  auto req = Prompt("Hello", 4);
  req.mutable_stopping()->set_ignore_eos(true);
  ASSERT_TRUE(Generate(*stub, req).status.ok());
  const std::string after = server.ScrapeMetrics();
  EXPECT_EQ(MetricValue(after, "thetaserve_generation_tokens_total"), 4);
  EXPECT_EQ(MetricValue(after, "thetaserve_step_duration_seconds_count{phase=\"decode\"}"), 3);
  EXPECT_GT(MetricValue(after, "thetaserve_v_rows_read_total"), 0);
}

// --log-requests: a line per finished request from either API (a client's id quoted, no text);
// --log-stats-interval: a stats line for each interval that saw work, none while idle. A
// server without the flag logs no request lines.
TEST(ServerLifecycleTest, LogsRequestsAndStatsWhenAsked) {
  const int http_port = FreePort();
  ServerProcess server({"--http-port", std::to_string(http_port), "--log-requests",
                        "--log-stats-interval", "0.2"});
  ASSERT_TRUE(server.started());
  auto stub = server.stub();
  auto req = Prompt("The capital of France is", 4);
  req.set_request_id("logged id");
  req.mutable_stopping()->set_ignore_eos(true);
  ASSERT_TRUE(Generate(*stub, req).status.ok());
  const HttpResult http = HttpCall(http_port, "POST", "/v1/completions",
                                   R"({"prompt": "Hello", "max_tokens": 3, "n": 2, "ignore_eos": true})");
  ASSERT_EQ(http.status, 200) << http.body;
  ASSERT_TRUE(WaitForRunning(*stub, 0));
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // the last busy interval ends
  auto count = [](const std::string& log, const std::string& what) {
    int n = 0;
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++n;
    return n;
  };
  const std::string log = ReadFileOrDie(server.log_path());
  EXPECT_EQ(count(log, "\nrequest id=\"logged id\" api=grpc outcome=length prompt_tokens=5 "
                       "completion_tokens=4 queue_s="), 1) << log;
  EXPECT_EQ(count(log, " api=http outcome=length prompt_tokens=1 completion_tokens=3 "), 2) << log;
  EXPECT_EQ(count(log, "\nrequest "), 3) << "the warm-up is no client's request\n" << log;
  EXPECT_GE(count(log, "\nstats prompt_tokens_per_s="), 1) << log;
  EXPECT_EQ(log.find("Paris"), std::string::npos) << "no text in the log\n" << log;
  // Idle: nothing more.
  const int stats_lines = count(log, "\nstats ");
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  EXPECT_EQ(count(ReadFileOrDie(server.log_path()), "\nstats "), stats_lines);

  ServerProcess quiet;
  ASSERT_TRUE(quiet.started());
  ASSERT_TRUE(Generate(*quiet.stub(), Prompt("Hello", 2)).status.ok());
  EXPECT_EQ(ReadFileOrDie(quiet.log_path()).find("request id="), std::string::npos);
}

TEST(ServerLifecycleTest, ApiKeyIsRequiredWhenSet) {
  ServerProcess server({"--api-key", "sesame"});
  ASSERT_TRUE(server.started());
  auto stub = server.stub();
  StreamResult none = Generate(*stub, Prompt("Hello", 2));
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  StreamResult wrong = Generate(*stub, Prompt("Hello", 2), 60, "wrong");
  EXPECT_EQ(wrong.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  StreamResult right = Generate(*stub, Prompt("Hello", 2), 60, "sesame");
  EXPECT_TRUE(right.status.ok()) << right.status.error_message();
  EXPECT_EQ(server.HealthStatus(), "SERVING") << "health stays open for probes";
  // `client` takes the key from THETASERVE_API_KEY too, as `serve` does; --api-key wins.
  const std::string client = BinaryPath() + " client --addr " + server.address() +
                             " --prompt Hello --max-tokens 2";
  int rc = 0;
  std::string out = RunCommand("THETASERVE_API_KEY=sesame " + client + " 2>&1", &rc);
  EXPECT_EQ(rc, 0) << out;
  out = RunCommand("THETASERVE_API_KEY=sesame " + client + " --api-key wrong 2>&1", &rc);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("UNAUTHENTICATED"), std::string::npos) << out;
  const std::string metrics = server.ScrapeMetrics();
  EXPECT_EQ(MetricValue(metrics, "thetaserve_requests_rejected_total{code=\"UNAUTHENTICATED\"}"),
            3);
  EXPECT_EQ(MetricValue(metrics, "thetaserve_requests_rejected_total{code=\"INVALID_ARGUMENT\"}"),
            0);
}

// Failures to listen exit 1 with a message. Both TLS failures crashed (an abort on a corrupted
// heap, a segfault): the engine's thread still ran with the metrics and service it reports to
// gone. A port in use was shared (gRPC's SO_REUSEPORT) and the second server said it served.
TEST(ServerLifecycleTest, FailuresToListenExitCleanly) {
  const ScopedTempDir tmp("server_e2e_test");
  const std::string bogus = tmp.File("bogus.pem");
  { std::ofstream(bogus) << "xx\n"; }
  const std::string serve = BinaryPath() + " serve --model " + DefaultModelPath() +
                            " --metrics-port 0 --port " + std::to_string(FreePort());
  int rc = 0;
  std::string out = RunCommand(serve + " --tls-cert /nonexistent --tls-key /nonexistent 2>&1", &rc);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 1) << rc << "\n" << out;
  EXPECT_NE(out.find("--tls-cert and --tls-key must both name readable PEM files"),
            std::string::npos) << out;
  EXPECT_EQ(out.find("loading"), std::string::npos) << "checked before the model loads";

  out = RunCommand(serve + " --tls-cert " + bogus + " --tls-key " + bogus + " 2>&1", &rc);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 1) << rc << "\n" << out;
  EXPECT_NE(out.find("the TLS certificate and key are not PEM"), std::string::npos) << out;

  ServerProcess first(std::vector<std::string>{});
  ASSERT_TRUE(first.started());
  const std::string taken = "127.0.0.1:" + std::to_string(first.port());
  out = RunCommand(BinaryPath() + " serve --model " + DefaultModelPath() +
                       " --metrics-port 0 --host 127.0.0.1 --port " + std::to_string(first.port()) +
                       " 2>&1",
                   &rc);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 1) << rc << "\n" << out;
  EXPECT_NE(out.find("cannot listen on " + taken + " (in use?)"), std::string::npos) << out;
  EXPECT_EQ(first.HealthStatus(), "SERVING");
}

TEST(ServerLifecycleTest, ServesTlsWithTheGivenCertificate) {
  // A self-signed certificate for localhost, made here with the openssl CLI.
  const ScopedTempDir tmp("server_e2e_test");
  const std::string cert = tmp.File("tls-cert.pem"), key = tmp.File("tls-key.pem");
  const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
                          "-addext subjectAltName=DNS:localhost -keyout " + key + " -out " + cert +
                          " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl could not make a test certificate";
  // The fixture's plaintext health probe cannot reach a TLS server: probe over TLS here.
  ServerProcess server({"--tls-cert", cert, "--tls-key", key}, /*timeout_s=*/0);
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadFileOrDie(cert);
  auto channel = grpc::CreateChannel("localhost:" + std::to_string(server.port()), grpc::SslCredentials(ssl));
  auto stub = v1::Generation::NewStub(channel);
  StreamResult r;
  for (int i = 0; i < 600; ++i) {  // until loaded and warmed up
    r = Generate(*stub, Prompt("Hello", 4), 30);
    if (r.status.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.complete.usage().completion_tokens(), 4u);
  // Plaintext clients are refused by a TLS server.
  auto plain = v1::Generation::NewStub(
      grpc::CreateChannel("localhost:" + std::to_string(server.port()), grpc::InsecureChannelCredentials()));
  StreamResult p = Generate(*plain, Prompt("Hello", 2), 5);
  EXPECT_FALSE(p.status.ok());
}

TEST(ServerLifecycleTest, FullQueueIsResourceExhausted) {
  ServerProcess server({"--max-num-seqs", "1", "--max-queue", "1"});
  ASSERT_TRUE(server.started());
  auto long_req = Prompt("Once upon a time", 300);
  long_req.mutable_stopping()->set_ignore_eos(true);
  std::vector<StreamResult> results(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300 * i));
      auto s = server.stub();
      results[i] = Generate(*s, long_req, 120);
    });
  }
  // Abort the long ones once the third has been answered.
  threads[2].join();
  EXPECT_EQ(results[2].status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << results[2].status.error_message();
  // The refusal is told apart from bad input, so an alert can watch for a full queue.
  const std::string metrics = server.ScrapeMetrics();
  EXPECT_EQ(MetricValue(metrics, "thetaserve_requests_rejected_total{code=\"RESOURCE_EXHAUSTED\"}"),
            1);
  EXPECT_EQ(MetricValue(metrics, "thetaserve_requests_total{outcome=\"rejected\"}"), 1);
  server.Signal(SIGKILL);
  threads[0].join();
  threads[1].join();
}

// A server with one slot by priority (and `aging`, --priority-aging, unless 0): a batch
// request (priority 5, `batch_tokens` tokens, EOS ignored) runs on a thread of its own; once
// it runs, and `delay` later, an urgent one (priority 0, 4 tokens) is sent from this thread.
struct UrgentBesideBatch {
  v1::ModelInfo info;
  v1::GenerateRequest batch_req;
  StreamResult batch, urgent;
  bool batch_done_when_urgent_came = false;
  bool batch_done_when_urgent_ended = false;
};
void RunUrgentBesideBatch(ServerProcess& server, int batch_tokens, double aging,
                          std::chrono::milliseconds delay, UrgentBesideBatch* out) {
  auto stub = server.stub();
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->GetModelInfo(&ctx, {}, &out->info).ok());
  out->batch_req = Prompt("Once upon a time", batch_tokens);
  out->batch_req.mutable_stopping()->set_ignore_eos(true);
  out->batch_req.set_priority(5);
  std::atomic<bool> batch_done{false};
  std::thread batch_thread([&] {
    auto s = server.stub();
    out->batch = Generate(*s, out->batch_req, 300);
    batch_done = true;
  });
  const bool running = WaitForRunning(*stub, 1);
  if (running) std::this_thread::sleep_for(delay);
  out->batch_done_when_urgent_came = batch_done;
  auto urgent_req = Prompt("The capital of France is", 4);
  urgent_req.set_priority(0);
  if (running) out->urgent = Generate(*stub, urgent_req, 300);
  out->batch_done_when_urgent_ended = batch_done;
  batch_thread.join();
  ASSERT_TRUE(running) << "the batch request never ran";
  ASSERT_TRUE(out->urgent.status.ok()) << out->urgent.status.error_message();
  ASSERT_TRUE(out->batch.status.ok()) << out->batch.status.error_message();
  EXPECT_EQ(out->info.scheduling_policy(), "priority");
  EXPECT_EQ(out->info.priority_aging(), aging);
}

// --scheduling-policy priority with one slot: an urgent request (priority 0) arriving while a
// long batch request (priority 5) runs preempts it, finishes first, and the batch request then
// recomputes what it had and ends with the text it gets alone (greedy, CPU: the same bits).
TEST(ServerLifecycleTest, PriorityPolicyLetsAnUrgentRequestPreemptABatchOne) {
  ServerProcess server({"--max-num-seqs", "1", "--scheduling-policy", "priority"});
  ASSERT_TRUE(server.started());
  UrgentBesideBatch run;
  ASSERT_NO_FATAL_FAILURE(RunUrgentBesideBatch(server, 160, 0, {}, &run));
  EXPECT_FALSE(run.batch_done_when_urgent_ended) << "the urgent request waited for the batch one";
  EXPECT_EQ(run.urgent.complete.preemptions(), 0u);
  EXPECT_EQ(run.batch.complete.preemptions(), 1u);
  EXPECT_EQ(run.batch.complete.usage().completion_tokens(), 160u);
  auto stub = server.stub();
  EXPECT_EQ(Status(*stub).preemptions(), 1u);
  const std::string metrics = server.ScrapeMetrics();
  EXPECT_EQ(MetricValue(metrics, "thetaserve_preemptions_total"), 1);
  EXPECT_EQ(MetricValue(metrics, "thetaserve_priority_preemptions_total"), 1);
  StreamResult alone = Generate(*stub, run.batch_req, 300);
  ASSERT_TRUE(alone.status.ok()) << alone.status.error_message();
  EXPECT_EQ(run.batch.ids, alone.ids) << "the preempted request recomputed its tokens as they were";
  EXPECT_EQ(alone.complete.preemptions(), 0u);
}

// --priority-aging 50: a request gains 50 priority levels a second. A batch request (priority
// 5) that has run for half a second has gained 25, so an urgent one (priority 0) arriving then
// comes after it: it waits for the slot instead of preempting it (strict, it would: above).
TEST(ServerLifecycleTest, PriorityAgingKeepsARequestThatWaitedFromBeingPreempted) {
  ServerProcess server(
      {"--max-num-seqs", "1", "--scheduling-policy", "priority", "--priority-aging", "50"});
  ASSERT_TRUE(server.started());
  UrgentBesideBatch run;
  ASSERT_NO_FATAL_FAILURE(
      RunUrgentBesideBatch(server, 300, 50, std::chrono::milliseconds(500), &run));
  ASSERT_FALSE(run.batch_done_when_urgent_came) << "300 tokens took under half a second";
  // (Whether the batch client saw its end before the urgent one saw its own is a race between
  // the two client threads; the server's counts are not.)
  EXPECT_EQ(run.batch.complete.preemptions(), 0u) << "the urgent request preempted the batch one";
  EXPECT_EQ(run.batch.complete.usage().completion_tokens(), 300u);
  const std::string metrics = server.ScrapeMetrics();
  EXPECT_EQ(MetricValue(metrics, "thetaserve_priority_preemptions_total"), 0);
}

}  // namespace
}  // namespace thetaserve::testing
