// The OpenAI-compatible API's JSON on its own: request bodies into GenerateRequests (and
// through BuildRequest, as the server does), engine output into completion objects and chunks.
// The real SmolLM2 tokenizer renders the log-probabilities' tokens.
#include "server/openai_api.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "scheduler/guided_json.h"
#include "scheduler/guided_regex.h"
#include "scheduler/guided_schema.h"
#include "server/openai_response.h"
#include "server/validation.h"
#include "tests/test_util.h"

namespace thetaserve::server {
namespace {

using Json = nlohmann::ordered_json;
constexpr char kServed[] = "SmolLM2-135M-Instruct.Q4_1";

absl::StatusOr<OpenAiCall> Completion(const std::string& body) {
  return ParseOpenAiRequest(body, OpenAiEndpoint::kCompletions, kServed);
}
absl::StatusOr<OpenAiCall> Chat(const std::string& body) {
  return ParseOpenAiRequest(body, OpenAiEndpoint::kChatCompletions, kServed);
}

// The status is INVALID_ARGUMENT and its message contains `words`.
::testing::AssertionResult RefusedWith(const absl::StatusOr<OpenAiCall>& call,
                                       const std::string& words) {
  if (call.ok()) return ::testing::AssertionFailure() << "accepted";
  if (call.status().code() != absl::StatusCode::kInvalidArgument) {
    return ::testing::AssertionFailure() << call.status();
  }
  if (std::string(call.status().message()).find(words) == std::string::npos) {
    return ::testing::AssertionFailure() << "message '" << call.status().message()
                                         << "' lacks '" << words << "'";
  }
  return ::testing::AssertionSuccess();
}

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
      {R"("guided_grammar": "root ::= x")", "guided_grammar is not supported"},
      {R"("structured_outputs": {"structural_tag": "{}"})",
       "structured_outputs.structural_tag is not supported"},
      {R"("structured_outputs": {"grammar": "root ::= x", "choice": ["a"]})",
       "structured_outputs.grammar is not supported"},
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
  EXPECT_TRUE(text->add_special_tokens()) << "a prompt gets BOS by default, as in vLLM";
  auto chat = ParseTokenizeRequest(R"({"messages": [{"role": "user", "content": "x"}],
      "add_generation_prompt": false, "model": "SmolLM2-135M-Instruct.Q4_1"})", kServed);
  ASSERT_TRUE(chat.ok()) << chat.status();
  ASSERT_EQ(chat->chat().messages_size(), 1);
  EXPECT_FALSE(chat->chat().add_generation_prompt());
  EXPECT_FALSE(chat->add_special_tokens()) << "the template writes a chat's special tokens";
  EXPECT_FALSE(ParseTokenizeRequest(R"({"prompt": "x", "add_special_tokens": false})", kServed)
                   ->add_special_tokens());
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

class OpenAiResponseTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = model::Model::Load(testing::DefaultModelPath());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  // Two deltas: " Paris" (with its top two) and "." — ids from the real tokenizer.
  static std::vector<scheduler::TokenDelta> Deltas() {
    const auto& tok = model_->tokenizer();
    const int32_t paris = tok.Encode(" Paris", false, false).at(0);
    const int32_t dot = tok.Encode(".", false, false).at(0);
    scheduler::TokenDelta a, b;
    a.token_ids = {paris};
    a.text = std::string(" Paris");  // (assigning a literal sets off GCC 12's false -Wrestrict)
    a.logprobs = {-0.25f};
    a.top = {{{paris, -0.25f}, {dot, -2.0f}}};
    b.token_ids = {dot};
    b.text = std::string(".");
    b.logprobs = {-std::numeric_limits<float>::infinity()};
    b.top = {{{dot, -std::numeric_limits<float>::infinity()}, {paris, -3.0f}}};
    return {a, b};
  }
  static scheduler::FinishInfo Finished(scheduler::FinishReason reason) {
    scheduler::FinishInfo f;
    f.reason = reason;
    f.prompt_tokens = 5;
    f.completion_tokens = 2;
    return f;
  }
  static model::Model* model_;
};
model::Model* OpenAiResponseTest::model_ = nullptr;

// vLLM's allowed_token_ids, bad_words and truncate_prompt_tokens reach the engine's request:
// the allowed ids sorted once each, each bad word tokenized alone and after a space (where
// that is another token), the prompt's last k tokens; what is wrong is named.
TEST_F(OpenAiResponseTest, VllmsSamplingExtensionsReachTheEngineRequest) {
  auto build = [&](const std::string& body) -> absl::StatusOr<scheduler::Request> {
    auto call = Completion(body);
    if (!call.ok()) return call.status();
    auto built = BuildRequest(call->request, *model_);
    if (!built.ok()) {
      return absl::Status(built.status().code(),
                          ToOpenAiFieldNames(std::string(built.status().message())));
    }
    return built;
  };
  auto allowed = build(R"({"prompt": "x", "allowed_token_ids": [7, 3, 7]})");
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  ASSERT_NE(allowed->sampling.allowed_tokens, nullptr);
  EXPECT_EQ(*allowed->sampling.allowed_tokens, std::vector<int32_t>({3, 7}));
  EXPECT_EQ(build(R"({"prompt": "x", "allowed_token_ids": [1, 49152]})").status().message(),
            "allowed_token_ids[1] = 49152 is outside the vocabulary [0, 49152)");
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "allowed_token_ids": 5})"),
                          "allowed_token_ids must be a list of token ids"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "allowed_token_ids": [-1]})"),
                          "allowed_token_ids[0] must be a token id"));

  // guided_choice, or structured_outputs.choice (vLLM's newer name), not both.
  for (const char* body : {R"({"prompt": "x", "guided_choice": ["yes", "no"]})",
                           R"({"prompt": "x", "structured_outputs": {"choice": ["yes", "no"],
                               "disable_fallback": true}})"}) {
    auto guided = build(body);
    ASSERT_TRUE(guided.ok()) << guided.status();
    auto* choice = dynamic_cast<const scheduler::ChoiceGuide*>(guided->guide.get());
    ASSERT_NE(choice, nullptr) << body;
    EXPECT_EQ(choice->choices(), std::vector<std::string>({"no", "yes"})) << body;
  }
  // guided_regex, or structured_outputs.regex.
  for (const char* body : {R"({"prompt": "x", "guided_regex": "(yes|no)!"})",
                           R"({"prompt": "x", "structured_outputs": {"regex": "(yes|no)!"}})"}) {
    auto guided = build(body);
    ASSERT_TRUE(guided.ok()) << guided.status();
    auto* regex = dynamic_cast<const scheduler::RegexGuide*>(guided->guide.get());
    ASSERT_NE(regex, nullptr) << body;
    EXPECT_EQ(regex->pattern(), "(yes|no)!") << body;
    EXPECT_TRUE(regex->Complete("no!")) << body;
  }
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "guided_regex": "a",
      "structured_outputs": {"regex": "b"}})"), "are both given; send one"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "guided_regex": ["a"]})"),
                          "guided_regex must be a string"));
  // One JSON object: response_format json_object, or structured_outputs.json_object.
  for (const char* body : {R"({"prompt": "x", "response_format": {"type": "json_object"}})",
                           R"({"prompt": "x", "structured_outputs": {"json_object": true}})"}) {
    auto guided = build(body);
    ASSERT_TRUE(guided.ok()) << guided.status();
    auto* json = dynamic_cast<const scheduler::JsonObjectGuide*>(guided->guide.get());
    ASSERT_NE(json, nullptr) << body;
    EXPECT_TRUE(json->Complete(R"({"a": [1]})")) << body;
  }
  auto unguided = build(R"({"prompt": "x", "structured_outputs": {"json_object": false}})");
  ASSERT_TRUE(unguided.ok()) << unguided.status();
  EXPECT_EQ(unguided->guide, nullptr);
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "response_format": {"type": "json_object"},
      "structured_outputs": {"regex": "a"}})"),
      "response_format and structured_outputs.regex are both given; send one"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "guided_choice": ["a"],
      "structured_outputs": {"json_object": true}})"),
      "structured_outputs.json_object and guided_choice are both given; send one"));
  EXPECT_TRUE(
      RefusedWith(Completion(R"({"prompt": "x", "structured_outputs": {"json_object": 1}})"),
                  "structured_outputs.json_object must be true or false"));
  // A JSON schema by any of its three names (or as a string holding it), its properties in the
  // order they were sent (the parsed body sorts keys; the schema is taken from its text).
  const std::string schema =
      R"({"type": "object", "properties": {"zeta": {"type": "integer"},
          "alpha": {"enum": ["a", "b"]}}, "required": ["zeta", "alpha"]})";
  Json as_string = {{"prompt", "x"}, {"guided_json", schema}};
  for (const std::string& body :
       {absl::StrCat(R"({"prompt": "x", "guided_json": )", schema, "}"),
        absl::StrCat(R"({"prompt": "x", "structured_outputs": {"json": )", schema, "}}"),
        absl::StrCat(R"({"prompt": "x", "response_format": {"type": "json_schema",
            "json_schema": {"name": "pair", "strict": true, "schema": )", schema, "}}}"),
        as_string.dump()}) {
    auto call = Completion(body);
    ASSERT_TRUE(call.ok()) << call.status() << body;
    auto guided = build(body);
    ASSERT_TRUE(guided.ok()) << guided.status();
    auto* regex = dynamic_cast<const scheduler::RegexGuide*>(guided->guide.get());
    ASSERT_NE(regex, nullptr) << body;
    EXPECT_TRUE(regex->Complete(R"({"zeta": 3, "alpha": "b"})")) << body;
    EXPECT_FALSE(regex->Accepts(R"({"alpha": "b", "zeta": 3})")) << body;
  }
  EXPECT_EQ(Completion(absl::StrCat(R"({"prompt": "x", "response_format": {"type": "json_schema",
      "json_schema": {"schema": )", schema, "}}}"))->schema_field,
            "response_format.json_schema.schema");
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "guided_json": {"type": "string"},
      "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "null"}}}})"),
      "response_format and guided_json are both given; send one"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "guided_json": {"type": "string"},
      "structured_outputs": {"json": {"type": "null"}}})"), "are both given; send one"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "response_format": {"type": "json_object"},
      "structured_outputs": {"json": {"type": "null"}}})"),
      "structured_outputs.json and response_format are both given; send one"));
  EXPECT_TRUE(RefusedWith(
      Completion(R"({"prompt": "x", "guided_json": 3})"),
      "guided_json must be a JSON schema (an object, or a string holding one)"));
  EXPECT_TRUE(
      RefusedWith(Completion(R"({"prompt": "x", "response_format": {"type": "json_schema"}})"),
                  "response_format.json_schema must be an object with the schema"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "response_format": {"type": "json_schema",
      "json_schema": {"name": "x"}}})"),
      "response_format.json_schema.schema must be given, a JSON schema (an object)"));
  auto json_false = build(R"({"prompt": "x", "structured_outputs": {"json": false}})");
  ASSERT_TRUE(json_false.ok()) << json_false.status();
  EXPECT_EQ(json_false->guide, nullptr);
  EXPECT_EQ(build(R"({"prompt": "x", "guided_json": {"type": "object", "minProperties": 1}})")
                .status()
                .message(),
            "guided_json: #: keyword minProperties is not supported");
  EXPECT_EQ(build(R"({"prompt": "x", "structured_outputs": {"regex": "a+", "choice": ["a"]}})")
                .status()
                .message(),
            "guided_choice and guided_regex are both given; send one");
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "guided_choice": ["a"],
      "structured_outputs": {"choice": ["b"]}})"), "are both given; send one"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "guided_choice": []})"),
                          "guided_choice must be a non-empty list of strings"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "structured_outputs": {"choice": [1]}})"),
                          "structured_outputs.choice[0] must be a string"));
  EXPECT_EQ(build(R"({"prompt": "x", "guided_choice": ["a", ""]})").status().message(),
            "guided_choice[1] has 0 bytes; it must have 1 to 1024");
  Json many_choices = {{"prompt", "x"}, {"guided_choice", std::vector<std::string>(1025, "a")}};
  EXPECT_EQ(build(many_choices.dump()).status().message(),
            "guided_choice has 1025 choices; at most 1024 are allowed");

  const model::Tokenizer& tok = model_->tokenizer();
  auto words = build(R"({"prompt": "x", "bad_words": ["Paris", "  New York"]})");
  ASSERT_TRUE(words.ok()) << words.status();
  std::vector<std::vector<int32_t>> expected = {tok.Encode("Paris", false)};
  const std::vector<int32_t> spaced = tok.Encode(" Paris", false);
  ASSERT_EQ(spaced.size(), 1u);  // " Paris" is one token of its own
  ASSERT_NE(spaced, expected[0]);
  expected.push_back(spaced);
  const std::vector<int32_t> ny = tok.Encode("New York", false);
  const std::vector<int32_t> spaced_ny = tok.Encode(" New York", false);
  ASSERT_EQ(ny.size(), 2u);  // the tokenizer's facts the rule is tested on
  ASSERT_EQ(spaced_ny.size(), 2u);
  ASSERT_NE(ny[0], spaced_ny[0]);
  expected.push_back(ny);
  expected.push_back(spaced_ny);
  ASSERT_NE(words->sampling.bad_words, nullptr);
  EXPECT_EQ(*words->sampling.bad_words, expected);
  // After a space the digits take one token more: that spelling is not added (vLLM's rule).
  ASSERT_NE(tok.Encode(" 123", false).size(), tok.Encode("123", false).size());
  auto digits = build(R"({"prompt": "x", "bad_words": ["123"]})");
  ASSERT_TRUE(digits.ok()) << digits.status();
  EXPECT_EQ(*digits->sampling.bad_words,
            std::vector<std::vector<int32_t>>({tok.Encode("123", false)}));
  std::string long_word;
  for (int i = 0; i < 128; ++i) long_word += "x ";
  Json heavy_words = {{"prompt", "x"}, {"bad_words", std::vector<std::string>(40, long_word)}};
  EXPECT_EQ(std::string(build(heavy_words.dump()).status().message()).rfind(
                "bad_words come to more than 4096 tokens", 0),
            0u) << build(heavy_words.dump()).status();
  EXPECT_EQ(build(R"({"prompt": "x", "bad_words": ["ok", "  "]})").status().message(),
            "bad_words[1] is empty (or only spaces); remove it");
  // Leading spaces are stripped as Python's lstrip strips them, Unicode ones (U+3000) too.
  auto ideographic = build(R"({"prompt": "x", "bad_words": ["　  Paris"]})");
  ASSERT_TRUE(ideographic.ok()) << ideographic.status();
  EXPECT_EQ(ideographic->sampling.bad_words->front(), tok.Encode("Paris", false));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "bad_words": ["a", 5]})"),
                          "bad_words[1] must be a string"));
  Json many = {{"prompt", "x"}, {"bad_words", std::vector<std::string>(1025, "a")}};
  EXPECT_EQ(build(many.dump()).status().message(),
            "bad_words has 1025 words; at most 1024 are allowed");

  const std::string text = "one two three four five six seven";
  const std::vector<int32_t> whole = tok.Encode(text);
  ASSERT_GT(whole.size(), 4u);
  auto cut = build(Json{{"prompt", text}, {"truncate_prompt_tokens", 3}}.dump());
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->prompt, std::vector<int32_t>(whole.end() - 3, whole.end()));
  for (int k : {-1, 1000}) {
    auto kept = build(Json{{"prompt", text}, {"truncate_prompt_tokens", k}}.dump());
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_EQ(kept->prompt, whole) << k;
  }
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "truncate_prompt_tokens": 0})"),
                          "truncate_prompt_tokens = 0; it must be >= 1"));
  v1::GenerateRequest grpc_zero;
  grpc_zero.set_prompt(text);
  grpc_zero.set_truncate_prompt_tokens(0);
  EXPECT_EQ(BuildRequest(grpc_zero, *model_).status().code(),
            absl::StatusCode::kInvalidArgument);

  // A tokenizer that puts BOS in front of text keeps it, and the last k - 1 tokens after it
  // (vLLM's left truncation); token ids are cut as they are.
  auto tiny = model::Model::Load(testing::TestDataPath("tiny_llama"));
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  const model::Tokenizer& llama = (*tiny)->tokenizer();
  ASSERT_TRUE(llama.add_bos());
  const std::vector<int32_t> with_bos = llama.Encode(text);
  ASSERT_EQ(with_bos.front(), llama.bos_id());
  ASSERT_GT(with_bos.size(), 4u);
  v1::GenerateRequest cut_text;
  cut_text.set_prompt(text);
  cut_text.set_truncate_prompt_tokens(3);
  auto kept_bos = BuildRequest(cut_text, **tiny);
  ASSERT_TRUE(kept_bos.ok()) << kept_bos.status();
  EXPECT_EQ(kept_bos->prompt, std::vector<int32_t>({with_bos[0], with_bos[with_bos.size() - 2],
                                                    with_bos.back()}));
  v1::GenerateRequest cut_ids;
  cut_ids.mutable_prompt_token_ids()->mutable_ids()->Add(with_bos.begin(), with_bos.end());
  cut_ids.set_truncate_prompt_tokens(3);
  auto sliced = BuildRequest(cut_ids, **tiny);
  ASSERT_TRUE(sliced.ok()) << sliced.status();
  EXPECT_EQ(sliced->prompt, std::vector<int32_t>(with_bos.end() - 3, with_bos.end()));
}

// The range and the vocabulary are checked where gRPC's are (BuildRequest), with the HTTP name.
TEST_F(OpenAiResponseTest, LogitBiasOutsideItsRangeOrTheVocabularyIsRefused) {
  auto build = [&](const std::string& body) {
    auto call = Completion(body);
    EXPECT_TRUE(call.ok()) << call.status();
    return BuildRequest(call->request, *model_);
  };
  auto ok = build(R"({"prompt": "x", "logit_bias": {"5": -100, "6": 100}})");
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->sampling.logit_bias.size(), 2u);
  auto far = build(R"({"prompt": "x", "logit_bias": {"5": 150}})");
  ASSERT_FALSE(far.ok());
  EXPECT_EQ(far.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ToOpenAiFieldNames(std::string(far.status().message())),
            "logit_bias[5] = 150; it must be in [-100, 100]");
  auto more = build(R"({"prompt": "x", "max_tokens": 8, "min_tokens": 9})");
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(ToOpenAiFieldNames(std::string(more.status().message())),
            "min_tokens = 9 exceeds max_tokens = 8");
  auto outside = build(R"({"prompt": "x", "logit_bias": {"49152": 1}})");
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(ToOpenAiFieldNames(std::string(outside.status().message())),
            "logit_bias has token id 49152, outside the vocabulary [0, 49152)");
}

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

// Chat's tools: a function named in tool_choice, or "required" (one call or more), guides
// the output to the call's JSON, whose errors name the tool; earlier calls and results in the
// history reach the template as text.
TEST(OpenAiApiTest, ToolChoiceGuidesTheCall) {
  const std::string tools = R"("tools": [
      {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
          "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}},
      {"type": "function", "function": {"name": "get_weather", "description": "The weather",
          "parameters": {"type": "object", "properties": {"unit": {"enum": ["c", "f"]},
          "city": {"type": "string"}}, "required": ["unit", "city"]}}}])";
  auto chat = [&](const std::string& rest) {
    return Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )", tools,
                             rest, "}"));
  };
  auto named =
      chat(R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->tool_calls, OpenAiCall::ToolCalls::kNamed);
  EXPECT_EQ(named->tool_name, "get_weather");
  EXPECT_EQ(named->schema_field, "tools[1].function.parameters");
  // The parameters as sent: "unit" before "city".
  EXPECT_EQ(named->request.sampling().guided_json(),
            R"({"type": "object", "properties": {"unit": {"enum": ["c", "f"]},
          "city": {"type": "string"}}, "required": ["unit", "city"]})");
  auto required = chat(R"(, "tool_choice": "required", "parallel_tool_calls": false)");
  ASSERT_TRUE(required.ok()) << required.status();
  EXPECT_EQ(required->tool_calls, OpenAiCall::ToolCalls::kRequired);
  auto guide = scheduler::CompileJsonSchema(required->request.sampling().guided_json());
  ASSERT_TRUE(guide.ok()) << guide.status();
  EXPECT_TRUE((*guide)->Accepts(R"([{"name": "get_time", "parameters": {"zone": "UTC"}}])"));
  EXPECT_FALSE((*guide)->Accepts(R"([{"name": "get_time", "parameters": {"unit": "c"}}])"));
  EXPECT_FALSE((*guide)->Accepts(R"([{"name": "get_time", "parameters": {"zone": "UTC"}},
      {"name": "get_time", "parameters": {"zone": "UTC"}}])"));  // one: not parallel
  EXPECT_FALSE((*guide)->Accepts("[]"));
  const std::pair<std::string, std::string> refused[] = {
      {R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}})",
       "tool_choice.function.name 'nope' is not in tools"},
      {R"(, "tool_choice": "auto")", "tools is not supported: tool_choice \"auto\""},
      {"", "tools is not supported: tool_choice \"auto\" (the default with tools)"},
      {R"(, "tool_choice": "required", "stream": true)",
       "tool_choice is not supported: \"required\" is not streamed"},
      {R"(, "tool_choice": "required", "guided_regex": "a")",
       "tool_choice and guided_regex are both given; send one"},
      {R"(, "tool_choice": {"type": "function"})", "tool_choice must be \"none\", \"required\""},
  };
  for (const auto& [rest, message] : refused) {
    EXPECT_TRUE(RefusedWith(chat(rest), message)) << rest;
  }
  auto with_tools = [](const std::string& tools_json) {
    return Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], "tools": )",
                             tools_json, R"(, "tool_choice": "required"})"));
  };
  EXPECT_TRUE(RefusedWith(with_tools(R"([{"type": "function", "function": {"name": "a b"}}])"),
                          "tools[0].function.name must be 1 to 64 letters, digits, _ or -"));
  EXPECT_TRUE(RefusedWith(with_tools(R"([{"type": "function", "function": {"name": "a"}},
      {"type": "function", "function": {"name": "a"}}])"), "tools[1].function.name repeats 'a'"));
  EXPECT_TRUE(RefusedWith(with_tools(R"([{"type": "function", "function": {"name": "a",
      "parameters": {"type": "object", "properties": {"n": {"type": "number", "maximum": 1}}}}}])"),
      "tools[0].function.parameters: #/properties/n/maximum: bounds on a number"));
  EXPECT_TRUE(RefusedWith(with_tools("[]"), "tools must be a non-empty list of functions"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "tool_choice": "required"})"),
                          "tool_choice is not supported: chat completions only"));
  // A function without parameters takes none: {} only.
  auto bare = with_tools(R"([{"type": "function", "function": {"name": "ping"}}])");
  ASSERT_TRUE(bare.ok()) << bare.status();
  auto bare_guide = scheduler::CompileJsonSchema(bare->request.sampling().guided_json());
  ASSERT_TRUE(bare_guide.ok());
  EXPECT_TRUE((*bare_guide)->Accepts(R"([{"name": "ping", "parameters": {}}])"));

  // History: an assistant's calls (content null) and a tool's result.
  auto history = Chat(R"({"messages": [{"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]})");
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->request.chat().messages_size(), 3);
  EXPECT_EQ(history->request.chat().messages(1).content(),
            R"({"name":"get_weather","arguments":{"city":"Paris"}})");
  EXPECT_EQ(history->request.chat().messages(2).role(), "tool");
  EXPECT_TRUE(RefusedWith(Chat(R"({"messages": [{"role": "user", "content": "x",
      "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]})"),
      "messages[0].tool_calls must be a list, on an assistant message"));
  EXPECT_TRUE(Chat(R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})").ok());

  // A function of no arguments ({"properties": {}}, {} or none) is called with {}.
  for (const char* parameters : {R"(, "parameters": {"type": "object", "properties": {}})",
                                 R"(, "parameters": {})", ""}) {
    auto none = Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "ping")", parameters, R"(}}],
        "tool_choice": {"type": "function", "function": {"name": "ping"}}})"));
    ASSERT_TRUE(none.ok()) << none.status() << parameters;
    auto g = scheduler::CompileJsonSchema(none->request.sampling().guided_json());
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE((*g)->Accepts("{}")) << parameters;
    EXPECT_TRUE((*g)->Accepts("{ }")) << parameters;
    EXPECT_FALSE((*g)->Accepts(R"({"a": 1})")) << parameters;
    EXPECT_FALSE((*g)->Accepts(R"("text")")) << parameters;
  }
  // Only a function that may be called is checked; response_format gives way to a call.
  auto other_unsupported = chat(R"(, "tool_choice": {"type": "function", "function":
      {"name": "get_time"}}, "response_format": {"type": "json_object"})");
  const std::string mail = R"({"type": "function", "function": {"name": "mail", "parameters":
      {"type": "object", "properties": {"to": {"type": "string", "format": "email"}}}}})";
  auto skipped = Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [)", mail, R"(, {"type": "function", "function": {"name": "get_time"}}],
      "tool_choice": {"type": "function", "function": {"name": "get_time"}},
      "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "null"}}}})"));
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(skipped->schema_field, "tools[1].function.parameters");
  EXPECT_FALSE(skipped->request.sampling().json_object());
  EXPECT_TRUE(RefusedWith(Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [)", mail, R"(], "tool_choice": "required"})")),
      "tools[0].function.parameters: #/properties/to/format: \"email\" is not supported"));
  EXPECT_TRUE(RefusedWith(chat(R"(, "tool_choice": 5)"), "tool_choice must be \"none\""));
  EXPECT_TRUE(RefusedWith(chat(R"(, "tool_choice": "bogus")"), "tool_choice must be \"none\""));
  // "required": the functions' definitions meet at the list's top, where their references
  // find them; one name defined two ways is refused.
  const std::string point = R"({"type": "object", "properties": {"x": {"type": "integer"}},
      "required": ["x"]})";
  auto with_defs = [&](const std::string& second_point) {
    return Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], "tools": [
        {"type": "function", "function": {"name": "a", "parameters": {"$defs": {"P": )", point,
        R"(}, "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "required": ["p"]}}},
        {"type": "function", "function": {"name": "b", "parameters": {"$defs": {"P": )",
        second_point, R"(}, "type": "object", "properties": {"q": {"$ref": "#/$defs/P"}},
        "required": ["q"]}}}], "tool_choice": "required"})"));
  };
  auto shared = with_defs(point);
  ASSERT_TRUE(shared.ok()) << shared.status();
  auto shared_guide = scheduler::CompileJsonSchema(shared->request.sampling().guided_json());
  ASSERT_TRUE(shared_guide.ok()) << shared_guide.status();
  EXPECT_TRUE((*shared_guide)->Accepts(R"([{"name": "a", "parameters": {"p": {"x": 1}}},
      {"name": "b", "parameters": {"q": {"x": 2}}}])"));
  EXPECT_TRUE(RefusedWith(with_defs(R"({"type": "string"})"),
                          "tools[1].function.parameters.$defs.P is defined differently"));
  ASSERT_TRUE(other_unsupported.ok()) << other_unsupported.status();
  EXPECT_EQ(other_unsupported->tool_calls, OpenAiCall::ToolCalls::kNamed);
}

// A named call answers with the message's tool_calls (content null, finish "stop"), streamed
// as the call's id and name, then its arguments; "required" reads the list of calls back.
TEST_F(OpenAiResponseTest, ToolCallsAnswerAsTheMessagesToolCalls) {
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}])";
  auto call = Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )", tools,
      R"(, "tool_choice": {"type": "function", "function": {"name": "f"}}})"));
  ASSERT_TRUE(call.ok()) << call.status();
  scheduler::TokenDelta part1, part2;
  part1.token_ids = {1};
  part1.text = std::string("{\"a\": ");
  part2.token_ids = {2};
  part2.text = std::string("1}");
  OpenAiResponseBuilder whole(*call, "chatcmpl-1", 1700000000, kServed, model_->tokenizer());
  whole.Add(0, part1);
  whole.Add(0, part2);
  const Json done = whole.Complete({Finished(scheduler::FinishReason::kStop)});
  const Json& message = done["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());
  ASSERT_EQ(message["tool_calls"].size(), 1u);
  const Json& tc = message["tool_calls"][0];
  EXPECT_EQ(tc["type"], "function");
  EXPECT_EQ(tc["function"]["name"], "f");
  EXPECT_EQ(tc["function"]["arguments"], "{\"a\": 1}");
  EXPECT_EQ(tc["id"].get<std::string>().substr(0, 5), "call_");
  EXPECT_EQ(tc["id"].get<std::string>().size(), 29u);
  EXPECT_EQ(done["choices"][0]["finish_reason"], "stop");

  OpenAiResponseBuilder streamed(*call, "chatcmpl-2", 1700000000, kServed, model_->tokenizer());
  const Json first = streamed.DeltaChunk(0, part1);
  const Json& d1 = first["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(d1["index"], 0);
  EXPECT_EQ(d1["function"]["name"], "f");
  EXPECT_EQ(d1["function"]["arguments"], "{\"a\": ");
  EXPECT_TRUE(d1.contains("id"));
  const Json second = streamed.DeltaChunk(0, part2);
  const Json& d2 = second["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_FALSE(d2.contains("id"));
  EXPECT_EQ(d2["function"]["arguments"], "1}");
  EXPECT_TRUE(OpenAiResponseBuilder::Carries(second));
  scheduler::TokenDelta nothing;
  EXPECT_FALSE(OpenAiResponseBuilder::Carries(streamed.DeltaChunk(0, nothing)));

  auto required = Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )",
                                    tools, R"(, "tool_choice": "required"})"));
  ASSERT_TRUE(required.ok()) << required.status();
  scheduler::TokenDelta calls;
  calls.token_ids = {1};
  calls.text =
      std::string(R"([{"name": "f", "parameters": {"a": 2}}, {"name": "f", "parameters": {}}])");
  OpenAiResponseBuilder listed(*required, "chatcmpl-3", 1700000000, kServed, model_->tokenizer());
  listed.Add(0, calls);
  const Json two = listed.Complete({Finished(scheduler::FinishReason::kStop)});
  ASSERT_EQ(two["choices"][0]["message"]["tool_calls"].size(), 2u);
  EXPECT_EQ(two["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"a\":2}");
  EXPECT_EQ(two["choices"][0]["finish_reason"], "tool_calls");
  // Cut short, the calls stay text.
  OpenAiResponseBuilder cut(*required, "chatcmpl-4", 1700000000, kServed, model_->tokenizer());
  cut.Add(0, part1);
  const Json text = cut.Complete({Finished(scheduler::FinishReason::kLength)});
  EXPECT_EQ(text["choices"][0]["message"]["content"], "{\"a\": ");
  EXPECT_FALSE(text["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(text["choices"][0]["finish_reason"], "length");
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
}

TEST_F(OpenAiResponseTest, SplitChoicesMakesAGroupWithItsOwnSeeds) {
  auto call = Completion(R"({"prompt": "x", "n": 3, "seed": 7, "temperature": 0.5})");
  ASSERT_TRUE(call.ok());
  auto built = BuildRequest(call->request, *model_);
  ASSERT_TRUE(built.ok()) << built.status();
  built->id = "cmpl-9";
  const auto group = SplitChoices(*built, 3);
  ASSERT_EQ(group.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(group[i].id, absl::StrCat("cmpl-9/", i));
    EXPECT_EQ(group[i].group_id, "cmpl-9");
    EXPECT_EQ(group[i].group_index, i);
    ASSERT_TRUE(group[i].sampling.seed.has_value());
    EXPECT_EQ(*group[i].sampling.seed, uint64_t(7 + i));
    EXPECT_EQ(group[i].prompt, built->prompt);
    EXPECT_EQ(group[i].sampling.temperature, 0.5f);
  }
  const auto alone = SplitChoices(*built, 1);
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_EQ(alone[0].id, "cmpl-9");
  EXPECT_TRUE(alone[0].group_id.empty());
  EXPECT_EQ(*alone[0].sampling.seed, 7u);
  built->sampling.seed.reset();
  for (const auto& r : SplitChoices(*built, 2)) EXPECT_FALSE(r.sampling.seed.has_value());
  // Over gRPC, n past the bound is refused where the other fields are.
  v1::GenerateRequest many;
  many.set_prompt("x");
  many.set_n(129);
  auto refused = BuildRequest(many, *model_);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), "n = 129; it must be in [1, 128] (0 means 1)");
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
