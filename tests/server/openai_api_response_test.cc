// The OpenAI-compatible API's responses: engine output into completion objects and stream
// chunks (legacy and chat log-probabilities, their text offsets, several completions and
// prompts, echo, vLLM's prompt_logprobs, finish reasons, invalid UTF-8). The real SmolLM2
// tokenizer renders the log-probabilities' tokens.
#include "server/openai_response.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/request.h"
#include "server/openai_api.h"
#include "server/validation.h"
#include "tests/server/openai_api_test_util.h"

namespace thetaserve::server {
namespace {

using testing::Chat;
using testing::Completion;
using Json = testing::OrderedJson;
using testing::OpenAiResponseTest;
using testing::RefusedWith;
using testing::kServed;

TEST_F(OpenAiResponseTest, CompletionWithLogprobsInTheLegacyFormat) {
  auto call = Completion(R"({"prompt": "x", "logprobs": 1})");
  ASSERT_TRUE(call.ok());
  OpenAiResponseBuilder b(*call, "cmpl-1", 1700000000, kServed, model_->tokenizer());
  for (const auto& d : Deltas()) b.Add(0, d);
  const Json j = b.Complete({Finished(scheduler::FinishReason::kEos)});
  EXPECT_EQ(j["id"], "cmpl-1");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], kServed);
  const Json& c = j["choices"][0];
  EXPECT_EQ(c["text"], " Paris.");
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(c["logprobs"]["tokens"], Json({" Paris", "."}));
  EXPECT_EQ(c["logprobs"]["text_offset"], Json({0, 6}));
  EXPECT_FLOAT_EQ(c["logprobs"]["token_logprobs"][0].get<float>(), -0.25f);
  EXPECT_FLOAT_EQ(c["logprobs"]["token_logprobs"][1].get<float>(), -9999.0f);  // -inf
  // top 1 of the two the engine gave; the sampled token is among them or added (n + 1).
  EXPECT_EQ(c["logprobs"]["top_logprobs"][0].size(), 1u);
  EXPECT_FLOAT_EQ(c["logprobs"]["top_logprobs"][0][" Paris"].get<float>(), -0.25f);
  ASSERT_EQ(c["logprobs"]["top_logprobs"][1].size(), 1u);
  EXPECT_FLOAT_EQ(c["logprobs"]["top_logprobs"][1]["."].get<float>(), -9999.0f);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
  EXPECT_EQ(j["usage"]["total_tokens"], 7);
}

// text_offset counts characters, as OpenAI and vLLM do (Python slices a str): it counted UTF-8
// bytes, so text[offset:offset + len(token)] missed every token after the first non-ASCII one.
TEST_F(OpenAiResponseTest, TextOffsetsCountCharactersNotBytes) {
  const auto& tok = model_->tokenizer();
  const std::string text = " Café übër naïve, 東京.";
  const std::vector<int32_t> ids = tok.Encode(text, false, false);
  ASSERT_GT(ids.size(), 4u);
  scheduler::TokenDelta d;
  d.token_ids = ids;
  d.text = text;
  for (int32_t id : ids) {
    d.logprobs.push_back(-1.0f);
    d.top.push_back({{id, -1.0f}});
  }
  auto call = Completion(R"({"prompt": "x", "logprobs": 0})");
  ASSERT_TRUE(call.ok());
  OpenAiResponseBuilder b(*call, "cmpl-4", 1, kServed, tok);
  b.Add(0, d);
  const Json j = b.Complete({Finished(scheduler::FinishReason::kLength)});
  const Json& lp = j["choices"][0]["logprobs"];
  // The text as code points, as a Python str holds it.
  auto code_points = [](const std::string& s) {
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size();) {
      size_t n = 1;
      while (i + n < s.size() && (static_cast<unsigned char>(s[i + n]) & 0xC0) == 0x80) ++n;
      out.push_back(s.substr(i, n));
      i += n;
    }
    return out;
  };
  // Whole characters only: no byte of one split off into another token (CJK characters are
  // split over byte tokens).
  auto whole_chars = [](const std::string& s) {
    for (size_t i = 0; i < s.size();) {
      const unsigned char c = static_cast<unsigned char>(s[i]);
      const size_t n =
          c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
      if (n == 0 || i + n > s.size()) return false;
      for (size_t k = 1; k < n; ++k) {
        if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
      }
      i += n;
    }
    return true;
  };
  const std::vector<std::string> chars = code_points(text);
  ASSERT_EQ(lp["text_offset"].size(), ids.size());
  int whole = 0;
  size_t last = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string token = tok.TokenBytes(ids[i]);
    const size_t offset = lp["text_offset"][i].get<size_t>();
    EXPECT_GE(offset, last) << i;
    last = offset;
    if (!whole_chars(token)) continue;
    ++whole;
    // A token of whole characters sits at its offset in the text.
    std::string at;
    const size_t n = code_points(token).size();
    for (size_t k = offset; k < offset + n && k < chars.size(); ++k) at += chars[k];
    EXPECT_EQ(at, token) << "token " << i << " at " << offset;
  }
  EXPECT_GE(whole, 8) << "the text's Latin tokens, at least";
  EXPECT_EQ(lp["text_offset"].back().get<size_t>() +
                code_points(tok.TokenBytes(ids.back())).size(),
            chars.size()) << "the last token ends at the text's length in characters";
}

// With a stop string the engine holds back text that could begin it: a token arrives with no
// text, and its text comes with a later token's. text_offset counted the text given out, so
// every token after a held one took the held one's offset ([0, 5, 6, 6, 6, 6, 6, 26, ...] for
// " Alex, and I'm a ..."); it counts the tokens themselves, whole or streamed.
TEST_F(OpenAiResponseTest, TextOffsetsFollowTheTokensWhenTheirTextIsHeldBack) {
  auto deltas = Deltas();
  deltas[1].text = deltas[0].text + deltas[1].text;  // " Paris." with the second token
  deltas[0].text.clear();                            // " Paris" held back
  auto call = Completion(R"({"prompt": "x", "logprobs": 0, "stop": " Paris!"})");
  ASSERT_TRUE(call.ok());
  OpenAiResponseBuilder whole(*call, "cmpl-8", 1, kServed, model_->tokenizer());
  for (const auto& d : deltas) whole.Add(0, d);
  const Json c = whole.Complete({Finished(scheduler::FinishReason::kLength)})["choices"][0];
  EXPECT_EQ(c["text"], " Paris.");
  EXPECT_EQ(c["logprobs"]["text_offset"], Json({0, 6}));
  OpenAiResponseBuilder streamed(*call, "cmpl-9", 1, kServed, model_->tokenizer());
  EXPECT_EQ(streamed.DeltaChunk(0, deltas[0])["choices"][0]["logprobs"]["text_offset"], Json({0}));
  const Json second = streamed.DeltaChunk(0, deltas[1])["choices"][0];
  EXPECT_EQ(second["text"], " Paris.");
  EXPECT_EQ(second["logprobs"]["text_offset"], Json({6}));
}

TEST_F(OpenAiResponseTest, TheSampledTokenJoinsTheAlternativesWhenOutsideTheTopN) {
  auto call = Completion(R"({"prompt": "x", "logprobs": 1})");
  ASSERT_TRUE(call.ok());
  OpenAiResponseBuilder b(*call, "cmpl-2", 1, kServed, model_->tokenizer());
  auto d = Deltas()[0];
  std::swap(d.top[0][0], d.top[0][1]);  // the sampled " Paris" is now second: outside top 1
  b.Add(0, d);
  const Json top = b.Complete({Finished(scheduler::FinishReason::kLength)})["choices"][0]["logprobs"]
                       ["top_logprobs"][0];
  ASSERT_EQ(top.size(), 2u) << top.dump();
  EXPECT_TRUE(top.contains("."));
  EXPECT_FLOAT_EQ(top[" Paris"].get<float>(), -0.25f);
  // logprobs: 0 still names the sampled token.
  auto zero = Completion(R"({"prompt": "x", "logprobs": 0})");
  ASSERT_TRUE(zero.ok());
  OpenAiResponseBuilder z(*zero, "cmpl-3", 1, kServed, model_->tokenizer());
  z.Add(0, Deltas()[0]);
  const Json ztop = z.Complete({Finished(scheduler::FinishReason::kLength)})["choices"][0]
                        ["logprobs"]["top_logprobs"][0];
  EXPECT_EQ(ztop, Json({{" Paris", -0.25f}}));
}

TEST_F(OpenAiResponseTest, ChatStreamChunksInOrder) {
  auto call = Chat(R"({"messages": [{"role": "user", "content": "x"}], "stream": true,
      "logprobs": true, "top_logprobs": 2})");
  ASSERT_TRUE(call.ok());
  OpenAiResponseBuilder b(*call, "chatcmpl-1", 1700000000, kServed, model_->tokenizer());
  const Json role = b.RoleChunk(0);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  const auto deltas = Deltas();
  const Json first = b.DeltaChunk(0, deltas[0]);
  EXPECT_EQ(first["choices"][0]["delta"]["content"], " Paris");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  const Json& lp = first["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(lp["token"], " Paris");
  EXPECT_EQ(lp["bytes"], Json({32, 80, 97, 114, 105, 115}));
  ASSERT_EQ(lp["top_logprobs"].size(), 2u);
  EXPECT_EQ(lp["top_logprobs"][1]["token"], ".");
  b.DeltaChunk(0, deltas[1]);
  const Json fin = b.FinishChunk(0, Finished(scheduler::FinishReason::kLength));
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(fin["choices"][0]["delta"].empty());
  const Json usage = b.UsageChunk({Finished(scheduler::FinishReason::kLength)});
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 7);
}

TEST_F(OpenAiResponseTest, SeveralCompletionsAreIndexedAndThePromptIsCountedOnce) {
  auto call = Chat(R"({"messages": [{"role": "user", "content": "x"}], "n": 2, "logprobs": true})");
  ASSERT_TRUE(call.ok());
  OpenAiResponseBuilder b(*call, "chatcmpl-3", 1, kServed, model_->tokenizer(), 2);
  const auto deltas = Deltas();
  b.Add(1, deltas[1]);
  b.Add(0, deltas[0]);
  b.Add(1, deltas[0]);
  scheduler::FinishInfo second = Finished(scheduler::FinishReason::kLength);
  second.completion_tokens = 3;
  const Json j = b.Complete({Finished(scheduler::FinishReason::kEos), second});
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["content"], " Paris");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"].size(), 1u);
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(j["choices"][1]["message"]["content"], ". Paris");
  EXPECT_EQ(j["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][1]["logprobs"]["content"].size(), 2u);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["usage"]["total_tokens"], 10);

  // Streaming: every chunk names its completion.
  OpenAiResponseBuilder s(*call, "chatcmpl-4", 1, kServed, model_->tokenizer(), 2);
  EXPECT_EQ(s.RoleChunk(1)["choices"][0]["index"], 1);
  const Json delta = s.DeltaChunk(1, deltas[0]);
  EXPECT_EQ(delta["choices"][0]["index"], 1);
  EXPECT_EQ(delta["choices"][0]["delta"]["content"], " Paris");
  EXPECT_EQ(s.FinishChunk(1, second)["choices"][0]["index"], 1);
  EXPECT_EQ(s.UsageChunk({second, second})["usage"]["completion_tokens"], 6);
}

// Several prompts with n each: choice p * n + i is completion i of prompt p, each echoes its
// own prompt, and usage counts every prompt once.
TEST_F(OpenAiResponseTest, SeveralPromptsNumberTheirChoicesInOrder) {
  auto call = Completion(R"({"prompt": ["The capital", "Paris"], "n": 2})");
  ASSERT_TRUE(call.ok()) << call.status();
  OpenAiResponseBuilder b(*call, "cmpl-8", 1, kServed, model_->tokenizer(), 4);
  const auto deltas = Deltas();
  for (int i = 0; i < 4; ++i) b.Add(i, deltas[i % 2]);
  std::vector<scheduler::FinishInfo> infos(4, Finished(scheduler::FinishReason::kLength));
  infos[2].prompt_tokens = infos[3].prompt_tokens = 1;
  const Json j = b.Complete(infos);
  ASSERT_EQ(j["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], i % 2 ? "." : " Paris");
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5 + 1);
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  EXPECT_EQ(b.UsageChunk(infos)["usage"]["total_tokens"], 14);

  auto echo = Completion(R"({"prompt": ["The capital", "Paris"], "echo": true})");
  ASSERT_TRUE(echo.ok()) << echo.status();
  OpenAiResponseBuilder e(*echo, "cmpl-9", 1, kServed, model_->tokenizer(), 2,
                          {"The capital", "Paris"});
  EXPECT_EQ(e.DeltaChunk(1, deltas[1])["choices"][0]["text"], "Paris.");
  EXPECT_EQ(e.DeltaChunk(0, deltas[0])["choices"][0]["text"], "The capital Paris");
  OpenAiResponseBuilder w(*echo, "cmpl-10", 1, kServed, model_->tokenizer(), 2,
                          {"The capital", "Paris"});
  w.Add(0, deltas[0]);
  const Json whole = w.Complete({infos[0], infos[2]});
  EXPECT_EQ(whole["choices"][0]["text"], "The capital Paris");
  EXPECT_EQ(whole["choices"][1]["text"], "Paris") << "a choice with no tokens still echoes";
}

TEST_F(OpenAiResponseTest, EchoReturnsThePromptAndItsScoresFirst) {
  // The mapping: echo with logprobs scores the prompt; so does echo of the prompt alone.
  auto scored = Completion(R"({"prompt": "x", "echo": true, "logprobs": 2, "max_tokens": 0})");
  ASSERT_TRUE(scored.ok()) << scored.status();
  EXPECT_TRUE(scored->echo);
  EXPECT_EQ(scored->request.sampling().prompt_logprobs(), 2u);
  EXPECT_EQ(scored->request.stopping().max_tokens(), 0u);
  auto alone = Completion(R"({"prompt": "x", "echo": true, "max_tokens": 0})");
  ASSERT_TRUE(alone.ok());
  EXPECT_TRUE(alone->request.sampling().has_prompt_logprobs());
  auto text_only = Completion(R"({"prompt": "x", "echo": true, "max_tokens": 3})");
  ASSERT_TRUE(text_only.ok());
  EXPECT_FALSE(text_only->request.sampling().has_prompt_logprobs());
  auto built = BuildRequest(scored->request, *model_);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->prompt_logprobs, 2);
  EXPECT_EQ(built->stopping.max_tokens, 0);
  v1::GenerateRequest zero;
  zero.set_prompt("x");
  zero.mutable_stopping()->set_max_tokens(0);
  auto refused = BuildRequest(zero, *model_);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "stopping.max_tokens must be >= 1 (0 only with sampling.prompt_logprobs)");

  // The response: the prompt's text, then the completion's; the prompt's tokens lead the
  // log-probabilities, the first with nulls, the offsets running over both.
  const std::vector<int32_t> prompt = model_->tokenizer().Encode("The capital", false);
  ASSERT_EQ(prompt.size(), 2u);
  auto deltas = Deltas();
  deltas[0].prompt = std::make_shared<const scheduler::PromptScores>(scheduler::PromptScores{
      .token_ids = prompt,
      .logprobs = {-4.5f},
      .top = {{{prompt[1], -4.5f}, {deltas[0].token_ids[0], -5.0f}}},
      .ranks = {}});
  auto call = Completion(R"({"prompt": "The capital", "echo": true, "logprobs": 1})");
  ASSERT_TRUE(call.ok());
  OpenAiResponseBuilder b(*call, "cmpl-5", 1, kServed, model_->tokenizer(), 1, {"The capital"});
  for (const auto& d : deltas) b.Add(0, d);
  const Json c = b.Complete({Finished(scheduler::FinishReason::kLength)})["choices"][0];
  EXPECT_EQ(c["text"], "The capital Paris.");
  EXPECT_EQ(c["logprobs"]["tokens"], Json({"The", " capital", " Paris", "."}));
  EXPECT_EQ(c["logprobs"]["text_offset"], Json({0, 3, 11, 17}));
  EXPECT_TRUE(c["logprobs"]["token_logprobs"][0].is_null());
  EXPECT_TRUE(c["logprobs"]["top_logprobs"][0].is_null());
  EXPECT_FLOAT_EQ(c["logprobs"]["token_logprobs"][1].get<float>(), -4.5f);
  EXPECT_EQ(c["logprobs"]["top_logprobs"][1].size(), 1u);
  EXPECT_FLOAT_EQ(c["logprobs"]["token_logprobs"][2].get<float>(), -0.25f);

  // Streamed: the first chunk carries the prompt and its scores with the first token.
  OpenAiResponseBuilder s(*call, "cmpl-6", 1, kServed, model_->tokenizer(), 1, {"The capital"});
  const Json first = s.DeltaChunk(0, deltas[0]);
  EXPECT_EQ(first["choices"][0]["text"], "The capital Paris");
  EXPECT_EQ(first["choices"][0]["logprobs"]["tokens"], Json({"The", " capital", " Paris"}));
  EXPECT_TRUE(OpenAiResponseBuilder::Carries(first));
  const Json second = s.DeltaChunk(0, deltas[1]);
  EXPECT_EQ(second["choices"][0]["text"], ".");
  EXPECT_EQ(second["choices"][0]["logprobs"]["text_offset"], Json({17}));
  // Without echo nothing of the prompt comes back, even when the delta has its scores.
  auto plain = Completion(R"({"prompt": "The capital", "logprobs": 1})");
  ASSERT_TRUE(plain.ok());
  OpenAiResponseBuilder p(*plain, "cmpl-7", 1, kServed, model_->tokenizer());
  EXPECT_EQ(p.DeltaChunk(0, deltas[0])["choices"][0]["text"], " Paris");
}

// vLLM's prompt_logprobs: asked for (not with a stream, where only 0 is taken, and returns
// nothing, as vLLM's), one scoring serving echo too; in the response each prompt token but the
// first has its own entry (with its rank) and the k most likely, keyed by token id, on each
// completion's choice, and once beside a chat's choices.
TEST_F(OpenAiResponseTest, PromptLogprobsAsVllmGivesThem) {
  auto three = Completion(R"({"prompt": "x", "prompt_logprobs": 3})");
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->prompt_logprobs, 3);
  EXPECT_EQ(three->request.sampling().prompt_logprobs(), 3u);
  auto with_echo = Completion(R"({"prompt": "x", "prompt_logprobs": 1, "echo": true,
      "logprobs": 4})");
  ASSERT_TRUE(with_echo.ok()) << with_echo.status();
  EXPECT_EQ(with_echo->request.sampling().prompt_logprobs(), 4u);
  auto chat = Chat(R"({"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 0})");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->prompt_logprobs, 0);
  EXPECT_TRUE(chat->request.sampling().has_prompt_logprobs());
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "prompt_logprobs": 1, "stream": true})"),
                          "prompt_logprobs is not available with stream: true"));
  auto streamed_zero = Completion(R"({"prompt": "x", "prompt_logprobs": 0, "stream": true})");
  ASSERT_TRUE(streamed_zero.ok()) << streamed_zero.status();
  EXPECT_EQ(streamed_zero->prompt_logprobs, -1);
  EXPECT_FALSE(streamed_zero->request.sampling().has_prompt_logprobs());
  for (const char* k : {"-1", "21", "1.5", "true"}) {
    EXPECT_TRUE(RefusedWith(Completion(absl::StrCat(R"({"prompt": "x", "prompt_logprobs": )", k,
                                                    "}")),
                            "prompt_logprobs")) << k;
  }

  const std::vector<int32_t> prompt = model_->tokenizer().Encode("The capital of", false);
  ASSERT_EQ(prompt.size(), 3u);
  auto deltas = Deltas();
  deltas[0].prompt = std::make_shared<const scheduler::PromptScores>(scheduler::PromptScores{
      .token_ids = prompt,
      .logprobs = {-4.5f, -0.5f},
      .top = {{{7, -1.0f}, {prompt[1], -4.5f}, {9, -5.0f}},
              {{prompt[2], -0.5f}, {11, -2.0f}, {12, -3.0f}}},
      .ranks = {2, 1}});
  auto two = Completion(R"({"prompt": "The capital of", "prompt_logprobs": 2})");
  ASSERT_TRUE(two.ok());
  OpenAiResponseBuilder b(*two, "cmpl-8", 1, kServed, model_->tokenizer(), 2);
  for (int i = 0; i < 2; ++i) {
    for (const auto& d : deltas) b.Add(i, d);
  }
  const auto& tok = model_->tokenizer();
  auto entry = [&](int32_t id, float logprob, int rank) {
    return Json{{"logprob", logprob}, {"rank", rank}, {"decoded_token", tok.TokenBytes(id)}};
  };
  Json want = Json::array({nullptr});
  want.push_back({{std::to_string(prompt[1]), entry(prompt[1], -4.5f, 2)},
                  {"7", entry(7, -1.0f, 1)}});
  want.push_back({{std::to_string(prompt[2]), entry(prompt[2], -0.5f, 1)},
                  {"11", entry(11, -2.0f, 2)}});
  const Json done = b.Complete({Finished(scheduler::FinishReason::kLength),
                                Finished(scheduler::FinishReason::kLength)});
  EXPECT_EQ(done["choices"][0]["prompt_logprobs"], want);
  EXPECT_EQ(done["choices"][1]["prompt_logprobs"], want);
  EXPECT_EQ(done["choices"][0]["text"], " Paris.");
  EXPECT_FALSE(done.contains("prompt_logprobs"));

  ASSERT_TRUE(chat.ok());
  OpenAiResponseBuilder c(*chat, "chatcmpl-9", 1, kServed, tok);
  for (const auto& d : deltas) c.Add(0, d);
  const Json chat_done = c.Complete({Finished(scheduler::FinishReason::kLength)});
  ASSERT_EQ(chat_done["prompt_logprobs"].size(), 3u);
  EXPECT_EQ(chat_done["prompt_logprobs"][2],
            Json({{std::to_string(prompt[2]), entry(prompt[2], -0.5f, 1)}}));
  EXPECT_FALSE(chat_done["choices"][0].contains("prompt_logprobs"));
  // Not asked: no field.
  auto plain = Completion(R"({"prompt": "The capital of"})");
  OpenAiResponseBuilder p(*plain, "cmpl-10", 1, kServed, tok);
  for (const auto& d : deltas) p.Add(0, d);
  EXPECT_FALSE(p.Complete({Finished(scheduler::FinishReason::kLength)})["choices"][0]
                   .contains("prompt_logprobs"));
}

TEST_F(OpenAiResponseTest, FinishReasonsFollowVllm) {
  EXPECT_STREQ(OpenAiFinishReason(scheduler::FinishReason::kStop), "stop");
  EXPECT_STREQ(OpenAiFinishReason(scheduler::FinishReason::kEos), "stop");
  EXPECT_STREQ(OpenAiFinishReason(scheduler::FinishReason::kLength), "length");
  EXPECT_STREQ(OpenAiFinishReason(scheduler::FinishReason::kCancelled), "abort");
  auto call = Chat(R"({"messages": [{"role": "user", "content": "x"}]})");
  ASSERT_TRUE(call.ok());
  OpenAiResponseBuilder b(*call, "chatcmpl-2", 1, kServed, model_->tokenizer());
  const Json j = b.Complete({Finished(scheduler::FinishReason::kStop)});
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
}

TEST_F(OpenAiResponseTest, InvalidUtf8InATokenBecomesAReplacementCharacter) {
  // A byte-level token that is half of a UTF-8 character.
  const auto& tok = model_->tokenizer();
  int32_t half = -1;
  for (int32_t id = 0; id < tok.vocab_size() && half < 0; ++id) {
    const std::string bytes = tok.TokenBytes(id);
    if (bytes.size() == 1 && static_cast<unsigned char>(bytes[0]) >= 0xC2 &&
        static_cast<unsigned char>(bytes[0]) < 0xF0) {
      half = id;
    }
  }
  ASSERT_GE(half, 0);
  Json j = {{"token", tok.TokenBytes(half)}};
  const std::string dumped = DumpJson(j);
  EXPECT_NE(dumped.find("\xEF\xBF\xBD"), std::string::npos) << dumped;
  EXPECT_NO_THROW(Json::parse(dumped));
}

}  // namespace
}  // namespace thetaserve::server
