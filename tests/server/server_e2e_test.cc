// End to end over loopback TCP with the real model: the `thetaserve serve` binary and real gRPC
// clients — health, streaming, concurrency, cancellation, deadlines, and bad input's codes.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>
#include <thread>

#include "grpcpp/generic/generic_stub.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/server/e2e_util.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace thetaserve::testing {
namespace {

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
    // What JSON's 1e300 becomes as a float: it said "= inf; it must be >= 0".
    auto r = base();
    r.mutable_sampling()->set_temperature(std::numeric_limits<float>::infinity());
    cases.push_back({"infinite temperature", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "sampling.temperature = inf; it must be finite (at most 3.40282e+38)"});
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

// Tokenize as Generate: no input is an error (the HTTP route's '{}' is a 400 too), while an
// input that is empty text is a tokenization like any other.
TEST_F(ServerE2ETest, TokenizeWithoutInputIsInvalidArgument) {
  auto stub = server_->stub();
  grpc::ClientContext ctx;
  v1::TokenizeResponse resp;
  const grpc::Status st = stub->Tokenize(&ctx, v1::TokenizeRequest(), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_EQ(st.error_message(), "one of text or chat is required");
  v1::TokenizeRequest empty;
  empty.set_text("");
  empty.set_add_special_tokens(false);
  grpc::ClientContext ctx2;
  const grpc::Status ok = stub->Tokenize(&ctx2, empty, &resp);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(resp.ids_size(), 0);
  EXPECT_FALSE(TokenIds(*stub, "Hello", false).empty()) << "and the server keeps serving";
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
  // Answered, and not written to the log: protobuf logged a line per such request
  // ("[libprotobuf ERROR ...] String field ... contains invalid UTF-8 data"), which let any
  // client write the server's log.
  const std::string log = ReadFileOrDie(server_->log_path());
  EXPECT_EQ(log.find("invalid UTF-8"), std::string::npos) << log;
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

// skip_special_tokens (vLLM's): special tokens are left out of the text by default and written
// where they were generated when it is false (it had no field: a client could not see them);
// their ids come either way. EOS that ends the output is written only with
// include_stop_str_in_output as well, as vLLM does.
TEST_F(ServerE2ETest, SkipSpecialTokensFalseWritesThemIntoTheText) {
  auto stub = server_->stub();
  const std::vector<uint32_t> im_end = TokenIds(*stub, "<|im_end|>", false);
  ASSERT_EQ(im_end.size(), 1u);
  auto forced = Prompt("Hello", 3);
  forced.mutable_stopping()->set_ignore_eos(true);
  (*forced.mutable_sampling()->mutable_logit_bias())[im_end[0]] = 100.0f;
  StreamResult skipped = Generate(*stub, forced);
  ASSERT_TRUE(skipped.status.ok()) << skipped.status.error_message();
  EXPECT_EQ(skipped.ids, std::vector<uint32_t>(3, im_end[0]));
  EXPECT_EQ(skipped.text, "");
  forced.set_skip_special_tokens(false);
  StreamResult written = Generate(*stub, forced);
  ASSERT_TRUE(written.status.ok()) << written.status.error_message();
  EXPECT_EQ(written.ids, skipped.ids);
  EXPECT_EQ(written.text, "<|im_end|><|im_end|><|im_end|>");

  auto eos = forced;  // <|im_end|> is SmolLM2-Instruct's EOS
  eos.mutable_stopping()->set_ignore_eos(false);
  StreamResult ended = Generate(*stub, eos);
  ASSERT_TRUE(ended.status.ok()) << ended.status.error_message();
  ASSERT_EQ(ended.complete.finish_reason(), v1::FINISH_REASON_EOS);
  EXPECT_EQ(ended.text, "");
  eos.mutable_stopping()->set_include_stop_str_in_output(true);
  ended = Generate(*stub, eos);
  ASSERT_TRUE(ended.status.ok()) << ended.status.error_message();
  EXPECT_EQ(ended.text, "<|im_end|>");

  // A stop string finds a special token's text once it is written.
  auto stopped = forced;  // skip_special_tokens false, ignore_eos
  stopped.mutable_stopping()->add_stop("<|im_end|>");
  StreamResult cut = Generate(*stub, stopped);
  ASSERT_TRUE(cut.status.ok()) << cut.status.error_message();
  EXPECT_EQ(cut.complete.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(cut.ids.size(), 1u);
  EXPECT_EQ(cut.text, "");

  // A guided output is exactly one of its choices: the EOS that ends it ("yes", where "yes sir"
  // could go on) is not written, include_stop_str_in_output or not (it came out "yes<|im_end|>").
  auto guided = Prompt("Answer:", 8);
  guided.mutable_sampling()->add_guided_choice("yes");
  guided.mutable_sampling()->add_guided_choice("yes sir");
  (*guided.mutable_sampling()->mutable_logit_bias())[im_end[0]] = 100.0f;
  guided.set_skip_special_tokens(false);
  guided.mutable_stopping()->set_include_stop_str_in_output(true);
  StreamResult chose = Generate(*stub, guided);
  ASSERT_TRUE(chose.status.ok()) << chose.status.error_message();
  EXPECT_EQ(chose.complete.finish_reason(), v1::FINISH_REASON_EOS);
  EXPECT_EQ(chose.text, "yes");
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

}  // namespace
}  // namespace thetaserve::testing
