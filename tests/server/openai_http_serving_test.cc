// The OpenAI-compatible HTTP API serving under way, end to end (the real binary with SmolLM2):
// each answer counted by route and status, a client that vanishes freeing its pages, Abort over
// gRPC ending an HTTP stream, and sixteen concurrent streams that all complete.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/server/openai_http_e2e.h"

namespace thetaserve::testing {
namespace {

// Each answer of the HTTP API is counted by route and status class; a request the transport
// refuses before any route sees it, by its reason.
TEST_F(OpenAiHttpTest, HttpRequestsAreCountedByRouteAndStatus) {
  ASSERT_TRUE(server_->started());
  auto count = [](const std::string& metrics, const std::string& route, const std::string& cls) {
    return MetricValue(metrics, "thetaserve_http_requests_total{route=\"" + route +
                                    "\",status=\"" + cls + "\"}");
  };
  const std::string bad_request = "thetaserve_http_refused_total{reason=\"bad_request\"}";
  const std::string before = server_->ScrapeMetrics();  // (the metrics port: not counted)
  ASSERT_GE(count(before, "/v1/completions", "5xx"), 0) << "every series exported from 0";
  // All of them (docs/metrics.md: 11 routes × 3 classes).
  size_t series = 0;
  for (size_t at = 0; (at = before.find("\nthetaserve_http_requests_total{", at)) !=
                      std::string::npos;
       ++at) {
    ++series;
  }
  EXPECT_EQ(series, 33u);
  ASSERT_GE(MetricValue(before, bad_request), 0);
  EXPECT_EQ(HttpCall(http_port_, "GET", "/v1/models").status, 200);
  EXPECT_EQ(HttpCall(http_port_, "GET", "/health").status, 200);
  EXPECT_EQ(HttpCall(http_port_, "GET", "/version").status, 200);
  const HttpResult post_version = HttpCall(http_port_, "POST", "/version", "{}");
  EXPECT_EQ(post_version.status, 405);
  EXPECT_EQ(post_version.headers.at("allow"), "GET, HEAD");
  EXPECT_EQ(Json::parse(post_version.body)["error"]["message"], "use GET");
  // vLLM's /ping (SageMaker's health check): /health's answer, to GET and POST.
  const HttpResult ping = HttpCall(http_port_, "GET", "/ping");
  EXPECT_EQ(ping.status, 200);
  EXPECT_EQ(ping.body, R"({"status":"serving"})");
  EXPECT_EQ(HttpCall(http_port_, "POST", "/ping", "").status, 200);
  const HttpResult put = HttpCall(http_port_, "PUT", "/ping", "");
  EXPECT_EQ(put.status, 405);
  EXPECT_EQ(put.headers.at("allow"), "GET, HEAD, POST");
  EXPECT_EQ(Json::parse(put.body)["error"]["message"], "use GET or POST");
  EXPECT_EQ(HttpCall(http_port_, "GET", "/v1/models/nope").status, 404);
  const HttpResult get_completions = HttpCall(http_port_, "GET", "/v1/completions");
  EXPECT_EQ(get_completions.status, 405);
  EXPECT_EQ(get_completions.headers.at("allow"), "POST");
  EXPECT_EQ(Json::parse(get_completions.body)["error"]["message"], "use POST");
  EXPECT_EQ(Post("/v1/completions", {{"prompt", "x"}, {"temperature", "hot"}}).status, 400);
  EXPECT_EQ(Post("/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 1}}).status, 200);
  EXPECT_EQ(Post("/v1/embeddings", {{"input", "x"}}).status, 404);
  const HttpResult server_wide = HttpCall(http_port_, "OPTIONS", "*");  // RFC 9112 3.2.4
  EXPECT_EQ(server_wide.status, 200);
  EXPECT_EQ(server_wide.headers.at("allow"), "GET, HEAD, POST, OPTIONS");
  {
    HttpConnection c(http_port_);
    c.SendRaw("GET /v1/models HTTP/1.1\r\n\r\n");  // no Host: the transport's 400
    EXPECT_EQ(c.Read(10).status, 400);
  }
  const std::string after = server_->ScrapeMetrics();
  auto delta = [&](const std::string& route, const std::string& cls) {
    return count(after, route, cls) - count(before, route, cls);
  };
  EXPECT_EQ(delta("/v1/models", "2xx"), 1);
  EXPECT_EQ(delta("/health", "2xx"), 1);
  EXPECT_EQ(delta("/version", "2xx"), 1);
  EXPECT_EQ(delta("/version", "4xx"), 1);
  EXPECT_EQ(delta("/ping", "2xx"), 2);
  EXPECT_EQ(delta("/ping", "4xx"), 1);
  EXPECT_EQ(delta("/v1/models/{id}", "4xx"), 1);
  EXPECT_EQ(delta("/v1/completions", "4xx"), 2);
  EXPECT_EQ(delta("/v1/completions", "2xx"), 1);
  EXPECT_EQ(delta("other", "4xx"), 1);
  EXPECT_EQ(delta("other", "2xx"), 1);
  EXPECT_EQ(delta("/v1/completions", "5xx"), 0);
  EXPECT_EQ(delta("/v1/chat/completions", "2xx"), 0);
  EXPECT_EQ(MetricValue(after, bad_request) - MetricValue(before, bad_request), 1);
}

// The client's request id, as vLLM takes it: the X-Request-Id header (a proxy's trace id), or
// the body's request_id, names the call (cmpl-<it>: the log line, Abort), and X-Request-Id
// answers with the header's own value. Both were ignored: a random id came back, which nothing
// upstream could match. An id in flight is 409, naming it; a malformed one 400.
TEST_F(OpenAiHttpTest, TheClientsRequestIdNamesTheCall) {
  ASSERT_TRUE(server_->started());
  const Json body = {{"prompt", "Hello"}, {"max_tokens", 2}};
  HttpResult r = HttpCall(http_port_, "POST", "/v1/completions", body.dump(),
                          {{"X-Request-Id", "trace-42"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json::parse(r.body)["id"], "cmpl-trace-42");
  EXPECT_EQ(r.headers["x-request-id"], "trace-42");
  r = Post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                    {"max_tokens", 2}, {"request_id", "abc-1"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json::parse(r.body)["id"], "chatcmpl-abc-1");
  EXPECT_EQ(r.headers["x-request-id"], "chatcmpl-abc-1");
  // The header wins over the body's field, streamed as whole.
  Json streamed = body;
  streamed["stream"] = true;
  streamed["request_id"] = "from-body";
  r = HttpCall(http_port_, "POST", "/v1/completions", streamed.dump(),
               {{"X-Request-Id", "from-header"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["x-request-id"], "from-header");
  EXPECT_NE(r.body.find(R"("id":"cmpl-from-header")"), std::string::npos) << r.body;

  r = HttpCall(http_port_, "POST", "/v1/completions", body.dump(), {{"X-Request-Id", "a b"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("the X-Request-Id header must be 1 to 256 visible ASCII characters"),
            std::string::npos) << r.body;
  Json long_id = body;
  long_id["request_id"] = std::string(257, 'x');
  r = Post("/v1/completions", long_id);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("request_id must be 1 to 256"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find(R"("param":"request_id")"), std::string::npos) << r.body;

  // In flight already: a request_id is 409, naming it, and the first goes on; an X-Request-Id
  // (a proxy's retry while its first try is being cancelled) goes on under a suffix.
  auto stub = server_->stub();
  ASSERT_TRUE(WaitForRunning(*stub, 0));
  HttpConnection c(http_port_);
  const std::string long_body = Json{{"prompt", "Tell me a long story"}, {"max_tokens", 4000},
                                     {"ignore_eos", true}, {"stream", true},
                                     {"request_id", "busy-1"}}.dump();
  ASSERT_TRUE(c.SendRaw(RequestHead("/v1/completions", long_body)));
  ASSERT_EQ(c.ReadHead(60).status, 200);
  ASSERT_TRUE(WaitForRunning(*stub, 1));
  Json clash = body;
  clash["request_id"] = "busy-1";
  r = Post("/v1/completions", clash);
  EXPECT_EQ(r.status, 409);
  EXPECT_NE(r.body.find("request_id 'cmpl-busy-1' is already in flight"), std::string::npos)
      << r.body;
  EXPECT_NE(r.body.find(R"("param":"request_id")"), std::string::npos) << r.body;
  r = HttpCall(http_port_, "POST", "/v1/completions", body.dump(), {{"X-Request-Id", "busy-1"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["x-request-id"], "busy-1");
  const std::string suffixed = Json::parse(r.body)["id"];
  EXPECT_EQ(suffixed.rfind("cmpl-busy-1-", 0), 0u) << suffixed;
  EXPECT_EQ(suffixed.size(), std::string("cmpl-busy-1-").size() + 8) << suffixed;
  // Two prompts under it (the call takes cmpl-busy-1 and its prompts cmpl-busy-1-<p>): the
  // whole call moves to the suffix, its prompts under it.
  Json two = body;
  two["prompt"] = {"Hello", "Goodbye"};
  r = HttpCall(http_port_, "POST", "/v1/completions", two.dump(), {{"X-Request-Id", "busy-1"}});
  ASSERT_EQ(r.status, 200) << r.body;
  const Json both = Json::parse(r.body);
  EXPECT_EQ(both["choices"].size(), 2u) << r.body;
  EXPECT_EQ(both["id"].get<std::string>().rfind("cmpl-busy-1-", 0), 0u) << r.body;
  EXPECT_NE(both["id"], suffixed) << r.body;
  // The first is still generating, under its own id.
  EXPECT_TRUE(WaitForRunning(*stub, 1));
}

// vLLM's stream_options.continuous_usage_stats: with include_usage, every chunk carries its
// choice's usage so far (it was ignored: only the last chunk had usage). Two prompts, two
// choices each: each choice's counts rise to its own completion tokens, over its own prompt.
TEST_F(OpenAiHttpTest, ContinuousUsageStatsPutUsageInEveryChunk) {
  ASSERT_TRUE(server_->started());
  const Json body = {{"prompt", {"Hello", "Once upon a time there was"}}, {"n", 2},
                     {"max_tokens", 5}, {"ignore_eos", true}, {"temperature", 0},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true},
                                         {"continuous_usage_stats", true}}}};
  const HttpResult r = Post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<int64_t> prompt(4, -1), last(4, 0);
  int chunks = 0;
  Json usage;
  for (const std::string& e : SseData(r.body)) {
    if (e == "[DONE]") break;
    const Json j = Json::parse(e);
    ASSERT_TRUE(j.contains("usage")) << e;
    if (j["choices"].empty()) {  // the last chunk: the whole call's
      usage = j["usage"];
      continue;
    }
    ++chunks;
    const int i = j["choices"][0]["index"];
    const Json& u = j["usage"];
    if (prompt[i] < 0) prompt[i] = u["prompt_tokens"];
    EXPECT_EQ(u["prompt_tokens"], prompt[i]) << e;
    EXPECT_GE(u["completion_tokens"].get<int64_t>(), last[i]) << e;
    last[i] = u["completion_tokens"];
    EXPECT_EQ(u["total_tokens"], prompt[i] + last[i]) << e;
  }
  EXPECT_GE(chunks, 8);
  EXPECT_EQ(last, std::vector<int64_t>(4, 5));
  EXPECT_EQ(prompt[0], prompt[1]);
  EXPECT_EQ(prompt[2], prompt[3]);
  EXPECT_LT(prompt[0], prompt[2]);
  ASSERT_FALSE(usage.is_null());
  EXPECT_EQ(usage["prompt_tokens"], prompt[0] + prompt[2]);
  EXPECT_EQ(usage["completion_tokens"], 20);
  // Without include_usage it asks for nothing, as vLLM's; and it must be a boolean.
  Json alone = body;
  alone["stream_options"] = {{"continuous_usage_stats", true}};
  const HttpResult plain = Post("/v1/completions", alone);
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_EQ(plain.body.find("\"usage\""), std::string::npos) << plain.body;
  alone["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", "yes"}};
  const HttpResult bad = Post("/v1/completions", alone);
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("stream_options.continuous_usage_stats must be true or false"),
            std::string::npos) << bad.body;
}

TEST_F(OpenAiHttpTest, AVanishedClientFreesItsPagesStreamingOrNot) {
  ASSERT_TRUE(server_->started());
  auto stub = server_->stub();
  ASSERT_TRUE(WaitForRunning(*stub, 0));
  const std::string kCancelled = "thetaserve_requests_total{outcome=\"cancelled\"}";
  const double cancelled_before = MetricValue(server_->ScrapeMetrics(), kCancelled);
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streaming" : "whole completion");
    const Json body = {{"prompt", "Tell me a very long story about a dragon"},
                       {"max_tokens", 4000}, {"ignore_eos", true}, {"stream", stream}};
    {
      HttpConnection c(http_port_);
      ASSERT_TRUE(c.SendRaw(RequestHead("/v1/completions", body.dump())));
      ASSERT_TRUE(WaitForRunning(*stub, 1));
      if (stream) {
        HttpResult head = c.ReadHead(30);
        EXPECT_EQ(head.status, 200);
      }
      EXPECT_GT(Status(*stub).pages().used_k(), 0u);
    }  // the client goes away mid-generation
    EXPECT_TRUE(WaitForRunning(*stub, 0)) << "the request kept running or kept its pages";
  }
  EXPECT_EQ(MetricValue(server_->ScrapeMetrics(), kCancelled), cancelled_before + 2);
}

// Clients that leave take everything of theirs with them. Rounds of twelve requests left
// mid-generation — HTTP clients gone from a stream or a whole completion, gRPC streams
// cancelled — and after each, once nothing runs and no HTTP connection is open, the process
// holds no KV page and no more descriptors than after the two warm-up rounds, and threads at
// most 4 more (gRPC's executor and timer pools grow with load, bounded by the cores: seen
// growing by 2 in a later round, and from 1 to 4 and 1 to 2 under bursts of 32 requests; a
// thread kept per request would add 12 a round). Read from outside, through the server's own process_* series
// (docs/metrics.md). Seen failing with a descriptor, and with a thread, kept per request.
TEST_F(OpenAiHttpTest, ClientsThatLeaveLeaveNoThreadsDescriptorsOrPages) {
  ASSERT_TRUE(server_->started());
  auto stub = server_->stub();
  ASSERT_TRUE(WaitForRunning(*stub, 0));
  struct Held {
    double threads = 0, fds = 0;
  };
  auto held = [&] {
    const std::string m = server_->ScrapeMetrics();
    return Held{MetricValue(m, "process_threads"), MetricValue(m, "process_open_fds")};
  };
  // Twelve requests left mid-generation; returns once nothing runs and no connection is open
  // (closed ones drain for up to 1 s before the server lets them go).
  auto round = [&] {
    constexpr int kEach = 6;
    {
      std::vector<std::unique_ptr<HttpConnection>> http;
      std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
      std::vector<std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>>> readers;
      for (int i = 0; i < kEach; ++i) {
        const Json body = {{"prompt", "Tell me a long story, number " + std::to_string(i)},
                           {"max_tokens", 4000}, {"ignore_eos", true}, {"stream", i % 2 == 0}};
        http.push_back(std::make_unique<HttpConnection>(http_port_));
        EXPECT_TRUE(http.back()->SendRaw(RequestHead("/v1/completions", body.dump())));
        auto req = Prompt("Tell me a long story, number " + std::to_string(i), 4000);
        req.mutable_stopping()->set_ignore_eos(true);
        contexts.push_back(std::make_unique<grpc::ClientContext>());
        readers.push_back(stub->Generate(contexts.back().get(), req));
      }
      v1::GenerateResponse first;
      for (auto& r : readers) EXPECT_TRUE(r->Read(&first)) << "a gRPC stream sent nothing";
      EXPECT_TRUE(WaitForRunning(*stub, 2 * kEach)) << "the twelve never ran together";
      for (auto& c : contexts) c->TryCancel();
      for (auto& r : readers) EXPECT_EQ(r->Finish().error_code(), grpc::StatusCode::CANCELLED);
    }  // the HTTP clients go away mid-generation
    EXPECT_TRUE(WaitForRunning(*stub, 0, 30)) << "a request kept running";
    std::string metrics;
    for (int i = 0; i < 100; ++i) {
      metrics = server_->ScrapeMetrics();
      if (MetricValue(metrics, "thetaserve_http_connections_open") == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(MetricValue(metrics, "thetaserve_http_connections_open"), 0) << metrics;
    const v1::ServerStatus status = Status(*stub);
    EXPECT_EQ(status.pages().used_k() + status.pages().used_v(), 0u);
  };
  Held warm;
  for (int r = 0; r < 2; ++r) {
    round();
    const Held h = held();
    warm = {std::max(warm.threads, h.threads), std::max(warm.fds, h.fds)};
  }
  ASSERT_GT(warm.threads, 0) << "no process_threads series";
  ASSERT_GT(warm.fds, 0) << "no process_open_fds series";
  for (int r = 3; r <= 5; ++r) {
    SCOPED_TRACE("round " + std::to_string(r));
    round();
    // A handler thread may still be on its way out: up to 5 s to come back down.
    Held later = held();
    for (int i = 0; i < 50 && (later.threads > warm.threads + 4 || later.fds > warm.fds); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      later = held();
    }
    std::printf("round %d: %g threads, %g descriptors (after the warm-up: %g, %g)\n", r,
                later.threads, later.fds, warm.threads, warm.fds);
    EXPECT_LE(later.threads, warm.threads + 4);
    EXPECT_LE(later.fds, warm.fds);
  }
}

TEST_F(OpenAiHttpTest, AbortOverGrpcEndsAnHttpStreamWithAbort) {
  ASSERT_TRUE(server_->started());
  HttpConnection c(http_port_);
  const Json body = {{"prompt", "Once upon a time"}, {"max_tokens", 4000}, {"ignore_eos", true},
                     {"stream", true}};
  HttpResult r = OpenStream(c, body);
  ASSERT_EQ(r.status, 200);
  const std::string id = r.headers["x-request-id"];
  ASSERT_FALSE(id.empty());
  auto stub = server_->stub();
  ASSERT_TRUE(WaitForRunning(*stub, 1));
  grpc::ClientContext ctx;
  v1::AbortRequest abort;
  abort.set_request_id(id);
  v1::AbortResponse found;
  ASSERT_TRUE(stub->Abort(&ctx, abort, &found).ok());
  EXPECT_TRUE(found.found());
  c.ReadBody(&r, 30);
  ASSERT_EQ(r.status, 200);
  const auto events = SseData(r.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(Json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "abort");
  EXPECT_TRUE(WaitForRunning(*stub, 0));
}

TEST_F(OpenAiHttpTest, SixteenConcurrentStreamsAllComplete) {
  ASSERT_TRUE(server_->started());
  using Clock = std::chrono::steady_clock;
  std::atomic<int> done{0};
  std::vector<Clock::time_point> started(16), ended(16);
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      const Json body = {{"prompt", "Story number " + std::to_string(i) + ":"},
                         {"max_tokens", 12}, {"ignore_eos", true}, {"stream", true},
                         {"stream_options", {{"include_usage", true}}}};
      HttpConnection c(http_port_);
      c.SendRaw(RequestHead("/v1/completions", body.dump()));
      HttpResult r = c.ReadHead(120);
      std::string first;
      if (!c.ReadChunk(&first, 120)) return;  // the first token's event
      started[i] = Clock::now();
      c.ReadBody(&r, 120);
      r.body = first + r.body;
      ended[i] = Clock::now();
      const auto events = SseData(r.body);
      if (r.status == 200 && events.size() >= 3 && events.back() == "[DONE]" &&
          Json::parse(events[events.size() - 2])["usage"]["completion_tokens"] == 12) {
        ++done;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(done.load(), 16);
  // All sixteen were decoding together: none ended before the last one had its first token.
  EXPECT_LT(*std::max_element(started.begin(), started.end()),
            *std::min_element(ended.begin(), ended.end()));
}

}  // namespace
}  // namespace thetaserve::testing
