// Tokenizer::FromGguf on the real SmolLM2-135M-Instruct GGUF (byte-level BPE, pre-tokenizer
// "smollm") and on tiny_llama.gguf (SentencePiece scores, byte fallback): ids must equal the
// Hugging Face references in tests/data/reference, and encoding must be fast.
#include <chrono>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tests/model/tokenizer_reference_util.h"
#include "tests/test_util.h"

namespace thetaserve::model {
namespace {

std::unique_ptr<Tokenizer> LoadGguf(const std::string& path) {
  auto gguf = GgufFile::Open(path);
  EXPECT_TRUE(gguf.ok()) << gguf.status();
  if (!gguf.ok()) return nullptr;
  auto tok = Tokenizer::FromGguf(**gguf);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

TEST(TokenizerGgufTest, SmolLm2MatchesHuggingFace) {
  auto tok = LoadGguf(thetaserve::testing::DefaultModelPath());
  ASSERT_NE(tok, nullptr);
  EXPECT_GE(ExpectMatchesReference(*tok, "reference/tokenization_smollm2.json"), 1000u);
  EXPECT_EQ(tok->stop_ids(), (std::vector<int32_t>{2}));  // <|im_end|> is also EOS
  EXPECT_TRUE(tok->IsSpecial(1));
}

TEST(TokenizerGgufTest, SmolLm2ChatPrompt) {
  auto tok = LoadGguf(thetaserve::testing::DefaultModelPath());
  ASSERT_NE(tok, nullptr);
  auto prompt = tok->ApplyChatTemplate({{"user", "What is 2+2?"}});
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(*prompt,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
  // HF: tokenizer.apply_chat_template(messages, add_generation_prompt=True)
  EXPECT_EQ(tok->Encode(*prompt, /*add_bos=*/false),
            (std::vector<int32_t>{1,    9690, 198,  2683, 359,   253, 5356, 5646, 11173, 3365,
                                  3511, 308,  34519, 28,  7018,  411, 407,  19712, 8182, 2,
                                  198,  1,    4093, 198,  1780,  314, 216,  34,    27,   34,
                                  47,   2,    198,  1,    520,   9531, 198}));
}

TEST(TokenizerGgufTest, TinyLlamaScoresMatchHuggingFaceBpe) {
  auto tok = LoadGguf(thetaserve::testing::TestDataPath("tiny_llama_gguf/tiny_llama.gguf"));
  ASSERT_NE(tok, nullptr);
  EXPECT_GE(ExpectMatchesReference(*tok, "reference/tokenization_tiny_llama.json"), 1000u);
}

TEST(TokenizerGgufTest, EncodesMegabytesInSeconds) {
  auto tok = LoadGguf(thetaserve::testing::DefaultModelPath());
  ASSERT_NE(tok, nullptr);
  // 4 MiB of varied text: the reference texts repeated with a counter so words vary.
  const nlohmann::json ref = nlohmann::json::parse(thetaserve::testing::ReadFileOrDie(
      thetaserve::testing::TestDataPath("reference/tokenization_smollm2.json")));
  std::string text;
  for (int round = 0; text.size() < (4u << 20); ++round) {
    for (const auto& c : ref["cases"]) {
      text += c["text"].get<std::string>();
      text += ' ';
      text += std::to_string(round);
      text += '\n';
    }
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok->Encode(text, false);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("encoded %zu bytes into %zu tokens in %.2f s\n", text.size(), ids.size(), seconds);
  EXPECT_GT(ids.size(), text.size() / 8);
  EXPECT_LT(seconds, 10.0);
  EXPECT_EQ(tok->Decode(ids), text);
}

}  // namespace
}  // namespace thetaserve::model
