// The pieces JSON schemas are built from: literals match only themselves, integer ranges
// exactly their integers, bars and nesting are found where they are.
#include "scheduler/json_text_regex.h"

#include <random>
#include <string>

#include "gtest/gtest.h"
#include "scheduler/guided_regex.h"

namespace thetaserve::scheduler {
namespace {

bool Matches(const std::string& regex, std::string_view text) {
  auto guide = RegexGuide::Compile(regex, 1 << 20);
  EXPECT_TRUE(guide.ok()) << regex << ": " << guide.status();
  return guide.ok() && (*guide)->Accepts(text);
}

TEST(JsonTextRegexTest, ALiteralMatchesItselfOnly) {
  for (const std::string text : {"a.b*c", "(x|y)^$", "[\\d]{2}", "é \"q\"", "\\u00e9", "?+{}"}) {
    EXPECT_TRUE(Matches(RegexLiteral(text), text)) << text;
    EXPECT_FALSE(Matches(RegexLiteral(text), text + "x")) << text;
  }
  EXPECT_FALSE(Matches(RegexLiteral("a.c"), "abc"));
}

TEST(JsonTextRegexTest, IntegerRangesHoldExactlyTheirIntegers) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  for (int round = 0; round < 12; ++round) {
    int64_t lo = int64_t(rng() % 4001) - 2000, hi = int64_t(rng() % 4001) - 2000;
    if (lo > hi) std::swap(lo, hi);
    const std::string regex = IntegerRangeRegex(lo, hi);
    for (int64_t n = -2100; n <= 2100; n += 1 + int64_t(rng() % 3)) {
      ASSERT_EQ(Matches(regex, std::to_string(n)), n >= lo && n <= hi)
          << "[" << lo << ", " << hi << "] n=" << n << " seed " << seed;
    }
  }
  EXPECT_TRUE(Matches(IntegerRangeRegex(std::nullopt, std::nullopt), "-12"));
  EXPECT_FALSE(Matches(IntegerRangeRegex(0, std::nullopt), "-0"));
  EXPECT_FALSE(Matches(IntegerRangeRegex(0, std::nullopt), "01"));
  EXPECT_TRUE(Matches(IntegerRangeRegex(7, std::nullopt), "1234567890123456789"));
  EXPECT_FALSE(Matches(IntegerRangeRegex(7, std::nullopt), "12345678901234567890"));
}

TEST(JsonTextRegexTest, BarsAndNestingAreFoundWhereTheyAre) {
  EXPECT_TRUE(HasTopLevelBar("a|b"));
  EXPECT_FALSE(HasTopLevelBar("(a|b)"));
  EXPECT_FALSE(HasTopLevelBar("[|]"));
  EXPECT_FALSE(HasTopLevelBar("[]|]"));
  EXPECT_FALSE(HasTopLevelBar("a\\|b"));
  EXPECT_TRUE(HasTopLevelBar("(a)|[b|]"));
  EXPECT_EQ(JsonNesting(R"({"a": [1, {"b": "[[[{"}]})"), 3);
  EXPECT_EQ(JsonNesting(R"("\"[")"), 0);
}

}  // namespace
}  // namespace thetaserve::scheduler
