// The pre-tokenizer regex matchers against Hugging Face tokenizers' own splits (expected
// pieces generated with tokenizers.pre_tokenizers.Split(Regex(pattern), "isolated"), which
// evaluates the patterns with Oniguruma), plus the Digits and Metaspace splitters.
#include "model/tokenizer_pretokenize.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/unicode_tables.h"

namespace thetaserve::model {
namespace {

struct SplitCase {
  SplitRegex regex;
  std::string text;
  std::vector<std::string> pieces;
};

const SplitCase kHfSplits[] = {
    {SplitRegex::kGpt2, "Hello world", {"Hello", " world"}},
    {SplitRegex::kGpt2, "a  b", {"a", " ", " b"}},
    {SplitRegex::kGpt2, "a   b  ", {"a", "  ", " b", "  "}},
    {SplitRegex::kGpt2, "I'm don't we'll THEY'RE", {"I", "'m", " don", "'t", " we", "'ll", " THEY", "'", "RE"}},
    {SplitRegex::kGpt2, "I'M fine", {"I", "'", "M", " fine"}},
    {SplitRegex::kGpt2, "x\n\n  y", {"x", "\n\n ", " y"}},
    {SplitRegex::kGpt2, "x \n \n\ty", {"x", " \n \n", "\t", "y"}},
    {SplitRegex::kGpt2, "12345 678", {"12345", " 678"}},
    {SplitRegex::kGpt2, "abc123def", {"abc", "123", "def"}},
    {SplitRegex::kGpt2, "  leading", {" ", " leading"}},
    {SplitRegex::kGpt2, "tab\t\tend\t", {"tab", "\t", "\t", "end", "\t"}},
    {SplitRegex::kGpt2, "¡Hola! ¿Qué tal?", {"¡", "Hola", "!", " ¿", "Qué", " tal", "?"}},
    {SplitRegex::kGpt2, "日本語のテキスト", {"日本語のテキスト"}},
    {SplitRegex::kGpt2, "naïve café", {"naïve", " café"}},
    {SplitRegex::kGpt2, "a\r\nb", {"a", "\r", "\n", "b"}},
    {SplitRegex::kGpt2, "emoji 😀👍 ok", {"emoji", " 😀👍", " ok"}},
    {SplitRegex::kGpt2, "3.14159", {"3", ".", "14159"}},
    {SplitRegex::kGpt2, "...!!!\n\n", {"...!!!", "\n\n"}},
    {SplitRegex::kGpt2, "'s'S'\u017f", {"'s", "'", "S", "'", "\u017f"}},
    {SplitRegex::kGpt2, "x \u00a0 y", {"x", " \u00a0", " y"}},
    {SplitRegex::kGpt2, "٣٤٥ ⅣⅫ ²", {"٣٤٥", " ⅣⅫ", " ²"}},
    {SplitRegex::kGpt2, " \n", {" \n"}},
    {SplitRegex::kGpt2, "\n", {"\n"}},
    {SplitRegex::kGpt2, "a\u3000\u3000b", {"a", "\u3000", "\u3000", "b"}},
    {SplitRegex::kGpt2, "'", {"'"}},
    {SplitRegex::kGpt2, "'ll've", {"'ll", "'ve"}},
    {SplitRegex::kGpt2, "$$ 'x", {"$$", " '", "x"}},
    {SplitRegex::kGpt2, "def f(x):\n    return x\n", {"def", " f", "(", "x", "):", "\n   ", " return", " x", "\n"}},
    {SplitRegex::kLlama3, "Hello world", {"Hello", " world"}},
    {SplitRegex::kLlama3, "a  b", {"a", " ", " b"}},
    {SplitRegex::kLlama3, "a   b  ", {"a", "  ", " b", "  "}},
    {SplitRegex::kLlama3, "I'm don't we'll THEY'RE", {"I", "'m", " don", "'t", " we", "'ll", " THEY", "'RE"}},
    {SplitRegex::kLlama3, "I'M fine", {"I", "'M", " fine"}},
    {SplitRegex::kLlama3, "x\n\n  y", {"x", "\n\n", " ", " y"}},
    {SplitRegex::kLlama3, "x \n \n\ty", {"x", " \n \n", "\ty"}},
    {SplitRegex::kLlama3, "12345 678", {"123", "45", " ", "678"}},
    {SplitRegex::kLlama3, "abc123def", {"abc", "123", "def"}},
    {SplitRegex::kLlama3, "  leading", {" ", " leading"}},
    {SplitRegex::kLlama3, "tab\t\tend\t", {"tab", "\t", "\tend", "\t"}},
    {SplitRegex::kLlama3, "¡Hola! ¿Qué tal?", {"¡Hola", "!", " ¿", "Qué", " tal", "?"}},
    {SplitRegex::kLlama3, "日本語のテキスト", {"日本語のテキスト"}},
    {SplitRegex::kLlama3, "naïve café", {"naïve", " café"}},
    {SplitRegex::kLlama3, "a\r\nb", {"a", "\r\n", "b"}},
    {SplitRegex::kLlama3, "emoji 😀👍 ok", {"emoji", " 😀👍", " ok"}},
    {SplitRegex::kLlama3, "3.14159", {"3", ".", "141", "59"}},
    {SplitRegex::kLlama3, "...!!!\n\n", {"...!!!\n\n"}},
    {SplitRegex::kLlama3, "'s'S'\u017f", {"'s", "'S", "'\u017f"}},
    {SplitRegex::kLlama3, "x \u00a0 y", {"x", " \u00a0", " y"}},
    {SplitRegex::kLlama3, "٣٤٥ ⅣⅫ ²", {"٣٤٥", " ", "ⅣⅫ", " ", "²"}},
    {SplitRegex::kLlama3, " \n", {" \n"}},
    {SplitRegex::kLlama3, "\n", {"\n"}},
    {SplitRegex::kLlama3, "a\u3000\u3000b", {"a", "\u3000", "\u3000b"}},
    {SplitRegex::kLlama3, "'", {"'"}},
    {SplitRegex::kLlama3, "'ll've", {"'ll", "'ve"}},
    {SplitRegex::kLlama3, "$$ 'x", {"$$", " '", "x"}},
    {SplitRegex::kLlama3, "def f(x):\n    return x\n", {"def", " f", "(x", "):\n", "   ", " return", " x", "\n"}},
    {SplitRegex::kQwen2, "Hello world", {"Hello", " world"}},
    {SplitRegex::kQwen2, "a  b", {"a", " ", " b"}},
    {SplitRegex::kQwen2, "a   b  ", {"a", "  ", " b", "  "}},
    {SplitRegex::kQwen2, "I'm don't we'll THEY'RE", {"I", "'m", " don", "'t", " we", "'ll", " THEY", "'RE"}},
    {SplitRegex::kQwen2, "I'M fine", {"I", "'M", " fine"}},
    {SplitRegex::kQwen2, "x\n\n  y", {"x", "\n\n", " ", " y"}},
    {SplitRegex::kQwen2, "x \n \n\ty", {"x", " \n \n", "\ty"}},
    {SplitRegex::kQwen2, "12345 678", {"1", "2", "3", "4", "5", " ", "6", "7", "8"}},
    {SplitRegex::kQwen2, "abc123def", {"abc", "1", "2", "3", "def"}},
    {SplitRegex::kQwen2, "  leading", {" ", " leading"}},
    {SplitRegex::kQwen2, "tab\t\tend\t", {"tab", "\t", "\tend", "\t"}},
    {SplitRegex::kQwen2, "¡Hola! ¿Qué tal?", {"¡Hola", "!", " ¿", "Qué", " tal", "?"}},
    {SplitRegex::kQwen2, "日本語のテキスト", {"日本語のテキスト"}},
    {SplitRegex::kQwen2, "naïve café", {"naïve", " café"}},
    {SplitRegex::kQwen2, "a\r\nb", {"a", "\r\n", "b"}},
    {SplitRegex::kQwen2, "emoji 😀👍 ok", {"emoji", " 😀👍", " ok"}},
    {SplitRegex::kQwen2, "3.14159", {"3", ".", "1", "4", "1", "5", "9"}},
    {SplitRegex::kQwen2, "...!!!\n\n", {"...!!!\n\n"}},
    {SplitRegex::kQwen2, "'s'S'\u017f", {"'s", "'S", "'\u017f"}},
    {SplitRegex::kQwen2, "x \u00a0 y", {"x", " \u00a0", " y"}},
    {SplitRegex::kQwen2, "٣٤٥ ⅣⅫ ²", {"٣", "٤", "٥", " ", "Ⅳ", "Ⅻ", " ", "²"}},
    {SplitRegex::kQwen2, " \n", {" \n"}},
    {SplitRegex::kQwen2, "\n", {"\n"}},
    {SplitRegex::kQwen2, "a\u3000\u3000b", {"a", "\u3000", "\u3000b"}},
    {SplitRegex::kQwen2, "'", {"'"}},
    {SplitRegex::kQwen2, "'ll've", {"'ll", "'ve"}},
    {SplitRegex::kQwen2, "$$ 'x", {"$$", " '", "x"}},
    {SplitRegex::kQwen2, "def f(x):\n    return x\n", {"def", " f", "(x", "):\n", "   ", " return", " x", "\n"}},
};

std::vector<std::string> Split(SplitRegex regex, std::string_view text) {
  std::vector<std::string_view> views;
  SplitByRegex(text, regex, &views);
  return std::vector<std::string>(views.begin(), views.end());
}

TEST(PreTokenizeTest, RegexSplitsMatchHuggingFace) {
  for (const SplitCase& c : kHfSplits) {
    EXPECT_EQ(Split(c.regex, c.text), c.pieces)
        << "pattern " << SplitRegexPattern(c.regex) << "\ntext '" << c.text << "'";
  }
}

TEST(PreTokenizeTest, WhitespaceRunGivesItsLastSpaceToTheNextWord) {
  // \s+(?!\S): the run stops one short of a word, which then takes the space via " ?\p{L}+".
  EXPECT_EQ(Split(SplitRegex::kGpt2, "a    b"), (std::vector<std::string>{"a", "   ", " b"}));
  // At the end of the text the whole run is one piece.
  EXPECT_EQ(Split(SplitRegex::kGpt2, "a    "), (std::vector<std::string>{"a", "    "}));
  // A single space before a non-letter (here '\t') is kept alone by the final \s+.
  EXPECT_EQ(Split(SplitRegex::kGpt2, " \tb"), (std::vector<std::string>{" ", "\t", "b"}));
}

TEST(PreTokenizeTest, ContractionsAreCaseSensitiveOnlyInGpt2) {
  EXPECT_EQ(Split(SplitRegex::kGpt2, "WE'LL"), (std::vector<std::string>{"WE", "'", "LL"}));
  EXPECT_EQ(Split(SplitRegex::kLlama3, "WE'LL"), (std::vector<std::string>{"WE", "'LL"}));
}

TEST(PreTokenizeTest, DigitsSplitsEveryNumberCharacter) {
  std::vector<std::string_view> out;
  SplitDigits("ab12 ³x٣", /*individual=*/true, &out);
  EXPECT_EQ(std::vector<std::string>(out.begin(), out.end()),
            (std::vector<std::string>{"ab", "1", "2", " ", "³", "x", "٣"}));
  out.clear();
  SplitDigits("ab12 ³x", /*individual=*/false, &out);
  EXPECT_EQ(std::vector<std::string>(out.begin(), out.end()),
            (std::vector<std::string>{"ab", "12", " ", "³", "x"}));
}

TEST(PreTokenizeTest, MetaspaceSplitKeepsMarkerWithTheFollowingWord) {
  std::vector<std::string_view> out;
  SplitBeforeMarker("▁a▁▁b▁", "▁", &out);
  EXPECT_EQ(std::vector<std::string>(out.begin(), out.end()),
            (std::vector<std::string>{"▁a", "▁", "▁b", "▁"}));
  out.clear();
  SplitBeforeMarker("x▁y", "▁", &out);
  EXPECT_EQ(std::vector<std::string>(out.begin(), out.end()),
            (std::vector<std::string>{"x", "▁y"}));
}

TEST(PreTokenizeTest, InvalidUtf8BytesAreKeptAsPunctuation) {
  // Each stray byte is its own character of no class; no byte is lost.
  const std::string text = "a\xff\xfe b";
  EXPECT_EQ(Split(SplitRegex::kGpt2, text), (std::vector<std::string>{"a", "\xff\xfe", " b"}));
}

TEST(UnicodeTablesTest, ClassesFollowUnicode14) {
  EXPECT_TRUE(IsUnicodeLetter('a'));
  EXPECT_TRUE(IsUnicodeLetter(0x65E5));    // 日
  EXPECT_TRUE(IsUnicodeLetter(0x30000));   // CJK Extension G (new in 13.0)
  EXPECT_FALSE(IsUnicodeLetter(0x0301));   // combining acute: a mark
  EXPECT_TRUE(IsUnicodeNumber(0x00B2));    // ²  (No)
  EXPECT_TRUE(IsUnicodeNumber(0x2163));    // Ⅳ (Nl)
  EXPECT_TRUE(IsUnicodeWhitespace(0x3000));
  EXPECT_TRUE(IsUnicodeWhitespace(0x0085));
  EXPECT_FALSE(IsUnicodeWhitespace(0x180E));  // left White_Space in 6.3
  EXPECT_FALSE(IsUnicodeWhitespace(0x200B));  // zero width space is Cf
  EXPECT_EQ(UnicodeClass(0x110000), 0);
}

}  // namespace
}  // namespace thetaserve::model
