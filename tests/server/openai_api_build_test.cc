// OpenAI-compatible request bodies through BuildRequest, as the server builds the engine's
// request: vLLM's sampling extensions (allowed_token_ids, guided decoding by choice, regex, JSON
// object or schema, bad_words, truncate_prompt_tokens), logit_bias's range and vocabulary, and
// n completions split into a group with their own seeds. The real SmolLM2 tokenizer (and
// tiny_llama's, for a BOS) tokenizes.
#include "server/validation.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "scheduler/guided_choice.h"
#include "scheduler/guided_grammar.h"
#include "scheduler/guided_json.h"
#include "scheduler/guided_regex.h"
#include "scheduler/request.h"
#include "server/openai_api.h"
#include "tests/server/openai_api_test_util.h"
#include "tests/test_util.h"

namespace thetaserve::server {
namespace {

using testing::Completion;
using Json = testing::OrderedJson;
using testing::OpenAiResponseTest;
using testing::RefusedWith;

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
  // A GBNF grammar: guided_grammar, or structured_outputs.grammar (false: none).
  for (const char* body :
       {R"({"prompt": "x", "guided_grammar": "root ::= (\"yes\" | \"no\") \"!\""})",
        R"({"prompt": "x", "structured_outputs": {"grammar": "root ::= (\"yes\" | \"no\") \"!\""}})"}) {
    auto guided = build(body);
    ASSERT_TRUE(guided.ok()) << guided.status();
    auto* grammar = dynamic_cast<const scheduler::GrammarGuide*>(guided->guide.get());
    ASSERT_NE(grammar, nullptr) << body;
    EXPECT_TRUE(grammar->Complete("no!")) << body;
    EXPECT_FALSE(grammar->Accepts("no")) << body;
  }
  auto no_grammar = build(R"({"prompt": "x", "structured_outputs": {"grammar": false}})");
  ASSERT_TRUE(no_grammar.ok()) << no_grammar.status();
  EXPECT_EQ(no_grammar->guide, nullptr);
  // llama.cpp server's name for it (its default, "", is none).
  auto llama_cpp = build(R"({"prompt": "x", "grammar": "root ::= \"yes\" | \"no\""})");
  ASSERT_TRUE(llama_cpp.ok()) << llama_cpp.status();
  auto* llama_grammar = dynamic_cast<const scheduler::GrammarGuide*>(llama_cpp->guide.get());
  ASSERT_NE(llama_grammar, nullptr);
  EXPECT_TRUE(llama_grammar->Complete("yes"));
  no_grammar = build(R"({"prompt": "x", "grammar": ""})");
  ASSERT_TRUE(no_grammar.ok()) << no_grammar.status();
  EXPECT_EQ(no_grammar->guide, nullptr);
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "guided_grammar": "root ::= \"a\"",
      "grammar": "root ::= \"b\""})"),
      "grammar and guided_grammar are both given; send one"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "grammar": 3})"),
                          "grammar must be a string"));
  auto beside_false = build(R"({"prompt": "x", "grammar": "root ::= \"a\"",
      "structured_outputs": {"grammar": false}})");
  ASSERT_TRUE(beside_false.ok()) << beside_false.status();
  EXPECT_NE(dynamic_cast<const scheduler::GrammarGuide*>(beside_false->guide.get()), nullptr);
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "grammar": "root ::= \"a\"",
      "grammar_lazy": true})"), "grammar_lazy is not supported"));
  EXPECT_EQ(build(R"({"prompt": "x", "guided_grammar": "root ::= value"})").status().message(),
            "guided_grammar: line 1, column 10: rule 'value' is used but not defined");
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "guided_grammar": "root ::= \"a\"",
      "structured_outputs": {"grammar": "root ::= \"b\""}})"),
      "guided_grammar and structured_outputs.grammar are both given; send one"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "guided_grammar": 5})"),
                          "guided_grammar must be a string"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "guided_grammar": ""})"),
                          "guided_grammar is empty"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "guided_regex": "a",
      "guided_grammar": "root ::= \"a\""})"),
      "guided_grammar and guided_regex are both given; send one"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "response_format": {"type": "json_schema",
      "json_schema": {"schema": {"type": "null"}}}, "structured_outputs": {"grammar": "root ::= \"a\""}})"),
      "structured_outputs.grammar and response_format.json_schema.schema are both given; send "
      "one"));
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

// add_special_tokens on a chat: unset, the template's tokens alone (it writes what it wants);
// true, BOS in front as well where the model asks for one, as vLLM, but never a second: this
// template (Llama 2's) writes BOS itself, where vLLM would put BOS BOS. It was ignored on a
// chat. The Tokenize RPC takes the same default (it put BOS before a chat that Generate did
// not), so its ids are Generate's. skip_special_tokens reaches the engine, true unless false.
TEST(BuildRequestTest, AddSpecialTokensOnAChatAndSkipSpecialTokens) {
  auto tiny = model::Model::Load(testing::TestDataPath("tiny_llama"));
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  const model::Tokenizer& llama = (*tiny)->tokenizer();
  ASSERT_TRUE(llama.add_bos());
  // Where the text has no BOS, add_special puts one in front.
  EXPECT_EQ(EncodeRenderedChat(llama, "Hello there", true), llama.Encode("Hello there", true));
  EXPECT_EQ(EncodeRenderedChat(llama, "Hello there", false), llama.Encode("Hello there", false));
  ASSERT_NE(llama.Encode("Hello there", true), llama.Encode("Hello there", false));

  v1::GenerateRequest chat;
  auto* m = chat.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("Hello there");
  auto rendered = RenderChat(chat.chat(), **tiny);
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  const std::vector<int32_t> bare = llama.Encode(*rendered, /*add_bos=*/false);
  ASSERT_EQ(bare.front(), llama.bos_id()) << "the template writes BOS";

  auto unset = BuildRequest(chat, **tiny);
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_EQ(unset->prompt, bare);
  EXPECT_TRUE(unset->skip_special_tokens);
  chat.set_add_special_tokens(true);
  chat.set_skip_special_tokens(false);
  auto asked = BuildRequest(chat, **tiny);
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->prompt, bare) << "one BOS, the template's";
  EXPECT_FALSE(asked->skip_special_tokens);

  v1::TokenizeRequest tokenize;
  *tokenize.mutable_chat() = chat.chat();
  auto ids = TokenizeInput(tokenize, **tiny);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(std::vector<int32_t>(ids->ids().begin(), ids->ids().end()), bare);
  tokenize.set_add_special_tokens(true);
  ids = TokenizeInput(tokenize, **tiny);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(std::vector<int32_t>(ids->ids().begin(), ids->ids().end()), bare);
  // Text is encoded as it always was: BOS in front unless asked not to.
  v1::TokenizeRequest text;
  text.set_text("Hello there");
  ids = TokenizeInput(text, **tiny);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(std::vector<int32_t>(ids->ids().begin(), ids->ids().end()),
            llama.Encode("Hello there", true));
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
  const auto unseeded = SplitChoices(*built, 2);
  ASSERT_EQ(unseeded.size(), 2u);
  for (const auto& r : unseeded) EXPECT_FALSE(r.sampling.seed.has_value());
  // Over gRPC, n past the bound is refused where the other fields are.
  v1::GenerateRequest many;
  many.set_prompt("x");
  many.set_n(129);
  auto refused = BuildRequest(many, *model_);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), "n = 129; it must be in [1, 128] (0 means 1)");
}

}  // namespace
}  // namespace thetaserve::server
