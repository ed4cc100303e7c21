// GrammarGuide: the texts a GBNF grammar matches (against hand-made cases, and against the
// regular-expression guide on random grammars both can write), the tokens it lets through,
// UTF-8 split across tokens, recursion, and the grammars it refuses.
#include "scheduler/guided_grammar.h"

#include <algorithm>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/guided_regex.h"

namespace thetaserve::scheduler {
namespace {

std::shared_ptr<const GrammarGuide> MustCompile(const std::string& text) {
  auto g = GrammarGuide::Compile(text);
  EXPECT_TRUE(g.ok()) << text << ": " << g.status();
  return g.ok() ? *g : nullptr;
}

std::vector<int32_t> Allowed(const Guide& g, std::string_view so_far,
                             const TokenBytesIndex& vocab) {
  std::vector<int32_t> ids;
  g.Allowed(so_far, vocab, &ids);
  return ids;
}

// A JSON grammar in GBNF (as llama.cpp's grammars/json.gbnf is written).
constexpr const char* kJson = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)";

TEST(GrammarGuideTest, WholeTextsAreThoseTheGrammarMatches) {
  struct Case {
    const char* grammar;
    const char* text;
    bool match;
  };
  const Case cases[] = {
      {R"(root ::= "yes" | "no")", "yes", true},
      {R"(root ::= "yes" | "no")", "no", true},
      {R"(root ::= "yes" | "no")", "ye", false},
      {R"(root ::= "yes" | "no")", "yesno", false},
      {R"(root ::= "yes" | "no")", "", false},
      // Recursion: balanced parentheses.
      {R"g(root ::= "(" root ")" root | "")g", "", true},
      {R"g(root ::= "(" root ")" root | "")g", "(()())()", true},
      {R"g(root ::= "(" root ")" root | "")g", "(()", false},
      {R"g(root ::= "(" root ")" root | "")g", "())(", false},
      // Rules defined after their use, names with '-' and '_', comments, lines.
      {"root ::= greeting \" \" who # a comment\ngreeting ::= \"hi\" | \"hello\"\n"
       "who ::= my-name | your_name\nmy-name ::= \"me\"\nyour_name ::= \"you\"",
       "hello you", true},
      {"root ::= greeting \" \" who\ngreeting ::= \"hi\" | \"hello\"\nwho ::= \"me\"",
       "hi  me", false},
      // A rule goes on after ::= and '|' at a line's end, and inside a group.
      {"root ::=\n  \"a\" |\n  (\"b\"\n   \"c\")", "bc", true},
      {"root ::=\n  \"a\" |\n  (\"b\"\n   \"c\")", "a", true},
      // ... and, as xgrammar reads it, on the next lines until one begins a rule.
      {"root ::= \"a\"\n  | \"b\" # b\n\n  | \"c\"\n  \"d\"\nx ::= \"e\"", "cd", true},
      {"root ::= \"a\"\n  | \"b\" # b\n\n  | \"c\"\n  \"d\"\nx ::= \"e\"", "b", true},
      {"root ::= \"a\"\n  | \"b\" # b\n\n  | \"c\"\n  \"d\"\nx ::= \"e\"", "c", false},
      {"root ::= \"a\"\n  | \"b\" # b\n\n  | \"c\"\n  \"d\"\nx ::= \"e\"", "e", false},
      // Classes, negation, ranges, any character, escapes.
      {R"(root ::= [a-c0-9]+)", "ab09c", true},
      {R"(root ::= [a-c0-9]+)", "abd", false},
      {R"(root ::= [^a-c]+)", "xyz\n", true},
      {R"(root ::= [^a-c]+)", "xaz", false},
      {R"(root ::= .+)", "any\nthing é", true},
      {R"(root ::= [\]\-\\]+)", "]-\\", true},
      {R"(root ::= "\x41\u00e9\U0001F600\t\"")", "Aé😀\t\"", true},
      {R"(root ::= [α-ω]+ " " [^α-ω]+)", "λόγος abc", false},  // ό is outside α-ω
      {R"(root ::= [α-ω]+ " " [^α-ω]+)", "λογος abc", true},
      // Repetitions of characters, literals and groups.
      {R"(root ::= "ab"+)", "ababab", true},
      {R"(root ::= "ab"+)", "aba", false},
      {R"(root ::= "ab"*)", "", true},
      {R"(root ::= "x" "ab"? "y")", "xy", true},
      {R"(root ::= "x" "ab"? "y")", "xaby", true},
      {R"(root ::= "x" "ab"? "y")", "xababy", false},
      {R"(root ::= [0-9]{2,3} ("-" [0-9]{,2}){2} "!"{1,})", "12--5!!", true},
      {R"(root ::= [0-9]{2,3} ("-" [0-9]{,2}){2} "!"{1,})", "1--5!", false},
      {R"(root ::= [0-9]{2,3} ("-" [0-9]{,2}){2} "!"{1,})", "1234--5!", false},
      {R"(root ::= [0-9]{2,3} ("-" [0-9]{,2}){2} "!"{1,})", "123-99-!", true},
      {R"(root ::= [0-9]{2,3} ("-" [0-9]{,2}){2} "!"{1,})", "123-999-!", false},
      {R"(root ::= [0-9]{2,3} ("-" [0-9]{,2}){2} "!"{1,})", "12--", false},
      {R"(root ::= "a"{3})", "aaa", true},
      {R"(root ::= "a"{3})", "aaaa", false},
      // A cycle back to a rule at an alternative's end is not left recursion.
      {R"(root ::= ("a"?)*)", "aaa", true},
      {"root ::= a\na ::= b | \"x\"\nb ::= a | \"y\"", "y", true},
      // The rules made for groups and repetitions take no name a rule can have.
      {"root ::= (\"a\") root_1\nroot_1 ::= \"b\"", "ab", true},
      // JSON.
      {kJson, R"({"a": [1, -2.5e10, true, null, {"b": "c\"\u00e9"}], "d": {}})", true},
      {kJson, R"({"a": [1, 2,]})", false},
      {kJson, R"({"a": 01})", false},
      {kJson, R"([1])", false},
      {kJson, R"({"a" 1})", false},
  };
  for (const Case& c : cases) {
    auto g = MustCompile(c.grammar);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->Accepts(c.text), c.match) << c.grammar << "\non \"" << c.text << "\"";
  }
}

TEST(GrammarGuideTest, CompleteWhereNothingMayFollow) {
  auto g = MustCompile(R"(root ::= "yes" | "yes!" | "no")");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(g->Accepts("yes"));
  EXPECT_FALSE(g->Complete("yes"));  // "yes!" may follow
  EXPECT_TRUE(g->Complete("yes!"));
  EXPECT_TRUE(g->Complete("no"));
  EXPECT_FALSE(g->Complete("n"));
  auto json = MustCompile(kJson);
  ASSERT_NE(json, nullptr);
  EXPECT_TRUE(json->Accepts("{}"));
  EXPECT_FALSE(json->Complete("{}"));  // whitespace may follow
  EXPECT_TRUE(json->Complete("{} "));  // ws is one space at most: nothing more
}

TEST(GrammarGuideTest, TheNextTokensKeepTheOutputOnTheWayToAWholeText) {
  //                        0    1    2     3     4     5    6  (special)  7
  TokenBytesIndex vocab({"(", ")", "()", "((", "x", ")(", "", "())"});
  auto g = MustCompile(R"g(root ::= "(" root ")" root | "x")g");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Allowed(*g, "", vocab), (std::vector<int32_t>{0, 3, 4}));
  // After "(": another, or x; not ")" (root is not empty here).
  EXPECT_EQ(Allowed(*g, "(", vocab), (std::vector<int32_t>{0, 3, 4}));
  // ")(" closes the group and opens the root after it; "()" and "())" open one inside.
  EXPECT_EQ(Allowed(*g, "(x", vocab), (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(Allowed(*g, "((x", vocab), (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(Allowed(*g, "(x)", vocab), (std::vector<int32_t>{0, 3, 4}));
  EXPECT_TRUE(g->Accepts("(x)x"));
  EXPECT_TRUE(g->LeadsOn("((x)"));
  EXPECT_FALSE(g->LeadsOn("(x))"));
  EXPECT_TRUE(Allowed(*g, "(x)x", vocab).empty());
  EXPECT_TRUE(Allowed(*g, ")", vocab).empty());
}

// A character's bytes may be split between tokens (byte-level BPE): the first half is let
// through only where a character the grammar takes begins with it.
TEST(GrammarGuideTest, ACharacterSplitBetweenTokensIsFollowedByteByByte) {
  const std::string alpha = "α";  // CE B1
  const std::string omega = "ω";  // CF 89
  //                      0                   1                   2      3    4
  TokenBytesIndex vocab({alpha.substr(0, 1), alpha.substr(1), alpha, "a", omega.substr(0, 1)});
  auto g = MustCompile(R"(root ::= "α"+)");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Allowed(*g, "", vocab), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(Allowed(*g, alpha.substr(0, 1), vocab), (std::vector<int32_t>{1}));
  EXPECT_FALSE(g->Accepts(alpha.substr(0, 1)));
  EXPECT_EQ(Allowed(*g, alpha, vocab), (std::vector<int32_t>{0, 2}));
  auto range = MustCompile(R"(root ::= [ά-ϊ])");  // U+03AC-U+03CA: CE AC … CF 8A
  ASSERT_NE(range, nullptr);
  EXPECT_EQ(Allowed(*range, "", vocab), (std::vector<int32_t>{0, 2, 4}));
  auto none = MustCompile(R"(root ::= [^α-ω])");  // CE 91 … CF 89 out; other CE/CF bytes in
  ASSERT_NE(none, nullptr);
  EXPECT_EQ(Allowed(*none, "", vocab), (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(Allowed(*none, "\xce", vocab), std::vector<int32_t>{});  // 1: B1 is α
}

// Random grammars that a regular expression can also write, and random texts: both guides
// must take the same texts and let the same tokens through (two independent automata: the
// regular expression's is a DFA over bytes).
TEST(GrammarGuideTest, MatchesWhatTheSameRegularExpressionMatches) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  const std::vector<std::string> letters = {"a", "b", "1", "é"};
  // Writes one random expression both ways, and a text it matches.
  std::function<void(int, std::string*, std::string*)> make = [&](int depth, std::string* re,
                                                                  std::string* gbnf) {
    const int kind = depth == 0 ? int(rng() % 3) : int(rng() % 8);
    std::string r1, g1, r2, g2;
    switch (kind) {
      case 0: {  // a literal
        std::string lit;
        for (int k = 1 + int(rng() % 3); k > 0; --k) lit += letters[rng() % letters.size()];
        *re = "(?:" + lit + ")";
        *gbnf = "\"" + lit + "\"";
        return;
      }
      case 1: {
        const bool negated = rng() % 2;
        const std::string set = letters[rng() % 3] + letters[rng() % 3];
        *re = std::string("[") + (negated ? "^" : "") + set + "]";
        *gbnf = *re;
        return;
      }
      case 2:
        *re = ".";
        *gbnf = ".";
        return;
      case 3:
        make(depth - 1, &r1, &g1);
        make(depth - 1, &r2, &g2);
        *re = "(?:" + r1 + r2 + ")";
        *gbnf = "(" + g1 + " " + g2 + ")";
        return;
      case 4:
        make(depth - 1, &r1, &g1);
        make(depth - 1, &r2, &g2);
        *re = "(?:" + r1 + "|" + r2 + ")";
        *gbnf = "(" + g1 + " | " + g2 + ")";
        return;
      default: {
        make(depth - 1, &r1, &g1);
        const char* quantifiers[] = {"*", "+", "?", "{2}", "{1,3}", "{,2}", "{2,}"};
        const std::string q = quantifiers[rng() % 7];
        *re = "(?:" + r1 + ")" + q;
        *gbnf = "(" + g1 + ")" + q;
        return;
      }
    }
  };
  int compared = 0, matched = 0;
  for (int round = 0; round < 60; ++round) {
    std::string re, gbnf;
    make(3, &re, &gbnf);
    auto regex = RegexGuide::Compile(re);
    if (!regex.ok()) continue;  // past the automaton's bounds
    auto grammar = MustCompile("root ::= " + gbnf);
    ASSERT_NE(grammar, nullptr) << "seed " << seed;
    std::vector<std::string> tokens(200);
    for (std::string& t : tokens) {
      for (int k = 1 + int(rng() % 4); k > 0; --k) {
        const std::string& l = letters[rng() % letters.size()];
        t += rng() % 8 == 0 ? l.substr(0, 1) : l;  // now and then half of é
      }
    }
    TokenBytesIndex vocab(tokens);
    // Texts: random ones, and ones grown by the guides' own next tokens (so most lead on).
    for (int t = 0; t < 40; ++t) {
      std::string text;
      const bool grow = t % 2 == 0;
      for (int k = int(rng() % 7); k > 0; --k) {
        if (grow) {
          const auto next = Allowed(**regex, text, vocab);
          if (next.empty()) break;
          text += tokens[next[rng() % next.size()]];
        } else {
          text += letters[rng() % letters.size()];
        }
      }
      const std::string where = "seed " + std::to_string(seed) + ": " + re + " vs " + gbnf +
                                " on \"" + text + "\"";
      EXPECT_EQ(grammar->Accepts(text), (*regex)->Accepts(text)) << where;
      EXPECT_EQ(grammar->Complete(text), (*regex)->Complete(text)) << where;
      EXPECT_EQ(Allowed(*grammar, text, vocab), Allowed(**regex, text, vocab)) << where;
      ++compared;
      matched += (*regex)->Accepts(text);
    }
  }
  EXPECT_GT(compared, 1000) << "seed " << seed;
  EXPECT_GT(matched, 50) << "seed " << seed;  // the comparison saw matches, not only misses
}

// A guide remembers the parses of the outputs it has read, so a step reads only the bytes since
// the last: grown byte by byte (characters split included), two outputs in turn, its answers are
// a new guide's.
TEST(GrammarGuideTest, RememberedParsesAnswerAsANewGuideDoes) {
  const std::string text = R"({"a": [1, {"b": "cé\n"}, [[true]], -2.5e3], "d": {"e": null}})";
  const std::string other = R"({"a": [1, 2], "x": "é"})";
  TokenBytesIndex vocab({"{", "\"", "a", "[", "1", ",", " ", "}", "]", "é", "\xc3", "\xa9",
                         "true", ":", "\": ", "]]", "e3"});
  auto g = MustCompile(kJson);
  ASSERT_NE(g, nullptr);
  for (size_t n = 0; n <= text.size(); ++n) {
    for (const std::string& t : {text, other}) {
      if (n > t.size()) continue;
      const std::string so_far = t.substr(0, n);
      auto fresh = MustCompile(kJson);
      ASSERT_NE(fresh, nullptr);
      EXPECT_TRUE(g->LeadsOn(so_far)) << so_far;
      EXPECT_EQ(g->Accepts(so_far), fresh->Accepts(so_far)) << so_far;
      EXPECT_EQ(g->Complete(so_far), fresh->Complete(so_far)) << so_far;
      EXPECT_EQ(Allowed(*g, so_far, vocab), Allowed(*fresh, so_far, vocab)) << so_far;
      EXPECT_FALSE(g->LeadsOn(so_far + "\x01")) << so_far;  // never in JSON, even in a string
    }
  }
  EXPECT_TRUE(g->Accepts(text));
  EXPECT_TRUE(g->Accepts(other));
}

// An alternative that can never end (a rule that never ends, a class with no character) is
// never entered: the guide lets through only what leads to a whole text.
TEST(GrammarGuideTest, AlternativesThatNeverEndAreNeverEntered) {
  TokenBytesIndex vocab({"a", "b", "c", "ab"});
  for (const char* text : {"root ::= \"a\" x | \"b\"\nx ::= \"c\" x",
                           "root ::= \"a\" [^\\x00-\\U0010FFFF] | \"b\""}) {
    auto g = MustCompile(text);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(Allowed(*g, "", vocab), std::vector<int32_t>{1}) << text;
    EXPECT_FALSE(g->LeadsOn("a")) << text;
    EXPECT_TRUE(g->Complete("b")) << text;
  }
}

// The synthetic vocabulary of the sampler bench: 49,152 distinct strings of 1–8 letters, half
// after a space.
std::vector<std::string> LetterVocabulary() {
  std::mt19937 rng(1);
  std::set<std::string> seen;
  std::vector<std::string> tokens;
  while (tokens.size() < 49152) {
    std::string t = tokens.size() % 2 ? " " : "";
    for (int n = 1 + int(rng() % 8); n > 0; --n) t += char('a' + rng() % 26);
    if (seen.insert(t).second) tokens.push_back(t);
  }
  return tokens;
}

// A grammar that makes stack nodes at every character (each letter opens a level that its
// capital closes) would pass kMaxGrammarNodes within one walk of a large vocabulary; the walk
// frees them between first bytes and finds every token a token-by-token check finds.
TEST(GrammarGuideTest, AWalkOfALargeVocabularyFindsEveryToken) {
  std::string text = "root ::= p\np ::= \"\"";
  for (char c = 'a'; c <= 'z'; ++c) {
    text += std::string(" | \"") + c + "\" p \"" + char(c - 'a' + 'A') + "\"";
  }
  auto g = MustCompile(text);
  ASSERT_NE(g, nullptr);
  const std::vector<std::string> tokens = LetterVocabulary();
  TokenBytesIndex vocab(tokens);
  for (const std::string so_far : {"", "ab"}) {
    std::vector<int32_t> want;
    for (int32_t id = 0; id < int32_t(tokens.size()); ++id) {
      if (g->LeadsOn(so_far + tokens[id])) want.push_back(id);
    }
    EXPECT_EQ(want.size(), 24576u);  // the tokens without a space
    EXPECT_EQ(Allowed(*g, so_far, vocab), want) << "after \"" << so_far << "\"";
  }
  // 2,500 levels open: 27 stacks 2,500 deep sharing their tails, a key of about 20 KB (each
  // level written once; written stack by stack it was 270 KB, too large to remember), the
  // state made again from it after each reset. Every token without a space leads on.
  const std::vector<int32_t> deep = Allowed(*g, std::string(2500, 'a'), vocab);
  EXPECT_EQ(deep.size(), 24576u);
  for (int32_t id : deep) EXPECT_NE(tokens[id][0], ' ') << tokens[id];
}

// Grammars built to be ambiguous. A thousand alternatives alike: a thousand stacks move
// together, sharing their expansions (where each expanded apart, one walk of this vocabulary
// took a minute and a half). A thousand-fold repetition inside a repetition: after 100
// characters a hundred ways to read them, each its own top, and a walk past kMaxGrammarWork:
// it stops there, every token it let through leading on, and the next call stops at the same
// place.
TEST(GrammarGuideTest, GrammarsBuiltToBeAmbiguousStayBounded) {
  const std::vector<std::string> tokens = LetterVocabulary();  // every one [a-z ]+
  TokenBytesIndex vocab(tokens);
  std::string text = "root ::= item*\nitem ::= [a-z ]";
  for (int i = 1; i < 1000; ++i) text += " | [a-z ]";
  auto alike = MustCompile(text);
  ASSERT_NE(alike, nullptr);
  EXPECT_EQ(Allowed(*alike, "", vocab).size(), tokens.size());
  EXPECT_EQ(Allowed(*alike, "ab c", vocab).size(), tokens.size());

  auto nested = MustCompile("root ::= ([a-z ]{0,1000})*");
  ASSERT_NE(nested, nullptr);
  const std::string so_far(100, 'a');
  const std::vector<int32_t> allowed = Allowed(*nested, so_far, vocab);
  EXPECT_LT(allowed.size(), tokens.size());  // every token leads on: the walk stopped
  EXPECT_GT(allowed.size(), 0u);
  for (size_t i = 0; i < allowed.size(); i += 97) {
    EXPECT_TRUE(nested->LeadsOn(so_far + tokens[allowed[i]])) << tokens[allowed[i]];
  }
  // Again, its parse of so_far remembered now (read again, or made from what was remembered).
  EXPECT_EQ(Allowed(*nested, so_far, vocab), allowed);
  EXPECT_EQ(Allowed(*nested, so_far, vocab), allowed);
  EXPECT_TRUE(nested->Accepts(so_far + " b"));

  // Readings that multiply under one top (joins keep their members' alike tops apart, so the
  // graph doubles at each character): past kMaxJoinMembers stacks under one top the call stops
  // there (a review measured 0.3-1.3 s a call reaching kMaxGrammarNodes before that bound).
  auto multiplying = MustCompile("root ::= r\nr ::= g r r r | \"\"\ng ::= \"b\"");
  ASSERT_NE(multiplying, nullptr);
  EXPECT_TRUE(multiplying->Accepts(std::string(6, 'b')));
  EXPECT_FALSE(multiplying->LeadsOn(std::string(30, 'b')));  // the bound, not the grammar
}

// One guide is shared by a call's completions and read by the sampling threads at once: its
// remembered parses and next tokens are locked. Four threads read prefixes of two outputs in
// different orders and get what one thread got.
TEST(GrammarGuideTest, ThreadsSharingAGuideGetWhatOneThreadGets) {
  const std::vector<std::string> texts = {R"({"a": [1, {"b": "c"}], "d": true})",
                                          R"({"x": "yz", "w": [[], {}]})"};
  TokenBytesIndex vocab({"{", "\"", "a", "[", "1", ",", " ", "}", "]", "true", ":", "\": ",
                         "x", "yz", "[]", "{}"});
  std::vector<std::string> prefixes;
  for (const std::string& t : texts) {
    for (size_t n = 0; n <= t.size(); ++n) prefixes.push_back(t.substr(0, n));
  }
  std::vector<std::vector<int32_t>> want;
  std::vector<bool> whole;
  {
    auto alone = MustCompile(kJson);
    ASSERT_NE(alone, nullptr);
    for (const std::string& p : prefixes) {
      want.push_back(Allowed(*alone, p, vocab));
      whole.push_back(alone->Accepts(p));
    }
  }
  auto shared = MustCompile(kJson);
  ASSERT_NE(shared, nullptr);
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < prefixes.size(); ++i) {
          const size_t k = (i * 7 + size_t(t) * 13 + size_t(round)) % prefixes.size();
          wrong[t] += Allowed(*shared, prefixes[k], vocab) != want[k];
          wrong[t] += shared->Accepts(prefixes[k]) != whole[k];
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
}

// Alternatives that part and then read the same thing keep one stack per top (the stacks under
// them joined), where apart they doubled at every level: past kMaxGrammarStacks (ten levels of
// two array forms, 1,024 x's here) the output went no further.
TEST(GrammarGuideTest, AlternativesThatPartAndMeetAgainKeepOneParse) {
  // After n x's, one way to read them per number of y's still allowed.
  auto optional = MustCompile("root ::= \"x\" root opt | \"\"\nopt ::= \"y\" | \"\"");
  ASSERT_NE(optional, nullptr);
  const std::string xs(1500, 'x');
  EXPECT_TRUE(optional->Accepts(xs + std::string(1000, 'y')));
  EXPECT_TRUE(optional->Accepts(xs + std::string(1500, 'y')));
  EXPECT_FALSE(optional->LeadsOn(xs + std::string(1501, 'y')));
  EXPECT_FALSE(optional->LeadsOn(xs + "yx"));

  // Two array forms of the same items, one of at most two: both enter the item at every level.
  const std::string arrays =
      "root ::= value\nvalue ::= many | few | \"0\"\n"
      "many ::= \"[\" value (\",\" value)* \"]\"\nfew ::= \"[\" value (\",\" value)? \"]\"";
  auto g = MustCompile(arrays);
  ASSERT_NE(g, nullptr);
  TokenBytesIndex vocab({"[", "]", ",", "0", "x", "]]", "0]"});
  const std::string open(300, '[');
  EXPECT_TRUE(g->Accepts(open + "0" + std::string(300, ']')));
  EXPECT_TRUE(g->Accepts(open + "0,0,0" + std::string(300, ']')));
  EXPECT_FALSE(g->LeadsOn(open + "0" + std::string(301, ']')));
  EXPECT_EQ(Allowed(*g, open + "0", vocab), (std::vector<int32_t>{1, 2, 5}));
  EXPECT_EQ(Allowed(*g, open, vocab), (std::vector<int32_t>{0, 3, 6}));
  // Grown a token at a time from what it lets through, it answers as a new guide does (its
  // remembered parses, keys of joined stacks, made again from those keys).
  std::mt19937 rng(7);
  std::string text;
  for (int step = 0; step < 400; ++step) {
    const std::vector<int32_t> next = Allowed(*g, text, vocab);
    auto fresh = MustCompile(arrays);
    ASSERT_NE(fresh, nullptr);
    ASSERT_EQ(next, Allowed(*fresh, text, vocab)) << text;
    ASSERT_EQ(g->Accepts(text), fresh->Accepts(text)) << text;
    if (next.empty()) break;
    // 150 levels deep, then any way on.
    const int32_t id = step < 150 ? 0 : next[rng() % next.size()];
    text += std::vector<std::string>{"[", "]", ",", "0", "x", "]]", "0]"}[id];
  }
  EXPECT_GE(std::count(text.begin(), text.end(), '['), 150) << text;
  EXPECT_GE(text.size(), 400u) << text;
}

// Past kMaxGrammarStacks stacks at once (a rule of more alternatives than that, each its own
// top) the output goes no further.
TEST(GrammarGuideTest, AnAmbiguityPastTheBoundEndsTheText) {
  auto wide = [](int n) {
    std::string text = "root ::= \"x\" r\nr ::= \"a0\"";
    for (int i = 1; i < n; ++i) text += " | \"a" + std::to_string(i) + "\"";
    return text;
  };
  auto within = MustCompile(wide(1000));
  ASSERT_NE(within, nullptr);
  EXPECT_TRUE(within->Accepts("xa999"));
  auto past = MustCompile(wide(1100));
  ASSERT_NE(past, nullptr);
  EXPECT_FALSE(past->LeadsOn("x"));
}

TEST(GrammarGuideTest, RefusesWhatItCannotParseAndSaysWhere) {
  auto refused = [](const std::string& text, const std::string& why) {
    auto g = GrammarGuide::Compile(text);
    if (g.ok()) return ::testing::AssertionFailure() << text << " compiled";
    if (g.status().code() != absl::StatusCode::kInvalidArgument ||
        g.status().message().find(why) == std::string_view::npos) {
      return ::testing::AssertionFailure() << text << ": " << g.status();
    }
    return ::testing::AssertionSuccess();
  };
  EXPECT_TRUE(refused("value ::= \"a\"", "no rule 'root'"));
  EXPECT_TRUE(refused("root ::= value", "line 1, column 10: rule 'value' is used but not defined"));
  EXPECT_TRUE(refused("root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is "
                                                         "defined twice"));
  EXPECT_TRUE(refused("root ::= \"a", "line 1, column 10: a literal without its closing \""));
  EXPECT_TRUE(refused("root ::= [a-", "a class without its closing ]"));
  EXPECT_TRUE(refused("root ::= [z-a]", "a class range whose end comes before its start"));
  EXPECT_TRUE(refused("root ::= (\"a\"", "a group without its closing )"));
  EXPECT_TRUE(refused("root ::= \"a\")", "line 1, column 13: a ) without its opening ("));
  EXPECT_TRUE(refused("root ::= * \"a\"", "'*' with nothing before it to repeat"));
  EXPECT_TRUE(refused("root ::= \"a\"{3,2}", "{m,n} with n below m"));
  EXPECT_TRUE(refused("root ::= \"a\"{1001}", "a repetition count above 1000"));
  EXPECT_TRUE(refused("root ::= \"a\"{x}", "expected {m}, {m,}, {,n} or {m,n}"));
  EXPECT_TRUE(refused("root = \"a\"", "expected ::= after the rule name 'root'"));
  EXPECT_TRUE(refused("::= \"a\"", "expected a rule's name"));
  EXPECT_TRUE(refused("start: \"a\"", "expected ::= after the rule name 'start' (the grammar is "
                                      "GBNF, as llama.cpp and vLLM's xgrammar backend read it"));
  EXPECT_TRUE(refused("?start: expr", "Lark's `name: ...` is not read"));
  EXPECT_TRUE(refused("root ::= \"\\q\"", "unknown escape \\q"));
  EXPECT_TRUE(refused("root ::= \"\\uD800\"", "U+D800, which is not a character"));
  EXPECT_TRUE(refused("root ::= \"\xff\"", "not valid UTF-8"));
  EXPECT_TRUE(refused("root ::= \"\x80\"", "not valid UTF-8"));  // a continuation byte alone
  EXPECT_TRUE(refused("root ::= \"a\" ~", "unexpected '~'"));
  EXPECT_TRUE(refused("root ::= <[1000]>", "unexpected '<'"));  // llama.cpp's token ids
  EXPECT_TRUE(refused("root ::= [^\\x00-\\U0010FFFF]", "no text matches rule 'root'"));
  EXPECT_TRUE(refused("root ::= a\na ::= \"(\" a \")\"", "no text matches rule 'root'"));
  EXPECT_TRUE(refused("root ::= root \"a\" | \"b\"",
                      "rule 'root' is left-recursive (root -> root before reading"));
  EXPECT_TRUE(refused("root ::= expr\nexpr ::= term | sum\nsum ::= expr \"+\" term\n"
                      "term ::= [0-9]",
                      "rule 'sum' is left-recursive (sum -> expr -> sum"));
  EXPECT_TRUE(refused("root ::= \"a\"? root \"b\" | \"c\"", "left-recursive"));
  EXPECT_TRUE(refused(std::string(kMaxGrammarBytes + 1, ' '), "at most 65536"));
  std::string wide = "root ::=";  // 201 copies of 1000 characters
  for (int i = 0; i < 201; ++i) wide += " \"a\"{1000}";
  EXPECT_TRUE(refused(wide, "more than 200000 elements"));
  std::string deep = "root ::= ";
  for (int i = 0; i < 70; ++i) deep += "(";
  EXPECT_TRUE(refused(deep, "groups nested more than 64 deep"));
}

}  // namespace
}  // namespace thetaserve::scheduler
