// The OpenAI-compatible HTTP API end to end: the real `thetaserve serve --http-port` binary with
// SmolLM2, raw HTTP over loopback, and the gRPC API beside it on the same engine. (Guided
// output: openai_http_guided_test.cc; n choices, echo and lists of prompts:
// openai_http_choices_test.cc; counting, cancellation and concurrent streams:
// openai_http_serving_test.cc; sampling parameters: openai_http_sampling_test.cc; servers
// started with their own flags: openai_http_lifecycle_test.cc.)
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/server/openai_http_e2e.h"

namespace thetaserve::testing {
namespace {

TEST_F(OpenAiHttpTest, HealthAndModelsDescribeTheServer) {
  ASSERT_TRUE(server_->started());
  HttpResult health = HttpCall(http_port_, "GET", "/health");
  EXPECT_EQ(health.status, 200);
  // vLLM's /version: the binary's own (as --version prints it).
  HttpResult version = HttpCall(http_port_, "GET", "/version");
  ASSERT_EQ(version.status, 200) << version.body;
  const std::string printed = RunCommand(BinaryPath() + " --version");
  EXPECT_EQ(printed.rfind(absl::StrCat("thetaserve ", Json::parse(version.body)["version"]
                                                          .get<std::string>(), "\n"), 0),
            0u)
      << version.body << " vs " << printed;
  HttpResult models = HttpCall(http_port_, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  const Json m = Json::parse(models.body);
  EXPECT_EQ(m["object"], "list");
  ASSERT_EQ(m["data"].size(), 1u);
  EXPECT_EQ(m["data"][0]["id"], kModelName);
  EXPECT_EQ(m["data"][0]["max_model_len"], 8192);
  EXPECT_EQ(HttpCall(http_port_, "GET", std::string("/v1/models/") + kModelName).status, 200);
  EXPECT_EQ(HttpCall(http_port_, "GET", "/v1/models/gpt-4o").status, 404);
  // The id percent-decoded, as a client that encodes the path segment sends it (it was 404).
  EXPECT_EQ(HttpCall(http_port_, "GET", "/v1/models/SmolLM2-135M-Instruct%2EQ4_1").status, 200);
  EXPECT_EQ(HttpCall(http_port_, "GET", "/v1/models/SmolLM2-135M-Instruct%2eQ4%5F1").status, 200);
  const HttpResult bad = HttpCall(http_port_, "GET", "/v1/models/SmolLM2%2-135M");
  EXPECT_EQ(bad.status, 404);
  EXPECT_NE(bad.body.find("the model 'SmolLM2%2-135M' does not exist"), std::string::npos)
      << bad.body;

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

// vLLM's skip_special_tokens over HTTP, whole and streamed: false writes the special tokens
// generated (here <|im_end|>, forced by logit_bias) into the text; the default leaves them out.
TEST_F(OpenAiHttpTest, SkipSpecialTokensFalseWritesThemIntoTheText) {
  ASSERT_TRUE(server_->started());
  HttpResult ids = Post("/tokenize", {{"prompt", "<|im_end|>"}, {"add_special_tokens", false}});
  ASSERT_EQ(ids.status, 200) << ids.body;
  const Json im_end = Json::parse(ids.body)["tokens"];
  ASSERT_EQ(im_end.size(), 1u);
  Json body = {{"prompt", "Hello"},
               {"max_tokens", 3},
               {"ignore_eos", true},
               {"logit_bias", {{std::to_string(im_end[0].get<int>()), 100}}}};
  HttpResult r = Post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json::parse(r.body)["choices"][0]["text"], "");
  body["skip_special_tokens"] = false;
  r = Post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json whole = Json::parse(r.body);
  EXPECT_EQ(whole["choices"][0]["text"], "<|im_end|><|im_end|><|im_end|>");
  StreamedAlike(body, whole);
  Json chat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
               {"max_tokens", 2},
               {"ignore_eos", true},
               {"skip_special_tokens", false},
               {"logit_bias", {{std::to_string(im_end[0].get<int>()), 100}}}};
  r = Post("/v1/chat/completions", chat);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json::parse(r.body)["choices"][0]["message"]["content"], "<|im_end|><|im_end|>");
}

// vLLM's return_token_ids: the prompt's ids (/tokenize's) and each choice's generated ids
// (the gRPC stream's), whole and streamed alike; on chat the prompt's beside the choices. It
// was ignored.
TEST_F(OpenAiHttpTest, ReturnTokenIdsGivesThePromptsAndTheChoicesIds) {
  ASSERT_TRUE(server_->started());
  auto stub = server_->stub();
  const std::vector<std::string> texts = {"The capital of France is", "Once upon a time"};
  Json body = {{"prompt", texts}, {"max_tokens", 6}, {"temperature", 0},
               {"return_token_ids", true}};
  HttpResult r = Post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json whole = Json::parse(r.body);
  ASSERT_EQ(whole["choices"].size(), 2u);
  for (int p = 0; p < 2; ++p) {
    const Json& c = whole["choices"][p];
    EXPECT_EQ(c["prompt_token_ids"], Json(TokenIds(*stub, texts[p]))) << p;
    StreamResult grpc = Generate(*stub, Prompt(texts[p], 6));
    ASSERT_TRUE(grpc.status.ok());
    EXPECT_EQ(c["token_ids"], Json(grpc.ids)) << p;
  }
  body["stream"] = true;
  r = Post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<Json> ids(2, Json::array());
  std::vector<int> prompts_seen(2, 0);
  for (const std::string& e : SseData(r.body)) {
    if (e == "[DONE]") break;
    const Json c = Json::parse(e)["choices"][0];
    const int i = c["index"];
    if (c.contains("prompt_token_ids")) {
      ++prompts_seen[i];
      EXPECT_EQ(c["prompt_token_ids"], whole["choices"][i]["prompt_token_ids"]);
    }
    if (c.contains("token_ids")) {
      for (const Json& id : c["token_ids"]) ids[i].push_back(id);
    }
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(prompts_seen[i], 1) << "once, with the choice's first chunk";
    EXPECT_EQ(ids[i], whole["choices"][i]["token_ids"]) << i;
  }
  const Json messages = {{{"role", "user"}, {"content", "Hi"}}};
  r = Post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 4},
                                    {"temperature", 0}, {"return_token_ids", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  const Json chat = Json::parse(r.body);
  const HttpResult tokenized = Post("/tokenize", {{"messages", messages}});
  ASSERT_EQ(tokenized.status, 200);
  EXPECT_EQ(chat["prompt_token_ids"], Json::parse(tokenized.body)["tokens"]);
  EXPECT_EQ(chat["choices"][0]["token_ids"].size(),
            chat["usage"]["completion_tokens"].get<size_t>());
  EXPECT_FALSE(Json::parse(Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}}).body)
                   ["choices"][0].contains("token_ids")) << "only when asked";
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

}  // namespace
}  // namespace thetaserve::testing
