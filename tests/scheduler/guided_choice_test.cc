#include "scheduler/guided_choice.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace thetaserve::scheduler {
namespace {

// A toy vocabulary: whole words, pieces, single bytes, and a special token (no bytes).
const std::vector<std::string> kVocab = {"yes", "y", "e", "s", "no", "n", "o", " please",
                                         " ", "please", "", "ye", "yess", "noo"};

std::vector<int32_t> Next(const ChoiceGuide& g, const std::string& so_far) {
  const TokenBytesIndex vocab(kVocab);
  std::vector<int32_t> out;
  g.Allowed(so_far, vocab, &out);
  return out;
}

// A token may come next when it continues the output toward some choice: a whole rest, a piece
// of one, never past its end nor off every choice, and never a special token.
TEST(ChoiceGuideTest, NextTokensContinueTowardAChoice) {
  const ChoiceGuide g({"yes", "no", "yes please", "no"});
  EXPECT_EQ(Next(g, ""), std::vector<int32_t>({0, 1, 4, 5, 11}));  // yes y no n ye
  EXPECT_EQ(Next(g, "y"), std::vector<int32_t>({2}));                // e
  EXPECT_EQ(Next(g, "ye"), std::vector<int32_t>({3}));               // s ("yess" overshoots)
  EXPECT_EQ(Next(g, "yes"), std::vector<int32_t>({7, 8}));           // " please", " "
  EXPECT_EQ(Next(g, "yes "), std::vector<int32_t>({9}));             // please
  EXPECT_EQ(Next(g, "no"), std::vector<int32_t>({}));                // done ("noo" overshoots)
  EXPECT_EQ(Next(g, "x"), std::vector<int32_t>({}));                 // off every choice
}

// The output is done once it is a choice no other extends; a choice another extends is a
// choice (EOS may end it there) but not complete.
TEST(ChoiceGuideTest, CompleteOnlyWhenNoLongerChoiceExtendsIt) {
  const ChoiceGuide g({"yes", "yes please", "no"});
  EXPECT_TRUE(g.IsChoice("yes"));
  EXPECT_FALSE(g.Complete("yes"));
  EXPECT_TRUE(g.Complete("yes please"));
  EXPECT_TRUE(g.Complete("no"));
  EXPECT_FALSE(g.IsChoice("ye"));
  EXPECT_FALSE(g.Complete("ye"));
  EXPECT_FALSE(g.Complete(""));
}

// Choices of several bytes per character (UTF-8) are matched byte by byte: a token that ends
// inside a character may come when the rest of the character follows.
TEST(ChoiceGuideTest, MatchesBytesNotCharacters) {
  const TokenBytesIndex vocab({"\xc3", "\xa9", "caf", "caf\xc3\xa9", "\xc3\xa8"});
  const ChoiceGuide g({"caf\xc3\xa9"});  // café
  std::vector<int32_t> out;
  g.Allowed("", vocab, &out);
  EXPECT_EQ(out, std::vector<int32_t>({2, 3}));
  g.Allowed("caf", vocab, &out);
  EXPECT_EQ(out, std::vector<int32_t>({0}));  // not è
  g.Allowed("caf\xc3", vocab, &out);
  EXPECT_EQ(out, std::vector<int32_t>({1}));
}

// The index finds every token that is a prefix of a string, duplicates (two ids with the same
// bytes) included, none past the string's end, and no empty (special) token.
TEST(TokenBytesIndexTest, PrefixesOfAStringAreEveryTokenThatBeginsIt) {
  const TokenBytesIndex vocab({"a", "ab", "abc", "b", "", "ab", "abcd", "abd"});
  std::vector<int32_t> ids;
  vocab.PrefixesOf("abcx", &ids);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, std::vector<int32_t>({0, 1, 2, 5}));
  ids.clear();
  vocab.PrefixesOf("b", &ids);
  EXPECT_EQ(ids, std::vector<int32_t>({3}));
  ids.clear();
  vocab.PrefixesOf("zz", &ids);
  EXPECT_TRUE(ids.empty());
  vocab.PrefixesOf("", &ids);
  EXPECT_TRUE(ids.empty());
}

// Allowed over the index equals the definition checked token by token: a token may come when
// the output's bytes followed by its own begin a choice (random vocabulary and choices).
TEST(ChoiceGuideTest, AllowedIsEveryTokenThatContinuesTowardAChoice) {
  std::mt19937 rng(11);
  std::vector<std::string> bytes(3000);
  for (std::string& b : bytes) {
    for (int n = 1 + int(rng() % 4); n > 0; --n) b += char('a' + rng() % 4);
  }
  bytes[17].clear();  // a special token
  std::vector<std::string> choices;
  for (int i = 0; i < 40; ++i) {
    std::string c;
    for (int n = 1 + int(rng() % 5); n > 0; --n) c += bytes[rng() % bytes.size()];
    choices.push_back(c);
  }
  const ChoiceGuide guide(choices);
  const TokenBytesIndex vocab(bytes);
  for (const std::string& so_far : {std::string(), choices[0].substr(0, 1),
                                    choices[1].substr(0, choices[1].size() / 2), choices[2],
                                    std::string("zz")}) {
    std::vector<int32_t> want;
    for (size_t id = 0; id < bytes.size(); ++id) {
      if (bytes[id].empty()) continue;
      const std::string next = so_far + bytes[id];
      for (const std::string& c : choices) {
        if (c.starts_with(next)) {
          want.push_back(int32_t(id));
          break;
        }
      }
    }
    std::vector<int32_t> got;
    guide.Allowed(so_far, vocab, &got);
    EXPECT_EQ(got, want) << "after '" << so_far << "'";
  }
}

}  // namespace
}  // namespace thetaserve::scheduler
