// Requests of many answers over the OpenAI-compatible HTTP API end to end (the real binary with
// SmolLM2): n choices, echo and its prompt scores, vLLM's prompt_logprobs, and lists of prompts;
// each answer is what a request of its own gives.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/server/openai_http_e2e.h"

namespace thetaserve::testing {
namespace {

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

  // A prompt that cannot fit is named, and nothing of the call runs (no prompt token of the
  // good one is computed, no request finishes).
  const std::string metrics_before = server_->ScrapeMetrics();
  const std::string too_long(200'000, 'a');
  HttpResult bad = Post("/v1/completions", {{"prompt", {"fine", too_long}}});
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("prompt[1]: "), std::string::npos) << bad.body;
  // One that fits the context but never the KV cache (128 MiB here) is named too.
  HttpResult big = Post("/v1/completions", {{"prompt", {"fine", "fine"}}, {"max_tokens", 7000}});
  EXPECT_EQ(big.status, 400) << big.body;
  EXPECT_NE(big.body.find("prompt[0]: prompt + max_tokens = "), std::string::npos) << big.body;
  const std::string metrics_after = server_->ScrapeMetrics();
  for (const char* counter : {"thetaserve_prompt_tokens_total",
                              "thetaserve_requests_total{outcome=\"length\"}"}) {
    EXPECT_GE(MetricValue(metrics_before, counter), 0) << counter;
    EXPECT_EQ(MetricValue(metrics_after, counter), MetricValue(metrics_before, counter)) << counter;
  }
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

}  // namespace
}  // namespace thetaserve::testing
