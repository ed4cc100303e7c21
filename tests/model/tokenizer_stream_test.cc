// StreamDecoder: UTF-8 characters split across tokens are held back until complete, the
// deltas add up to Decode(), SPM tokens keep their leading spaces after the first.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/tokenizer.h"
#include "model/tokenizer_spec.h"
#include "model/tokenizer_utf8.h"

namespace thetaserve::model {
namespace {

constexpr char kMarker[] = "\xE2\x96\x81";  // ▁

// Byte-level: <|im_end|> 0, then the 256 byte characters (id = 1 + byte), then "Ġhé".
std::unique_ptr<Tokenizer> ByteLevel() {
  TokenizerSpec spec;
  spec.pieces = {"<|im_end|>"};
  AddedTokenSpec end;
  end.id = 0;
  end.content = "<|im_end|>";
  spec.added_tokens = {end};
  for (int b = 0; b < 256; ++b) {
    spec.pieces.push_back(BytesToByteLevel(std::string(1, static_cast<char>(b))));
  }
  spec.pieces.push_back(BytesToByteLevel(" hé"));
  spec.byte_level = true;
  spec.pre_tokenizer = {PreTokenizerStep(PreTokenizerStep::Kind::kByteLevel)};
  spec.decoder = {DecoderStep(DecoderStep::Kind::kByteLevel)};
  auto tok = BuildTokenizer(std::move(spec));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return std::move(*tok);
}

// SPM (Llama 2 decoder): <s> 0, <0x00>.. 1.., then ▁Hello 257, ▁world 258, ▁ 259.
std::unique_ptr<Tokenizer> Spm() {
  TokenizerSpec spec;
  spec.merge_algorithm = MergeAlgorithm::kScores;
  spec.pieces = {"<s>"};
  AddedTokenSpec bos;
  bos.id = 0;
  bos.content = "<s>";
  spec.added_tokens = {bos};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    spec.pieces.push_back(buf);
  }
  for (const char* w : {"Hello", "world", ""}) spec.pieces.push_back(std::string(kMarker) + w);
  spec.scores.assign(spec.pieces.size(), 0.0f);
  DecoderStep replace(DecoderStep::Kind::kReplace);
  replace.pattern = kMarker;
  replace.content = " ";
  DecoderStep strip(DecoderStep::Kind::kStrip);
  strip.pattern = " ";
  strip.start = 1;
  spec.decoder = {replace, DecoderStep(DecoderStep::Kind::kByteFallback),
                  DecoderStep(DecoderStep::Kind::kFuse), strip};
  auto tok = BuildTokenizer(std::move(spec));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return std::move(*tok);
}

std::vector<std::string> PushAll(StreamDecoder& dec, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(dec.Push(id));
  return out;
}

TEST(StreamDecoderTest, HoldsBackAByteLevelCharacterSplitAcrossTokens) {
  auto tok = ByteLevel();
  StreamDecoder dec(*tok);
  // "€" is E2 82 AC, one token per byte.
  EXPECT_EQ(PushAll(dec, {1 + 'a', 1 + 0xE2, 1 + 0x82, 1 + 0xAC, 1 + '!'}),
            (std::vector<std::string>{"a", "", "", "€", "!"}));
  EXPECT_EQ(dec.Flush(), "");
}

TEST(StreamDecoderTest, FlushReplacesAnIncompleteCharacter) {
  auto tok = ByteLevel();
  StreamDecoder dec(*tok);
  EXPECT_EQ(dec.Push(1 + 0xF0), "");
  EXPECT_EQ(dec.Push(1 + 0x9F), "");
  EXPECT_EQ(dec.Flush(), "\xEF\xBF\xBD");
}

TEST(StreamDecoderTest, IllFormedBytesAreReplacedAtOnce) {
  auto tok = ByteLevel();
  StreamDecoder dec(*tok);
  EXPECT_EQ(dec.Push(1 + 0xE2), "");
  // 'a' cannot continue E2: the held byte becomes U+FFFD and 'a' goes out with it.
  EXPECT_EQ(dec.Push(1 + 'a'), "\xEF\xBF\xBD" "a");
}

TEST(StreamDecoderTest, SkipsSpecialTokensUnlessAsked) {
  auto tok = ByteLevel();
  StreamDecoder skipping(*tok);
  EXPECT_EQ(skipping.Push(0), "");
  StreamDecoder rendering(*tok, /*skip_special=*/false);
  EXPECT_EQ(rendering.Push(0), "<|im_end|>");
}

TEST(StreamDecoderTest, SpmKeepsLeadingSpacesAfterTheFirstToken) {
  auto tok = Spm();
  StreamDecoder dec(*tok);
  const std::vector<int32_t> ids = {0, 257, 258, 259, 1 + 0xC3, 1 + 0xA9, 258};
  const std::vector<std::string> deltas = PushAll(dec, ids);
  EXPECT_EQ(deltas, (std::vector<std::string>{"", "Hello", " world", " ", "", "é", " world"}));
  std::string joined;
  for (const std::string& d : deltas) joined += d;
  EXPECT_EQ(joined, tok->Decode(ids, /*skip_special=*/true));
  EXPECT_EQ(tok->Decode(ids), "<s> Hello world é world");
}

TEST(StreamDecoderTest, DeltasAddUpToDecode) {
  auto tok = ByteLevel();
  const std::string text = "naïve 日本 😀 hé hé";
  const std::vector<int32_t> ids = tok->Encode(text, false);
  StreamDecoder dec(*tok);
  std::string joined;
  for (int32_t id : ids) {
    const std::string delta = dec.Push(id);
    EXPECT_TRUE(IsValidUtf8(delta));
    joined += delta;
  }
  joined += dec.Flush();
  EXPECT_EQ(joined, text);
  EXPECT_EQ(tok->Decode(ids), text);
}

}  // namespace
}  // namespace thetaserve::model
