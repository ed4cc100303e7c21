// The OpenAI-compatible HTTP API end to end: the real `thetaserve serve --http-port` binary with
// SmolLM2, raw HTTP over loopback, and the gRPC API beside it on the same engine.
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "scheduler/guided_json.h"
#include "tests/server/e2e_util.h"
#include "tests/server/http_client.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace thetaserve::testing {
namespace {

using Json = nlohmann::json;
constexpr char kModelName[] = "SmolLM2-135M-Instruct.Q4_1";

std::string GrpcText(v1::Generation::Stub& stub, const v1::GenerateRequest& req,
                     v1::Complete* complete = nullptr) {
  grpc::ClientContext ctx;
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse resp;
  std::string text;
  while (reader->Read(&resp)) {
    if (resp.has_chunk()) text += resp.chunk().text();
    if (resp.has_complete() && complete) *complete = resp.complete();
  }
  EXPECT_TRUE(reader->Finish().ok());
  return text;
}

std::string RequestHead(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Sends a streaming request on `c` and reads the response's head (sent once the request is in
// the engine).
HttpResult OpenStream(HttpConnection& c, const Json& body) {
  if (!c.SendRaw(RequestHead("/v1/completions", body.dump()))) return {};
  return c.ReadHead(60);
}

// A streamed response of n choices taken apart: each choice's text (a completion's `text`, a
// chat reply's delta content), how many of its chunks named the role and how many carried a
// finish reason, and the usage when it was sent. A chunk for a choice outside [0, n) or after
// its choice finished fails the test; so does a stream that does not end with [DONE].
struct StreamedChoices {
  std::vector<std::string> texts;
  std::vector<int> roles, finishes;
  Json usage;
};

StreamedChoices CollectChoices(const std::string& sse_body, int n) {
  StreamedChoices out{std::vector<std::string>(n), std::vector<int>(n, 0),
                      std::vector<int>(n, 0), Json()};
  const std::vector<std::string> events = SseData(sse_body);
  EXPECT_TRUE(!events.empty() && events.back() == "[DONE]") << sse_body;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const Json e = Json::parse(events[i]);
    if (e.contains("usage") && !e["usage"].is_null()) out.usage = e["usage"];
    for (const Json& c : e["choices"]) {
      const int index = c["index"];
      if (index < 0 || index >= n) {
        ADD_FAILURE() << "choice index " << index << " in " << events[i];
        continue;
      }
      EXPECT_EQ(out.finishes[index], 0) << "a chunk after choice " << index << " finished";
      if (c.contains("text")) out.texts[index] += c["text"].get<std::string>();
      if (c.contains("delta")) {
        const Json& delta = c["delta"];
        if (delta.contains("role")) ++out.roles[index];
        if (delta.contains("content") && delta["content"].is_string()) {
          out.texts[index] += delta["content"].get<std::string>();
        }
      }
      if (!c["finish_reason"].is_null()) ++out.finishes[index];
    }
  }
  return out;
}

class OpenAiHttpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    http_port_ = FreePort();
    // 128 MiB of KV cache (f16) holds ~5,800 tokens of one sequence, fewer than SmolLM2's
    // context: the chat default's clamp to the cache is tested.
    server_ = new ServerProcess({"--http-port", std::to_string(http_port_), "--max-num-seqs", "16",
                                 "--kv-cache-memory", "128M"}, 180, /*report_failure=*/false);
  }
  static void TearDownTestSuite() { delete server_; }

  static HttpResult Post(const std::string& path, const Json& body) {
    return HttpCall(http_port_, "POST", path, body.dump());
  }
  // A completions request again, streamed: each choice's text is the whole response's.
  static StreamedChoices StreamedAlike(Json body, const Json& whole) {
    body["stream"] = true;
    const HttpResult s = Post("/v1/completions", body);
    EXPECT_EQ(s.status, 200) << s.body;
    const int n = int(whole["choices"].size());
    StreamedChoices parts = CollectChoices(s.body, n);
    for (int i = 0; i < n; ++i) EXPECT_EQ(parts.texts[i], whole["choices"][i]["text"]) << i;
    return parts;
  }
  // A greedy chat of one user message, for the gRPC side.
  static v1::GenerateRequest GreedyChat(const std::string& content, uint32_t max_tokens) {
    v1::GenerateRequest req;
    v1::ChatMessage* m = req.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(content);
    req.mutable_stopping()->set_max_tokens(max_tokens);
    req.mutable_sampling()->set_temperature(0);
    return req;
  }
  static ServerProcess* server_;
  static int http_port_;
};
ServerProcess* OpenAiHttpTest::server_ = nullptr;
int OpenAiHttpTest::http_port_ = 0;

TEST_F(OpenAiHttpTest, HealthAndModelsDescribeTheServer) {
  ASSERT_TRUE(server_->started());
  HttpResult health = HttpCall(http_port_, "GET", "/health");
  EXPECT_EQ(health.status, 200);
  HttpResult models = HttpCall(http_port_, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  const Json m = Json::parse(models.body);
  EXPECT_EQ(m["object"], "list");
  ASSERT_EQ(m["data"].size(), 1u);
  EXPECT_EQ(m["data"][0]["id"], kModelName);
  EXPECT_EQ(m["data"][0]["max_model_len"], 8192);
  EXPECT_EQ(HttpCall(http_port_, "GET", std::string("/v1/models/") + kModelName).status, 200);
  EXPECT_EQ(HttpCall(http_port_, "GET", "/v1/models/gpt-4o").status, 404);

  // /metrics on the API port too, as vLLM serves it: the same families as --metrics-port's,
  // valid for promtool.
  HttpResult metrics = HttpCall(http_port_, "GET", "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_EQ(metrics.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  for (const char* family : {"thetaserve_requests_total", "thetaserve_kv_pages_capacity",
                             "thetaserve_build_info", "thetaserve_time_to_first_token_seconds"}) {
    EXPECT_NE(metrics.body.find(absl::StrCat("# TYPE ", family, " ")), std::string::npos)
        << family;
    EXPECT_NE(server_->ScrapeMetrics().find(absl::StrCat("# TYPE ", family, " ")),
              std::string::npos) << family;
  }
  ScopedTempDir tmp("openai_http_e2e_test");
  const std::string path = tmp.File("metrics.txt");
  std::ofstream(path) << metrics.body;
  int rc = 0;
  const std::string check = RunCommand("promtool check metrics < " + path + " 2>&1", &rc);
  EXPECT_EQ(rc, 0) << "promtool check metrics failed:\n" << check;
  EXPECT_EQ(HttpCall(http_port_, "POST", "/metrics", "{}").status, 405);
}

// vLLM's /tokenize (a prompt, or messages through the chat template) gives the Tokenize RPC's
// ids, and /detokenize turns ids back into the text.
TEST_F(OpenAiHttpTest, TokenizeAndDetokenizeAsVllm) {
  ASSERT_TRUE(server_->started());
  auto stub = server_->stub();
  auto grpc_ids = [&](const v1::TokenizeRequest& req) {
    return Json(TokenIds(TokenizeRpc(*stub, req)));
  };
  const std::string text = "The capital of France is";
  v1::TokenizeRequest plain;
  plain.set_text(text);
  HttpResult r = Post("/tokenize", {{"prompt", text}});
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Json::parse(r.body);
  EXPECT_EQ(j["tokens"], grpc_ids(plain));
  EXPECT_EQ(j["count"], j["tokens"].size());
  EXPECT_EQ(j["max_model_len"], 8192);
  plain.set_add_special_tokens(false);
  r = Post("/tokenize", {{"prompt", text}, {"add_special_tokens", false}, {"model", kModelName}});
  ASSERT_EQ(r.status, 200) << r.body;
  const Json bare = Json::parse(r.body)["tokens"];
  EXPECT_EQ(bare, grpc_ids(plain));

  v1::TokenizeRequest chat;
  v1::ChatMessage* m = chat.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("Hi");
  chat.set_add_special_tokens(false);
  r = Post("/tokenize", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json::parse(r.body)["tokens"], grpc_ids(chat));

  HttpResult back = Post("/detokenize", {{"tokens", bare}});
  ASSERT_EQ(back.status, 200) << back.body;
  EXPECT_EQ(Json::parse(back.body)["prompt"], text);

  EXPECT_EQ(Post("/tokenize", {{"prompt", text}, {"messages", Json::array()}}).status, 400);
  HttpResult outside = Post("/detokenize", {{"tokens", {5, 999999}}});
  EXPECT_EQ(outside.status, 400);
  EXPECT_NE(outside.body.find("tokens[1] = 999999 is outside the vocabulary"), std::string::npos)
      << outside.body;
  EXPECT_EQ(HttpCall(http_port_, "GET", "/tokenize").status, 405);
}

TEST_F(OpenAiHttpTest, CompletionEqualsTheGrpcStreamOfTheSameRequest) {
  ASSERT_TRUE(server_->started());
  HttpResult r = Post("/v1/completions", {{"model", kModelName},
                                          {"prompt", "The capital of France is"},
                                          {"max_tokens", 24},
                                          {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["content-type"], "application/json");
  const Json j = Json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], kModelName);
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(r.headers["x-request-id"], j["id"]);

  v1::GenerateRequest req;
  req.set_prompt("The capital of France is");
  req.mutable_sampling()->set_temperature(0);
  req.mutable_stopping()->set_max_tokens(24);
  auto stub = server_->stub();
  v1::Complete complete;
  const std::string grpc_text = GrpcText(*stub, req, &complete);
  ASSERT_FALSE(grpc_text.empty());
  EXPECT_EQ(j["choices"][0]["text"], grpc_text);
  EXPECT_NE(grpc_text.find("Paris"), std::string::npos) << grpc_text;
  EXPECT_EQ(j["usage"]["prompt_tokens"], complete.usage().prompt_tokens());
  EXPECT_EQ(j["usage"]["completion_tokens"], complete.usage().completion_tokens());
  EXPECT_EQ(j["choices"][0]["finish_reason"],
            complete.finish_reason() == v1::FINISH_REASON_LENGTH ? "length" : "stop");
}

// What a client of another OpenAI server sends and was refused or misread: a body sent chunked
// (its length unknown up front: 411 before), HEAD on a GET route (a 405 with a body), and ids
// that two replicas started in the same second shared (the start second and a counter).
TEST_F(OpenAiHttpTest, ChunkedBodiesHeadAndRandomIds) {
  ASSERT_TRUE(server_->started());
  const std::string body =
      R"({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})";
  HttpConnection c(http_port_);
  ASSERT_TRUE(c.SendRaw("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
                        absl::StrFormat("%x\r\n%s\r\n", 10, body.substr(0, 10)) +
                        absl::StrFormat("%x\r\n%s\r\n0\r\n\r\n", body.size() - 10,
                                        body.substr(10))));
  HttpResult chunked = c.Read(120);
  ASSERT_EQ(chunked.status, 200) << chunked.body;
  HttpResult plain = Post("/v1/completions", Json::parse(body));
  ASSERT_EQ(plain.status, 200) << plain.body;
  const Json a = Json::parse(chunked.body), b = Json::parse(plain.body);
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  for (const Json* j : {&a, &b}) {
    const std::string id = (*j)["id"];
    EXPECT_EQ(id.size(), 5u + 32u) << id;
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 5), std::string::npos) << id;
  }
  EXPECT_NE(a["id"], b["id"]);

  ASSERT_TRUE(c.SendRaw("HEAD /health HTTP/1.1\r\nHost: t\r\n\r\nGET /health HTTP/1.1\r\nHost: t\r\n\r\n"));
  HttpResult head = c.ReadHead(10);
  EXPECT_EQ(head.status, 200);
  HttpResult get = c.Read(10);  // the next response, not a HEAD body read as one
  EXPECT_EQ(get.status, 200);
  EXPECT_EQ(get.body, R"({"status":"serving"})");
}

// A page in a browser calls the API across origins (CORS): the preflight needs no API key and
// names what the request may use; every answer carries Access-Control-Allow-Origin. (Refused
// before: OPTIONS was a 405, and no answer allowed an origin.)
TEST_F(OpenAiHttpTest, BrowserPagesMayCallTheApi) {
  ASSERT_TRUE(server_->started());
  HttpResult preflight =
      HttpCall(http_port_, "OPTIONS", "/v1/chat/completions", "",
               {{"Origin", "https://app.example.com"},
                {"Access-Control-Request-Method", "POST"},
                {"Access-Control-Request-Headers", "authorization, content-type"}});
  EXPECT_EQ(preflight.status, 200);
  EXPECT_EQ(preflight.headers["access-control-allow-origin"], "*");
  EXPECT_EQ(preflight.headers["access-control-allow-methods"], "GET, HEAD, POST, OPTIONS");
  EXPECT_EQ(preflight.headers["access-control-allow-headers"], "authorization, content-type");
  HttpResult r = HttpCall(http_port_, "POST", "/v1/completions",
                          R"({"prompt": "Hi", "max_tokens": 1})",
                          {{"Origin", "https://app.example.com"}});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["access-control-allow-origin"], "*");
  EXPECT_EQ(r.headers["access-control-expose-headers"], "X-Request-Id");
  EXPECT_EQ(HttpCall(http_port_, "GET", "/health").headers.count("access-control-allow-origin"),
            0u) << "not without an Origin";
}

TEST_F(OpenAiHttpTest, StreamedChatEqualsTheWholeChat) {
  ASSERT_TRUE(server_->started());
  const Json body = {{"messages", {{{"role", "system"}, {"content", "You are brief."}},
                                   {{"role", "user"}, {"content", "Name three colours."}}}},
                     {"max_tokens", 40},
                     {"temperature", 0}};
  HttpResult whole = Post("/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.body;
  const Json w = Json::parse(whole.body);
  EXPECT_EQ(w["object"], "chat.completion");
  const std::string content = w["choices"][0]["message"]["content"];
  ASSERT_FALSE(content.empty());

  Json sbody = body;
  sbody["stream"] = true;
  sbody["stream_options"] = {{"include_usage", true}};
  HttpResult streamed = Post("/v1/chat/completions", sbody);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_EQ(streamed.headers["content-type"], "text/event-stream");
  const std::vector<std::string> events = SseData(streamed.body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  const Json first = Json::parse(events[0]);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string joined;
  std::string finish;
  Json usage;
  for (size_t i = 1; i + 1 < events.size(); ++i) {
    const Json e = Json::parse(events[i]);
    EXPECT_EQ(e["id"], first["id"]);
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    if (e.contains("usage")) usage = e["usage"];
    if (e["choices"].empty()) continue;
    const Json& c = e["choices"][0];
    if (c["delta"].contains("content")) joined += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(joined, content);
  EXPECT_EQ(finish, w["choices"][0]["finish_reason"]);
  EXPECT_EQ(usage, w["usage"]);
  // Several events: the text arrived as it was generated, not in one piece.
  EXPECT_GE(streamed.chunks.size(), 4u);
}

// vLLM's bad_words, allowed_token_ids and truncate_prompt_tokens on the real model: the word
// the model would say is not said; only the allowed tokens come out; a cut prompt is its last
// k tokens (the same completion as those ids sent alone, and what echo returns).
TEST_F(OpenAiHttpTest, VllmsSamplingExtensionsShapeTheOutput) {
  ASSERT_TRUE(server_->started());
  auto text_of = [&](const Json& body) {
    HttpResult r = Post("/v1/completions", body);
    EXPECT_EQ(r.status, 200) << r.body;
    return Json::parse(r.body)["choices"][0]["text"].get<std::string>();
  };
  const Json france = {{"prompt", "The capital of France is"}, {"max_tokens", 12},
                       {"temperature", 0}};
  const std::string said = text_of(france);
  ASSERT_NE(said.find("Paris"), std::string::npos) << said;
  Json no_paris = france;
  no_paris["bad_words"] = {"Paris"};
  const std::string unsaid = text_of(no_paris);
  EXPECT_EQ(unsaid.find("Paris"), std::string::npos) << unsaid;
  EXPECT_NE(unsaid, said);

  auto stub = server_->stub();
  const std::vector<uint32_t> yes = TokenIds(*stub, " yes", false);
  const std::vector<uint32_t> no = TokenIds(*stub, " no", false);
  ASSERT_EQ(yes.size(), 1u);
  ASSERT_EQ(no.size(), 1u);
  for (uint64_t seed : {1, 2, 3}) {
    std::string rest = text_of({{"prompt", "Is the sky green?"}, {"max_tokens", 6},
                                {"temperature", 1.0}, {"seed", seed}, {"ignore_eos", true},
                                {"allowed_token_ids", {yes[0], no[0]}}});
    const size_t length = rest.size();
    for (const char* word : {" yes", " no"}) {
      for (size_t at; (at = rest.find(word)) != std::string::npos;) rest.erase(at, strlen(word));
    }
    EXPECT_GE(length, 6 * 3u);
    EXPECT_EQ(rest, "") << "seed " << seed;
  }

  const std::string story = "Once upon a time, in a small village by the sea, there lived";
  const std::vector<uint32_t> ids = TokenIds(*stub, story);
  ASSERT_GT(ids.size(), 8u);
  const std::vector<uint32_t> last5(ids.end() - 5, ids.end());
  const Json cut = {{"prompt", story}, {"truncate_prompt_tokens", 5}, {"max_tokens", 6},
                    {"temperature", 0}};
  HttpResult r = Post("/v1/completions", cut);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = Json::parse(r.body);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["choices"][0]["text"], text_of({{"prompt", last5}, {"max_tokens", 6},
                                               {"temperature", 0}}));
  Json echoed = cut;
  echoed["echo"] = true;
  const std::string tail = Json::parse(Post("/detokenize", {{"tokens", last5}}).body)["prompt"];
  EXPECT_EQ(text_of(echoed), tail + j["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(Post("/v1/completions", {{"prompt", story}, {"truncate_prompt_tokens", 0}}).status,
            400);
}

// guided_choice on the real model: the answer is one of the choices, whole, with finish_reason
// stop (greedy: the one the model prefers; sampled, streamed, n of them, a choice that is the
// start of another, chat with vLLM's structured_outputs.choice).
TEST_F(OpenAiHttpTest, GuidedChoiceAnswersWithOneOfTheChoices) {
  ASSERT_TRUE(server_->started());
  auto post = [&](const std::string& path, const Json& body) {
    HttpResult r = Post(path, body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? Json::parse(r.body) : Json();
  };
  const std::vector<std::string> cities = {" London", " Paris", " Berlin", " Rome"};
  Json j = post("/v1/completions", {{"prompt", "The capital of France is"}, {"max_tokens", 20},
                                    {"temperature", 0}, {"guided_choice", cities}});
  EXPECT_EQ(j["choices"][0]["text"], " Paris");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");

  const std::vector<std::string> answers = {"yes", "yes, absolutely", "no", "maybe", "I think so"};
  auto one_of = [&](const std::string& text) {
    return std::find(answers.begin(), answers.end(), text) != answers.end();
  };
  const Json sampled = {{"prompt", "Question: is the sea salty? Answer:"}, {"max_tokens", 20},
                        {"temperature", 1.5}, {"n", 4}, {"seed", 21},
                        {"guided_choice", answers}};
  j = post("/v1/completions", sampled);
  ASSERT_EQ(j["choices"].size(), 4u);
  std::set<std::string> seen;
  for (const Json& c : j["choices"]) {
    const std::string text = c["text"];
    EXPECT_TRUE(one_of(text)) << text;
    EXPECT_EQ(c["finish_reason"], "stop") << text;
    seen.insert(text);
  }
  EXPECT_GE(seen.size(), 2u) << "four draws at temperature 1.5 gave one answer (seed 21)";
  const StreamedChoices parts = StreamedAlike(sampled, j);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(parts.finishes[i], 1) << i;

  j = post("/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "Is this review positive or negative? "
                                                          "'I loved every minute of it.'"}}}},
            {"temperature", 0}, {"structured_outputs", {{"choice", {"positive", "negative"}}}}});
  const std::string label = j["choices"][0]["message"]["content"];
  EXPECT_TRUE(label == "positive" || label == "negative") << label;
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

// guided_regex on the real model: every answer matches the pattern whole (greedy; sampled at a
// high temperature, n of them, streamed alike; chat with structured_outputs.regex), ending with
// stop once nothing may follow; a pattern that may go on ends by EOS or max_tokens, a match or
// a prefix of one. A pattern the guide cannot take is refused, naming the field as sent.
TEST_F(OpenAiHttpTest, GuidedRegexAnswersMatchThePattern) {
  ASSERT_TRUE(server_->started());
  auto post = [&](const std::string& path, const Json& body) {
    HttpResult r = Post(path, body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? Json::parse(r.body) : Json();
  };
  const std::string phone = R"(\(\d{3}\) \d{3}-\d{4})";
  const std::regex phone_re(phone);
  Json j = post("/v1/completions", {{"prompt", "For reservations, call us at"}, {"max_tokens", 30},
                                    {"temperature", 0}, {"guided_regex", phone}});
  std::string text = j["choices"][0]["text"];
  EXPECT_TRUE(std::regex_match(text, phone_re)) << text;
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const std::string greedy_phone = text;

  const Json sampled = {{"prompt", "My favourite number is"}, {"max_tokens", 12},
                        {"temperature", 1.5}, {"n", 4}, {"seed", 5},
                        {"guided_regex", "[1-9][0-9]*( or [1-9][0-9]*)?"}};
  j = post("/v1/completions", sampled);
  ASSERT_EQ(j["choices"].size(), 4u);
  // A prefix of a match: digits, then perhaps " or" and digits.
  const std::regex prefix_re("[1-9][0-9]*( (o(r( [1-9][0-9]*)?)?)?)?");
  for (const Json& c : j["choices"]) {
    text = c["text"];
    EXPECT_TRUE(std::regex_match(text, prefix_re)) << text;
    EXPECT_TRUE(c["finish_reason"] == "stop" || c["finish_reason"] == "length") << text;
    if (c["finish_reason"] == "stop") {
      EXPECT_TRUE(std::regex_match(text, std::regex("[1-9][0-9]*( or [1-9][0-9]*)?"))) << text;
    }
  }
  StreamedAlike(sampled, j);

  const std::string verdict = "(yes|no), because [a-z ,]{10,60}\\.";
  j = post("/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "Is the sea salty? Explain briefly."}}}},
            {"temperature", 0}, {"max_tokens", 40},
            {"structured_outputs", {{"regex", verdict}}}});
  text = j["choices"][0]["message"]["content"];
  EXPECT_TRUE(std::regex_match(text, std::regex(verdict))) << text;
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");

  auto error_of = [&](const Json& body) {
    HttpResult r = Post("/v1/completions", body);
    EXPECT_EQ(r.status, 400) << r.body;
    return r.status == 400 ? Json::parse(r.body)["error"] : Json();
  };
  Json e = error_of({{"prompt", "x"}, {"guided_regex", "(?=a)b"}});
  EXPECT_TRUE(e["message"].get<std::string>().starts_with(
      "guided_regex: '(?' at position 0: look-arounds")) << e;
  EXPECT_EQ(e["param"], "guided_regex");
  e = error_of({{"prompt", "x"}, {"structured_outputs", {{"regex", "a{3,2}"}}}});
  EXPECT_EQ(e["message"],
            "structured_outputs.regex: {3,2} at position 1: the minimum is over the maximum");
  EXPECT_EQ(e["param"], "structured_outputs.regex");
  e = error_of({{"prompt", "x"}, {"guided_regex", "a"}, {"guided_choice", {"a"}}});
  EXPECT_EQ(e["message"], "guided_choice and guided_regex are both given; send one");
  EXPECT_EQ(error_of({{"prompt", "x"}, {"guided_regex", ""}})["message"], "guided_regex is empty");

  auto stub = server_->stub();
  v1::GenerateRequest bad = Prompt("x", 4);
  bad.mutable_sampling()->set_guided_regex("[ab");
  StreamResult refused = Generate(*stub, bad);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.status.error_message(),
            "sampling.guided_regex: unterminated character set at position 0");
  v1::GenerateRequest good = Prompt("For reservations, call us at", 30);
  good.mutable_sampling()->set_guided_regex(phone);
  StreamResult answered = Generate(*stub, good);
  ASSERT_TRUE(answered.status.ok()) << answered.status.error_message();
  EXPECT_EQ(answered.text, greedy_phone);  // the same guide over gRPC
  EXPECT_TRUE(std::regex_match(answered.text, phone_re)) << answered.text;
  EXPECT_EQ(answered.complete.finish_reason(), v1::FINISH_REASON_STOP);
}

// response_format json_object on the real model: greedy answers are JSON objects that end with
// stop when they close; sampled ones (n of them, streamed alike) are objects or, cut by
// max_tokens, the start of one; over gRPC too, and never with another guide.
TEST_F(OpenAiHttpTest, JsonObjectAnswersAreJsonObjects) {
  ASSERT_TRUE(server_->started());
  auto post = [&](const std::string& path, const Json& body) {
    HttpResult r = Post(path, body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? Json::parse(r.body) : Json();
  };
  auto ask = [](const std::string& content) {
    return Json{{"messages", {{{"role", "user"}, {"content", content}}}}, {"temperature", 0},
                {"max_tokens", 120}, {"response_format", {{"type", "json_object"}}}};
  };
  Json j = post("/v1/chat/completions", ask("Describe a cat as a JSON object with name and age."));
  std::string text = j["choices"][0]["message"]["content"];
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << text;
  ASSERT_TRUE(Json::accept(text)) << text;
  EXPECT_TRUE(Json::parse(text).is_object()) << text;
  const std::string greedy_cat = text;

  auto leads_on = [](const std::string& prefix) {
    scheduler::JsonObjectGuide::State state;
    return scheduler::JsonObjectGuide::Step({}, prefix, &state);
  };
  const Json sampled = {{"prompt", "A JSON object describing a book:"}, {"max_tokens", 40},
                        {"temperature", 1.0}, {"n", 3}, {"seed", 11},
                        {"structured_outputs", {{"json_object", true}}}};
  j = post("/v1/completions", sampled);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (const Json& c : j["choices"]) {
    text = c["text"];
    if (c["finish_reason"] == "stop") {
      EXPECT_TRUE(Json::accept(text) && Json::parse(text).is_object()) << text;
    } else {
      EXPECT_EQ(c["finish_reason"], "length") << text;
      EXPECT_TRUE(leads_on(text)) << text;
    }
  }
  StreamedAlike(sampled, j);

  auto stub = server_->stub();
  v1::GenerateRequest req = GreedyChat("Describe a cat as a JSON object with name and age.", 120);
  req.mutable_sampling()->set_json_object(true);
  StreamResult answered = Generate(*stub, req);
  ASSERT_TRUE(answered.status.ok()) << answered.status.error_message();
  EXPECT_EQ(answered.text, greedy_cat);
  req.mutable_sampling()->set_guided_regex("a+");
  StreamResult refused = Generate(*stub, req);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.status.error_message(),
            "sampling.json_object and sampling.guided_regex are both given; send one");
}

// A JSON schema guides the answer: by response_format json_schema on chat, guided_json on
// completions (sampled, streamed alike) and on gRPC; the answers parse, hold the schema's
// types and bounds, and keep its properties' order; a schema that cannot be guided is refused
// naming the field and where in the schema.
TEST_F(OpenAiHttpTest, JsonSchemaAnswersFollowTheSchema) {
  ASSERT_TRUE(server_->started());
  auto post = [&](const std::string& path, const std::string& body) {
    HttpResult r = HttpCall(http_port_, "POST", path, body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? Json::parse(r.body) : Json();
  };
  // Sent as text: the order of "name", "age", "indoor" is the order asked for.
  const std::string cat_schema =
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
          "age": {"type": "integer", "minimum": 0, "maximum": 30}, "indoor": {"type": "boolean"}},
          "required": ["name", "age", "indoor"]})";
  auto check_cat = [](const std::string& text) {
    ASSERT_TRUE(Json::accept(text)) << text;
    const auto cat = nlohmann::ordered_json::parse(text);
    std::vector<std::string> keys;
    for (const auto& [key, value] : cat.items()) keys.push_back(key);
    EXPECT_EQ(keys, std::vector<std::string>({"name", "age", "indoor"})) << text;
    EXPECT_TRUE(cat["name"].is_string() && cat["indoor"].is_boolean()) << text;
    ASSERT_TRUE(cat["age"].is_number_integer()) << text;
    EXPECT_GE(cat["age"].get<int>(), 0) << text;
    EXPECT_LE(cat["age"].get<int>(), 30) << text;
  };
  Json j = post("/v1/chat/completions", absl::StrCat(R"({"messages": [{"role": "user",
      "content": "Describe a cat as JSON."}], "temperature": 0, "max_tokens": 200,
      "response_format": {"type": "json_schema", "json_schema": {"name": "cat", "strict": true,
      "schema": )", cat_schema, "}}}"));
  std::string text = j["choices"][0]["message"]["content"];
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << text;
  check_cat(text);
  const std::string greedy_cat = text;

  // Sampled completions, an enum and an optional property among them.
  const std::string book_schema =
      R"({"type": "object", "properties": {"title": {"type": "string", "maxLength": 30},
          "genre": {"enum": ["novel", "poetry", "history"]},
          "pages": {"type": "integer", "minimum": 1, "maximum": 2000}},
          "required": ["title", "genre"]})";
  const std::string sampled = absl::StrCat(R"({"prompt": "A JSON object describing a book:",
      "max_tokens": 80, "temperature": 1.0, "n": 3, "seed": 5, "guided_json": )", book_schema,
                                           "}");
  j = post("/v1/completions", sampled);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (const Json& c : j["choices"]) {
    text = c["text"];
    ASSERT_EQ(c["finish_reason"], "stop") << text;
    ASSERT_TRUE(Json::accept(text)) << text;
    const Json book = Json::parse(text);
    EXPECT_TRUE(book["title"].is_string()) << text;
    EXPECT_TRUE(book["genre"] == "novel" || book["genre"] == "poetry" || book["genre"] == "history")
        << text;
    if (book.contains("pages")) {
      EXPECT_TRUE(book["pages"].is_number_integer()) << text;
    }
    EXPECT_EQ(book.size(), book.contains("pages") ? 3u : 2u) << text;
  }
  // Re-sent as parsed (a sorted body), the schema as text keeping its order.
  Json resent = Json::parse(sampled);
  resent["guided_json"] = book_schema;
  StreamedAlike(resent, j);

  // gRPC: the same schema gives the same greedy answer.
  auto stub = server_->stub();
  v1::GenerateRequest req = GreedyChat("Describe a cat as JSON.", 200);
  req.mutable_sampling()->set_guided_json(cat_schema);
  StreamResult answered = Generate(*stub, req);
  ASSERT_TRUE(answered.status.ok()) << answered.status.error_message();
  EXPECT_EQ(answered.text, greedy_cat);
  req.mutable_sampling()->set_guided_json(
      R"({"type": "object", "properties": {"a": {"type": "string", "format": "email"}}})");
  StreamResult refused = Generate(*stub, req);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.status.error_message(),
            "sampling.guided_json: #/properties/a/format: \"email\" is not supported (date, "
            "time, date-time, uuid)");
  HttpResult bad = HttpCall(http_port_, "POST", "/v1/chat/completions",
                            R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "x",
      "schema": {"type": "object", "properties": {"n": {"type": "number", "maximum": 3}}}}}})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(Json::parse(bad.body)["error"]["message"],
            "response_format.json_schema.schema: #/properties/n/maximum: bounds on a number "
            "other than minimum 0 are not supported (an integer takes any bounds)");
  EXPECT_EQ(Json::parse(bad.body)["error"]["param"], "response_format.json_schema.schema");
  // And the server serves on.
  EXPECT_EQ(post("/v1/completions", sampled)["choices"], j["choices"]);
}

// Tools over real HTTP with the real model: a named function's call (streamed alike), calls
// when "required", and the result sent back as a tool message, answered as text.
TEST_F(OpenAiHttpTest, ToolCallsFollowTheirFunctionsParameters) {
  ASSERT_TRUE(server_->started());
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "The weather in a city", "parameters": {"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
      "required": ["city", "unit"]}}}, {"type": "function", "function": {"name": "get_time",
      "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength":
      20}}, "required": ["zone"]}}}])");
  Json ask = {{"messages", {{{"role", "user"}, {"content", "What is the weather in Paris?"}}}},
              {"temperature", 0}, {"max_tokens", 100}, {"tools", tools},
              {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}};
  HttpResult r = Post("/v1/chat/completions", ask);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json named = Json::parse(r.body);
  const Json& message = named["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null()) << r.body;
  ASSERT_EQ(message["tool_calls"].size(), 1u) << r.body;
  const Json& call = message["tool_calls"][0];
  EXPECT_EQ(call["function"]["name"], "get_weather");
  const std::string arguments = call["function"]["arguments"];
  ASSERT_TRUE(Json::accept(arguments)) << arguments;
  const Json args = Json::parse(arguments);
  EXPECT_TRUE(args["city"].is_string()) << arguments;
  EXPECT_TRUE(args["unit"] == "celsius" || args["unit"] == "fahrenheit") << arguments;
  EXPECT_EQ(named["choices"][0]["finish_reason"], "stop");

  // Streamed: the id and name first, then the same arguments in pieces.
  Json streamed = ask;
  streamed["stream"] = true;
  HttpResult s = Post("/v1/chat/completions", streamed);
  ASSERT_EQ(s.status, 200) << s.body;
  std::string pieces, id;
  const std::vector<std::string> lines = absl::StrSplit(s.body, '\n');
  for (const std::string& line : lines) {
    if (line.rfind("data: {", 0) != 0) continue;
    const Json chunk = Json::parse(line.substr(6));
    if (chunk["choices"].empty() || !chunk["choices"][0]["delta"].contains("tool_calls")) {
      continue;
    }
    const Json& d = chunk["choices"][0]["delta"]["tool_calls"][0];
    if (d.contains("id")) {
      EXPECT_TRUE(id.empty()) << "a second id";
      id = d["id"];
      EXPECT_EQ(d["function"]["name"], "get_weather");
    }
    pieces += d["function"]["arguments"].get<std::string>();
  }
  EXPECT_FALSE(id.empty());
  EXPECT_EQ(pieces, arguments);

  // "required": a list of calls, finish "tool_calls".
  Json required = ask;
  required["tool_choice"] = "required";
  r = Post("/v1/chat/completions", required);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json listed = Json::parse(r.body);
  EXPECT_EQ(listed["choices"][0]["finish_reason"], "tool_calls") << r.body;
  ASSERT_GE(listed["choices"][0]["message"]["tool_calls"].size(), 1u) << r.body;
  for (const Json& c : listed["choices"][0]["message"]["tool_calls"]) {
    EXPECT_TRUE(c["function"]["name"] == "get_weather" || c["function"]["name"] == "get_time");
    EXPECT_TRUE(Json::accept(c["function"]["arguments"].get<std::string>())) << r.body;
  }

  // A named function's schema that cannot be guided is named as the client sent it.
  Json unguided = ask;
  unguided["tools"][0]["function"]["parameters"]["properties"]["city"]["format"] = "email";
  r = Post("/v1/chat/completions", unguided);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Json::parse(r.body)["error"]["message"],
            "tools[0].function.parameters: #/properties/city: format beside pattern, "
            "minLength or maxLength is not supported");

  // A function of no arguments is called with {}.
  Json ping = ask;
  ping["tools"] = Json::parse(R"([{"type": "function", "function": {"name": "ping",
      "parameters": {"type": "object", "properties": {}}}}])");
  ping["tool_choice"] = {{"type", "function"}, {"function", {{"name", "ping"}}}};
  r = Post("/v1/chat/completions", ping);
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string ping_args =
      Json::parse(r.body)["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"];
  EXPECT_TRUE(Json::parse(ping_args).empty() && Json::parse(ping_args).is_object()) << ping_args;
  // Too many functions for a list of calls: the message says what to change.
  Json many = required;
  many["tools"] = Json::array();
  for (int i = 0; i < 40; ++i) {
    many["tools"].push_back(Json::parse(absl::StrCat(
        R"({"type": "function", "function": {"name": "f)", i, R"(", "parameters": {"type":
        "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"},
        "c": {"type": "boolean"}}, "required": ["a", "b", "c"]}}})")));
  }
  r = Post("/v1/chat/completions", many);
  EXPECT_EQ(r.status, 400) << r.body;
  const std::string too_many = Json::parse(r.body)["error"]["message"];
  EXPECT_EQ(too_many.rfind("tools: with tool_choice \"required\" the functions' parameters, as "
                           "a list of calls, are too large to guide", 0), 0u)
      << too_many;

  // The result goes back; the answer is text.
  Json answer = {{"messages", {{{"role", "user"}, {"content", "What is the weather in Paris?"}},
                               message,
                               {{"role", "tool"}, {"tool_call_id", call["id"]},
                                {"content", "18 C and sunny"}}}},
                 {"temperature", 0}, {"max_tokens", 24}};
  r = Post("/v1/chat/completions", answer);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json replied = Json::parse(r.body);
  EXPECT_TRUE(replied["choices"][0]["message"]["content"].is_string()) << r.body;
  EXPECT_FALSE(replied["choices"][0]["message"]["content"].get<std::string>().empty());
  EXPECT_FALSE(replied["choices"][0]["message"].contains("tool_calls"));
}

// continue_final_message: the reply goes on from a prefilled start of the assistant's answer
// (the rendering ends right after it; Tokenize over gRPC renders the same), and is what a
// completion of that rendering gives; add_generation_prompt false renders no new turn.
TEST_F(OpenAiHttpTest, ChatMayContinueAPrefilledAnswer) {
  ASSERT_TRUE(server_->started());
  const std::string prefill = "The capital of France is";
  const Json messages = {{{"role", "user"}, {"content", "What is the capital of France?"}},
                         {{"role", "assistant"}, {"content", prefill}}};
  HttpResult r = Post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 8},
                                               {"temperature", 0},
                                               {"continue_final_message", true},
                                               {"add_generation_prompt", false}});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string reply = Json::parse(r.body)["choices"][0]["message"]["content"];
  EXPECT_NE(reply.find("Paris"), std::string::npos) << reply;

  auto stub = server_->stub();
  v1::TokenizeRequest treq;
  v1::ChatMessages* chat = treq.mutable_chat();
  for (const Json& m : messages) {
    v1::ChatMessage* msg = chat->add_messages();
    msg->set_role(m["role"].get<std::string>());
    msg->set_content(m["content"].get<std::string>());
  }
  chat->set_continue_final_message(true);
  treq.set_add_special_tokens(false);
  v1::TokenizeResponse rendered = TokenizeRpc(*stub, treq);
  EXPECT_TRUE(rendered.rendered().ends_with("<|im_start|>assistant\n" + prefill))
      << rendered.rendered();
  const Json ids = TokenIds(rendered);
  HttpResult completion = Post("/v1/completions", {{"prompt", ids}, {"max_tokens", 8},
                                                   {"temperature", 0}});
  ASSERT_EQ(completion.status, 200) << completion.body;
  EXPECT_EQ(Json::parse(completion.body)["choices"][0]["text"], reply);

  // Both at once opens a turn and continues one: refused.
  EXPECT_EQ(Post("/v1/chat/completions", {{"messages", messages},
                                          {"continue_final_message", true},
                                          {"add_generation_prompt", true}}).status, 400);
  // No new turn: the reply is what follows the end of the user's turn.
  HttpResult no_turn = Post("/v1/chat/completions",
                            {{"messages", {messages[0]}}, {"add_generation_prompt", false},
                             {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_EQ(no_turn.status, 200) << no_turn.body;
  chat->clear_continue_final_message();
  chat->set_add_generation_prompt(false);
  chat->mutable_messages()->RemoveLast();
  rendered = TokenizeRpc(*stub, treq);
  EXPECT_TRUE(rendered.rendered().ends_with("France?<|im_end|>\n")) << rendered.rendered();
  HttpResult after_turn = Post("/v1/completions", {{"prompt", TokenIds(rendered)},
                                                   {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_EQ(after_turn.status, 200);
  EXPECT_EQ(Json::parse(no_turn.body)["choices"][0]["message"]["content"],
            Json::parse(after_turn.body)["choices"][0]["text"]);
}

TEST_F(OpenAiHttpTest, ChatWithoutMaxTokensRunsToTheEndWithinTheCache) {
  // The chat default is the rest of the context, clamped to what the KV cache (128 MiB here:
  // fewer tokens than SmolLM2's 8192) holds for one sequence.
  ASSERT_TRUE(server_->started());
  HttpResult r = Post("/v1/chat/completions",
                      {{"messages", {{{"role", "user"}, {"content", "Say hello."}}}},
                       {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = Json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(j["choices"][0]["message"]["content"].get<std::string>().empty());
}

TEST_F(OpenAiHttpTest, LogitBiasForcesATokenAndBadBiasesAre400) {
  ASSERT_TRUE(server_->started());
  HttpResult r = Post("/v1/completions", {{"prompt", "One, two, three,"}, {"max_tokens", 3},
                                          {"temperature", 0.8}, {"seed", 3}, {"logprobs", 1},
                                          {"logit_bias", {{"1000", 100}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  const Json tokens = Json::parse(r.body)["choices"][0]["logprobs"]["tokens"];
  ASSERT_EQ(tokens.size(), 3u) << r.body;
  EXPECT_EQ(tokens[0], tokens[1]);
  EXPECT_EQ(tokens[1], tokens[2]);
  HttpResult bad = Post("/v1/completions", {{"prompt", "x"}, {"logit_bias", {{"7", 500}}}});
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("logit_bias[7] = 500; it must be in [-100, 100]"), std::string::npos)
      << bad.body;
}

TEST_F(OpenAiHttpTest, LogprobsComeBackInBothFormats) {
  ASSERT_TRUE(server_->started());
  HttpResult c = Post("/v1/completions", {{"prompt", "One, two, three,"}, {"max_tokens", 4},
                                          {"temperature", 0}, {"logprobs", 2}});
  ASSERT_EQ(c.status, 200) << c.body;
  const Json lp = Json::parse(c.body)["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 4u);
  ASSERT_EQ(lp["top_logprobs"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_EQ(lp["top_logprobs"][i].size(), 2u);  // greedy: the sampled token is in the top 2
    // Greedy: the sampled token is the most likely one.
    double best = -1e9;
    for (auto& [tok, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    EXPECT_DOUBLE_EQ(lp["token_logprobs"][i].get<double>(), best);
  }
  HttpResult chat = Post("/v1/chat/completions",
                         {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 3},
                          {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 3}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  const Json content = Json::parse(chat.body)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 3u);
  EXPECT_EQ(content[0]["top_logprobs"].size(), 3u);
  EXPECT_EQ(content[0]["top_logprobs"][0]["token"], content[0]["token"]);
}

TEST_F(OpenAiHttpTest, StopStringsAndSeedsBehaveAsOverGrpc) {
  ASSERT_TRUE(server_->started());
  const Json body = {{"prompt", "Count: 1, 2, 3, 4,"}, {"max_tokens", 30}, {"temperature", 0},
                     {"stop", ", 8"}};
  const Json j = Json::parse(Post("/v1/completions", body).body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << j.dump();
  const std::string cut = j["choices"][0]["text"];
  EXPECT_EQ(cut.find(", 8"), std::string::npos);
  // vLLM's include_stop_str_in_output: the same text up to the end of the stop string, whole
  // or streamed.
  Json with_stop = body;
  with_stop["include_stop_str_in_output"] = true;
  const Json k = Json::parse(Post("/v1/completions", with_stop).body);
  EXPECT_EQ(k["choices"][0]["finish_reason"], "stop") << k.dump();
  EXPECT_EQ(k["choices"][0]["text"], cut + ", 8");
  with_stop["stream"] = true;
  const HttpResult streamed = Post("/v1/completions", with_stop);
  ASSERT_EQ(streamed.status, 200);
  EXPECT_EQ(CollectChoices(streamed.body, 1).texts[0], cut + ", 8");
  // And a stop token id's text, as vLLM's (without it, the token ends the output unseen).
  auto stub = server_->stub();
  const std::vector<uint32_t> comma = TokenIds(*stub, ",", /*add_special_tokens=*/false);
  ASSERT_EQ(comma.size(), 1u);
  Json at_comma = {{"prompt", "Count: 1, 2, 3, 4,"}, {"max_tokens", 30}, {"temperature", 0},
                   {"stop_token_ids", {comma[0]}}};
  auto text_of = [&](const Json& body) {
    return Json::parse(Post("/v1/completions", body).body)["choices"][0]["text"];
  };
  const std::string before = text_of(at_comma);
  EXPECT_EQ(before.find(','), std::string::npos) << before;
  at_comma["include_stop_str_in_output"] = true;
  EXPECT_EQ(text_of(at_comma), before + ",");
  // Sampling with a seed repeats.
  const Json seeded = {{"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 1.0},
                       {"seed", 7}};
  const Json a = Json::parse(Post("/v1/completions", seeded).body);
  const Json b = Json::parse(Post("/v1/completions", seeded).body);
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
}

TEST_F(OpenAiHttpTest, BadInputGetsItsStatusAndTheServerKeepsServing) {
  ASSERT_TRUE(server_->started());
  auto status_of = [&](const std::string& path, const std::string& raw_body) {
    HttpResult r = HttpCall(http_port_, "POST", path, raw_body);
    if (r.status >= 400) {
      const Json e = Json::parse(r.body);  // an OpenAI error object
      EXPECT_TRUE(e["error"]["message"].is_string()) << r.body;
      EXPECT_EQ(e["error"]["code"], r.status);
    }
    return r.status;
  };
  EXPECT_EQ(status_of("/v1/completions", "{not json"), 400);
  EXPECT_EQ(status_of("/v1/completions", R"({"prompt": "x", "n": 0})"), 400);
  EXPECT_EQ(status_of("/v1/completions", R"({"prompt": "x", "n": 2, "best_of": 3})"), 400);
  EXPECT_EQ(status_of("/v1/completions", R"({"prompt": "x", "temperature": -1})"), 400);
  EXPECT_EQ(status_of("/v1/completions", R"({"prompt": "x", "max_tokens": 100000})"), 400);
  EXPECT_EQ(status_of("/v1/completions", R"({"prompt": [1, 2, 4000000]})"), 400);
  EXPECT_EQ(status_of("/v1/completions", R"({"prompt": "x", "model": "gpt-4o"})"), 404);
  EXPECT_EQ(status_of("/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})"), 400);
  EXPECT_EQ(status_of("/v1/completions", "{\"prompt\": \"\xff\xfe\"}"), 400);
  EXPECT_EQ(status_of("/v1/chat/completions",
                      R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": 5}})"),
            400);  // once a crash of the whole server (a JSON type error thrown)
  EXPECT_EQ(status_of("/v1/embeddings", "{}"), 404);
  EXPECT_EQ(HttpCall(http_port_, "GET", "/v1/completions").status, 405);
  // The error names its field in `param`, whichever layer refused it (the HTTP parser, the
  // shared validation, a prompt of a list), and none when it is about no one field.
  auto param_of = [&](const std::string& raw_body) {
    return Json::parse(HttpCall(http_port_, "POST", "/v1/completions", raw_body).body)["error"]
                      ["param"];
  };
  EXPECT_EQ(param_of(R"({"prompt": "x", "temperature": "hot"})"), "temperature");
  EXPECT_EQ(param_of(R"({"prompt": "x", "top_p": 1.5})"), "top_p");
  // The two penalties share a range, and were refused as one ("presence_penalty" for either).
  EXPECT_EQ(param_of(R"({"prompt": "x", "presence_penalty": 0.5, "frequency_penalty": 5})"),
            "frequency_penalty");
  EXPECT_EQ(param_of(R"({"prompt": "x", "presence_penalty": -3})"), "presence_penalty");
  EXPECT_EQ(param_of(R"({"prompt": ["a", [1, 2, 4000000]]})"), "prompt[1][2]");
  EXPECT_EQ(param_of(R"({"prompt": "x", "stop": ["a","b","c","d","e","f","g","h","i","j","k","l",)"
                     R"("m","n","o","p","q"]})"),
            "stop") << "17 stop strings";
  // A field checked by the shared validation is named as the client spelled it.
  EXPECT_EQ(param_of(R"({"prompt": "x", "guided_choice": ["a", ""]})"), "guided_choice[1]");
  HttpResult structured =
      HttpCall(http_port_, "POST", "/v1/completions",
               R"({"prompt": "x", "structured_outputs": {"choice": ["a", ""]}})");
  EXPECT_EQ(structured.status, 400);
  EXPECT_EQ(Json::parse(structured.body)["error"]["message"],
            "structured_outputs.choice[1] has 0 bytes; it must have 1 to 1024");
  EXPECT_EQ(Json::parse(structured.body)["error"]["param"], "structured_outputs.choice[1]");
  EXPECT_TRUE(param_of("{not json").is_null());
  // This server serves first come, first served (the default --scheduling-policy).
  HttpResult priority = Post("/v1/completions", {{"prompt", "x"}, {"priority", 1}});
  EXPECT_EQ(priority.status, 400) << priority.body;
  EXPECT_EQ(Json::parse(priority.body)["error"]["param"], "priority") << priority.body;
  {
    HttpConnection c(http_port_);
    c.SendRaw("\x16\x03\x01 not http at all\r\n\r\n");
    EXPECT_EQ(c.Read(10).status, 400);
  }
  const std::string metrics = server_->ScrapeMetrics();
  EXPECT_GE(MetricValue(metrics, "thetaserve_requests_total{outcome=\"rejected\"}"), 8);
  // Bad input, by the code the gRPC API answers it with.
  EXPECT_GE(MetricValue(metrics, "thetaserve_requests_rejected_total{code=\"INVALID_ARGUMENT\"}"),
            8);
  HttpResult ok = Post("/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 2}});
  EXPECT_EQ(ok.status, 200) << ok.body;
}

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
  ASSERT_GE(MetricValue(before, bad_request), 0);
  EXPECT_EQ(HttpCall(http_port_, "GET", "/v1/models").status, 200);
  EXPECT_EQ(HttpCall(http_port_, "GET", "/health").status, 200);
  EXPECT_EQ(HttpCall(http_port_, "GET", "/v1/models/nope").status, 404);
  EXPECT_EQ(HttpCall(http_port_, "GET", "/v1/completions").status, 405);
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
  EXPECT_EQ(delta("/v1/models/{id}", "4xx"), 1);
  EXPECT_EQ(delta("/v1/completions", "4xx"), 2);
  EXPECT_EQ(delta("/v1/completions", "2xx"), 1);
  EXPECT_EQ(delta("other", "4xx"), 1);
  EXPECT_EQ(delta("other", "2xx"), 1);
  EXPECT_EQ(delta("/v1/completions", "5xx"), 0);
  EXPECT_EQ(delta("/v1/chat/completions", "2xx"), 0);
  EXPECT_EQ(MetricValue(after, bad_request) - MetricValue(before, bad_request), 1);
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

// n completions: a whole response with n choices (completion i is what a request of its
// own with seed + i gives; usage counts the prompt once), and a stream whose chunks carry
// their choice's index, each ending with its finish reason; a client that goes away ends all.
TEST_F(OpenAiHttpTest, NCompletionsComeBackAsIndexedChoices) {
  ASSERT_TRUE(server_->started());
  const Json body = {{"prompt", "Once upon a time, in a small village by the sea,"},
                     {"max_tokens", 10}, {"temperature", 0.9}, {"seed", 77},
                     {"ignore_eos", true}, {"n", 3}};
  HttpResult r = Post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = Json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 3u);
  int64_t prompt_tokens = 0;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["finish_reason"], "length");
    Json alone = body;
    alone.erase("n");
    alone["seed"] = 77 + i;
    HttpResult a = Post("/v1/completions", alone);
    ASSERT_EQ(a.status, 200) << a.body;
    const Json aj = Json::parse(a.body);
    EXPECT_EQ(j["choices"][i]["text"], aj["choices"][0]["text"]) << "choice " << i;
    prompt_tokens = aj["usage"]["prompt_tokens"];
  }
  EXPECT_NE(j["choices"][0]["text"], j["choices"][1]["text"]);
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens"], 30);

  Json chat = {{"messages", {{{"role", "user"}, {"content", "Name a colour."}}}},
               {"max_tokens", 8}, {"temperature", 0.9}, {"n", 2}, {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  HttpResult streamed = Post("/v1/chat/completions", chat);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_GE(SseData(streamed.body).size(), 6u);
  const StreamedChoices colours = CollectChoices(streamed.body, 2);
  EXPECT_EQ(colours.roles, std::vector<int>({1, 1}));
  EXPECT_EQ(colours.finishes, std::vector<int>({1, 1}));
  ASSERT_TRUE(colours.usage.is_object()) << streamed.body;
  EXPECT_LE(colours.usage["completion_tokens"].get<int>(), 16);
  EXPECT_GE(colours.usage["completion_tokens"].get<int>(), 2);

  // A client that leaves a stream of n = 4 cancels all four.
  auto stub = server_->stub();
  ASSERT_TRUE(WaitForRunning(*stub, 0));
  {
    HttpConnection c(http_port_);
    HttpResult head = OpenStream(c, {{"prompt", "Tell me a very long story"}, {"max_tokens", 4000},
                                     {"ignore_eos", true}, {"stream", true}, {"n", 4}});
    ASSERT_EQ(head.status, 200);
    ASSERT_TRUE(WaitForRunning(*stub, 4));
  }
  EXPECT_TRUE(WaitForRunning(*stub, 0)) << "the completions kept running or kept their pages";
}

// echo: the prompt comes back before the completion, and with logprobs its tokens' scores
// (the first null); max_tokens = 0 scores the prompt alone (how evaluation harnesses compute
// log-likelihoods through a completions API).
TEST_F(OpenAiHttpTest, EchoReturnsThePromptAndScoresIt) {
  ASSERT_TRUE(server_->started());
  const std::string prompt = "The capital of France is";
  HttpResult r = Post("/v1/completions", {{"prompt", prompt}, {"echo", true}, {"logprobs", 1},
                                          {"max_tokens", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = Json::parse(r.body);
  const Json& c = j["choices"][0];
  EXPECT_EQ(c["text"], prompt);
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 0);
  const Json& lp = c["logprobs"];
  const size_t P = j["usage"]["prompt_tokens"];
  ASSERT_EQ(lp["tokens"].size(), P);
  std::string joined;
  for (const Json& t : lp["tokens"]) joined += t.get<std::string>();
  EXPECT_EQ(joined, prompt);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (size_t i = 1; i < P; ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_GE(lp["top_logprobs"][i].size(), 1u);
  }
  EXPECT_EQ(lp["text_offset"][1], lp["tokens"][0].get<std::string>().size());

  // With tokens: the prompt's text, then what the same request without echo gives.
  const Json body = {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}};
  HttpResult plain = Post("/v1/completions", body);
  ASSERT_EQ(plain.status, 200);
  const std::string completion = Json::parse(plain.body)["choices"][0]["text"];
  Json echo_body = body;
  echo_body["echo"] = true;
  HttpResult echoed = Post("/v1/completions", echo_body);
  ASSERT_EQ(echoed.status, 200) << echoed.body;
  EXPECT_EQ(Json::parse(echoed.body)["choices"][0]["text"], prompt + completion);
  echo_body["stream"] = true;
  echo_body["logprobs"] = 0;
  HttpResult streamed = Post("/v1/completions", echo_body);
  ASSERT_EQ(streamed.status, 200);
  const auto events = SseData(streamed.body);
  ASSERT_GE(events.size(), 3u);
  std::string text;
  size_t scored_tokens = 0;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const Json e = Json::parse(events[i]);
    text += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["logprobs"].is_null()) {
      scored_tokens += e["choices"][0]["logprobs"]["tokens"].size();
    }
  }
  EXPECT_EQ(Json::parse(events[0])["choices"][0]["text"].get<std::string>().rfind(prompt, 0), 0u)
      << "the first event starts with the prompt";
  EXPECT_EQ(text, prompt + completion);
  EXPECT_EQ(scored_tokens, P + 6);
  // Not on chat, and max_tokens = 0 only with echo.
  EXPECT_EQ(Post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                          {"echo", true}}).status, 400);
  EXPECT_EQ(Post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 0}}).status, 400);
}

// echo with n > 1: every choice echoes its prompt with the prompt's scores (computed once, by
// the first completion), then its own completion (what a request of its own with seed + i
// gives); streamed alike; with max_tokens 0 every choice is the scored prompt alone.
TEST_F(OpenAiHttpTest, EchoWithNCompletionsGivesEveryChoiceThePromptAndItsScores) {
  ASSERT_TRUE(server_->started());
  auto post = [&](const Json& body) {
    HttpResult r = Post("/v1/completions", body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? Json::parse(r.body) : Json();
  };
  const std::vector<std::string> prompts = {"The capital of France is", "Water boils at"};
  std::vector<Json> scores;  // [prompt]: its echo's log-probabilities when sent alone
  for (const std::string& p : prompts) {
    const Json alone = post({{"prompt", p}, {"echo", true}, {"logprobs", 1}, {"max_tokens", 0}});
    ASSERT_FALSE(alone.is_null());
    scores.push_back(alone["choices"][0]["logprobs"]);
    ASSERT_GE(scores.back()["tokens"].size(), 3u);
  }
  auto head = [](const Json& logprobs, size_t count) {  // the first `count` of each list
    Json out = Json::object();
    for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
      out[key] = Json(std::vector<Json>(logprobs[key].begin(), logprobs[key].begin() + count));
    }
    return out;
  };

  const Json body = {{"prompt", prompts[0]}, {"echo", true}, {"logprobs", 1}, {"n", 3},
                     {"max_tokens", 5}, {"temperature", 0.9}, {"seed", 5}, {"ignore_eos", true}};
  const Json whole = post(body);
  ASSERT_EQ(whole["choices"].size(), 3u);
  const size_t P = scores[0]["tokens"].size();
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    const Json& c = whole["choices"][i];
    const Json own = post({{"prompt", prompts[0]}, {"max_tokens", 5}, {"temperature", 0.9},
                           {"seed", 5 + i}, {"ignore_eos", true}});
    EXPECT_EQ(c["text"], prompts[0] + own["choices"][0]["text"].get<std::string>());
    ASSERT_EQ(c["logprobs"]["tokens"].size(), P + 5);
    EXPECT_EQ(head(c["logprobs"], P), scores[0]);
  }
  EXPECT_EQ(whole["usage"]["completion_tokens"], 15);

  Json stream_body = body;
  stream_body["stream"] = true;
  HttpResult streamed = Post("/v1/completions", stream_body);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  const StreamedChoices choices = CollectChoices(streamed.body, 3);
  std::vector<size_t> scored(3, 0);
  std::vector<bool> first_seen(3, false);
  for (const std::string& e : SseData(streamed.body)) {
    if (e == "[DONE]") continue;
    const Json event = Json::parse(e);
    for (const Json& c : event["choices"]) {
      const int index = c["index"];
      if (!first_seen[index] && c["finish_reason"].is_null()) {
        first_seen[index] = true;
        EXPECT_EQ(c["text"].get<std::string>().rfind(prompts[0], 0), 0u) << e;
        ASSERT_FALSE(c["logprobs"].is_null()) << e;
        EXPECT_EQ(head(c["logprobs"], P), scores[0]) << e;
      }
      if (!c["logprobs"].is_null()) scored[index] += c["logprobs"]["tokens"].size();
    }
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(choices.texts[i], whole["choices"][i]["text"]) << i;
    EXPECT_EQ(scored[i], P + 5) << i;
  }

  // Two prompts, two choices each, scored alone: choice p * 2 + i is prompt p's scores.
  const Json just_scores = post({{"prompt", prompts}, {"echo", true}, {"logprobs", 1},
                                 {"n", 2}, {"max_tokens", 0}});
  ASSERT_EQ(just_scores["choices"].size(), 4u);
  for (int k = 0; k < 4; ++k) {
    const Json& c = just_scores["choices"][k];
    EXPECT_EQ(c["text"], prompts[k / 2]) << k;
    EXPECT_EQ(c["logprobs"], scores[k / 2]) << k;
  }
  EXPECT_EQ(just_scores["usage"]["completion_tokens"], 0);

  // Every choice carries the prompt's scores: prompt tokens x n are bounded (262,144).
  const Json five_thousand = std::vector<uint32_t>(5000, 1);
  HttpResult heavy = Post("/v1/completions", {{"prompt", five_thousand}, {"echo", true},
                                              {"logprobs", 1}, {"n", 60}, {"max_tokens", 0}});
  EXPECT_EQ(heavy.status, 400);
  EXPECT_NE(heavy.body.find("the prompt scores asked for come to more than 262144 tokens "
                            "(5000 prompt tokens so far, n = 60"), std::string::npos)
      << heavy.body;
}

// vLLM's prompt_logprobs on the real model: each prompt token after the first has its score
// (the one echo gives), its rank (the one gRPC's PromptLogprobs gives) and the k most likely;
// every choice of n has them; a chat has them once, for the rendered prompt; not streamed.
TEST_F(OpenAiHttpTest, PromptLogprobsScoreAndRankEveryPromptToken) {
  ASSERT_TRUE(server_->started());
  auto stub = server_->stub();
  const std::string prompt = "The capital of France is Paris, and the capital of Italy is";
  const std::vector<uint32_t> ids = TokenIds(*stub, prompt);
  const size_t P = ids.size();
  ASSERT_GT(P, 8u);
  HttpResult r = Post("/v1/completions", {{"prompt", prompt}, {"prompt_logprobs", 2},
                                          {"max_tokens", 2}, {"n", 2}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = Json::parse(r.body);
  const Json& scores = j["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(scores.size(), P) << r.body;
  EXPECT_TRUE(scores[0].is_null());
  EXPECT_EQ(j["choices"][1]["prompt_logprobs"], scores);

  const Json echoed = Json::parse(Post("/v1/completions", {{"prompt", prompt}, {"echo", true},
                                                           {"logprobs", 1}, {"max_tokens", 0}})
                                      .body)["choices"][0]["logprobs"];
  v1::GenerateRequest req = Prompt(prompt, 1);
  req.mutable_sampling()->set_prompt_logprobs(0);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  v1::PromptLogprobs grpc_scores;
  while (reader->Read(&resp)) {
    if (resp.has_prompt_logprobs()) grpc_scores = resp.prompt_logprobs();
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(size_t(grpc_scores.logprobs_size()), P - 1);
  int firsts = 0;
  for (size_t i = 1; i < P; ++i) {
    SCOPED_TRACE(i);
    const Json& at = scores[i];
    const std::string own = std::to_string(ids[i]);
    ASSERT_TRUE(at.contains(own)) << at;
    EXPECT_LE(at.size(), 3u);
    EXPECT_NEAR(at[own]["logprob"].get<double>(), echoed["token_logprobs"][i].get<double>(),
                1e-6);
    EXPECT_EQ(at[own]["decoded_token"], echoed["tokens"][i]);
    const int rank = at[own]["rank"];
    EXPECT_EQ(rank, int(grpc_scores.logprobs(int(i) - 1).rank()));
    EXPECT_GE(rank, 1);
    firsts += rank == 1;
    bool has_first = false;  // the model's most likely token is always among them (k = 2)
    for (const auto& [id, e] : at.items()) {
      EXPECT_LE(e["logprob"].get<double>(), 0.0);
      if (e["rank"] == 1) has_first = true;
      if (e["rank"].get<int>() < rank) {
        EXPECT_GE(e["logprob"].get<double>(), at[own]["logprob"].get<double>()) << id;
      }
    }
    EXPECT_TRUE(has_first) << at;
  }
  EXPECT_GT(firsts, 0);  // "capital of" is predictable the second time
  EXPECT_LT(firsts, int(P) - 1);

  HttpResult chat = Post("/v1/chat/completions",
                         {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                          {"prompt_logprobs", 1}, {"max_tokens", 1}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  const Json cj = Json::parse(chat.body);
  EXPECT_EQ(cj["prompt_logprobs"].size(), cj["usage"]["prompt_tokens"].get<size_t>());
  EXPECT_FALSE(cj["choices"][0].contains("prompt_logprobs"));
  EXPECT_EQ(Post("/v1/completions", {{"prompt", prompt}, {"prompt_logprobs", 1},
                                     {"stream", true}}).status, 400);
}

// A list of prompts (how lm-evaluation-harness batches): choice p * n + i is what prompt p
// alone gives as its choice i, scored prompts included; usage adds the prompts up; a stream
// numbers its chunks alike; a bad prompt is named; a client that leaves cancels them all, and
// Abort of the call's id ends every prompt.
TEST_F(OpenAiHttpTest, AListOfPromptsGetsOneChoicePerPromptInOrder) {
  ASSERT_TRUE(server_->started());
  auto stub = server_->stub();
  // Token ids as a harness sends them (its own tokenizer's).
  const Json ids = TokenIds(*stub, "Once upon a time");
  ASSERT_FALSE(ids.empty());
  const Json prompts = {"The capital of France is", ids, "Water boils at"};

  // Log-likelihoods, as lm-evaluation-harness's local-completions asks for them (it reads
  // token_logprobs[context:-1], dropping the one token generated).
  const Json scored = {{"model", kModelName}, {"prompt", prompts}, {"temperature", 0},
                       {"max_tokens", 1}, {"logprobs", 1}, {"seed", 1234}, {"echo", true}};
  HttpResult r = Post("/v1/completions", scored);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = Json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 3u);
  int64_t prompt_tokens = 0;
  for (int p = 0; p < 3; ++p) {
    Json alone = scored;
    alone["prompt"] = prompts[p];
    HttpResult a = Post("/v1/completions", alone);
    ASSERT_EQ(a.status, 200) << a.body;
    const Json aj = Json::parse(a.body);
    const Json& c = j["choices"][p];
    EXPECT_EQ(c["index"], p);
    EXPECT_EQ(c["text"], aj["choices"][0]["text"]) << "prompt " << p;
    EXPECT_EQ(c["logprobs"], aj["choices"][0]["logprobs"]) << "prompt " << p;
    EXPECT_EQ(c["finish_reason"], "length");
    const int64_t prompt_length = aj["usage"]["prompt_tokens"];
    EXPECT_EQ(c["logprobs"]["token_logprobs"].size(), size_t(prompt_length + 1));
    prompt_tokens += prompt_length;
  }
  EXPECT_EQ(j["choices"][1]["text"].get<std::string>().rfind("Once upon a time", 0), 0u);
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);

  // n per prompt: each prompt's choices are its own request's, in order.
  const Json sampled = {{"prompt", {prompts[0], prompts[2]}}, {"max_tokens", 6}, {"n", 2},
                        {"temperature", 0.9}, {"seed", 11}, {"ignore_eos", true}};
  HttpResult s = Post("/v1/completions", sampled);
  ASSERT_EQ(s.status, 200) << s.body;
  const Json sj = Json::parse(s.body);
  ASSERT_EQ(sj["choices"].size(), 4u);
  for (int p = 0; p < 2; ++p) {
    Json alone = sampled;
    alone["prompt"] = sampled["prompt"][p];
    HttpResult a = Post("/v1/completions", alone);
    ASSERT_EQ(a.status, 200) << a.body;
    const Json aj = Json::parse(a.body);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(sj["choices"][p * 2 + i]["index"], p * 2 + i);
      EXPECT_EQ(sj["choices"][p * 2 + i]["text"], aj["choices"][i]["text"]) << p << "/" << i;
    }
  }
  EXPECT_EQ(sj["usage"]["completion_tokens"], 24);

  // Streamed: every chunk names its choice; each ends once; the usage counts them all.
  Json streamed_body = {{"prompt", prompts}, {"max_tokens", 5}, {"temperature", 0},
                        {"ignore_eos", true}, {"stream", true},
                        {"stream_options", {{"include_usage", true}}}};
  HttpResult st = Post("/v1/completions", streamed_body);
  ASSERT_EQ(st.status, 200) << st.body;
  const StreamedChoices per_prompt = CollectChoices(st.body, 3);
  EXPECT_EQ(per_prompt.finishes, std::vector<int>({1, 1, 1}));
  streamed_body.erase("stream");
  streamed_body.erase("stream_options");
  const Json whole = Json::parse(Post("/v1/completions", streamed_body).body);
  for (int p = 0; p < 3; ++p) EXPECT_EQ(per_prompt.texts[p], whole["choices"][p]["text"]) << p;
  EXPECT_EQ(per_prompt.usage["completion_tokens"], 15);
  EXPECT_EQ(per_prompt.usage["prompt_tokens"], prompt_tokens);

  // A prompt that cannot fit is named, and nothing of the call runs.
  const std::string too_long(200'000, 'a');
  HttpResult bad = Post("/v1/completions", {{"prompt", {"fine", too_long}}});
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("prompt[1]: "), std::string::npos) << bad.body;
  // One that fits the context but never the KV cache (128 MiB here) is named too.
  HttpResult big = Post("/v1/completions", {{"prompt", {"fine", "fine"}}, {"max_tokens", 7000}});
  EXPECT_EQ(big.status, 400) << big.body;
  EXPECT_NE(big.body.find("prompt[0]: prompt + max_tokens = "), std::string::npos) << big.body;
  // A parameter they share is not blamed on a prompt.
  HttpResult shared = Post("/v1/completions", {{"prompt", {"a", "b"}},
                                               {"stop_token_ids", {999999}}});
  EXPECT_EQ(shared.status, 400);
  EXPECT_NE(shared.body.find("\"stop_token_ids[0] = 999999"), std::string::npos) << shared.body;
  // At most 262,144 prompt tokens in one call, all prompts together.
  const Json five_thousand = std::vector<uint32_t>(5000, ids[0].get<uint32_t>());
  HttpResult heavy = Post("/v1/completions", {{"prompt", std::vector<Json>(53, five_thousand)}});
  EXPECT_EQ(heavy.status, 400);
  EXPECT_NE(heavy.body.find("more than 262144 tokens in all (53 of 53 counted)"),
            std::string::npos) << heavy.body;
  EXPECT_EQ(Post("/v1/completions", {{"prompt", {"a", 7}}}).status, 400);
  // With n = 2 the engine refuses request 2, the first of prompt 1's: prompt 1 is named.
  const Json two_thousand = std::vector<uint32_t>(2000, ids[0].get<uint32_t>());
  HttpResult second = Post("/v1/completions", {{"prompt", {"fine", two_thousand}}, {"n", 2},
                                               {"max_tokens", 4000}});
  EXPECT_EQ(second.status, 400) << second.body;
  EXPECT_NE(second.body.find("prompt[1]: prompt + max_tokens = 6000"), std::string::npos)
      << second.body;
  HttpResult bad_id = Post("/v1/completions", {{"prompt", {ids, {1, 2, 999999}}}});
  EXPECT_EQ(bad_id.status, 400);
  EXPECT_NE(bad_id.body.find("prompt[1][2] = 999999 is outside the vocabulary"), std::string::npos)
      << bad_id.body;
  ASSERT_TRUE(WaitForRunning(*stub, 0));

  // A client that leaves, streaming or not, cancels every prompt's completions.
  const std::string kCancelled = "thetaserve_requests_total{outcome=\"cancelled\"}";
  const Json endless = {{"prompt", {"Tell me a story", "Write a long poem", "Count to a million"}},
                        {"max_tokens", 4000}, {"ignore_eos", true}};
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streaming" : "whole completion");
    const double cancelled_before = MetricValue(server_->ScrapeMetrics(), kCancelled);
    Json body = endless;
    body["stream"] = stream;
    {
      HttpConnection c(http_port_);
      ASSERT_TRUE(c.SendRaw(RequestHead("/v1/completions", body.dump())));
      ASSERT_TRUE(WaitForRunning(*stub, 3));
    }
    EXPECT_TRUE(WaitForRunning(*stub, 0)) << "the completions kept running or kept their pages";
    EXPECT_EQ(MetricValue(server_->ScrapeMetrics(), kCancelled), cancelled_before + 3);
  }
  // Abort with the call's id ends all three.
  HttpConnection c(http_port_);
  Json body = endless;
  body["stream"] = true;
  HttpResult head = OpenStream(c, body);
  ASSERT_EQ(head.status, 200);
  ASSERT_TRUE(WaitForRunning(*stub, 3));
  grpc::ClientContext actx;
  v1::AbortRequest abort;
  abort.set_request_id(head.headers["x-request-id"]);
  v1::AbortResponse found;
  ASSERT_TRUE(stub->Abort(&actx, abort, &found).ok());
  EXPECT_TRUE(found.found());
  c.ReadBody(&head, 30);
  const auto aborted = SseData(head.body);
  std::vector<int> aborts(3, 0);
  for (const std::string& e : aborted) {
    if (e == "[DONE]") continue;
    const Json event = Json::parse(e);
    for (const Json& ch : event["choices"]) {
      if (ch["finish_reason"] == "abort") ++aborts[ch["index"].get<int>()];
    }
  }
  EXPECT_EQ(aborts, std::vector<int>({1, 1, 1}))
      << (aborted.size() > 1 ? aborted[aborted.size() - 2] : head.body.substr(0, 400));
  EXPECT_TRUE(WaitForRunning(*stub, 0));
  // Once it has ended, its id is no longer in flight (nor after a call that ran to its end).
  for (const std::string& ended : {head.headers["x-request-id"],
                                   r.headers["x-request-id"]}) {
    grpc::ClientContext again;
    abort.set_request_id(ended);
    ASSERT_TRUE(stub->Abort(&again, abort, &found).ok());
    EXPECT_FALSE(found.found()) << ended;
  }
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

TEST(OpenAiHttpLifecycleTest, ApiKeyGuardsTheApiButNotHealth) {
  const int http_port = FreePort();
  ServerProcess server({"--http-port", std::to_string(http_port), "--api-key", "sesame",
                        "--served-model-name", "tiny"});
  ASSERT_TRUE(server.started());
  const std::string body = R"({"model": "tiny", "prompt": "Hello", "max_tokens": 2})";
  HttpResult none = HttpCall(http_port, "POST", "/v1/completions", body);
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(none.headers["www-authenticate"], "Bearer");
  EXPECT_EQ(HttpCall(http_port, "POST", "/v1/completions", body,
                     {{"Authorization", "Bearer wrong"}}).status, 401);
  EXPECT_EQ(HttpCall(http_port, "GET", "/v1/models").status, 401);
  HttpResult right = HttpCall(http_port, "POST", "/v1/completions", body,
                              {{"Authorization", "Bearer sesame"}});
  EXPECT_EQ(right.status, 200) << right.body;
  EXPECT_EQ(Json::parse(right.body)["model"], "tiny");
  EXPECT_EQ(HttpCall(http_port, "POST", "/tokenize", R"({"prompt": "Hello"})").status, 401);
  EXPECT_EQ(HttpCall(http_port, "POST", "/detokenize", R"({"tokens": [1]})",
                     {{"Authorization", "Bearer sesame"}}).status, 200);
  // The scheme's name in any case (RFC 7235), as some clients and proxies send it.
  EXPECT_EQ(HttpCall(http_port, "POST", "/detokenize", R"({"tokens": [1]})",
                     {{"Authorization", "bearer sesame"}}).status, 200);
  // Health and metrics need no key (probes and scrapers have none).
  EXPECT_EQ(HttpCall(http_port, "GET", "/health").status, 200);
  HttpResult metrics = HttpCall(http_port, "GET", "/metrics");
  EXPECT_EQ(metrics.status, 200);
  // The two completions refused are counted (as a gRPC call with a wrong key is); the other
  // routes generate nothing and are not.
  EXPECT_EQ(MetricValue(metrics.body, "thetaserve_requests_rejected_total{code=\"UNAUTHENTICATED\"}"),
            2);
  EXPECT_EQ(MetricValue(metrics.body, "thetaserve_requests_total{outcome=\"rejected\"}"), 2);
}

// --allowed-origins: a listed origin is echoed (with Vary: Origin); another gets no CORS header
// and its preflight is the route's 405, which the browser takes as a refusal.
TEST(OpenAiHttpLifecycleTest, AllowedOriginsNameWhichPagesMayCall) {
  const int http_port = FreePort();
  ServerProcess server({"--http-port", std::to_string(http_port), "--allowed-origins",
                        "https://a.example,http://localhost:3000"});
  ASSERT_TRUE(server.started());
  HttpResult ok = HttpCall(http_port, "GET", "/v1/models", "", {{"Origin", "https://a.example"}});
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.headers["access-control-allow-origin"], "https://a.example");
  EXPECT_EQ(ok.headers["vary"], "Origin");
  HttpResult other =
      HttpCall(http_port, "GET", "/v1/models", "", {{"Origin", "https://b.example"}});
  EXPECT_EQ(other.status, 200);
  EXPECT_EQ(other.headers.count("access-control-allow-origin"), 0u);
  EXPECT_EQ(HttpCall(http_port, "OPTIONS", "/v1/models", "",
                     {{"Origin", "https://b.example"}, {"Access-Control-Request-Method", "GET"}})
                .status,
            405);
}

TEST(OpenAiHttpLifecycleTest, FlagErrorsAreRefusedBeforeTheModelLoads) {
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--http-port", "70000"},
        std::vector<std::string>{"--served-model-name", "x"},
        std::vector<std::string>{"--allowed-origins", "*"},
        std::vector<std::string>{"--max-http-connections", "10"},
        std::vector<std::string>{"--max-model-len", "0"},
        std::vector<std::string>{"--http-port", "8001", "--max-http-connections", "0"},
        std::vector<std::string>{"--http-port", "8001", "--allowed-origins", "app.example.com"}}) {
    ServerProcess server(flags, /*timeout_s=*/0);
    EXPECT_EQ(server.Wait(30), 2) << flags[0] << ": a bad command line";
  }
}

// --max-http-connections caps the HTTP API's open connections, and the process's descriptor
// limit does not get in its way: serve raises its soft limit (here started at 200, below the
// 300 asked for) to the hard one. Idle connections hold no thread, so 300 cost descriptors.
TEST(OpenAiHttpLifecycleTest, HttpConnectionsAreCappedByTheFlagNotTheDescriptorLimit) {
  const int http_port = FreePort();
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_GE(saved.rlim_max, 1024u) << "the hard limit leaves no room to test";
  rlimit low = saved;
  low.rlim_cur = 200;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  ServerProcess server({"--http-port", std::to_string(http_port), "--max-http-connections", "300"});
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_TRUE(server.started());
  std::vector<std::unique_ptr<HttpConnection>> open;
  for (int i = 0; i < 300; ++i) {
    open.push_back(std::make_unique<HttpConnection>(http_port));
    ASSERT_TRUE(open.back()->SendRaw("GET /health HTTP/1.1\r\nHost: t\r\n\r\n")) << i;
    ASSERT_EQ(open.back()->Read(10).status, 200) << "connection " << i;
  }
  HttpResult over = HttpCall(http_port, "GET", "/health");
  EXPECT_EQ(over.status, 503) << over.body;
  EXPECT_EQ(ReadFileOrDie(server.log_path()).find("lowered"), std::string::npos);
  // The metrics say so (scraped on the metrics port, which the cap does not touch).
  std::string metrics = server.ScrapeMetrics();
  EXPECT_EQ(MetricValue(metrics, "thetaserve_http_connections_open"), 300);
  EXPECT_EQ(MetricValue(metrics, "thetaserve_http_connections_limit"), 300);
  EXPECT_EQ(MetricValue(metrics, "thetaserve_http_refused_total{reason=\"connections\"}"), 1);
  EXPECT_EQ(MetricValue(metrics, "thetaserve_http_refused_total{reason=\"request_bytes\"}"), 0);
  open.erase(open.begin(), open.begin() + 200);  // the newest 100 stay (the sweep takes the
                                                 // oldest idle ones first)
  for (int i = 0; i < 100; ++i) {
    metrics = server.ScrapeMetrics();
    if (MetricValue(metrics, "thetaserve_http_connections_open") == 100) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(MetricValue(metrics, "thetaserve_http_connections_open"), 100);
}

// --max-model-len serves a shorter context than the model's: both APIs report it, requests are
// held to it (a chat without max_tokens gets what is left of it), and a longer one than the
// model's is a bad command line.
TEST(OpenAiHttpLifecycleTest, MaxModelLenBoundsEveryRequest) {
  const int http_port = FreePort();
  ServerProcess server({"--http-port", std::to_string(http_port), "--max-model-len", "48"});
  ASSERT_TRUE(server.started());
  const HttpResult models = HttpCall(http_port, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(Json::parse(models.body)["data"][0]["max_model_len"], 48);
  {
    grpc::ClientContext c;
    v1::ModelInfo info;
    ASSERT_TRUE(server.stub()->GetModelInfo(&c, {}, &info).ok());
    EXPECT_EQ(info.context_length(), 48u);
  }
  const HttpResult too_long = HttpCall(
      http_port, "POST", "/v1/completions",
      Json{{"prompt", "one two three four five six seven eight nine ten"}, {"max_tokens", 40}}.dump());
  EXPECT_EQ(too_long.status, 400) << too_long.body;
  EXPECT_NE(too_long.body.find("48"), std::string::npos) << too_long.body;
  const HttpResult chat = HttpCall(
      http_port, "POST", "/v1/chat/completions",
      Json{{"messages", {{{"role", "user"}, {"content", "Tell me a long story."}}}},
           {"temperature", 0}}.dump());
  ASSERT_EQ(chat.status, 200) << chat.body;
  const Json usage = Json::parse(chat.body)["usage"];
  EXPECT_LE(usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>(), 48) << usage;
  EXPECT_GT(usage["completion_tokens"].get<int>(), 0) << usage;

  ServerProcess longer({"--max-model-len", "100000"}, /*timeout_s=*/0);
  EXPECT_EQ(longer.Wait(60), 2);
  EXPECT_NE(ReadFileOrDie(longer.log_path())
                .find("--max-model-len 100000 is longer than the model's context of 8192 tokens"),
            std::string::npos)
      << ReadFileOrDie(longer.log_path());
}

// The chat default (no max_tokens) is the rest of the context, however little: the request was
// checked with the gRPC API's default of 16 first, so a prompt with fewer than 16 tokens of
// context left was refused ("max_tokens = 16 with a 8181-token prompt exceeds ...") though
// the client sent no max_tokens. The CPU's default KV cache holds a whole context.
TEST(OpenAiHttpLifecycleTest, ChatWithoutMaxTokensTakesWhatIsLeftOfTheContext) {
  const int http_port = FreePort();
  ServerProcess server({"--http-port", std::to_string(http_port)});
  ASSERT_TRUE(server.started());
  auto chat_of = [](int words) {
    std::string text;
    for (int i = 0; i < words; ++i) text += "hello ";
    return Json{{"messages", {{{"role", "user"}, {"content", text}}}}};
  };
  auto tokens = [&](int words) {
    const HttpResult r = HttpCall(http_port, "POST", "/tokenize", chat_of(words).dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? Json::parse(r.body)["count"].get<int>() : -1;
  };
  const int base = tokens(8100);
  ASSERT_GT(base, 8100);
  const int words = 8100 + (8192 - 5 - base);  // a word a token: 5 tokens of context left
  ASSERT_EQ(tokens(words), 8192 - 5);
  Json body = chat_of(words);
  body["ignore_eos"] = true;
  body["temperature"] = 0;
  // An 8,187-token prefill takes minutes on 2 cores, past 300 s when ctest runs the emulated
  // GPU tests beside it (CI, 2026-12-06: 66% of the prompt computed at 300 s).
  const HttpResult r =
      HttpCall(http_port, "POST", "/v1/chat/completions", body.dump(), {}, /*timeout_s=*/900);
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 400);
  const Json j = Json::parse(r.body);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 8192 - 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  // No room left at all: refused, naming the prompt, not a max_tokens the client never sent.
  const HttpResult full = HttpCall(http_port, "POST", "/v1/chat/completions",
                                   chat_of(words + 5).dump());
  EXPECT_EQ(full.status, 400) << full.body;
  EXPECT_EQ(full.body.find("max_tokens = 16"), std::string::npos) << full.body;
}

TEST(OpenAiHttpLifecycleTest, AStreamCutOffByShutdownEndsWithAnErrorEvent) {
  const int http_port = FreePort();
  ServerProcess server({"--http-port", std::to_string(http_port), "--drain-timeout", "0"});
  ASSERT_TRUE(server.started());
  HttpConnection c(http_port);
  const Json body = {{"prompt", "Hello"}, {"max_tokens", 4000}, {"ignore_eos", true},
                     {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  HttpResult r = OpenStream(c, body);
  ASSERT_EQ(r.status, 200);
  std::string first;
  ASSERT_TRUE(c.ReadChunk(&first, 60));  // generating
  server.Signal(SIGTERM);               // no drain time: the engine cancels it
  c.ReadBody(&r, 60);
  const auto events = SseData(first + r.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  const Json last = Json::parse(events[events.size() - 2]);
  ASSERT_TRUE(last.contains("error")) << last.dump();
  EXPECT_EQ(last["error"]["code"], 503);
  for (const auto& e : events) EXPECT_EQ(e.find("\"usage\""), std::string::npos) << e;
  EXPECT_EQ(server.Wait(60), 0);
}

// Without prefix caching a group's other completions do not wait for the first to compute
// the prompt: they finish a scoring-only request long before the first has scored a long
// prompt (128 tokens a step). Every choice still echoes the prompt with its scores, whole or
// streamed, with max_tokens 0 or 1.
TEST(OpenAiHttpLifecycleTest, WithoutPrefixCachingEveryChoiceStillGetsThePromptsScores) {
  const int http_port = FreePort();
  ServerProcess server({"--http-port", std::to_string(http_port), "--prefix-caching", "off"});
  ASSERT_TRUE(server.started());
  std::string prompt;
  for (int i = 0; i < 40; ++i) prompt += "The quick brown fox jumps over the lazy dog. ";
  auto post = [&](const Json& body) {
    return HttpCall(http_port, "POST", "/v1/completions", body.dump());
  };
  const HttpResult alone = post({{"prompt", prompt}, {"echo", true}, {"logprobs", 1},
                                 {"max_tokens", 0}});
  ASSERT_EQ(alone.status, 200) << alone.body;
  const Json scores = Json::parse(alone.body)["choices"][0]["logprobs"];
  const size_t P = scores["tokens"].size();
  ASSERT_GT(P, 300u);
  for (int max_tokens : {0, 1}) {
    SCOPED_TRACE(max_tokens);
    const Json body = {{"prompt", prompt}, {"echo", true}, {"logprobs", 1}, {"n", 4},
                       {"max_tokens", max_tokens}, {"temperature", 0}};
    const HttpResult r = post(body);
    ASSERT_EQ(r.status, 200) << r.body;
    const Json j = Json::parse(r.body);
    ASSERT_EQ(j["choices"].size(), 4u);
    for (const Json& c : j["choices"]) {
      EXPECT_EQ(c["text"].get<std::string>().rfind(prompt, 0), 0u) << c["index"];
      ASSERT_EQ(c["logprobs"]["tokens"].size(), P + max_tokens) << c["index"];
      EXPECT_EQ(c["logprobs"]["token_logprobs"][P - 1], scores["token_logprobs"][P - 1]);
    }
    Json streamed_body = body;
    streamed_body["stream"] = true;
    const HttpResult s = post(streamed_body);
    ASSERT_EQ(s.status, 200) << s.body;
    const StreamedChoices streamed = CollectChoices(s.body, 4);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(streamed.texts[i], j["choices"][i]["text"]) << i;
      EXPECT_EQ(streamed.finishes[i], 1) << i;
    }
  }
  EXPECT_EQ(server.HealthStatus(), "SERVING");
}

TEST(OpenAiHttpLifecycleTest, SigtermDrainsHttpStreamsToTheirEnd) {
  const int http_port = FreePort();
  ServerProcess server({"--http-port", std::to_string(http_port)});
  ASSERT_TRUE(server.started());
  HttpConnection c(http_port);
  // Long enough to be still running after the 200 ms below and the checks that follow (48
  // tokens took under 200 ms on a 2-core VM, and the server had gone when they ran).
  const Json body = {{"prompt", "Hello"}, {"max_tokens", 400}, {"ignore_eos", true},
                     {"stream", true}};
  HttpResult r = OpenStream(c, body);
  ASSERT_EQ(r.status, 200);
  server.Signal(SIGTERM);
  // New requests are refused while it drains ...
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  HttpConnection pooled(http_port);  // keep-alive: it does not ask to close
  ASSERT_TRUE(pooled.SendRaw(RequestHead("/v1/completions", R"({"prompt": "x"})")));
  HttpResult late = pooled.Read(30);
  EXPECT_EQ(late.status, 503);
  EXPECT_EQ(late.headers["retry-after"], "1");
  EXPECT_EQ(late.headers["connection"], "close");  // a pooled connection goes elsewhere
  HttpResult health = HttpCall(http_port, "GET", "/health");
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(health.headers["retry-after"], "1") << "as every 503 while loading or draining";
  // ... and the one in flight finishes.
  c.ReadBody(&r, 60);
  const auto events = SseData(r.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(Json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(server.Wait(60), 0);
}

}  // namespace
}  // namespace thetaserve::testing
