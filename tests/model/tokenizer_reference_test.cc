// Token ids for ~1300 texts (KJV and Austen lines, a tricky set) must equal Hugging Face
// tokenizers' on the tiny tokenizer.json files in tests/data (references written by
// scripts/make_reference.py).
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "model/tokenizer.h"
#include "tests/model/tokenizer_reference_util.h"
#include "tests/test_util.h"

namespace thetaserve::model {
namespace {

using thetaserve::testing::ReadFileOrDie;
using thetaserve::testing::TestDataPath;

std::unique_ptr<Tokenizer> LoadJson(const std::string& dir) {
  auto tok = Tokenizer::FromTokenizerJson(ReadFileOrDie(TestDataPath(dir + "/tokenizer.json")),
                                          ReadFileOrDie(TestDataPath(dir + "/tokenizer_config.json")));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

TEST(TokenizerReferenceTest, TinyLlamaSpmByteFallbackMatchesHuggingFace) {
  auto tok = LoadJson("tiny_llama");
  ASSERT_NE(tok, nullptr);
  EXPECT_GE(ExpectMatchesReference(*tok, "reference/tokenization_tiny_llama.json"), 1000u);
}

TEST(TokenizerReferenceTest, TinyQwen2ByteLevelMatchesHuggingFace) {
  auto tok = LoadJson("tiny_qwen2");
  ASSERT_NE(tok, nullptr);
  EXPECT_GE(ExpectMatchesReference(*tok, "reference/tokenization_tiny_qwen2.json"), 1000u);
}

TEST(TokenizerReferenceTest, TinyQwen2ChatTemplateUsesItsDefaultSystemMessage) {
  auto tok = LoadJson("tiny_qwen2");
  ASSERT_NE(tok, nullptr);
  auto prompt = tok->ApplyChatTemplate({{"user", "Hi"}});
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(*prompt,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi"
            "<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(tok->stop_ids(), (std::vector<int32_t>{599}));
}

}  // namespace
}  // namespace thetaserve::model
