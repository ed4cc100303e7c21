// The OpenAI-compatible API's request bodies on their own: /v1/completions and
// /v1/chat/completions bodies into GenerateRequests (every field, the prompt's shapes, chat
// messages, n and priority, and what is refused, by the field's HTTP name), /tokenize and
// /detokenize bodies, a Status's HTTP status and error body, and the API key check.
#include "server/openai_api.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/validation.h"
#include "tests/server/openai_api_test_util.h"

namespace thetaserve::server {
namespace {

using testing::Chat;
using testing::Completion;
using Json = testing::OrderedJson;
using testing::RefusedWith;
using testing::kServed;

TEST(OpenAiApiTest, CompletionFieldsMapOntoTheGenerateRequest) {
  auto call = Completion(R"({"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": "Hello",
      "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
      "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
      "seed": 42, "stop": ["\n", "END"], "stop_token_ids": [2], "ignore_eos": true,
      "include_stop_str_in_output": true,
      "logprobs": 3, "stream": true, "stream_options": {"include_usage": true},
      "cache_salt": "tenant-a", "user": "ignored", "n": 1, "echo": false, "priority": -3})");
  ASSERT_TRUE(call.ok()) << call.status();
  const v1::GenerateRequest& r = call->request;
  EXPECT_EQ(r.prompt(), "Hello");
  EXPECT_EQ(r.stopping().max_tokens(), 7u);
  EXPECT_FLOAT_EQ(r.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(r.sampling().top_p(), 0.9f);
  EXPECT_EQ(r.sampling().top_k(), 40);
  EXPECT_FLOAT_EQ(r.sampling().min_p(), 0.05f);
  EXPECT_FLOAT_EQ(r.sampling().repetition_penalty(), 1.1f);
  EXPECT_FLOAT_EQ(r.sampling().presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(r.sampling().frequency_penalty(), -0.5f);
  EXPECT_EQ(r.sampling().seed(), 42u);
  ASSERT_EQ(r.stopping().stop_size(), 2);
  EXPECT_TRUE(r.stopping().include_stop_str_in_output());
  EXPECT_EQ(r.stopping().stop(1), "END");
  ASSERT_EQ(r.stopping().stop_token_ids_size(), 1);
  EXPECT_EQ(r.stopping().stop_token_ids(0), 2u);
  EXPECT_TRUE(r.stopping().ignore_eos());
  EXPECT_EQ(r.sampling().logprobs(), 3);
  EXPECT_EQ(r.cache_salt(), "tenant-a");
  EXPECT_EQ(r.priority(), -3);
  EXPECT_TRUE(call->stream);
  EXPECT_TRUE(call->include_usage);
  EXPECT_TRUE(call->logprobs);
  EXPECT_EQ(call->top_logprobs, 3);
  EXPECT_TRUE(call->max_tokens_given);
}

TEST(OpenAiApiTest, DefaultsLeaveTheServersDefaults) {
  auto call = Completion(R"({"prompt": "Hello"})");
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_FALSE(call->request.sampling().has_temperature());
  EXPECT_FALSE(call->request.stopping().has_max_tokens());
  EXPECT_FALSE(call->request.sampling().has_seed());
  EXPECT_EQ(call->request.sampling().logprobs(), 0);
  EXPECT_FALSE(call->stream);
  EXPECT_FALSE(call->logprobs);
  EXPECT_FALSE(call->max_tokens_given);
  // null is "not given".
  auto nulls = Completion(R"({"prompt": "Hello", "max_tokens": null, "stop": null, "seed": null})");
  ASSERT_TRUE(nulls.ok()) << nulls.status();
  EXPECT_FALSE(nulls->request.stopping().has_max_tokens());
}

TEST(OpenAiApiTest, PromptTakesEveryOpenAiShapeOfOnePrompt) {
  auto ids = Completion(R"({"prompt": [1, 2, 3]})");
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->request.prompt_token_ids().ids_size(), 3);
  EXPECT_EQ(ids->request.prompt_token_ids().ids(2), 3u);
  auto one_string = Completion(R"({"prompt": ["Hello"]})");
  ASSERT_TRUE(one_string.ok());
  EXPECT_EQ(one_string->request.prompt(), "Hello");
  auto one_list = Completion(R"({"prompt": [[5, 6]]})");
  ASSERT_TRUE(one_list.ok());
  EXPECT_EQ(one_list->request.prompt_token_ids().ids_size(), 2);

  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": [1, -2]})"), "prompt[1]"));
}

// A list of several prompts (strings and token-id lists mixed, as OpenAI takes them): each
// is `request` with its own prompt; every other parameter goes with each.
TEST(OpenAiApiTest, AListOfPromptsBecomesOneRequestEach) {
  auto several = Completion(R"({"prompt": ["a b", [7, 8], "c"], "max_tokens": 3, "n": 2})");
  ASSERT_TRUE(several.ok()) << several.status();
  ASSERT_EQ(several->prompt_count(), 3u);
  EXPECT_TRUE(several->request.prompt().empty()) << "a list's prompts go in RequestFor's copies";
  EXPECT_EQ(several->RequestFor(0).prompt(), "a b");
  const v1::GenerateRequest ids = several->RequestFor(1);
  EXPECT_TRUE(ids.prompt().empty());
  ASSERT_EQ(ids.prompt_token_ids().ids_size(), 2);
  EXPECT_EQ(ids.prompt_token_ids().ids(1), 8u);
  const v1::GenerateRequest last = several->RequestFor(2);
  EXPECT_EQ(last.prompt(), "c");
  EXPECT_FALSE(last.has_prompt_token_ids());
  EXPECT_EQ(last.stopping().max_tokens(), 3u);
  EXPECT_EQ(last.n(), 2u);
  // One prompt, as before; chat has none.
  EXPECT_EQ(Completion(R"({"prompt": "x"})")->prompt_count(), 1u);
  EXPECT_EQ(Chat(R"({"messages": [{"role": "user", "content": "x"}]})")->prompt_count(), 1u);

  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": ["a", 5]})"),
                          "prompt[1] must be a string or a list of token ids"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": ["a", [1, -2]]})"), "prompt[1][1] must be"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": [[1], "b", {}]})"), "prompt[2] must be"));
  // At most 1,024 completions in one call: prompts × n.
  Json many = Json::array();
  for (int i = 0; i < 1025; ++i) many.push_back("x");
  EXPECT_TRUE(RefusedWith(Completion(Json{{"prompt", many}}.dump()), "holds 1025 prompts"));
  many.erase(many.begin() + 600, many.end());
  EXPECT_TRUE(RefusedWith(Completion(Json{{"prompt", many}, {"n", 2}}.dump()),
                          "n = 2 with 600 prompts asks for 1200 completions; at most 1024"));
  EXPECT_TRUE(Completion(Json{{"prompt", many}}.dump()).ok());
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": []})"), "prompt"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": 5})"), "prompt"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"max_tokens": 5})"), "prompt is required"));
}

TEST(OpenAiApiTest, ChatMessagesBecomeTheChatInput) {
  auto call = Chat(R"({"messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": "Hello."},
      {"role": "user", "content": "Bye", "name": "ignored"}],
    "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 2})");
  ASSERT_TRUE(call.ok()) << call.status();
  const auto& chat = call->request.chat();
  ASSERT_EQ(chat.messages_size(), 4);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(1).content(), "Hi \nthere") << "text parts joined by newlines, as vLLM";
  EXPECT_EQ(chat.messages(3).content(), "Bye");
  EXPECT_EQ(call->request.stopping().max_tokens(), 9u);
  EXPECT_TRUE(call->logprobs);
  EXPECT_EQ(call->top_logprobs, 2);
  EXPECT_EQ(call->request.sampling().logprobs(), 2);
  // The sampled token's log-probability alone still asks the engine for one.
  auto alone = Chat(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})");
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(alone->request.sampling().logprobs(), 1);
  EXPECT_EQ(alone->top_logprobs, 0);

  EXPECT_TRUE(RefusedWith(Chat(R"({"messages": []})"), "messages"));
  EXPECT_TRUE(RefusedWith(Chat(R"({"messages": [{"content": "x"}]})"), "messages[0].role"));
  // A user or system turn without content was rendered empty and generated to the context's end.
  EXPECT_TRUE(RefusedWith(Chat(R"({"messages": [{"role": "user"}]})"),
                          "messages[0].content is required"));
  EXPECT_TRUE(RefusedWith(Chat(R"({"messages": [{"role": "system", "content": null},
      {"role": "user", "content": "x"}]})"), "messages[0].content is required"));
  auto assistant = Chat(R"({"messages": [{"role": "user", "content": "x"},
      {"role": "assistant", "content": null}, {"role": "user", "content": "y"}]})");
  EXPECT_TRUE(assistant.ok()) << assistant.status() << ": an assistant turn may omit content";
  EXPECT_TRUE(RefusedWith(Chat(R"({"messages": [{"role": "function", "content": "x"}]})"),
                          "send the result as role 'tool'"));
  EXPECT_TRUE(RefusedWith(
      Chat(R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})"),
      "text only"));
  EXPECT_TRUE(RefusedWith(Chat(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})"),
                          "needs logprobs"));
  EXPECT_TRUE(RefusedWith(Chat(R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function"}]})"), "tools is not supported: tool_choice \"auto\""));
  EXPECT_TRUE(RefusedWith(Chat(R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {}}})"),
      "response_format.json_schema.schema must be given"));
  EXPECT_TRUE(RefusedWith(Chat(R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "grammar", "grammar": "root ::= x"}})"),
      "response_format is not supported"));
  // Wrong JSON types anywhere are refused, never thrown.
  for (const char* body : {
           R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": 5}})",
           R"({"messages": [{"role": "user", "content": "x"}], "response_format": []})",
           R"({"messages": [{"role": 3, "content": "x"}]})",
           R"({"messages": [{"role": "user", "content": {"a": 1}}]})",
           R"({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]})",
           R"({"messages": [{"role": "user", "content": [5]}]})",
           R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"a": 1}})",
           R"({"messages": [{"role": "user", "content": "x"}], "stream_options": 1})",
           R"({"messages": "hello"})", R"({"messages": [1]})"}) {
    absl::StatusOr<OpenAiCall> c;
    EXPECT_NO_THROW(c = Chat(body)) << body;
    EXPECT_FALSE(c.ok()) << body;
  }
  for (const char* body : {R"({"prompt": {"a": 1}})", R"({"prompt": [[1], [true]]})",
                           R"({"prompt": [true]})", R"({"prompt": "x", "n": "2"})",
                           R"({"prompt": "x", "logit_bias": 1})", R"({"prompt": "x", "echo": 1})",
                           R"({"prompt": "x", "stop_token_ids": 1})", R"({"prompt": "x", "model": 1})"}) {
    absl::StatusOr<OpenAiCall> c;
    EXPECT_NO_THROW(c = Completion(body)) << body;
    EXPECT_FALSE(c.ok()) << body;
  }
}

TEST(OpenAiApiTest, WhatTheServerCannotHonourIsRefusedByName) {
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "best_of": 3})"),
                          "best_of is not supported: = 3 with n = 1; only best_of = n"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "n": 2, "best_of": 4})"),
                          "best_of is not supported: = 4 with n = 2"));
  EXPECT_TRUE(RefusedWith(Chat(R"({"messages": [{"role": "user", "content": "x"}], "echo": true})"),
                          "echo is not supported: not on chat completions"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "max_tokens": 0})"),
                          "max_tokens = 0; it must be >= 1 (0 only with echo)"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "suffix": "y"})"), "suffix"));
  // Fields that change what is generated were taken and dropped (200 with unconstrained text);
  // each is refused by name on both routes.
  const std::pair<std::string, std::string> dropped[] = {
      {R"("response_format": {"type": "grammar"})", "response_format is not supported"},
      {R"("structured_outputs": {"structural_tag": "{}"})",
       "structured_outputs.structural_tag is not supported"},
      {R"("guided_whitespace_pattern": " ?", "response_format": {"type": "json_object"})",
       "guided_whitespace_pattern is not supported"},
      {R"("structured_outputs": {"json_object": true, "whitespace_pattern": ""})",
       "structured_outputs.whitespace_pattern is not supported"},
      {R"("structured_outputs": {"json_object": true, "disable_any_whitespace": true})",
       "structured_outputs.disable_any_whitespace is not supported"},
      {R"("use_beam_search": true)", "use_beam_search is not supported"},
      {R"("functions": [{"name": "f"}])", "functions is not supported"},
      {R"("function_call": "auto")", "function_call is not supported"},
      {R"("tools": [{"type": "function"}])", "tools is not supported"},
      {R"("tool_choice": "auto")", "tool_choice is not supported"},
  };
  for (const auto& [field, message] : dropped) {
    EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", )" + field + "}"), message)) << field;
    EXPECT_TRUE(RefusedWith(
        Chat(R"({"messages": [{"role": "user", "content": "x"}], )" + field + "}"), message))
        << field;
  }
  for (const char* field : {R"("chat_template": "{{x}}")",
                            R"("chat_template_kwargs": {"enable_thinking": false})"}) {
    EXPECT_TRUE(RefusedWith(
        Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )", field, "}")),
        "is not supported")) << field;
  }
  // Neutral values pass: tools with tool_choice "none" call none of them.
  auto neutral = Completion(R"({"prompt": "x", "suffix": "", "logit_bias": {}, "min_tokens": 0,
      "guided_json": null, "include_stop_str_in_output": false, "use_beam_search": false,
      "guided_whitespace_pattern": null,
      "structured_outputs": {"json_object": true, "disable_any_whitespace": false},
      "allowed_token_ids": [], "bad_words": [], "response_format": {"type": "text"}})");
  EXPECT_TRUE(neutral.ok()) << neutral.status();
  auto no_tools = Chat(R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none",
      "add_generation_prompt": true, "continue_final_message": false,
      "chat_template_kwargs": {}})");
  EXPECT_TRUE(no_tools.ok()) << no_tools.status();
}

// vLLM's add_generation_prompt and continue_final_message (an assistant's prefill) reach the
// chat template.
TEST(OpenAiApiTest, ChatMayContinueTheLastMessage) {
  const std::string messages =
      R"("messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}])";
  auto plain = Chat(absl::StrCat("{", messages, "}"));
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->request.chat().has_add_generation_prompt());
  EXPECT_FALSE(plain->request.chat().continue_final_message());
  auto prefill = Chat(absl::StrCat("{", messages, R"(, "continue_final_message": true,
      "add_generation_prompt": false})"));
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  EXPECT_TRUE(prefill->request.chat().continue_final_message());
  EXPECT_FALSE(prefill->request.chat().add_generation_prompt());
  EXPECT_TRUE(Chat(absl::StrCat("{", messages, R"(, "continue_final_message": true})")).ok());
  EXPECT_TRUE(RefusedWith(Chat(absl::StrCat("{", messages, R"(, "continue_final_message": true,
      "add_generation_prompt": true})")), "continue_final_message cannot be true with"));
  EXPECT_TRUE(RefusedWith(Chat(absl::StrCat("{", messages, R"(, "add_generation_prompt": 1})")),
                          "add_generation_prompt must be true or false"));
}

// vLLM's /tokenize and /detokenize bodies.
TEST(OpenAiApiTest, TokenizeAndDetokenizeBodies) {
  auto text = ParseTokenizeRequest(R"({"prompt": "Hello"})", kServed);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->text(), "Hello");
  // Unset: the Tokenize RPC's defaults, vLLM's (BOS for a prompt, none for a chat: the
  // defaults themselves are BuildRequestTest.AddSpecialTokensOnAChatAndSkipSpecialTokens's).
  EXPECT_FALSE(text->has_add_special_tokens());
  auto chat = ParseTokenizeRequest(R"({"messages": [{"role": "user", "content": "x"}],
      "add_generation_prompt": false, "model": "SmolLM2-135M-Instruct.Q4_1"})", kServed);
  ASSERT_TRUE(chat.ok()) << chat.status();
  ASSERT_EQ(chat->chat().messages_size(), 1);
  EXPECT_FALSE(chat->chat().add_generation_prompt());
  EXPECT_FALSE(chat->has_add_special_tokens());
  auto off = ParseTokenizeRequest(R"({"prompt": "x", "add_special_tokens": false})", kServed);
  ASSERT_TRUE(off.ok());
  EXPECT_TRUE(off->has_add_special_tokens());
  EXPECT_FALSE(off->add_special_tokens());
  for (const char* bad : {R"({})", R"({"prompt": "x", "messages": []})", R"({"prompt": [1]})",
                          R"({"prompt": "x", "add_special_tokens": 1})"}) {
    EXPECT_EQ(ParseTokenizeRequest(bad, kServed).status().code(),
              absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ParseTokenizeRequest(R"({"prompt": "x", "model": "gpt-4o"})", kServed).status().code(),
            absl::StatusCode::kNotFound);

  auto ids = ParseDetokenizeRequest(R"({"tokens": [1, 2, 3]})", kServed, 100);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ParseDetokenizeRequest(R"({"tokens": [1, 100]})", kServed, 100).status().message(),
            "tokens[1] = 100 is outside the vocabulary [0, 100)");
  EXPECT_EQ(ParseDetokenizeRequest(R"({"tokens": [-1]})", kServed, 100).status().message(),
            "tokens[0] must be a token id (an integer >= 0)");
  EXPECT_FALSE(ParseDetokenizeRequest(R"({"tokens": "abc"})", kServed, 100).ok());
  EXPECT_FALSE(ParseDetokenizeRequest(R"({})", kServed, 100).ok());
}

TEST(OpenAiApiTest, TypeErrorsNameTheField) {
  EXPECT_TRUE(RefusedWith(Completion("not json"), "not valid JSON"));
  // The parser's reason, without its exception tag: valid JSON syntax that it cannot hold, and
  // where the syntax breaks.
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "temperature": 1e400})"),
                          "not valid JSON: number overflow parsing '1e400'"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "\ud800"})"), "surrogate"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x",})"),
                          "not valid JSON: parse error at line 1"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": []})"), "prompt is empty"));
  EXPECT_TRUE(RefusedWith(Completion("[1]"), "JSON object"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "temperature": "hot"})"), "temperature must be a number"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "max_tokens": 2.5})"), "max_tokens must be an integer"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "max_tokens": 0})"), "max_tokens = 0"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "stream": "yes"})"), "stream must be true or false"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "stop": [1]})"), "stop[0]"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "seed": 1e30})"),
                          "seed must be an integer in [-2^63, 2^64)"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "seed": "7"})"), "seed must be"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "logprobs": 21})"), "logprobs = 21"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "top_k": -2})"), "top_k"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "stream_options": {"include_usage": true}})"),
                          "stream: true"));
  // A seed is any 64-bit integer, as vLLM's: -1 is none (random), another negative its bits.
  EXPECT_FALSE(Completion(R"({"prompt": "x", "seed": -1})")->request.sampling().has_seed());
  EXPECT_EQ(Completion(R"({"prompt": "x", "seed": -2})")->request.sampling().seed(),
            std::numeric_limits<uint64_t>::max() - 1);
  EXPECT_EQ(
      Completion(R"({"prompt": "x", "seed": 18446744073709551615})")->request.sampling().seed(),
      std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(Completion(R"({"prompt": "x", "seed": 7.0})")->request.sampling().seed(), 7u);
  EXPECT_EQ(Completion(R"({"prompt": "x", "seed": 1e16})")->request.sampling().seed(),
            10'000'000'000'000'000u);
  EXPECT_TRUE(
      RefusedWith(Completion(R"({"prompt": "x", "seed": 2.5})"), "seed must be an integer"));
  // vLLM's top_k = -1 is "off".
  auto off = Completion(R"({"prompt": "x", "top_k": -1})");
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->request.sampling().top_k(), 0);
}

TEST(OpenAiApiTest, LogitBiasMapsTokenIdKeysOntoTheRequest) {
  auto call = Chat(R"({"messages": [{"role": "user", "content": "x"}],
                       "logit_bias": {"5": 10, "49151": -100, "7": 0.5}})");
  ASSERT_TRUE(call.ok()) << call.status();
  const auto& bias = call->request.sampling().logit_bias();
  ASSERT_EQ(bias.size(), 3u);
  EXPECT_FLOAT_EQ(bias.at(5), 10.0f);
  EXPECT_FLOAT_EQ(bias.at(49151), -100.0f);
  EXPECT_FLOAT_EQ(bias.at(7), 0.5f);
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "logit_bias": {"the": 1}})"),
                          "logit_bias has the key 'the'; keys are token ids"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "logit_bias": {"-3": 1}})"),
                          "logit_bias has the key '-3'"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "logit_bias": {"5": "up"}})"),
                          "logit_bias[5] must be a number"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "logit_bias": [5]})"),
                          "logit_bias must be an object"));
}

TEST(OpenAiApiTest, MinTokensMapsOntoTheStoppingCriteria) {
  auto call = Completion(R"({"prompt": "x", "max_tokens": 9, "min_tokens": 4})");
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.stopping().min_tokens(), 4u);
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "min_tokens": -1})"),
                          "min_tokens = -1; it must be >= 0"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "min_tokens": 1.5})"),
                          "min_tokens must be an integer"));
}

TEST(OpenAiApiTest, AnotherModelNameIsNotFound) {
  auto call = Completion(R"({"model": "gpt-4o", "prompt": "x"})");
  ASSERT_FALSE(call.ok());
  EXPECT_EQ(call.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(call.status().message()).find(kServed), std::string::npos);
  EXPECT_EQ(HttpStatusFor(call.status()), 404);
}

// --served-model-name NAME,ALIAS...: a request may name any of them; an unknown name's error
// lists them all.
TEST(OpenAiApiTest, AliasesOfTheServedModelAreTaken) {
  const ServedModel served(std::vector<std::string>{"smol", "gpt-3.5-turbo"});
  EXPECT_EQ(served.name(), "smol");
  for (const char* model : {"smol", "gpt-3.5-turbo"}) {
    auto call = ParseOpenAiRequest(absl::StrCat(R"({"prompt": "x", "model": ")", model, R"("})"),
                                   OpenAiEndpoint::kCompletions, served);
    EXPECT_TRUE(call.ok()) << model << ": " << call.status();
  }
  auto other = ParseOpenAiRequest(R"({"prompt": "x", "model": "gpt-4o"})",
                                  OpenAiEndpoint::kCompletions, served);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().message(),
            "the model 'gpt-4o' does not exist; this server serves 'smol' (also "
            "'gpt-3.5-turbo')");
  EXPECT_EQ(ServedModel("one").Described(), "'one'");
  EXPECT_EQ(ServedModel(std::vector<std::string>{"a", "b", "c"}).Described(),
            "'a' (also 'b', 'c')");
}

TEST(OpenAiApiTest, ValidationMessagesUseTheHttpFieldNames) {
  EXPECT_EQ(ToOpenAiFieldNames("stopping.max_tokens = 5 with ..."), "max_tokens = 5 with ...");
  EXPECT_EQ(ToOpenAiFieldNames("sampling.top_p = 2; it must be in (0, 1]"),
            "top_p = 2; it must be in (0, 1]");
  EXPECT_EQ(ToOpenAiFieldNames("chat.messages[1].role is 'x'"), "messages[1].role is 'x'");
  EXPECT_EQ(HttpStatusFor(absl::ResourceExhaustedError("")), 429);
  EXPECT_EQ(HttpStatusFor(absl::UnavailableError("")), 503);
  EXPECT_EQ(HttpStatusFor(absl::InternalError("")), 500);
  const Json err = Json::parse(OpenAiErrorBody(429, "queue \"full\""));
  EXPECT_EQ(err["error"]["message"], "queue \"full\"");
  EXPECT_EQ(err["error"]["type"], "rate_limit_error");
  EXPECT_EQ(err["error"]["code"], 429);
  EXPECT_TRUE(err["error"]["param"].is_null());
  // param: the field the message is about, as it names it.
  const std::pair<const char*, const char*> params[] = {
      {"top_p = 2; it must be in (0, 1]", "top_p"},
      {"messages[1].role is 'x'; use system, user, assistant or tool", "messages[1].role"},
      {"prompt[1][2] = 999999 is outside the vocabulary [0, 49152)", "prompt[1][2]"},
      {"prompt[1]: the prompt has 50000 tokens", "prompt[1]"},
      {"structured_outputs.json is not supported: choice only", "structured_outputs.json"},
      {"n = 3 with 400 prompts asks for 1200 completions", "n"},
      {"the request body is not valid JSON: syntax error", ""},
      {"a message with role 'function' is not supported", ""},
      {"request id collision", ""},
      {"", ""},
  };
  for (const auto& [message, param] : params) {
    EXPECT_EQ(ErrorParam(message), param) << message;
  }
  const Json with_param = Json::parse(OpenAiErrorBody(400, "top_k = -2; it must be >= 0"));
  EXPECT_EQ(with_param["error"]["param"], "top_k");
}

TEST(OpenAiApiTest, NCompletionsAreParsedAndBounded) {
  auto three = Completion(R"({"prompt": "x", "n": 3, "best_of": 3})");
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->request.n(), 3u);
  auto one = Completion(R"({"prompt": "x"})");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->request.n(), 0u);  // unset: one
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "n": 0})"), "n = 0; it must be in [1, 128]"));
  EXPECT_TRUE(RefusedWith(Chat(R"({"messages": [{"role": "user", "content": "x"}], "n": 129})"),
                          "n = 129; it must be in [1, 128]"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "n": 2.5})"), "n must be an integer"));
  // 2^64 - 1 read as an int64 would be -1.
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "n": 18446744073709551615})"),
                          "n must be an integer below 2^63"));
}

TEST(OpenAiApiTest, PriorityIsAnInteger) {
  auto chat = Chat(R"({"messages": [{"role": "user", "content": "x"}], "priority": 2})");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->request.priority(), 2);
  auto unset = Completion(R"({"prompt": "x"})");
  ASSERT_TRUE(unset.ok());
  EXPECT_EQ(unset->request.priority(), 0);
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "priority": "high"})"),
                          "priority must be an integer"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "priority": 9223372036854775808})"),
                          "priority must be an integer below 2^63"));
  // Past 64 bits JSON's number is read as a float: still named for its range.
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "priority": 1180591620717411303424})"),
                          "priority must be an integer below 2^63"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "priority": -1180591620717411303424})"),
                          "priority must be an integer at or above -2^63"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "priority": -9223372036854775809})"),
                          "priority must be an integer at or above -2^63"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "priority": 1e17})"),
                          "priority must be an integer written in digits"));
  auto exact = Completion(R"({"prompt": "x", "priority": -3e2})");
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(exact->request.priority(), -300);
  auto digits = Completion(R"({"prompt": "x", "priority": -9223372036854775808})");
  ASSERT_TRUE(digits.ok()) << digits.status();
  EXPECT_EQ(digits->request.priority(), std::numeric_limits<int64_t>::min());
}

// vLLM's tokenization switches, on both routes: add_special_tokens (BOS before the prompt) and
// skip_special_tokens (special tokens left out of the text). They were ignored, so
// skip_special_tokens false changed nothing. Unset, the request leaves them unset: the
// server's defaults (true; add_special_tokens false on a chat) apply.
TEST(OpenAiApiTest, SpecialTokenSwitchesMapOntoTheRequest) {
  auto unset = Completion(R"({"prompt": "x"})");
  ASSERT_TRUE(unset.ok());
  EXPECT_FALSE(unset->request.has_add_special_tokens());
  EXPECT_FALSE(unset->request.has_skip_special_tokens());
  auto completion = Completion(
      R"({"prompt": "x", "add_special_tokens": false, "skip_special_tokens": false})");
  ASSERT_TRUE(completion.ok()) << completion.status();
  EXPECT_TRUE(completion->request.has_add_special_tokens());
  EXPECT_FALSE(completion->request.add_special_tokens());
  EXPECT_TRUE(completion->request.has_skip_special_tokens());
  EXPECT_FALSE(completion->request.skip_special_tokens());
  auto chat = Chat(R"({"messages": [{"role": "user", "content": "x"}],
                       "add_special_tokens": true, "skip_special_tokens": true})");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_TRUE(chat->request.add_special_tokens());
  EXPECT_TRUE(chat->request.skip_special_tokens());
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "skip_special_tokens": "no"})"),
                          "skip_special_tokens must be true or false"));
  // return_token_ids (vLLM's) is a switch too.
  EXPECT_FALSE(unset->return_token_ids);
  EXPECT_TRUE(Completion(R"({"prompt": "x", "return_token_ids": true})")->return_token_ids);
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "return_token_ids": 1})"),
                          "return_token_ids must be true or false"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "add_special_tokens": 0})"),
                          "add_special_tokens must be true or false"));
}

// The API key check (both APIs): the scheme in any case, then the key exactly.
TEST(ApiKeyTest, BearerSchemeInAnyCaseThenTheKeyExactly) {
  for (const char* ok : {"Bearer sesame", "bearer sesame", "BEARER sesame", "Bearer   sesame"}) {
    EXPECT_TRUE(BearerMatches(ok, "sesame")) << ok;
  }
  for (const char* no : {"", "Bearer", "Bearer ", "Bearersesame", "Basic sesame", "Bearer sesam",
                         "Bearer sesamE", "Bearer sesame ", "Bearer sesame2", " Bearer sesame",
                         "Bear sesame", "Bearer\tsesame"}) {
    EXPECT_FALSE(BearerMatches(no, "sesame")) << "'" << no << "'";
  }
}

}  // namespace
}  // namespace thetaserve::server
