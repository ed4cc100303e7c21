// RegexGuide: whole matches as Python's re.fullmatch decides them, the tokens it lets through
// (the vocabulary walk against a token-by-token check), UTF-8 split across tokens, and the
// patterns it refuses.
#include "scheduler/guided_regex.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace thetaserve::scheduler {
namespace {

std::shared_ptr<const RegexGuide> MustCompile(const std::string& pattern) {
  auto g = RegexGuide::Compile(pattern);
  EXPECT_TRUE(g.ok()) << pattern << ": " << g.status();
  return g.ok() ? *g : nullptr;
}

// The expectations are Python 3.11's re.fullmatch(pattern, text) is not None.
TEST(RegexGuideTest, WholeMatchesAreThoseOfPythonsFullmatch) {
  struct Case {
    const char* pattern;
    const char* text;
    bool match;
  };
  const Case cases[] = {
      {R"(\d{3}-\d{4})", "555-1234", true},
      {R"(\d{3}-\d{4})", "5551234", false},
      {R"(\d{3}-\d{4})", "555-123", false},
      {R"(\d{3}-\d{4})", "555-12345", false},
      {R"(\d{3}-\d{4})", "abc-defg", false},
      {"(yes|no|maybe)", "maybe", true},
      {"(yes|no|maybe)", "ye", false},
      {"(yes|no|maybe)", "yesno", false},
      {"(yes|no|maybe)", "", false},
      {"[A-Z][a-z]+( [A-Z][a-z]+)*", "New York", true},
      {"[A-Z][a-z]+( [A-Z][a-z]+)*", "new york", false},
      {"[A-Z][a-z]+( [A-Z][a-z]+)*", "New  York", false},
      {"[A-Z][a-z]+( [A-Z][a-z]+)*", "P", false},
      {R"(\w+@\w+\.com)", "a_b@c9.com", true},
      {R"(\w+@\w+\.com)", "a@b.org", false},
      {R"(\w+@\w+\.com)", "ab@.com", false},
      {"a{2,3}b{,2}c{2,}", "aac", false},
      {"a{2,3}b{,2}c{2,}", "aacc", true},
      {"a{2,3}b{,2}c{2,}", "aaabbcc", true},
      {"a{2,3}b{,2}c{2,}", "abcc", false},
      {"a{2,3}b{,2}c{2,}", "aaaabcc", false},
      {"a{2,3}b{,2}c{2,}", "aabbbcc", false},
      {"a{2,3}b{,2}c{2,}", "aacccccc", true},
      {"x{}y", "x{}y", true},
      {"x{}y", "xy", false},
      {"a{,}", "", true},
      {"a{,}", "aaaa", true},
      {"[^abc]+", "xyz", true},
      {"[^abc]+", "xaz", false},
      {"[^abc]+", "é", true},
      {"[^abc]+", "\n", true},
      {"[]a]+", "]a]", true},
      {"[]a]+", "b", false},
      {R"([a\-z])", "-", true},
      {R"([a\-z])", "b", false},
      {R"([\d.]+)", "3.14", true},
      {R"([\d.]+)", "3,14", false},
      {R"(\S+\s\S+)", "hello world", true},
      {R"(\S+\s\S+)", "hello  world", false},
      {R"(\S+\s\S+)", "hello\tworld", true},
      {R"(\x41\u00e9\U0001F600)", "Aé😀", true},
      {R"(\x41\u00e9\U0001F600)", "Ae😀", false},
      {".*", "anything at all", true},
      {".*", "two\nlines", false},
      {".*", "", true},
      {"(?:ab)+(?P<n>c)?", "ababc", true},
      {"(?:ab)+(?P<n>c)?", "abcab", false},
      {"^héllo wörld$", "héllo wörld", true},
      {"^héllo wörld$", "hello world", false},
      {"[α-ω]{2}", "αβ", true},
      {"[α-ω]{2}", "ab", false},
      {"[α-ω]{2}", "α", false},
      {"colou?r", "colour", true},
      {"colou?r", "colouur", false},
      {"a+?b*?", "aab", true},
      {"a+?b*?", "b", false},
      {R"(\.\*\+\?\(\)\[\]\{\}\|\\)", R"(.*+?()[]{}|\)", true},
      {"(a|)b", "b", true},
      {R"([\w-]+)", "foo-bar_9", true},
      {R"([\w-]+)", "foo bar", false},
      {R"(\012)", "\n", true},  // octal escapes, as Python reads them
      {R"([a-z\012])", "\n", true},
      {R"(\07)", "\a", true},
      {R"(\141)", "a", true},
      {R"([\1])", "\x01", true},
      {R"(\0012)", "\x01" "2", true},
      {"^a|^b", "b", true},  // anchors where nothing comes before or after
      {"a$|b$", "a", true},
      {R"(\Aab\Z)", "ab", true},
      {"(^a)|b", "a", true},
  };
  for (const Case& c : cases) {
    auto g = MustCompile(c.pattern);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->Accepts(c.text), c.match) << c.pattern << " on \"" << c.text << "\"";
  }
}

TEST(RegexGuideTest, APrefixLivesOnlyWhileAMatchCanFollow) {
  auto g = MustCompile(R"(\d{3}-\d{4})");
  ASSERT_NE(g, nullptr);
  EXPECT_NE(g->Step(RegexGuide::kStart, "555-"), RegexGuide::kDead);
  EXPECT_EQ(g->Step(RegexGuide::kStart, "55a"), RegexGuide::kDead);
  EXPECT_EQ(g->Step(RegexGuide::kStart, "555-12345"), RegexGuide::kDead);
  EXPECT_TRUE(g->Complete("555-1234"));  // nothing may follow a whole match
  auto more = MustCompile("a+");
  ASSERT_NE(more, nullptr);
  EXPECT_TRUE(more->Accepts("aa"));
  EXPECT_FALSE(more->Complete("aa"));  // a match that may go on: EOS or more
  // A branch that cannot reach the end is cut: after "ab" the empty class [^\s\S] must match.
  auto cut = MustCompile(R"(a(b[^\s\S])?|ac)");
  ASSERT_NE(cut, nullptr);
  EXPECT_TRUE(cut->Accepts("a"));
  EXPECT_NE(cut->Step(RegexGuide::kStart, "a"), RegexGuide::kDead);
  EXPECT_EQ(cut->Step(RegexGuide::kStart, "ab"), RegexGuide::kDead);
  EXPECT_FALSE(cut->Complete("a"));  // "ac" may follow
}

std::vector<int32_t> Allowed(const RegexGuide& g, std::string_view so_far,
                             const TokenBytesIndex& vocab) {
  std::vector<int32_t> ids;
  g.Allowed(so_far, vocab, &ids);
  return ids;
}

TEST(RegexGuideTest, TheNextTokensKeepTheOutputOnTheWayToAMatch) {
  //                        0    1    2     3    4     5    6  (special)
  TokenBytesIndex vocab({"a", "b", "ab", "1", "12", "x", "", "123"});
  auto g = MustCompile(R"(a+b?\d{1,2})");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Allowed(*g, "", vocab), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(Allowed(*g, "a", vocab), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(Allowed(*g, "ab", vocab), (std::vector<int32_t>{3, 4}));  // not "123": 3 digits
  EXPECT_EQ(Allowed(*g, "ab1", vocab), (std::vector<int32_t>{3}));
  EXPECT_TRUE(Allowed(*g, "ab12", vocab).empty());
  EXPECT_TRUE(Allowed(*g, "x", vocab).empty());
}

// A character's bytes may be split between tokens (byte-level BPE): each half is allowed where
// it leads on, and nothing that breaks the character.
TEST(RegexGuideTest, ACharacterSplitBetweenTokensIsFollowedByteByByte) {
  const std::string alpha = "α";  // CE B1
  TokenBytesIndex vocab({alpha.substr(0, 1), alpha.substr(1), alpha, "a", "\xce\xb2"});
  auto g = MustCompile("α+");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Allowed(*g, "", vocab), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(Allowed(*g, alpha.substr(0, 1), vocab), (std::vector<int32_t>{1}));
  EXPECT_EQ(Allowed(*g, alpha, vocab), (std::vector<int32_t>{0, 2}));
  auto any = MustCompile(".");
  ASSERT_NE(any, nullptr);
  EXPECT_EQ(Allowed(*any, "", vocab), (std::vector<int32_t>{0, 2, 3, 4}));
  EXPECT_EQ(Allowed(*any, "\xce", vocab), (std::vector<int32_t>{1}));
}

// The walk shares the steps of common prefixes and skips whole subtrees; token by token, with
// Step, must find the same tokens. Random vocabularies over a small alphabet (many shared
// prefixes, many dead ones).
TEST(RegexGuideTest, TheVocabularyWalkFindsWhatATokenByTokenCheckFinds) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  const std::string alphabet = "ab1- é";
  const char* patterns[] = {"(ab|a1)+-?", R"([ab]{2,5}\d*)", "a*b*1*", "(é|a)+ ?b",
                            R"([^-]{1,3}-[^ ]+)", "-+"};
  for (int round = 0; round < 20; ++round) {
    std::vector<std::string> tokens(300);
    for (std::string& t : tokens) {
      const int len = 1 + int(rng() % 6);
      for (int k = 0; k < len; ++k) t += alphabet[rng() % alphabet.size()];  // é's bytes apart
    }
    TokenBytesIndex vocab(tokens);
    for (const char* p : patterns) {
      auto g = MustCompile(p);
      ASSERT_NE(g, nullptr);
      for (const std::string so_far : {"", "a", "ab", "aba1", "\xc3", "é", "ab1-"}) {
        const int32_t state = g->Step(RegexGuide::kStart, so_far);
        std::vector<int32_t> want;
        if (state != RegexGuide::kDead) {
          for (int32_t id = 0; id < int32_t(tokens.size()); ++id) {
            if (g->Step(state, tokens[id]) != RegexGuide::kDead) want.push_back(id);
          }
        }
        EXPECT_EQ(Allowed(*g, so_far, vocab), want)
            << p << " after \"" << so_far << "\", seed " << seed << " round " << round;
      }
    }
  }
}

TEST(RegexGuideTest, RefusesWhatItCannotMatchAndSaysWhy) {
  auto refused = [](const std::string& pattern, const std::string& why) {
    auto g = RegexGuide::Compile(pattern);
    if (g.ok()) return ::testing::AssertionFailure() << pattern << " compiled";
    if (g.status().message().find(why) == std::string_view::npos) {
      return ::testing::AssertionFailure() << pattern << ": " << g.status();
    }
    return ::testing::AssertionSuccess();
  };
  EXPECT_TRUE(refused("(ab", "missing ), unterminated subpattern at position 0"));
  EXPECT_TRUE(refused("ab)", "unbalanced parenthesis at position 2"));
  EXPECT_TRUE(refused("*a", "nothing to repeat at position 0"));
  EXPECT_TRUE(refused("a**", "multiple repeat at position 2"));
  EXPECT_TRUE(refused("a++", "possessive repeat"));
  EXPECT_TRUE(refused(R"((a)\1)", "back-references"));
  EXPECT_TRUE(refused("(?=a)b", "look-arounds"));
  EXPECT_TRUE(refused("(?i)a", "flags"));
  EXPECT_TRUE(refused(R"(\bword)", "\\b at position 0 is not supported"));
  EXPECT_TRUE(refused("a^b", "^ at position 1 is not at the start"));
  EXPECT_TRUE(refused("a?^b", "^ at position 2 is not at the start"));  // a? may be empty
  EXPECT_TRUE(refused("(a$)b", "$ at position 2 is not at the end"));
  EXPECT_TRUE(refused(R"([\d-z])", "bad character range at position 1"));
  EXPECT_TRUE(refused(R"(\400)", "octal escape at position 0 is over \\377"));
  EXPECT_TRUE(refused("[ab", "unterminated character set"));
  EXPECT_TRUE(refused("[z-a]", "bad character range"));
  EXPECT_TRUE(refused("a{3,2}", "the minimum is over the maximum"));
  EXPECT_TRUE(refused("a{1001}", "over 1000"));
  EXPECT_TRUE(refused("ab\\", "ends with a backslash"));
  EXPECT_TRUE(refused("\xff", "not valid UTF-8"));
  EXPECT_TRUE(refused(R"([^\x00-\U0010FFFF])", "matches nothing"));
  EXPECT_TRUE(refused("(a{1000}){100}", "too large"));
  // 2^16 states to remember the last 16 letters.
  EXPECT_TRUE(refused("(a|b)*a(a|b){15}", "too complex"));
  EXPECT_TRUE(refused(std::string(4097, 'a'), "at most 4096"));
  // Small patterns with large automata are refused quickly (each once took seconds to minutes
  // and gigabytes): empty alternatives repeated, and repeats whose sets of states grow.
  EXPECT_TRUE(refused("(?:(?:" + std::string(2000, '|') + "a){1000}){20}", "too large"));
  EXPECT_TRUE(refused("(?:.?){1000}(?:.?){1000}", "too complex"));
  EXPECT_TRUE(refused("[ab]*a[ab]{13}(?:.?){1000}", "too complex"));
  EXPECT_TRUE(refused(std::string(65, '(') + "a" + std::string(65, ')'),
                      "more than 64 groups nested at position 64"));
  EXPECT_TRUE(RegexGuide::Compile(std::string(64, '(') + "a" + std::string(64, ')')).ok());
}

// Long bounded repeats of any character (".{0,1000}": up to 1000 characters of free text)
// stay within the bounds: UTF-8's continuation bytes multiply the states.
TEST(RegexGuideTest, ALongFreeTextFieldCompiles) {
  auto g = MustCompile(R"(\{"answer": ".{0,600}"\})");
  ASSERT_NE(g, nullptr);
  EXPECT_LT(g->num_states(), kMaxRegexDfaStates);
  EXPECT_TRUE(g->Accepts(R"({"answer": "αβγ and more"})"));
}

}  // namespace
}  // namespace thetaserve::scheduler
