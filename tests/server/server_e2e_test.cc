// End to end over loopback TCP with the real model: the `thetaserve serve` binary, real gRPC
// clients, real /metrics scrapes checked by promtool.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

#include "grpcpp/generic/generic_stub.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "model/theta_table.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace thetaserve::testing {
namespace {

struct StreamResult {
  std::string text;
  std::vector<uint32_t> ids;
  v1::Complete complete;
  grpc::Status status;
  int chunks = 0;
};

StreamResult Generate(v1::Generation::Stub& stub, const v1::GenerateRequest& req,
                      double timeout_s = 300, const std::string& api_key = "") {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  if (!api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key);
  auto reader = stub.Generate(&ctx, req);
  StreamResult out;
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (resp.has_chunk()) {
      out.text += resp.chunk().text();
      out.ids.insert(out.ids.end(), resp.chunk().token_ids().begin(), resp.chunk().token_ids().end());
      ++out.chunks;
    } else {
      out.complete = resp.complete();
    }
  }
  out.status = reader->Finish();
  return out;
}

v1::GenerateRequest Prompt(const std::string& text, int max_tokens, float temperature = 0) {
  v1::GenerateRequest req;
  req.set_prompt(text);
  req.mutable_sampling()->set_temperature(temperature);
  req.mutable_stopping()->set_max_tokens(max_tokens);
  return req;
}

// Runs a shell command; returns its stdout and, through `rc`, pclose's status.
std::string RunCommand(const std::string& cmd, int* rc = nullptr) {
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  if (rc) *rc = status;
  return out;
}

std::string RunGenerateBinary(const std::string& args) {
  return RunCommand(BinaryPath() + " generate --model " + DefaultModelPath() + " " + args + " 2>/dev/null");
}

class ServerE2ETest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--max-num-seqs", "32", "--kv-cache-memory", "256M"});
  }
  static void TearDownTestSuite() { delete server_; }
  static ServerProcess* server_;
};
ServerProcess* ServerE2ETest::server_ = nullptr;

TEST_F(ServerE2ETest, HealthIsServingAndReflectionListsTheService) {
  ASSERT_TRUE(server_->started());
  EXPECT_EQ(server_->HealthStatus(), "SERVING");
  EXPECT_EQ(server_->HealthStatus("thetaserve.v1.Generation"), "SERVING");
  // grpc.reflection.v1alpha ServerReflectionRequest{list_services: ""} (field 7), by hand.
  grpc::GenericStub stub(server_->channel());
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto call = stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  std::string req("\x3a\x00", 2);
  grpc::Slice slice(req);
  grpc::ByteBuffer buffer(&slice, 1);
  call->Write(buffer, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  std::vector<grpc::Slice> slices;
  response.Dump(&slices);
  std::string bytes;
  for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_NE(bytes.find("thetaserve.v1.Generation"), std::string::npos);
  EXPECT_NE(bytes.find("grpc.health.v1.Health"), std::string::npos);
  ctx.TryCancel();
  grpc::Status finish;
  call->Finish(&finish, reinterpret_cast<void*>(4));
  while (cq.Next(&tag, &ok) && tag != reinterpret_cast<void*>(4)) {
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(ServerE2ETest, StreamEqualsGenerateCommandWithTheSameSeed) {
  auto stub = server_->stub();
  auto req = Prompt("Once upon a time", 24, 0.8f);
  req.mutable_sampling()->set_seed(1234);
  req.mutable_stopping()->set_ignore_eos(true);
  StreamResult r = Generate(*stub, req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.complete.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(r.complete.usage().completion_tokens(), 24u);
  EXPECT_GT(r.chunks, 1) << "tokens should stream, not arrive in one message";
  std::string cli = RunGenerateBinary(
      "--prompt 'Once upon a time' --max-tokens 24 --temperature 0.8 --seed 1234 --ignore-eos");
  EXPECT_EQ(r.text + "\n", cli);
}

TEST_F(ServerE2ETest, ThirtyTwoConcurrentStreamsAllComplete) {
  const std::vector<std::string> prompts = {"The capital of France is", "def add(a, b):",
                                            "In the beginning", "My favourite colour is"};
  std::vector<std::string> solo;
  {
    auto stub = server_->stub();
    for (auto& p : prompts) {
      StreamResult r = Generate(*stub, Prompt(p, 16));
      ASSERT_TRUE(r.status.ok());
      solo.push_back(r.text);
    }
  }
  std::vector<StreamResult> results(32);
  std::vector<std::thread> threads;
  for (int i = 0; i < 32; ++i) {
    threads.emplace_back([&, i] {
      auto stub = server_->stub();
      results[i] = Generate(*stub, Prompt(prompts[i % prompts.size()], 16));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 32; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].text, solo[i % prompts.size()]) << "stream " << i;
    EXPECT_NE(results[i].complete.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  }
}

TEST_F(ServerE2ETest, ClientCancelFreesPagesWithinAStep) {
  auto stub = server_->stub();
  auto req = Prompt("Tell me a very long story about a dragon", 400);
  req.mutable_stopping()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  int tokens = 0;
  while (tokens < 5 && reader->Read(&resp)) tokens += resp.chunk().token_ids_size();
  ASSERT_GE(tokens, 5);
  v1::ServerStatus before;
  {
    grpc::ClientContext c;
    ASSERT_TRUE(stub->GetServerStatus(&c, {}, &before).ok());
  }
  EXPECT_GT(before.pages().used_k() + before.pages().used_v(), 0u);
  ctx.TryCancel();
  reader->Finish();
  EXPECT_TRUE(WaitForRunning(*stub, 0, /*timeout_s=*/5));
  const v1::ServerStatus after = Status(*stub);
  EXPECT_EQ(after.pages().used_k() + after.pages().used_v(), 0u);
  EXPECT_EQ(after.pages().free(), after.pages().total());
  EXPECT_EQ(after.running(), 0u);
}

TEST_F(ServerE2ETest, BadInputGetsItsCodeAndTheServerKeepsServing) {
  auto stub = server_->stub();
  struct Case {
    std::string name;
    v1::GenerateRequest req;
    grpc::StatusCode code;
    std::string message_part;
  };
  std::vector<Case> cases;
  auto base = [] { return Prompt("Hello", 4); };
  {
    v1::GenerateRequest r;
    cases.push_back({"no input", r, grpc::StatusCode::INVALID_ARGUMENT, "prompt"});
  }
  {
    auto r = base();
    r.set_prompt("");
    cases.push_back({"empty prompt", r, grpc::StatusCode::INVALID_ARGUMENT, "prompt is empty"});
  }
  {
    auto r = base();
    std::string big;
    for (int i = 0; i < 9000; ++i) big += " word";
    r.set_prompt(big);
    cases.push_back({"prompt too long", r, grpc::StatusCode::INVALID_ARGUMENT, "context"});
  }
  {
    auto r = base();
    r.mutable_stopping()->set_max_tokens(0);
    cases.push_back({"max_tokens 0", r, grpc::StatusCode::INVALID_ARGUMENT, "max_tokens"});
  }
  {
    auto r = base();
    r.mutable_stopping()->set_max_tokens(100000);
    cases.push_back({"max_tokens beyond context", r, grpc::StatusCode::INVALID_ARGUMENT, "max_tokens"});
  }
  {
    auto r = base();
    r.mutable_sampling()->set_temperature(-1);
    cases.push_back({"negative temperature", r, grpc::StatusCode::INVALID_ARGUMENT, "temperature"});
  }
  {
    auto r = base();
    (*r.mutable_sampling()->mutable_logit_bias())[49152] = 1.0f;
    cases.push_back({"logit_bias outside the vocabulary", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "logit_bias has token id 49152"});
  }
  {
    auto r = base();
    (*r.mutable_sampling()->mutable_logit_bias())[5] = -101.0f;
    cases.push_back({"logit_bias out of range", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "logit_bias[5] = -101; it must be in [-100, 100]"});
  }
  for (float p : {0.0f, 1.5f}) {
    auto r = base();
    r.mutable_sampling()->set_top_p(p);
    cases.push_back({"top_p " + std::to_string(p), r, grpc::StatusCode::INVALID_ARGUMENT, "top_p"});
  }
  {
    auto r = base();
    r.mutable_sampling()->set_top_k(-2);
    cases.push_back({"negative top_k", r, grpc::StatusCode::INVALID_ARGUMENT, "top_k"});
  }
  {
    v1::GenerateRequest r = base();
    r.mutable_prompt_token_ids()->add_ids(1);
    r.mutable_prompt_token_ids()->add_ids(49152);
    cases.push_back({"token id outside vocab", r, grpc::StatusCode::INVALID_ARGUMENT, "vocabulary"});
  }
  {
    auto r = base();
    for (int i = 0; i < 17; ++i) r.mutable_stopping()->add_stop(absl::StrCat("x", i));
    cases.push_back({"too many stop strings", r, grpc::StatusCode::INVALID_ARGUMENT, "stop strings"});
  }
  {
    auto r = base();
    r.mutable_stopping()->add_stop(std::string(300, 'a'));
    cases.push_back({"stop string too long", r, grpc::StatusCode::INVALID_ARGUMENT, "bytes"});
  }
  {
    auto r = base();
    r.mutable_stopping()->add_stop_token_ids(99999);
    cases.push_back({"stop token outside vocab", r, grpc::StatusCode::INVALID_ARGUMENT, "vocabulary"});
  }
  for (const Case& c : cases) {
    StreamResult r = Generate(*stub, c.req);
    EXPECT_EQ(r.status.error_code(), c.code) << c.name << ": " << r.status.error_message();
    EXPECT_NE(r.status.error_message().find(c.message_part), std::string::npos)
        << c.name << ": '" << r.status.error_message() << "' should mention '" << c.message_part << "'";
    StreamResult ok = Generate(*stub, base());
    EXPECT_TRUE(ok.status.ok()) << "after " << c.name << ": " << ok.status.error_message();
  }
}

TEST_F(ServerE2ETest, InvalidUtf8PromptIsRejected) {
  // Bytes on the wire that are not UTF-8: sent as a raw message so the client library does
  // not refuse to serialize them. GenerateRequest{prompt (field 2) = "\xff\xfe"}.
  grpc::GenericStub stub(server_->channel());
  grpc::ClientContext ctx;
  std::string raw("\x12\x02\xff\xfe", 4);
  grpc::Slice slice(raw);
  grpc::ByteBuffer request(&slice, 1);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&ctx, "/thetaserve.v1.Generation/Generate", &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  call->Write(request, reinterpret_cast<void*>(2));
  cq.Next(&tag, &ok);
  call->WritesDone(reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  while (cq.Next(&tag, &ok) && tag != reinterpret_cast<void*>(4)) {
  }
  EXPECT_NE(status.error_code(), grpc::StatusCode::OK) << status.error_message();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("UTF-8"), std::string::npos) << status.error_message();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  auto s = server_->stub();
  EXPECT_TRUE(Generate(*s, Prompt("Hello", 2)).status.ok());
}

TEST_F(ServerE2ETest, DeadlineExceededEndsTheStreamAndFreesPages) {
  auto stub = server_->stub();
  auto req = Prompt("Write a long essay", 2000);
  req.mutable_stopping()->set_ignore_eos(true);
  StreamResult r = Generate(*stub, req, /*timeout_s=*/0.5);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << r.status.error_message();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  v1::ServerStatus st;
  while (std::chrono::steady_clock::now() < until) {
    grpc::ClientContext c;
    ASSERT_TRUE(stub->GetServerStatus(&c, {}, &st).ok());
    if (st.pages().free() == st.pages().total()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(st.pages().free(), st.pages().total());
}

TEST_F(ServerE2ETest, AbortCancelsByRequestId) {
  auto stub = server_->stub();
  auto req = Prompt("Count from one to a thousand:", 1000);
  req.set_request_id("abort-me");
  req.mutable_stopping()->set_ignore_eos(true);
  StreamResult r;
  std::thread t([&] {
    auto s = server_->stub();
    r = Generate(*s, req);
  });
  v1::AbortResponse resp;
  bool found = false;
  for (int i = 0; i < 500 && !found; ++i) {
    grpc::ClientContext c;
    v1::AbortRequest a;
    a.set_request_id("abort-me");
    ASSERT_TRUE(stub->Abort(&c, a, &resp).ok());
    found = resp.found();
    if (!found) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  t.join();
  EXPECT_TRUE(found);
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.complete.finish_reason(), v1::FINISH_REASON_CANCELLED);
  EXPECT_LT(r.complete.usage().completion_tokens(), 1000u);
}

// A request id in flight is ALREADY_EXISTS, and the message names the id that clashes: with
// n = 2, "z" runs as "z/0" and "z/1" (it named "z" while "z/1" was the one in flight).
TEST_F(ServerE2ETest, AnIdInFlightIsAlreadyExistsNamingTheClash) {
  auto stub = server_->stub();
  auto long_req = Prompt("Count from one to a thousand:", 1000);
  long_req.set_request_id("dup-z/1");
  long_req.mutable_stopping()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, long_req);
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp)) << "its first tokens: it is in flight";

  auto group = Prompt("Hello", 2);
  group.set_request_id("dup-z");
  group.set_n(2);
  StreamResult clash = Generate(*stub, group);
  EXPECT_EQ(clash.status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(clash.status.error_message(),
            "request_id 'dup-z' with n = 2 names its completions 'dup-z/<i>', and 'dup-z/1' is "
            "already in flight");
  auto same = Prompt("Hello", 2);
  same.set_request_id("dup-z/1");
  StreamResult again = Generate(*stub, same);
  EXPECT_EQ(again.status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(again.status.error_message(), "request_id 'dup-z/1' is already in flight");

  grpc::ClientContext c;
  v1::AbortRequest a;
  a.set_request_id("dup-z/1");
  v1::AbortResponse found;
  EXPECT_TRUE(stub->Abort(&c, a, &found).ok());
  EXPECT_TRUE(found.found());
  v1::Complete complete;
  while (reader->Read(&resp)) {
    if (resp.has_complete()) complete = resp.complete();
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(complete.finish_reason(), v1::FINISH_REASON_CANCELLED);
  // Once it has ended, the id is free again.
  StreamResult after = Generate(*stub, group);
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
}

// logit_bias over gRPC: -100 on the greedy first token makes another come first, +100 on a
// token makes every sampled token that one; the streamed log-probabilities stay the model's.
TEST_F(ServerE2ETest, LogitBiasBansAndForcesTokens) {
  auto stub = server_->stub();
  auto req = Prompt("The capital of France is", 4);
  req.mutable_sampling()->set_logprobs(1);
  StreamResult plain = Generate(*stub, req);
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  ASSERT_FALSE(plain.ids.empty());
  const uint32_t first = plain.ids[0];

  (*req.mutable_sampling()->mutable_logit_bias())[first] = -100.0f;
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  std::vector<uint32_t> ids;
  uint32_t top_first = 0;
  while (reader->Read(&resp)) {
    if (!resp.has_chunk()) continue;
    if (ids.empty() && resp.chunk().logprobs_size() > 0 &&
        resp.chunk().logprobs(0).top_size() > 0) {
      top_first = resp.chunk().logprobs(0).top(0).token_id();
    }
    ids.insert(ids.end(), resp.chunk().token_ids().begin(), resp.chunk().token_ids().end());
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_FALSE(ids.empty());
  EXPECT_NE(ids[0], first) << "a -100 bias did not ban the greedy token";
  EXPECT_EQ(top_first, first) << "log-probabilities should be the model's, before the bias";

  auto forced = Prompt("Once upon a time", 6, 1.0f);
  forced.mutable_sampling()->set_seed(5);
  forced.mutable_stopping()->set_ignore_eos(true);
  (*forced.mutable_sampling()->mutable_logit_bias())[1000] = 100.0f;
  StreamResult f = Generate(*stub, forced);
  ASSERT_TRUE(f.status.ok()) << f.status.error_message();
  EXPECT_EQ(f.ids, std::vector<uint32_t>(6, 1000u));
}

// min_tokens: a chat reply that ends with EOS as its n-th token runs to at least n + 6 with
// min_tokens = n + 6, its first n - 1 tokens unchanged (greedy); a stop string in the text before
// min_tokens does not end it; min_tokens above max_tokens is INVALID_ARGUMENT.
TEST_F(ServerE2ETest, MinTokensHoldsOffEosAndStopStrings) {
  auto stub = server_->stub();
  auto chat = [] {
    v1::GenerateRequest req;
    auto* m = req.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content("Say hello.");
    req.mutable_sampling()->set_temperature(0);
    req.mutable_stopping()->set_max_tokens(64);
    return req;
  };
  StreamResult plain = Generate(*stub, chat());
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  ASSERT_EQ(plain.complete.finish_reason(), v1::FINISH_REASON_EOS) << plain.text;
  const size_t n = plain.ids.size();  // the last is the EOS token
  ASSERT_LT(n + 6, 64u) << "the reply was meant to end early: " << plain.text;

  auto longer = chat();
  longer.mutable_stopping()->set_min_tokens(static_cast<uint32_t>(n + 6));
  StreamResult held = Generate(*stub, longer);
  ASSERT_TRUE(held.status.ok()) << held.status.error_message();
  EXPECT_GE(held.ids.size(), n + 6) << held.text;
  EXPECT_EQ(std::vector<uint32_t>(held.ids.begin(), held.ids.begin() + n - 1),
            std::vector<uint32_t>(plain.ids.begin(), plain.ids.end() - 1));
  EXPECT_NE(held.ids[n - 1], plain.ids[n - 1]) << "EOS was sampled before min_tokens";

  // A stop string taken from the start of the plain reply: it ends the output at once without
  // min_tokens, and not before the min_tokens-th token with it.
  const std::string stop = plain.text.substr(0, std::min<size_t>(plain.text.size(), 2));
  ASSERT_FALSE(stop.empty());
  auto stopped = chat();
  stopped.mutable_stopping()->add_stop(stop);
  StreamResult early = Generate(*stub, stopped);
  ASSERT_TRUE(early.status.ok());
  EXPECT_EQ(early.complete.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_TRUE(early.text.empty()) << early.text;
  stopped.mutable_stopping()->set_min_tokens(4);
  StreamResult late = Generate(*stub, stopped);
  ASSERT_TRUE(late.status.ok());
  EXPECT_GE(late.ids.size(), 4u);
  EXPECT_EQ(late.text.substr(0, stop.size()), stop) << late.text;

  auto bad = chat();
  bad.mutable_stopping()->set_max_tokens(8);
  bad.mutable_stopping()->set_min_tokens(9);
  StreamResult refused = Generate(*stub, bad);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.status.error_message().find("min_tokens = 9 exceeds max_tokens = 8"),
            std::string::npos) << refused.status.error_message();
}

TEST_F(ServerE2ETest, ModelInfoDescribesTheModel) {
  auto stub = server_->stub();
  grpc::ClientContext c;
  v1::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&c, {}, &info).ok());
  EXPECT_EQ(info.architecture(), "llama");
  EXPECT_EQ(info.num_layers(), 30u);
  EXPECT_EQ(info.vocab_size(), 49152u);
  EXPECT_EQ(info.theta_mode(), "dense");
  EXPECT_EQ(info.kv_cache_dtype(), "f16");  // the CPU's default
  EXPECT_FALSE(info.model_fingerprint().empty());
}

TEST_F(ServerE2ETest, MetricsPassPromtoolAndMoveWithRequests) {
  std::string before = server_->ScrapeMetrics();
  ASSERT_FALSE(before.empty());
  const double gen_before = MetricValue(before, "thetaserve_generation_tokens_total");
  const double done_before = MetricValue(before, "thetaserve_requests_total{outcome=\"length\"}");
  // Scrape while requests run.
  std::vector<std::thread> load;
  for (int i = 0; i < 4; ++i) {
    load.emplace_back([&] {
      auto s = server_->stub();
      auto req = Prompt("The weather today", 24);
      req.mutable_stopping()->set_ignore_eos(true);
      Generate(*s, req);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::string during = server_->ScrapeMetrics();
  for (auto& t : load) t.join();
  std::string after = server_->ScrapeMetrics();

  const ScopedTempDir tmp("server_e2e_test");
  for (const std::string* text : {&during, &after}) {
    const std::string path = tmp.File("metrics.txt");
    std::ofstream(path) << *text;
    int rc = 0;
    const std::string out = RunCommand("promtool check metrics < " + path + " 2>&1", &rc);
    EXPECT_EQ(rc, 0) << "promtool check metrics failed:\n" << out;
  }
  EXPECT_GE(MetricValue(after, "thetaserve_generation_tokens_total"), gen_before + 4 * 24);
  EXPECT_GE(MetricValue(after, "thetaserve_requests_total{outcome=\"length\"}"), done_before + 4);
  EXPECT_GT(MetricValue(after, "thetaserve_time_to_first_token_seconds_count"), 0);
  EXPECT_GT(MetricValue(after, "thetaserve_kv_pages_capacity"), 0);
  EXPECT_GT(MetricValue(after, "thetaserve_v_rows_read_total"), 0);
}

// Prefix caching (on by default): a second request that begins with the same preamble finds
// its blocks cached, gets the text `generate` (no cache) gets, and the status RPC and the
// metrics say so; cached pages count as free once nothing runs.
TEST_F(ServerE2ETest, PrefixCacheServesASharedPreambleAndReportsIt) {
  auto stub = server_->stub();
  {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&ctx, {}, &info).ok());
    EXPECT_TRUE(info.prefix_caching());
  }
  auto status = [&] { return Status(*stub); };
  std::string preamble = "The following is a conversation with a patient librarian. ";
  for (int i = 0; i < 12; ++i) preamble += "She knows every shelf, every author and every date. ";
  const std::string first = preamble + "Visitor: where are the atlases? Librarian:";
  const std::string second = preamble + "Visitor: do you have poetry? Librarian:";
  ASSERT_TRUE(Generate(*stub, Prompt(first, 8)).status.ok());
  const v1::ServerStatus before = status();
  const double hits_before =
      MetricValue(server_->ScrapeMetrics(), "thetaserve_prefix_cache_hit_tokens_total");
  StreamResult r = Generate(*stub, Prompt(second, 8));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const v1::ServerStatus after = status();
  const std::string m = server_->ScrapeMetrics();

  // The preamble is well over 100 tokens: at least 6 blocks of 16 come from the cache.
  EXPECT_GE(after.prefix_cache_hit_tokens() - before.prefix_cache_hit_tokens(), 96u);
  EXPECT_GT(after.prefix_cache_query_tokens(), before.prefix_cache_query_tokens());
  EXPECT_GE(MetricValue(m, "thetaserve_prefix_cache_hit_tokens_total") - hits_before, 96);
  EXPECT_GT(after.prefix_cache_blocks(), 0u);
  EXPECT_GT(after.pages().cached(), 0u);
  EXPECT_EQ(MetricValue(m, "thetaserve_kv_pages_cached"), double(after.pages().cached()));
  EXPECT_EQ(after.running(), 0u);
  EXPECT_EQ(after.pages().used_k() + after.pages().used_v(), 0u);
  EXPECT_EQ(after.pages().free(), after.pages().total());
  // The same text as without any cache.
  EXPECT_EQ(r.text + "\n", RunGenerateBinary("--prompt '" + second + "' --max-tokens 8 --temperature 0"));

  // Another salt shares nothing with the unsalted requests, then finds its own blocks.
  auto salted = Prompt(second, 8);
  salted.set_cache_salt("tenant-b");
  for (int round = 0; round < 2; ++round) {
    const v1::ServerStatus st0 = status();
    StreamResult s = Generate(*stub, salted);
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.text, r.text);
    const uint64_t found = status().prefix_cache_hit_tokens() - st0.prefix_cache_hit_tokens();
    if (round == 0) {
      EXPECT_EQ(found, 0u) << "a salted request found unsalted blocks";
    } else {
      EXPECT_GE(found, 96u);
    }
  }
  salted.set_cache_salt(std::string(257, 'x'));
  StreamResult too_long = Generate(*stub, salted);
  EXPECT_EQ(too_long.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(too_long.status.error_message().find("cache_salt has 257 bytes"), std::string::npos)
      << too_long.status.error_message();
}

// n completions in one stream: chunks and Completes name their completion, completion i is
// what a request of its own with seed + i gives, the prompt is computed once (the others
// find it in the prefix cache), and one Abort of the request id ends them all.
TEST_F(ServerE2ETest, NCompletionsShareThePromptAndAbortTogether) {
  auto stub = server_->stub();
  auto status = [&] { return Status(*stub); };
  std::string prompt = "Write the next line of the poem. ";
  for (int i = 0; i < 8; ++i) prompt += "The river runs past the mill and the mill wheel turns. ";
  auto req = Prompt(prompt, 12, 0.9f);
  req.set_request_id("four-ways");
  req.set_cache_salt("n-completions");  // nothing cached before: every hit is the group's own
  req.set_n(4);
  req.mutable_sampling()->set_seed(500);
  req.mutable_stopping()->set_ignore_eos(true);
  const v1::ServerStatus before = status();
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  std::vector<std::string> texts(4);
  std::vector<int> completes(4, 0);
  std::vector<v1::Complete> complete(4);
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (resp.has_chunk()) {
      ASSERT_LT(resp.chunk().index(), 4u);
      EXPECT_EQ(completes[resp.chunk().index()], 0) << "a chunk after its Complete";
      texts[resp.chunk().index()] += resp.chunk().text();
    } else {
      ASSERT_LT(resp.complete().index(), 4u);
      ++completes[resp.complete().index()];
      complete[resp.complete().index()] = resp.complete();
    }
  }
  grpc::Status finished = reader->Finish();
  ASSERT_TRUE(finished.ok()) << finished.error_message();
  const v1::ServerStatus after_group = status();
  const uint32_t prompt_tokens = complete[0].usage().prompt_tokens();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(completes[i], 1) << i;
    EXPECT_EQ(complete[i].request_id(), "four-ways");
    EXPECT_EQ(complete[i].finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(complete[i].usage().completion_tokens(), 12u);
    EXPECT_EQ(complete[i].usage().prompt_tokens(), prompt_tokens);
    auto alone = req;
    alone.clear_n();
    alone.clear_request_id();
    alone.mutable_sampling()->set_seed(500 + i);
    StreamResult r = Generate(*stub, alone);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(texts[i], r.text) << "completion " << i;
  }
  EXPECT_NE(texts[0], texts[1]);
  // The later three found all of the prompt but the last token's block (of 16) in the cache.
  const uint64_t shared = (prompt_tokens - 1) / 16 * 16;
  ASSERT_GE(shared, 96u);
  EXPECT_GE(after_group.prefix_cache_hit_tokens() - before.prefix_cache_hit_tokens(), 3 * shared);

  // Abort by the request id: every completion ends CANCELLED, and the pages come back.
  auto long_req = Prompt("Count from one to a thousand:", 1000, 0.9f);
  long_req.set_request_id("abort-all");
  long_req.set_n(3);
  long_req.mutable_stopping()->set_ignore_eos(true);
  std::vector<v1::Complete> ends;
  grpc::Status long_status;
  std::thread t([&] {
    auto s = server_->stub();
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto rd = s->Generate(&c, long_req);
    v1::GenerateResponse m;
    while (rd->Read(&m)) {
      if (m.has_complete()) ends.push_back(m.complete());
    }
    long_status = rd->Finish();
  });
  bool found = false;
  for (int i = 0; i < 500 && !found; ++i) {
    // Abort only once tokens flow (a found-but-queued group would pass as well, but later).
    if (status().running() < 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    grpc::ClientContext c;
    v1::AbortRequest a;
    a.set_request_id("abort-all");
    v1::AbortResponse resp2;
    ASSERT_TRUE(stub->Abort(&c, a, &resp2).ok());
    found = resp2.found();
  }
  t.join();
  EXPECT_TRUE(found);
  EXPECT_TRUE(long_status.ok()) << long_status.error_message();
  ASSERT_EQ(ends.size(), 3u);
  for (const auto& e : ends) {
    EXPECT_EQ(e.finish_reason(), v1::FINISH_REASON_CANCELLED);
    EXPECT_LT(e.usage().completion_tokens(), 1000u);
  }
  EXPECT_TRUE(WaitForRunning(*stub, 0, /*timeout_s=*/5)) << "running, or pages held, after Abort";

  // A deadline ends every completion (the client hears DEADLINE_EXCEEDED from its own clock;
  // the server cancels all three at its next step).
  auto late = Prompt("Count from one to a thousand:", 1000, 0.9f);
  late.set_n(3);
  late.mutable_stopping()->set_ignore_eos(true);
  StreamResult expired = Generate(*stub, late, /*timeout_s=*/1.0);
  EXPECT_EQ(expired.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << expired.status.error_message();
  EXPECT_TRUE(WaitForRunning(*stub, 0, /*timeout_s=*/5))
      << "running, or pages held, after the deadline";

  // Out of range: INVALID_ARGUMENT, and the server goes on.
  auto many = Prompt("x", 4);
  many.set_n(129);
  StreamResult refused = Generate(*stub, many);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.status.error_message(), "n = 129; it must be in [1, 128] (0 means 1)");
  EXPECT_TRUE(Generate(*stub, Prompt("The capital of France is", 4)).status.ok());
}

// SamplingParams.prompt_logprobs: one PromptLogprobs message before the tokens, scoring every
// prompt token but the first; a prompt that continues with generated tokens scores them as
// the generation did; max_tokens = 0 scores without generating.
TEST_F(ServerE2ETest, PromptLogprobsScoreThePromptAsGenerationScoredItsTokens) {
  auto stub = server_->stub();
  auto read = [&](const v1::GenerateRequest& req, v1::PromptLogprobs* prompt, StreamResult* r,
                  std::vector<float>* logprobs) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse resp;
    int prompts = 0;
    while (reader->Read(&resp)) {
      if (resp.has_prompt_logprobs()) {
        EXPECT_EQ(r->ids.size(), 0u) << "prompt scores after tokens";
        *prompt = resp.prompt_logprobs();
        ++prompts;
      } else if (resp.has_chunk()) {
        r->text += resp.chunk().text();
        r->ids.insert(r->ids.end(), resp.chunk().token_ids().begin(), resp.chunk().token_ids().end());
        for (const auto& lp : resp.chunk().logprobs()) logprobs->push_back(lp.logprob());
      } else {
        r->complete = resp.complete();
      }
    }
    r->status = reader->Finish();
    return prompts;
  };
  auto gen = Prompt("The capital of France is", 6);
  gen.mutable_sampling()->set_logprobs(1);
  gen.mutable_sampling()->set_prompt_logprobs(0);
  gen.mutable_stopping()->set_ignore_eos(true);
  v1::PromptLogprobs prompt;
  StreamResult generated;
  std::vector<float> gen_logprobs;
  ASSERT_EQ(read(gen, &prompt, &generated, &gen_logprobs), 1);
  ASSERT_TRUE(generated.status.ok()) << generated.status.error_message();
  ASSERT_EQ(generated.ids.size(), 6u);
  const int P = prompt.token_ids_size();
  ASSERT_GE(P, 4);
  EXPECT_EQ(uint32_t(P), generated.complete.usage().prompt_tokens());
  ASSERT_EQ(prompt.logprobs_size(), P - 1);
  for (const auto& lp : prompt.logprobs()) {
    EXPECT_LE(lp.logprob(), 0.0f);
    EXPECT_EQ(lp.top_size(), 0);
  }

  // The prompt and the generated tokens as one prompt, scored without generating.
  v1::GenerateRequest score;
  for (uint32_t id : prompt.token_ids()) score.mutable_prompt_token_ids()->add_ids(id);
  for (uint32_t id : generated.ids) score.mutable_prompt_token_ids()->add_ids(id);
  score.mutable_sampling()->set_prompt_logprobs(2);
  score.mutable_stopping()->set_max_tokens(0);
  v1::PromptLogprobs scored;
  StreamResult none;
  std::vector<float> no_logprobs;
  ASSERT_EQ(read(score, &scored, &none, &no_logprobs), 1);
  ASSERT_TRUE(none.status.ok()) << none.status.error_message();
  EXPECT_TRUE(none.ids.empty());
  EXPECT_EQ(none.complete.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(none.complete.usage().completion_tokens(), 0u);
  ASSERT_EQ(scored.logprobs_size(), P + 6 - 1);
  for (int i = 0; i < P - 1; ++i) {
    EXPECT_NEAR(scored.logprobs(i).logprob(), prompt.logprobs(i).logprob(), 1e-3) << i;
  }
  for (int i = 0; i < 6; ++i) {
    const auto& lp = scored.logprobs(P - 1 + i);
    EXPECT_NEAR(lp.logprob(), gen_logprobs[i], 1e-3) << "generated token " << i;
    ASSERT_EQ(lp.top_size(), 2);
    EXPECT_EQ(lp.top(0).token_id(), generated.ids[i]) << "greedy: the most likely";
  }

  // Refused: scores past 20, and max_tokens = 0 without scores.
  score.mutable_sampling()->set_prompt_logprobs(21);
  StreamResult too_many = Generate(*stub, score);
  EXPECT_EQ(too_many.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(too_many.status.error_message(), "sampling.prompt_logprobs = 21; it must be in [0, 20]");
  score.mutable_sampling()->clear_prompt_logprobs();
  StreamResult zero = Generate(*stub, score);
  EXPECT_EQ(zero.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// `thetaserve client` sends n, logit_bias, min_tokens and ignore_eos, and prints each
// completion; its text is what the gRPC stream gives for the same request.
TEST_F(ServerE2ETest, ClientCommandSendsNLogitBiasAndMinTokens) {
  auto stub = server_->stub();
  const std::string base = BinaryPath() + " client --addr " + server_->address() + " --timeout 60";
  // Two sampled completions with the greedy first token banned.
  StreamResult greedy = Generate(*stub, Prompt("Once upon a time", 6));
  ASSERT_TRUE(greedy.status.ok() && !greedy.ids.empty());
  const uint32_t first = greedy.ids[0];
  int rc = 0;
  const std::string two = RunCommand(
      absl::StrCat(base, " --prompt 'Once upon a time' --max-tokens 6 --n 2 --temperature 0.8 "
                   "--seed 3 --ignore-eos --logit-bias ", first, ":-100,13:2.5 2>/dev/null"), &rc);
  EXPECT_EQ(rc, 0) << two;
  auto req = Prompt("Once upon a time", 6, 0.8f);
  req.mutable_stopping()->set_ignore_eos(true);
  (*req.mutable_sampling()->mutable_logit_bias())[first] = -100;
  (*req.mutable_sampling()->mutable_logit_bias())[13] = 2.5f;
  std::string want;
  for (int i = 0; i < 2; ++i) {
    req.mutable_sampling()->set_seed(3 + i);
    StreamResult r = Generate(*stub, req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(std::count(r.ids.begin(), r.ids.end(), first), 0);
    want += absl::StrCat("--- completion ", i, " ---\n", r.text, "\n");
  }
  EXPECT_EQ(two, want);
  // A chat reply that ends with EOS, held open for 8 more tokens by min_tokens.
  v1::GenerateRequest chat;
  auto* m = chat.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("Say hi.");
  chat.mutable_sampling()->set_temperature(0);
  chat.mutable_stopping()->set_max_tokens(80);
  StreamResult natural = Generate(*stub, chat);
  ASSERT_TRUE(natural.status.ok());
  ASSERT_EQ(natural.complete.finish_reason(), v1::FINISH_REASON_EOS);
  const size_t min_tokens = natural.ids.size() + 8;
  ASSERT_LE(min_tokens, 80u);
  chat.mutable_stopping()->set_min_tokens(min_tokens);
  StreamResult longer = Generate(*stub, chat);
  ASSERT_TRUE(longer.status.ok());
  EXPECT_GE(longer.ids.size(), min_tokens);
  const std::string held = RunCommand(
      absl::StrCat(base, " --chat --prompt 'Say hi.' --max-tokens 80 --min-tokens ", min_tokens,
                   " 2>/dev/null"), &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(held, longer.text + "\n");
  // Bad flags: the client's own message, or the server's.
  const std::string bad = RunCommand(base + " --prompt x --logit-bias 13 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(bad.find("--logit-bias takes TOKEN_ID:BIAS pairs"), std::string::npos) << bad;
  const std::string refused = RunCommand(base + " --prompt x --logit-bias 13:500 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(refused.find("logit_bias[13] = 500"), std::string::npos) << refused;
}

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
  // Wait until the request runs, then signal.
  auto stub = server.stub();
  for (int i = 0; i < 500; ++i) {
    grpc::ClientContext c;
    v1::ServerStatus st;
    if (stub->GetServerStatus(&c, {}, &st).ok() && st.running() > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
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

TEST(ServerLifecycleTest, TheCpuDefaultKvCacheHoldsTheWholeContext) {
  ServerProcess server({"--device", "cpu"});
  ASSERT_TRUE(server.started());
  // "KV cache: 0.25 GiB, the default (...); f16, ~11650 tokens of K and V"
  const std::string text = ReadFileOrDie(server.log_path());
  const size_t line = text.find("KV cache: ");
  ASSERT_NE(line, std::string::npos) << text;
  const size_t tilde = text.find("f16, ~", line);
  ASSERT_NE(tilde, std::string::npos) << text;
  EXPECT_GE(std::atoll(text.c_str() + tilde + 6), 8192) << text;
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
    const char* tokens;  // 64 MiB / (30 layers × 3 KV heads × K and V × row_bytes)
  };
  for (const Case& k : {Case{"f32", "f32", 256, "1456"}, Case{"fp8", "fp8_e4m3", 64, "5825"},
                        Case{"q8_0", "q8_0", 68, "5482"}}) {
    SCOPED_TRACE(k.flag);
    ServerProcess server({"--device", "cpu", "--kv-cache-dtype", k.flag, "--kv-cache-memory", "64M"});
    ASSERT_TRUE(server.started());
    auto stub = server.stub();
    {
      grpc::ClientContext c;
      v1::ModelInfo info;
      ASSERT_TRUE(stub->GetModelInfo(&c, {}, &info).ok());
      EXPECT_EQ(info.kv_cache_dtype(), k.name);
    }
    {
      grpc::ClientContext c;
      v1::ServerStatus st;
      ASSERT_TRUE(stub->GetServerStatus(&c, {}, &st).ok());
      EXPECT_EQ(st.pages().page_bytes(), 16u * k.row_bytes);  // 16 rows
    }
    const std::string log = ReadFileOrDie(server.log_path());
    EXPECT_NE(log.find(absl::StrCat("KV cache: 0.06 GiB; ", k.name, ", ~", k.tokens, " tokens of K and V")),
              std::string::npos) << log;
    EXPECT_NE(log.find(absl::StrCat("backend cpu (KV cache in ", k.name, ")")), std::string::npos) << log;
    const std::string metrics = server.ScrapeMetrics();
    const size_t info = metrics.find("\nthetaserve_build_info{");
    ASSERT_NE(info, std::string::npos) << metrics;
    EXPECT_NE(metrics.substr(info, metrics.find('\n', info + 1) - info)
                  .find(absl::StrCat("kv_cache_dtype=\"", k.name, "\"")),
              std::string::npos) << metrics;
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

TEST(ServerLifecycleTest, OutOfRangeFlagsAreRefusedByName) {
  // Each was accepted before: the log said it served on port 70000, the thread count crashed
  // the pool, the block size wrapped to negative pages.
  const std::pair<std::string, std::string> cases[] = {
      {"--port 70000", "--port must be in [0, 65535], got 70000"},
      {"--metrics-port -5", "--metrics-port must be in [0, 65535], got -5"},
      {"--http-port 65536", "--http-port must be in [0, 65535], got 65536"},
      {"--threads 5000000000", "--threads must be in [0, 1024], got 5000000000"},
      {"--block-size 3000000000", "--block-size must be in [1, 65536], got 3000000000"},
      {"--block-size 0", "--block-size must be in [1, 65536], got 0"},
      {"--drain-timeout nan", "--drain-timeout must be in [0, 86400], got nan"},
      // The Top-θ flags are read with the model (the θ file must match it).
      {"--local-window 0", "--local-window must be in [1, 2147483647], got 0"},
  };
  for (const auto& [flags, message] : cases) {
    int rc = 0;
    const std::string out = RunCommand(
        BinaryPath() + " serve --model " + DefaultModelPath() + " " + flags + " 2>&1", &rc);
    EXPECT_NE(rc, 0) << flags;
    EXPECT_NE(out.find("thetaserve serve: " + message), std::string::npos) << flags << "\n" << out;
    if (flags.find("--local-window") == std::string::npos) {
      EXPECT_EQ(out.find("loading"), std::string::npos) << flags << ": refused before loading";
    }
  }
}

TEST(ServerLifecycleTest, GenerateTakesSamplingTopKAndTheApisChecks) {
  // --top-k is the sampling flag (the attention baseline is --exact-top-k): it was refused as
  // "unexpected argument '40'" while the usage offered it.
  int rc = 0;
  const std::string generate = BinaryPath() + " generate --model " + DefaultModelPath();
  std::string out = RunCommand(generate + " --prompt 'Once upon a time' --max-tokens 4 --ignore-eos"
                                          " --temperature 0.8 --top-k 40 --seed 7 2>&1",
                               &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("generated 4 tokens"), std::string::npos) << out;
  // The same sampling checks as the API, before the model loads.
  const std::pair<std::string, std::string> cases[] = {
      {"--temperature -1", "sampling.temperature = -1; it must be >= 0 (0 = greedy)"},
      {"--top-p 7", "sampling.top_p = 7; it must be in (0, 1]"},
      {"--top-k -4", "--top-k must be in [0, 2147483647], got -4"},
      {"--min-p 2", "sampling.min_p = 2; it must be in [0, 1]"},
      {"--repetition-penalty 0", "sampling.repetition_penalty = 0; it must be > 0 (1 = off)"},
      {"--max-tokens 0", "--max-tokens must be in [1, 2147483647], got 0"},
  };
  for (const auto& [flags, message] : cases) {
    out = RunCommand(generate + " --prompt hi " + flags + " 2>&1", &rc);
    EXPECT_NE(rc, 0) << flags;
    EXPECT_NE(out.find("thetaserve generate: " + message), std::string::npos)
        << flags << "\n" << out;
    EXPECT_EQ(out.find("loading"), std::string::npos) << flags << ": refused before loading";
  }
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
  server.Signal(SIGKILL);
  threads[0].join();
  threads[1].join();
}

// A θ file for the real model: constant post-softmax θ = 2% beyond k = 16 (layers 0-1
// dense), saved at `path`.
model::ThetaTable ConstantTheta(const std::string& path) {
  auto model = model::Model::Load(DefaultModelPath());
  EXPECT_TRUE(model.ok()) << model.status();
  const auto& c = (*model)->config();
  model::ThetaTable table(c.num_layers, c.num_heads, model::ThetaTable::DefaultBuckets(8192));
  for (int32_t l = 0; l < c.num_layers; ++l) {
    table.k_per_layer[l] = l < 2 ? 512 : 16;
    for (int32_t h = 0; h < c.num_heads; ++h) {
      for (size_t b = 0; b < table.buckets().size(); ++b) table.theta_at(l, h, b) = 0.02f;
    }
  }
  table.model_fingerprint = (*model)->fingerprint();
  table.model_name = c.name;
  table.Finalize();
  EXPECT_TRUE(table.Save(path).ok());
  return table;
}

TEST(ServerTopThetaTest, SparsePolicyReportsItselfAndItsSavingsMove) {
  const ScopedTempDir tmp("server_e2e_test");
  const std::string path = tmp.File("theta_const.json");
  model::ThetaTable table = ConstantTheta(path);
  ASSERT_FALSE(::testing::Test::HasFailure());

  ServerProcess server({"--theta", path, "--policy", "sparse", "--local-window", "32"});
  ASSERT_TRUE(server.started());
  auto stub = server.stub();
  {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.theta_mode(), "top-theta-post");
    EXPECT_EQ(info.kv_policy(), "sparse");
    EXPECT_FALSE(info.prefix_caching()) << "the sparse policy rewrites V pages in place";
    EXPECT_EQ(info.calibration_fingerprint(), table.fingerprint);
  }
  std::string prompt;
  for (int i = 0; i < 40; ++i) prompt += "It is a truth universally acknowledged, that a single man. ";
  auto req = Prompt(prompt, 24);
  req.mutable_stopping()->set_ignore_eos(true);
  StreamResult r = Generate(*stub, req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.complete.usage().completion_tokens(), 24u);
  const std::string m = server.ScrapeMetrics();
  const double read = MetricValue(m, "thetaserve_v_rows_read_total");
  const double dense = MetricValue(m, "thetaserve_v_rows_read_dense_total");
  EXPECT_GT(read, 0);
  EXPECT_LT(read, 0.8 * dense) << "Top-θ should read well under the dense rows";
  EXPECT_GT(MetricValue(m, "thetaserve_v_rows_evicted_total"), 0) << "the sparse policy dropped nothing";
  EXPECT_LT(MetricValue(m, "thetaserve_attention_elements_kept_total"),
            MetricValue(m, "thetaserve_attention_elements_dense_total"));
  EXPECT_NE(m.find("theta_mode=\"top-theta-post\""), std::string::npos);
  // Every page comes back after the request.
  grpc::ClientContext ctx;
  v1::ServerStatus st;
  ASSERT_TRUE(stub->GetServerStatus(&ctx, {}, &st).ok());
  EXPECT_EQ(st.pages().free(), st.pages().total());

  // A θ file from another model is refused with a message naming both.
  table.model_fingerprint = "0123456789abcdef";
  table.Finalize();
  const std::string wrong = tmp.File("theta_wrong.json");
  ASSERT_TRUE(table.Save(wrong).ok());
  int rc = 0;
  const std::string out = RunCommand(BinaryPath() + " generate --model " + DefaultModelPath() +
                                     " --prompt hi --theta " + wrong + " 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("was calibrated for model"), std::string::npos) << out;
  EXPECT_NE(out.find("0123456789abcdef"), std::string::npos) << out;

  // A θ file of another shape names the shapes (it named two equal fingerprints).
  model::ThetaTable short_table(20, table.num_heads(), table.buckets());
  short_table.model_fingerprint = table.model_fingerprint;
  short_table.model_name = table.model_name;
  short_table.Finalize();
  const std::string shorter = tmp.File("theta_20_layers.json");
  ASSERT_TRUE(short_table.Save(shorter).ok());
  const std::string generate = BinaryPath() + " generate --model " + DefaultModelPath();
  std::string msg = RunCommand(generate + " --prompt hi --theta " + shorter + " 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(msg.find("holds 20 layers × 9 heads; this model has 30 × 9"), std::string::npos)
      << msg;
  // --exact-top-k takes its k from a θ file: without one it was silently dense.
  msg = RunCommand(generate + " --prompt hi --exact-top-k 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(msg.find("--exact-top-k needs --theta"), std::string::npos) << msg;
}

// eval and calibrate refuse work whose result could not be kept or used, before the run: an
// --out that cannot be written (eval wrote nothing and exited 0), --dense-layers covering every
// layer (calibrate wrote a file of no thresholds).
TEST(ServerLifecycleTest, EvalAndCalibrateRefuseUselessRunsUpFront) {
  const std::string model = " --model " + DefaultModelPath();
  int rc = 0;
  std::string out = RunCommand(BinaryPath() + " eval" + model + " --text " + SourceDir() +
                                   "/data/austen.txt --out /nonexistent/dir/x.jsonl 2>&1",
                               &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("cannot write --out /nonexistent/dir/x.jsonl"), std::string::npos) << out;
  const ScopedTempDir tmp("server_e2e_test");
  out = RunCommand(BinaryPath() + " calibrate" + model + " --corpus " + SourceDir() +
                       "/data/kjv.txt --context 64 --max-tokens 64 --k 8 --dense-layers 30 --out " +
                       tmp.File("t.json") + " 2>&1",
                   &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--dense-layers 30 leaves none of the model's 30 layers"), std::string::npos)
      << out;
}

// The offload policy over gRPC: it reports itself, a greedy request gets the text the full
// policy gives (`generate` with the same θ file), rows move to host memory and some are read
// back, nothing is dropped, and every page of both pools comes back. --offload-memory without
// the policy, as a share, or below one page is refused at startup.
TEST(ServerTopThetaTest, OffloadPolicyServesTheFullPolicysTextAndReportsHostMemory) {
  const ScopedTempDir tmp("server_e2e_test");
  const std::string path = tmp.File("theta_const_offload.json");
  ConstantTheta(path);
  ASSERT_FALSE(::testing::Test::HasFailure());
  ServerProcess server({"--theta", path, "--policy", "offload", "--local-window", "32",
                        "--keep-fraction", "0.05", "--offload-memory", "64M"});
  ASSERT_TRUE(server.started());
  auto stub = server.stub();
  {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.kv_policy(), "offload");
    EXPECT_FALSE(info.prefix_caching()) << "the offload policy rewrites V pages in place";
  }
  std::string prompt;
  for (int i = 0; i < 30; ++i) prompt += "It is a truth universally acknowledged, that a single man. ";
  StreamResult r = Generate(*stub, Prompt(prompt, 24));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const std::string full = RunGenerateBinary("--prompt '" + prompt + "' --max-tokens 24 --temperature 0 "
                                             "--theta " + path);
  EXPECT_EQ(r.text + "\n", full) << "the offload policy changed the output";

  grpc::ClientContext ctx;
  v1::ServerStatus st;
  ASSERT_TRUE(stub->GetServerStatus(&ctx, {}, &st).ok());
  EXPECT_EQ(st.pages().free(), st.pages().total());
  // Host pages have the KV pool's shape: 16 rows of 64 f16 elements.
  EXPECT_EQ(st.pages().page_bytes(), 2048u);
  EXPECT_EQ(st.host_pages_total(), uint64_t(64 << 20) / 2048);
  EXPECT_EQ(st.host_pages_used(), 0u);

  const std::string m = server.ScrapeMetrics();
  EXPECT_GT(MetricValue(m, "thetaserve_v_rows_offloaded_total"), 0);
  EXPECT_GT(MetricValue(m, "thetaserve_v_rows_read_host_total"), 0) << "no offloaded row was needed";
  EXPECT_EQ(MetricValue(m, "thetaserve_v_rows_evicted_total"), 0);
  EXPECT_EQ(MetricValue(m, "thetaserve_v_rows_retained_but_evicted_total"), 0);
  EXPECT_EQ(MetricValue(m, "thetaserve_host_pages_capacity"), double(64 << 20) / 2048);
  EXPECT_EQ(MetricValue(m, "thetaserve_host_pages_used"), 0);
  EXPECT_NE(m.find("kv_policy=\"offload\""), std::string::npos);

  for (const std::string& bad : {std::string("--offload-memory 1G"),
                                 "--theta " + path + " --policy offload --offload-memory 10%",
                                 "--theta " + path + " --policy offload --offload-memory 1K"}) {
    int rc = 0;
    const std::string out = RunCommand("timeout 120 " + BinaryPath() + " serve --model " +
                                           DefaultModelPath() + " --port 0 --metrics-port 0 " +
                                           bad + " 2>&1",
                                       &rc);
    EXPECT_NE(rc, 0) << bad;
    EXPECT_NE(out.find("--offload-memory"), std::string::npos) << out;
  }
}

// `thetaserve calibrate` on the real model and the KJV corpus with `args`: its stdout and stderr.
std::string RunCalibrate(const std::string& args, int* rc) {
  return RunCommand(BinaryPath() + " calibrate --model " + DefaultModelPath() + " --corpus " +
                        SourceDir() + "/data/kjv.txt " + args + " 2>&1",
                    rc);
}

// `calibrate --k-schedule` on the real model: the file records the schedule, θ is unchanged
// where k is (rows up to the first point see the same k, and attention is causal) and lower
// past it (post-softmax, the (k+1)-th largest probability falls as k grows); a schedule that
// reaches past --context is refused.
TEST(CalibrateCommandTest, KScheduleRaisesKWithTheRowLength) {
  const auto& run = RunCalibrate;
  const ScopedTempDir tmp("server_e2e_test");
  const std::string fixed = tmp.File("theta_k16.json");
  const std::string scheduled = tmp.File("theta_k16_64.json");
  int rc = 0;
  std::string out = run("--context 512 --max-tokens 512 --k 16 --out " + fixed, &rc);
  ASSERT_EQ(rc, 0) << out;
  out = run("--context 512 --max-tokens 512 --k-schedule 128:16,512:64 --out " + scheduled, &rc);
  ASSERT_EQ(rc, 0) << out;
  out = run("--context 256 --max-tokens 512 --k-schedule 128:16,512:64 --out " + scheduled + ".x", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("shorter than the k schedule's last length 512"), std::string::npos) << out;

  auto a = model::ThetaTable::Load(fixed);
  auto b = model::ThetaTable::Load(scheduled);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->k_schedule.empty());
  ASSERT_EQ(b->k_schedule.size(), 2u);
  EXPECT_EQ(b->k_schedule[1], std::make_pair(int64_t(512), 64));
  EXPECT_NE(a->fingerprint, b->fingerprint);
  int lower = 0, heads = 0;
  for (int32_t l = 2; l < a->num_layers(); ++l) {  // layers 0-1 are dense (k = 512)
    for (int32_t h = 0; h < a->num_heads(); ++h) {
      // Equal up to the order in which threads summed the rows.
      EXPECT_NEAR(a->Theta(l, h, 100), b->Theta(l, h, 100), 1e-5f * std::fabs(a->Theta(l, h, 100)))
          << l << " " << h;
      lower += b->Theta(l, h, 480) < a->Theta(l, h, 480);
      ++heads;
    }
  }
  EXPECT_EQ(lower, heads) << "k = 60 at L = 480 must give a lower probability threshold than k = 16";
}

// `calibrate --kv-cache-dtype`: the scores θ is calibrated on are computed over pages of that
// type, so fp8 pages give other thresholds than f32 pages, near them (K moves by at most 2^-4
// of itself, so a score by a fraction of a nat, and a post-softmax θ by a factor near 1);
// a bad type is refused.
TEST(CalibrateCommandTest, ScoresAreComputedOverTheGivenKvCacheDtype) {
  auto run = [](const std::string& args, int* rc) {
    return RunCalibrate("--context 512 --max-tokens 512 --k 16 " + args, rc);
  };
  const ScopedTempDir tmp("server_e2e_test");
  const std::string f32 = tmp.File("theta_f32.json");
  const std::string fp8 = tmp.File("theta_fp8.json");
  int rc = 0;
  std::string out = run("--kv-cache-dtype f32 --out " + f32, &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("(KV cache in f32)"), std::string::npos) << out;
  out = run("--kv-cache-dtype fp8 --out " + fp8, &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("(KV cache in fp8_e4m3)"), std::string::npos) << out;
  out = run("--kv-cache-dtype int4 --out " + fp8 + ".x", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--kv-cache-dtype must be auto, f32, f16, bf16, fp8"), std::string::npos) << out;

  auto a = model::ThetaTable::Load(f32);
  auto b = model::ThetaTable::Load(fp8);
  ASSERT_TRUE(a.ok() && b.ok());
  int differ = 0, heads = 0;
  for (int32_t l = 2; l < a->num_layers(); ++l) {
    for (int32_t h = 0; h < a->num_heads(); ++h) {
      const float x = a->Theta(l, h, 480), y = b->Theta(l, h, 480);
      ASSERT_GT(x, 0.0f);
      ASSERT_GT(y, 0.0f);
      EXPECT_LT(std::fabs(std::log(y / x)), 0.5f) << "layer " << l << " head " << h << ": " << x << " vs " << y;
      differ += x != y;
      ++heads;
    }
  }
  EXPECT_GT(differ, heads / 2) << "fp8 pages gave f32's thresholds: were they used?";
}

}  // namespace
}  // namespace thetaserve::testing
