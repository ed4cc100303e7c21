// FromTokenizerJson on tiny tokenizer.json files laid out exactly as Hugging Face tokenizers
// serializes them (Tokenizer.to_str()); the expected ids and decoded strings are what HF
// tokenizers 0.23 returns for the same files.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace thetaserve::model {
namespace {

using Json = nlohmann::json;
using Ids = std::vector<int32_t>;

std::string ByteLevelChar(int b) {
  // GPT-2 bytes_to_unicode.
  const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  int cp = b;
  if (!printable) {
    int extra = 0;
    for (int k = 0; k < b; ++k) {
      if (!((k >= 0x21 && k <= 0x7E) || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE)) ++extra;
    }
    cp = 0x100 + extra;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

Json Vocab(const std::vector<std::string>& pieces) {
  Json v = Json::object();
  for (size_t i = 0; i < pieces.size(); ++i) v[pieces[i]] = i;
  return v;
}

Json AddedTokens(const std::vector<std::string>& contents) {
  Json a = Json::array();
  for (size_t i = 0; i < contents.size(); ++i) {
    a.push_back({{"id", i}, {"content", contents[i]}, {"single_word", false}, {"lstrip", false},
                 {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  return a;
}

// Llama 2 style: Prepend/Replace normalizer, byte fallback, Strip decoder, "<s> $A".
// ids: <unk> 0, <s> 1, </s> 2, <0x00>.. 3.., ▁ 259, a, b, c, ▁a, ▁b, ab, ▁ab, é 267.
Json SpmTokenizerJson(bool metaspace) {
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    pieces.push_back(buf);
  }
  for (const char* p : {"▁", "a", "b", "c", "▁a", "▁b", "ab", "▁ab", "é"}) pieces.push_back(p);
  Json j = Json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null,
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
      "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
      "byte_fallback": true, "ignore_merges": false,
      "merges": [["▁", "a"], ["a", "b"], ["▁", "b"], ["▁a", "b"]]}})");
  j["model"]["vocab"] = Vocab(pieces);
  j["added_tokens"] = AddedTokens({"<unk>", "<s>", "</s>"});
  if (metaspace) {
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = Json::parse(
        R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true})");
    j["decoder"] = Json::parse(
        R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true})");
  } else {
    j["normalizer"] = Json::parse(R"({"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]})");
    j["pre_tokenizer"] = nullptr;
    j["decoder"] = Json::parse(R"({"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})");
  }
  return j;
}

// SmolLM2 style: Digits + ByteLevel, no post-processor.
// ids: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2, bytes 3..258, Ġa, ab, Ġab, 12.
Json ByteLevelTokenizerJson() {
  std::vector<std::string> pieces = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  for (int b = 0; b < 256; ++b) pieces.push_back(ByteLevelChar(b));
  for (const char* p : {"Ġa", "ab", "Ġab", "12"}) pieces.push_back(p);
  Json j = Json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null, "normalizer": null,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Digits", "individual_digits": true},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]},
    "post_processor": null,
    "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
      "merges": [["Ġ", "a"], ["a", "b"], ["Ġa", "b"], ["1", "2"]]}})");
  j["model"]["vocab"] = Vocab(pieces);
  j["added_tokens"] = AddedTokens({"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
  return j;
}

std::unique_ptr<Tokenizer> Load(const Json& j, const std::string& config = "") {
  auto tok = Tokenizer::FromTokenizerJson(j.dump(), config);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

TEST(TokenizerJsonTest, SpmByteFallbackMatchesHuggingFace) {
  auto tok = Load(SpmTokenizerJson(false));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->Encode("ab ab"), (Ids{1, 266, 266}));
  EXPECT_EQ(tok->Encode("ab<s>ab"), (Ids{1, 266, 1, 266}));
  EXPECT_EQ(tok->Encode("a€b"), (Ids{1, 263, 229, 133, 175, 261}));
  EXPECT_EQ(tok->Encode(" ab"), (Ids{1, 259, 266}));
  EXPECT_EQ(tok->Encode(""), (Ids{1}));
  EXPECT_EQ(tok->Encode("aé "), (Ids{1, 263, 267, 259}));
  EXPECT_EQ(tok->Encode("xxé"), (Ids{1, 259, 123, 123, 267}));
  EXPECT_EQ(tok->Encode("ba  ab"), (Ids{1, 264, 260, 259, 266}));
  EXPECT_EQ(tok->Encode("abab"), (Ids{1, 266, 265}));
  EXPECT_EQ(tok->Encode("a</s>"), (Ids{1, 263, 2}));
}

TEST(TokenizerJsonTest, SpmDecodeStripsOneLeadingSpaceLikeHuggingFace) {
  auto tok = Load(SpmTokenizerJson(false));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Decode({1, 266, 1, 266}), "<s> ab<s> ab");
  EXPECT_EQ(tok->Decode({1, 266, 1, 266}, /*skip_special=*/true), "ab ab");
  EXPECT_EQ(tok->Decode({1, 259, 266}), "<s>  ab");
  EXPECT_EQ(tok->Decode({1, 259, 266}, true), " ab");
  EXPECT_EQ(tok->Decode({1, 262, 263}), "<s>c a");
  // A run of byte tokens that is not valid UTF-8 becomes U+FFFD per byte.
  EXPECT_EQ(tok->Decode({3 + 0xE2, 3 + 0x82, 262, 3 + 0xE2, 3 + 0x82, 3 + 0xAC}), "��c€");
  EXPECT_EQ(tok->TokenBytes(266), " ab");
  EXPECT_EQ(tok->TokenBytes(3 + 0xE2), "\xE2");
}

TEST(TokenizerJsonTest, MetaspacePrependsOnlyAtTheStartOfTheInput) {
  auto tok = Load(SpmTokenizerJson(true));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("a b<s>c d"), (Ids{1, 263, 264, 1, 262, 259, 103}));
  EXPECT_EQ(tok->Encode("<s>c d"), (Ids{1, 1, 262, 259, 103}));
  EXPECT_EQ(tok->Encode(" c d"), (Ids{1, 259, 262, 259, 103}));
  EXPECT_EQ(tok->Encode("ab  ab"), (Ids{1, 266, 259, 266}));
  // The Metaspace decoder drops every marker of the first token and does no byte fallback.
  EXPECT_EQ(tok->Decode({1, 263, 264, 1, 262, 259, 103}), "<s> a b<s>c <0x64>");
  EXPECT_EQ(tok->Decode({1, 263, 264, 1, 262, 259, 103}, true), "a bc <0x64>");
  EXPECT_EQ(tok->Decode({259, 259, 263, 1, 263}), "  a<s> a");
}

TEST(TokenizerJsonTest, ByteLevelWithDigitsMatchesHuggingFace) {
  auto tok = Load(ByteLevelTokenizerJson());
  ASSERT_NE(tok, nullptr);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->Encode("ab ab 12"), (Ids{260, 261, 35, 52, 53}));
  EXPECT_EQ(tok->Encode("<|im_start|>user\nab<|im_end|>"), (Ids{1, 120, 118, 104, 117, 13, 260, 2}));
  EXPECT_EQ(tok->Encode("12ab"), (Ids{52, 53, 260}));
  EXPECT_EQ(tok->Encode("é"), (Ids{198, 172}));
  EXPECT_EQ(tok->Encode("ab  \n"), (Ids{260, 35, 35, 13}));
  EXPECT_EQ(tok->Decode({1, 120, 118, 104, 117, 13, 260, 2}), "<|im_start|>user\nab<|im_end|>");
  EXPECT_EQ(tok->Decode({1, 120, 118, 104, 117, 13, 260, 2}, true), "user\nab");
  // Ill-formed UTF-8 is replaced like Rust's from_utf8_lossy.
  EXPECT_EQ(tok->Decode({3 + 0xE2, 3 + 0x82}), "�");
  EXPECT_EQ(tok->Decode({3 + 0xE2, 3 + 0x82, 3 + 'a'}), "�a");
}

TEST(TokenizerJsonTest, ConfigChoosesBosEosAndTemplate) {
  const std::string config = R"({
    "add_bos_token": false, "bos_token": "<|im_start|>",
    "eos_token": {"content": "<|im_end|>", "special": true},
    "chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"})";
  auto tok = Load(ByteLevelTokenizerJson(), config);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->stop_ids(), (Ids{2}));
  auto prompt = tok->ApplyChatTemplate({{"user", "hi"}});
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(*prompt, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");

  // add_bos_token in the config overrides the post-processor.
  auto spm = Load(SpmTokenizerJson(false), R"({"add_bos_token": false, "eos_token": "</s>"})");
  ASSERT_NE(spm, nullptr);
  EXPECT_EQ(spm->Encode("ab"), (Ids{266}));
  EXPECT_EQ(spm->stop_ids(), (Ids{2}));
}

TEST(TokenizerJsonTest, UnsupportedComponentsAreNamed) {
  Json j = ByteLevelTokenizerJson();
  j["pre_tokenizer"] = Json::parse(R"({"type": "Whitespace"})");
  auto tok = Tokenizer::FromTokenizerJson(j.dump(), "");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(tok.status().message().find("Whitespace"), std::string::npos);

  j = ByteLevelTokenizerJson();
  j["pre_tokenizer"] = Json::parse(
      R"({"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Isolated", "invert": false})");
  EXPECT_EQ(Tokenizer::FromTokenizerJson(j.dump(), "").status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Tokenizer::FromTokenizerJson("{not json", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromTokenizerJson(R"({"model": {"type": "BPE", "vocab": []}})", "")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace thetaserve::model
