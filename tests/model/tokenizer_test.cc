// Encoding on hand-built tiny vocabularies: merge order, byte-level mapping, added/special
// tokens, pre-tokenizer sequences, SentencePiece-style byte fallback. Expected ids were
// checked against Hugging Face tokenizers built from the same vocabularies.
#include "model/tokenizer.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/tokenizer_spec.h"
#include "model/tokenizer_utf8.h"

namespace thetaserve::model {
namespace {

constexpr char kMarker[] = "\xE2\x96\x81";  // ▁

// A byte-level vocabulary: `specials` (ids 0..), then the 256 byte characters in byte order,
// then `extra` pieces, with `merges` in rank order.
TokenizerSpec ByteLevelSpec(std::vector<std::string> specials, std::vector<std::string> extra,
                            std::vector<std::pair<std::string, std::string>> merges) {
  TokenizerSpec spec;
  for (const std::string& s : specials) {
    AddedTokenSpec t;
    t.id = static_cast<int32_t>(spec.pieces.size());
    t.content = s;
    spec.added_tokens.push_back(t);
    spec.pieces.push_back(s);
  }
  for (int b = 0; b < 256; ++b) {
    spec.pieces.push_back(BytesToByteLevel(std::string(1, static_cast<char>(b))));
  }
  for (std::string& e : extra) spec.pieces.push_back(std::move(e));
  spec.merges = std::move(merges);
  spec.byte_level = true;
  PreTokenizerStep bl;
  bl.kind = PreTokenizerStep::Kind::kByteLevel;
  spec.pre_tokenizer = {bl};
  spec.decoder = {DecoderStep{DecoderStep::Kind::kByteLevel}};
  return spec;
}

std::unique_ptr<Tokenizer> Build(TokenizerSpec spec) {
  auto tok = BuildTokenizer(std::move(spec));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

// Pieces of the ids, for readable failures.
std::vector<std::string> Pieces(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(tok.Piece(id));
  return out;
}

using Strings = std::vector<std::string>;

TEST(TokenizerTest, MergesApplyInRankOrder) {
  // Both "ab" and "bc" exist; whichever merge ranks first wins the shared 'b'.
  auto bc_first = Build(ByteLevelSpec({}, {"ab", "bc"}, {{"b", "c"}, {"a", "b"}}));
  auto ab_first = Build(ByteLevelSpec({}, {"ab", "bc"}, {{"a", "b"}, {"b", "c"}}));
  EXPECT_EQ(Pieces(*bc_first, bc_first->Encode("abc", false)), (Strings{"a", "bc"}));
  EXPECT_EQ(Pieces(*ab_first, ab_first->Encode("abc", false)), (Strings{"ab", "c"}));
}

TEST(TokenizerTest, MergedTokensMergeFurther) {
  auto tok = Build(ByteLevelSpec({}, {"ab", "abc", "Ġab", "Ġabc"},
                                 {{"a", "b"}, {"ab", "c"}, {"Ġ", "ab"}, {"Ġab", "c"}}));
  // "Ġ a b c": a+b (rank 0) first; then ab+c (rank 1) beats Ġ+ab (rank 2), and nothing
  // joins "Ġ" with "abc".
  EXPECT_EQ(Pieces(*tok, tok->Encode(" abc", false)), (Strings{"Ġ", "abc"}));
}

TEST(TokenizerTest, EqualPairsMergeLeftmostFirst) {
  auto tok = Build(ByteLevelSpec({}, {"aa"}, {{"a", "a"}}));
  EXPECT_EQ(Pieces(*tok, tok->Encode("aaa", false)), (Strings{"aa", "a"}));
  EXPECT_EQ(Pieces(*tok, tok->Encode("aaaa", false)), (Strings{"aa", "aa"}));
}

TEST(TokenizerTest, ByteLevelMapsSpacesAndMultibyteCharacters) {
  auto tok = Build(ByteLevelSpec({}, {"Ġa", "Ã©"}, {{"Ġ", "a"}, {"Ã", "©"}}));
  // ' ' is byte 0x20 -> 'Ġ'; 'é' is C3 A9 -> "Ã" "©".
  EXPECT_EQ(Pieces(*tok, tok->Encode(" a é", false)), (Strings{"Ġa", "Ġ", "Ã©"}));
  EXPECT_EQ(tok->TokenBytes(tok->PieceToId("Ġa")), " a");
  EXPECT_EQ(tok->TokenBytes(tok->PieceToId("Ã©")), "é");
}

TEST(TokenizerTest, IgnoreMergesTakesAWordThatIsAToken) {
  // "abc" is a token but no merge chain builds it.
  TokenizerSpec spec = ByteLevelSpec({}, {"ab", "abc"}, {{"a", "b"}});
  auto plain = Build(spec);
  spec.ignore_merges = true;
  auto ignoring = Build(spec);
  EXPECT_EQ(Pieces(*plain, plain->Encode("abc", false)), (Strings{"ab", "c"}));
  EXPECT_EQ(Pieces(*ignoring, ignoring->Encode("abc", false)), (Strings{"abc"}));
}

TEST(TokenizerTest, SpecialTokensSplitTheTextFirst) {
  auto tok = Build(ByteLevelSpec({"<|im_start|>", "<|im"}, {"ab"}, {{"a", "b"}}));
  // Leftmost-longest: "<|im_start|>" wins over its prefix "<|im".
  EXPECT_EQ(Pieces(*tok, tok->Encode("ab<|im_start|>ab<|imx", false)),
            (Strings{"ab", "<|im_start|>", "ab", "<|im", "x"}));
  // The token splits a word that would otherwise merge across it.
  EXPECT_EQ(Pieces(*tok, tok->Encode("a<|im_start|>b", false)),
            (Strings{"a", "<|im_start|>", "b"}));
}

TEST(TokenizerTest, SpecialTokensAreTextWithoutParseSpecial) {
  TokenizerSpec spec = ByteLevelSpec({"<s>"}, {}, {});
  AddedTokenSpec user;  // a non-special added token still splits
  user.id = static_cast<int32_t>(spec.pieces.size());
  user.content = "<u>";
  user.special = false;
  spec.pieces.push_back("<u>");
  spec.added_tokens.push_back(user);
  auto tok = Build(spec);
  EXPECT_EQ(Pieces(*tok, tok->Encode("<s><u>", false, /*parse_special=*/true)),
            (Strings{"<s>", "<u>"}));
  EXPECT_EQ(Pieces(*tok, tok->Encode("<s><u>", false, /*parse_special=*/false)),
            (Strings{"<", "s", ">", "<u>"}));
  EXPECT_TRUE(tok->IsSpecial(0));
  EXPECT_FALSE(tok->IsSpecial(user.id));
}

TEST(TokenizerTest, AddedTokenStripsSwallowNeighbouringSpaces) {
  TokenizerSpec spec = ByteLevelSpec({"<m>"}, {}, {});
  spec.added_tokens[0].lstrip = true;
  spec.added_tokens[0].rstrip = true;
  auto tok = Build(spec);
  EXPECT_EQ(Pieces(*tok, tok->Encode("a  <m>\t b", false)), (Strings{"a", "<m>", "b"}));
}

TEST(TokenizerTest, BosOnlyWhenRequestedAndWanted) {
  TokenizerSpec spec = ByteLevelSpec({"<s>"}, {}, {});
  spec.bos_id = 0;
  spec.add_bos = true;
  auto tok = Build(spec);
  EXPECT_EQ(Pieces(*tok, tok->Encode("a", true)), (Strings{"<s>", "a"}));
  EXPECT_EQ(Pieces(*tok, tok->Encode("a", false)), (Strings{"a"}));
  EXPECT_EQ(Pieces(*tok, tok->Encode("", true)), (Strings{"<s>"}));
  spec.add_bos = false;
  auto no_bos = Build(spec);
  EXPECT_EQ(Pieces(*no_bos, no_bos->Encode("a", true)), (Strings{"a"}));
}

TEST(TokenizerTest, SmolLmDigitsSplitBeforeTheByteLevelRegex) {
  TokenizerSpec spec = ByteLevelSpec({}, {"12", "Ġ1"}, {{"1", "2"}, {"Ġ", "1"}});
  PreTokenizerStep digits;
  digits.kind = PreTokenizerStep::Kind::kDigits;
  digits.individual_digits = true;
  spec.pre_tokenizer.insert(spec.pre_tokenizer.begin(), digits);
  auto tok = Build(spec);
  // Without the Digits step these would be "12" and "Ġ1"+"2".
  EXPECT_EQ(Pieces(*tok, tok->Encode("12 12", false)), (Strings{"1", "2", "Ġ", "1", "2"}));
}

TEST(TokenizerTest, ByteLevelPrefixSpaceIsAddedToEverySplit) {
  // HF ByteLevel(add_prefix_space) prefixes each piece the previous step produced.
  TokenizerSpec spec = ByteLevelSpec({}, {}, {});
  PreTokenizerStep digits;
  digits.kind = PreTokenizerStep::Kind::kDigits;
  digits.individual_digits = true;
  spec.pre_tokenizer.insert(spec.pre_tokenizer.begin(), digits);
  spec.pre_tokenizer[1].add_prefix_space = true;
  auto tok = Build(spec);
  EXPECT_EQ(Pieces(*tok, tok->Encode("ab12", false)), (Strings{"Ġ", "a", "b", "Ġ", "1", "Ġ", "2"}));
}

TEST(TokenizerTest, Llama3RegexGroupsThreeDigits) {
  TokenizerSpec spec = ByteLevelSpec({}, {"12", "123"}, {{"1", "2"}, {"12", "3"}});
  PreTokenizerStep split;
  split.kind = PreTokenizerStep::Kind::kSplit;
  split.regex = SplitRegex::kLlama3;
  spec.pre_tokenizer.insert(spec.pre_tokenizer.begin(), split);
  spec.pre_tokenizer[1].use_regex = false;
  auto tok = Build(spec);
  EXPECT_EQ(Pieces(*tok, tok->Encode("12312", false)), (Strings{"123", "12"}));
}

// SentencePiece vocabulary for llama.cpp's score-based merges (GGUF "llama").
TokenizerSpec SpmSpec(std::vector<std::pair<std::string, float>> extra) {
  TokenizerSpec spec;
  spec.merge_algorithm = MergeAlgorithm::kScores;
  spec.pieces = {"<unk>", "<s>", "</s>"};
  spec.scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    spec.pieces.push_back(buf);
    spec.scores.push_back(0);
  }
  for (auto& [p, s] : extra) {
    spec.pieces.push_back(p);
    spec.scores.push_back(s);
  }
  for (int id : {0, 1, 2}) {
    AddedTokenSpec t;
    t.id = id;
    t.content = spec.pieces[id];
    spec.added_tokens.push_back(t);
  }
  spec.unk_id = 0;
  spec.bos_id = 1;
  spec.eos_id = 2;
  spec.add_bos = true;
  spec.byte_fallback = true;
  spec.normalizer = {{NormalizerStep::Kind::kPrepend, "", kMarker},
                     {NormalizerStep::Kind::kReplace, " ", kMarker}};
  DecoderStep replace{DecoderStep::Kind::kReplace};
  replace.pattern = kMarker;
  replace.content = " ";
  DecoderStep strip{DecoderStep::Kind::kStrip};
  strip.pattern = " ";
  strip.start = 1;
  spec.decoder = {replace, DecoderStep{DecoderStep::Kind::kByteFallback},
                  DecoderStep{DecoderStep::Kind::kFuse}, strip};
  return spec;
}

TEST(TokenizerTest, SpmMergesHighestScoreFirst) {
  const std::string m = kMarker;
  // (▁,a) makes "▁a" (-2), (a,b) makes "ab" (-1): "ab" wins, and "▁ab" is not a token.
  auto tok = Build(SpmSpec({{m, -5}, {"a", -5}, {"b", -5}, {"ab", -1}, {m + "a", -2}}));
  EXPECT_EQ(Pieces(*tok, tok->Encode("ab", false)), (Strings{m, "ab"}));
  EXPECT_EQ(Pieces(*tok, tok->Encode("a", true)), (Strings{"<s>", m + "a"}));
}

TEST(TokenizerTest, SpmFallsBackToBytes) {
  const std::string m = kMarker;
  auto tok = Build(SpmSpec({{m, -5}, {"a", -5}, {m + "a", -1}}));
  EXPECT_EQ(Pieces(*tok, tok->Encode("a€", false)), (Strings{m + "a", "<0xE2>", "<0x82>", "<0xAC>"}));
  EXPECT_EQ(tok->Decode(tok->Encode("a€", true), /*skip_special=*/true), "a€");
}

TEST(TokenizerTest, SpmPrefixesEveryTextPieceBetweenSpecialTokens) {
  const std::string m = kMarker;
  auto tok = Build(SpmSpec({{m, -5}, {"a", -5}, {"b", -5}, {m + "a", -1}, {m + "b", -1}}));
  // HF's Prepend normalizer (and llama.cpp) run on each piece after special-token splitting.
  EXPECT_EQ(Pieces(*tok, tok->Encode("a</s>b", false)), (Strings{m + "a", "</s>", m + "b"}));
  EXPECT_EQ(Pieces(*tok, tok->Encode("a b", false)), (Strings{m + "a", m + "b"}));
  EXPECT_EQ(Pieces(*tok, tok->Encode(" a", false)), (Strings{m, m + "a"}));
}

// Each refused for its reason (any error passed before): an id past the last piece, one at
// it, and a spec with no pieces at all.
TEST(TokenizerTest, RejectsIdsOutsideTheVocabulary) {
  TokenizerSpec spec = ByteLevelSpec({}, {}, {});
  const std::string n = std::to_string(spec.pieces.size());
  auto refusal = [&] {
    auto tok = BuildTokenizer(spec);
    return tok.ok() ? std::string("accepted") : std::string(tok.status().message());
  };
  spec.eos_id = 100000;
  EXPECT_EQ(refusal(), "tokenizer EOS id 100000 is outside the vocabulary of " + n);
  spec.eos_id = -1;
  spec.bos_id = static_cast<int32_t>(spec.pieces.size());
  EXPECT_EQ(refusal(), "tokenizer BOS id " + n + " is outside the vocabulary of " + n);
  spec.bos_id = -1;
  spec.pieces.clear();
  EXPECT_EQ(refusal(), "tokenizer vocabulary is empty");
}

TEST(TokenizerTest, StopIdsIncludeTheTemplatesEndOfTurnToken) {
  TokenizerSpec spec = ByteLevelSpec({"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, {}, {});
  spec.eos_id = 0;
  spec.chat_template = "{{'<|im_start|>' + message['content'] + '<|im_end|>'}}";
  auto tok = Build(spec);
  EXPECT_EQ(tok->stop_ids(), (std::vector<int32_t>{0, 2}));
}

// Python's str.lstrip()/rstrip(): Unicode White_Space and U+001C..U+001F go, U+200B (not
// White_Space), ill-formed bytes and everything inside the text stay.
TEST(TokenizerTest, PythonStripTakesUnicodeSpacesOnlyAtTheEnds) {
  const std::string s = "\x1c \t\u3000\u00a0a b\u2003\n\x1f";
  EXPECT_EQ(PythonLStrip(s), "a b\u2003\n\x1f");
  EXPECT_EQ(PythonRStrip(s), "\x1c \t\u3000\u00a0a b");
  EXPECT_EQ(PythonLStrip("\u200bx "), "\u200bx ");
  EXPECT_EQ(PythonRStrip(" x\xff"), " x\xff");
  EXPECT_EQ(PythonLStrip(" \r\n"), "");
  EXPECT_EQ(PythonRStrip(" \r\n"), "");
  EXPECT_TRUE(IsPythonSpace(0x85));
  EXPECT_FALSE(IsPythonSpace(kInvalidCodePoint));
}

}  // namespace
}  // namespace thetaserve::model
