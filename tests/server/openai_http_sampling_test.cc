// The sampling parameters over the OpenAI-compatible HTTP API on the real model: vLLM's
// extensions (bad_words, allowed_token_ids, truncate_prompt_tokens), logit_bias, log-probabilities
// in both formats, stop strings and seeds as over gRPC. (The rest of the HTTP API:
// openai_http_e2e_test.cc and its neighbours.)
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/server/openai_http_e2e.h"

namespace thetaserve::testing {
namespace {

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

TEST_F(OpenAiHttpTest, LogitBiasForcesATokenAndBadBiasesAre400) {
  ASSERT_TRUE(server_->started());
  HttpResult r = Post("/v1/completions", {{"prompt", "One, two, three,"}, {"max_tokens", 3},
                                          {"temperature", 0.8}, {"seed", 3}, {"logprobs", 1},
                                          {"logit_bias", {{"1000", 100}}},
                                          {"return_token_ids", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  const Json tokens = Json::parse(r.body)["choices"][0]["logprobs"]["tokens"];
  ASSERT_EQ(tokens.size(), 3u) << r.body;
  EXPECT_EQ(tokens[0], tokens[1]);
  EXPECT_EQ(tokens[1], tokens[2]);
  // The token the bias named, not another one repeated.
  EXPECT_EQ(Json::parse(r.body)["choices"][0]["token_ids"], Json::array({1000, 1000, 1000}))
      << r.body;
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

}  // namespace
}  // namespace thetaserve::testing
