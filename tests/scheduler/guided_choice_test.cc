#include "scheduler/guided_choice.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace thetaserve::scheduler {
namespace {

// A toy vocabulary: whole words, pieces, single bytes, and a special token (no bytes).
const std::vector<std::string> kVocab = {"yes", "y", "e", "s", "no", "n", "o", " please",
                                         " ", "please", "", "ye", "yess", "noo"};

std::vector<int32_t> Next(const ChoiceGuide& g, const std::string& so_far) {
  std::vector<int32_t> out;
  g.Allowed(so_far, kVocab, &out);
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
  const std::vector<std::string> vocab = {"\xc3", "\xa9", "caf", "caf\xc3\xa9", "\xc3\xa8"};
  const ChoiceGuide g({"caf\xc3\xa9"});  // café
  std::vector<int32_t> out;
  g.Allowed("", vocab, &out);
  EXPECT_EQ(out, std::vector<int32_t>({2, 3}));
  g.Allowed("caf", vocab, &out);
  EXPECT_EQ(out, std::vector<int32_t>({0}));  // not è
  g.Allowed("caf\xc3", vocab, &out);
  EXPECT_EQ(out, std::vector<int32_t>({1}));
}

}  // namespace
}  // namespace thetaserve::scheduler
