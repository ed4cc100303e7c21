// GrammarGuide: the texts a GBNF grammar matches (against hand-made cases, and against the
// regular-expression guide on random grammars both can write), the tokens it lets through,
// UTF-8 split across tokens, recursion (against an Earley recognizer on random grammars), and
// the grammars it refuses.
#include "scheduler/guided_grammar.h"

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "model/tokenizer_utf8.h"
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

// An Earley recognizer over the grammar as written (ParseGrammar's: no factoring, no stacks, no
// bounds): whether `text` is the beginning of some text of the grammar, and if so whether it is
// one (*whole) and one nothing may follow (*complete). The text is whole characters.
bool EarleyLeadsOn(const Grammar& g, std::string_view text, bool* whole, bool* complete) {
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < text.size();) {
    int len = 0;
    cps.push_back(model::DecodeUtf8At(text, i, &len));
    i += size_t(len);
  }
  using Item = std::tuple<int32_t, int32_t, int32_t>;  // rule, position, the set it began in
  struct Set {
    std::vector<Item> items;
    std::set<Item> has;
    std::map<int32_t, std::vector<Item>> waiting;  // [rule]: the items about to read it
    std::set<int32_t> ended;                        // rules read whole within this set
  };
  std::vector<Set> sets(cps.size() + 1);
  auto add = [&](size_t k, const Item& item) {
    if (!sets[k].has.insert(item).second) return;
    sets[k].items.push_back(item);
    const GrammarElement& e = g.elements[std::get<1>(item)];
    if (e.kind == GrammarElement::kRule) sets[k].waiting[e.value].push_back(item);
  };
  for (int32_t a : g.rules[g.root]) add(0, {g.root, a, 0});
  for (size_t k = 0; k <= cps.size(); ++k) {
    Set& set = sets[k];
    for (size_t i = 0; i < set.items.size(); ++i) {  // predict and complete
      const auto [rule, p, origin] = set.items[i];
      const GrammarElement& e = g.elements[p];
      if (e.kind == GrammarElement::kRule) {
        for (int32_t a : g.rules[e.value]) add(k, {e.value, a, int32_t(k)});
        if (set.ended.contains(e.value)) add(k, {rule, p + 1, origin});  // it matched nothing
      } else if (e.kind == GrammarElement::kEnd) {
        if (size_t(origin) == k) set.ended.insert(rule);
        const auto it = sets[origin].waiting.find(rule);
        if (it == sets[origin].waiting.end()) continue;
        const std::vector<Item> waiting = it->second;  // a copy: add may grow it
        for (const auto& [r2, p2, o2] : waiting) add(k, {r2, p2 + 1, o2});
      }
    }
    if (k == cps.size()) break;
    for (const auto& [rule, p, origin] : set.items) {  // scan
      const GrammarElement& e = g.elements[p];
      if (e.kind == GrammarElement::kClass && g.classes[e.value].Contains(cps[k])) {
        add(k + 1, {rule, p + 1, origin});
      }
    }
    if (sets[k + 1].items.empty()) return false;
  }
  *whole = false;
  bool more = false;
  for (const auto& [rule, p, origin] : sets.back().items) {
    const GrammarElement& e = g.elements[p];
    *whole |= rule == g.root && origin == 0 && e.kind == GrammarElement::kEnd;
    more |= e.kind == GrammarElement::kClass;
  }
  *complete = *whole && !more;
  return true;
}

struct EarleyComparison {
  int grammars = 0, texts = 0, whole = 0;
  int wrong = 0;   // a token let through, or an answer given, that Earley's contradicts
  int missed = 0;  // texts whose next tokens lacked some Earley finds (the guide's bounds)
  std::string first, first_wrong;  // the first of either, and of the wrong, to print
};

// Random grammars of up to four mutually recursive rules (literals, classes, references, groups,
// alternatives, every repetition, empty alternatives) over a, b, c and é, each with texts grown
// from its own next tokens and random ones over a vocabulary that splits é now and then: the
// guide's answers against Earley's, every token of the vocabulary checked.
EarleyComparison CompareWithEarley(uint32_t seed, int rounds) {
  std::mt19937 rng(seed);
  const std::vector<std::string> letters = {"a", "b", "c", "é"};
  EarleyComparison out;
  for (int round = 0; round < rounds; ++round) {
    const int rules = 1 + int(rng() % 4);
    // (Each draw its own statement: the order of an expression's operands is the compiler's,
    // and seed 1's grammars must be the same under any.)
    std::function<std::string(int)> item = [&](int depth) -> std::string {
      const auto kind = depth <= 0 ? rng() % 3 : rng() % 7;
      if (kind == 1 || kind == 3 || kind == 4) {
        const std::string first = kind == 1 ? letters[rng() % 3] : item(depth - 1);
        const std::string second = kind == 1 ? letters[rng() % 3] : item(depth - 1);
        return kind == 1 ? "[" + first + second + "]"
                         : "(" + first + (kind == 3 ? " " : " | ") + second + ")";
      }
      switch (kind) {
        case 0: {
          std::string literal;
          for (int k = 1 + int(rng() % 2); k > 0; --k) literal += letters[rng() % 4];
          return "\"" + literal + "\"";
        }
        case 2: return "r" + std::to_string(rng() % rules);
        default: {
          const char* repeats[] = {"*", "+", "?", "{2}", "{1,3}", "{,2}"};
          const std::string repeated = item(depth - 1);
          return "(" + repeated + ")" + repeats[rng() % 6];
        }
      }
    };
    std::string text = "root ::= r0\n";
    for (int r = 0; r < rules; ++r) {
      text += 'r' + std::to_string(r) + " ::= ";
      for (int a = 1 + int(rng() % 3); a > 0; --a) {
        for (int k = 1 + int(rng() % 3); k > 0; --k) text += item(2) + " ";
        if (a > 1) text += "| ";
      }
      if (rng() % 4 == 0) text += "| \"\"";
      text += "\n";
    }
    auto guide = GrammarGuide::Compile(text);
    if (!guide.ok()) continue;  // left-recursive, or no text
    const Grammar written = *ParseGrammar(text);
    ++out.grammars;
    std::vector<std::string> tokens(150);
    for (std::string& t : tokens) {
      for (int k = 1 + int(rng() % 3); k > 0; --k) {
        const std::string& l = letters[rng() % 4];
        t += rng() % 8 == 0 ? l.substr(0, 1) : l;  // now and then half of é
      }
    }
    TokenBytesIndex vocab(tokens);
    const GrammarGuide& g = **guide;
    for (int t = 0; t < 30; ++t) {
      std::string so_far;
      for (int k = int(rng() % 10); k > 0; --k) {
        if (t % 3 != 0) {
          const std::vector<int32_t> next = Allowed(g, so_far, vocab);
          if (next.empty()) break;
          const std::string& token = tokens[next[rng() % next.size()]];
          if (!model::IsValidUtf8(so_far + token)) break;  // a split é: judged below
          so_far += token;
        } else {
          so_far += letters[rng() % 4];
        }
      }
      ++out.texts;
      bool whole = false, complete = false;
      const bool leads = EarleyLeadsOn(written, so_far, &whole, &complete);
      out.whole += leads && whole;
      std::string why;
      // A parse the guide read through is exact; past a bound it answers no.
      if (g.LeadsOn(so_far)) {
        if (!leads) why = "leads on";
        if (g.Accepts(so_far) != (leads && whole)) why += " accepts";
        if (g.Complete(so_far) != (leads && complete)) why += " complete";
      } else if (leads && so_far.size() < 4) {
        why = "does not lead on (too short to pass a bound)";
      }
      const std::vector<int32_t> allowed = Allowed(g, so_far, vocab);
      bool missed = false;
      for (int32_t id = 0; id < int32_t(tokens.size()); ++id) {
        const std::string next = so_far + tokens[id];
        if (!model::IsValidUtf8(next)) continue;  // ends in half of é: not judged
        bool w, c;
        const bool in = std::binary_search(allowed.begin(), allowed.end(), id);
        const bool ok = leads && EarleyLeadsOn(written, next, &w, &c);
        if (in && !ok) why += " lets \"" + tokens[id] + "\" through";
        missed |= ok && !in;
      }
      if (!why.empty() || missed) {
        out.wrong += !why.empty();
        out.missed += missed;
        const std::string where = "seed " + std::to_string(seed) + " round " +
                                  std::to_string(round) + " after \"" + so_far + "\": " +
                                  (why.empty() ? "missed tokens" : why) + "\n" + text;
        if (out.first.empty()) out.first = where;
        if (out.first_wrong.empty() && !why.empty()) out.first_wrong = where;
      }
    }
  }
  return out;
}

// Against Earley on fresh random grammars: nothing let through, accepted or said complete that
// Earley refuses, and next tokens missed after at most 2% of the texts (a grammar built
// ambiguous enough to pass a bound may miss some: none did in 15 runs of this test, 15,000
// texts, but a fresh seed must not fail on it); on seed 1, every answer Earley's.
TEST(GrammarGuideTest, AnswersAsAnEarleyRecognizerDoes) {
  const uint32_t seed = std::random_device{}();
  const EarleyComparison fresh = CompareWithEarley(seed, 100);
  EXPECT_EQ(fresh.wrong, 0) << fresh.first_wrong;
  EXPECT_LE(fresh.missed, fresh.texts / 50) << fresh.first;
  EXPECT_GT(fresh.grammars, 15) << "seed " << seed;
  EXPECT_GT(fresh.whole, 100) << "seed " << seed;  // whole texts seen, not only refusals
  const EarleyComparison exact = CompareWithEarley(1, 60);
  EXPECT_EQ(exact.wrong + exact.missed, 0) << exact.first;
  EXPECT_EQ(exact.grammars, 21);
  EXPECT_EQ(exact.texts, 630);
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
std::string Utf8(uint32_t cp) {
  std::string out;
  model::AppendUtf8(cp, &out);
  return out;
}

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

// Grammars built to be ambiguous. A thousand alternatives written alike are read as one; a
// thousand one character apart, and a thousand-fold repetition inside a repetition (after 100
// characters a hundred ways to read them, each its own top), come back to the same sets of
// stacks, each moved once per character. One whose stacks differ at every prefix stops at the
// bounds, letting through the tokens before it in byte order.
TEST(GrammarGuideTest, GrammarsBuiltToBeAmbiguousStayBounded) {
  const std::vector<std::string> tokens = LetterVocabulary();  // every one [a-z ]+
  TokenBytesIndex vocab(tokens);
  std::string text = "root ::= item*\nitem ::= [a-z ]";
  for (int i = 1; i < 1000; ++i) text += " | [a-z ]";
  auto alike = MustCompile(text);
  ASSERT_NE(alike, nullptr);
  EXPECT_EQ(Allowed(*alike, "", vocab).size(), tokens.size());
  EXPECT_EQ(Allowed(*alike, "ab c", vocab).size(), tokens.size());
  // Each class one character apart (so not read once): a thousand stacks take every letter,
  // back to the same thousand. The walk moves them once per letter (a set of stacks met again
  // moves as it did: Parse::Step), so it finds every token; moving them at every byte of the
  // vocabulary it stopped at kMaxGrammarWork.
  text = "root ::= item*\nitem ::= [a-z ]";
  for (int i = 1; i < 1000; ++i) text += " | [a-z " + Utf8(0x100 + i) + "]";
  auto apart = MustCompile(text);
  ASSERT_NE(apart, nullptr);
  EXPECT_EQ(Allowed(*apart, "ab c", vocab).size(), tokens.size());
  EXPECT_TRUE(apart->Accepts("ab c" + Utf8(0x100 + 999)));

  // A thousand stacks over what was read (each letter opens a level its capital closes, a
  // space one that "_" closes; any of them may instead be the one character of w), so
  // every prefix of the vocabulary has stacks of its own, a thousand nodes made at each byte:
  // the walk stops at kMaxGrammarNodes (a few hundred tokens in), every token it let through
  // leading on. Without the bounds every token would (the text can always open a level more).
  text = "root ::= s\ns ::= w | \" \" s \"_\"";
  for (char c = 'a'; c <= 'z'; ++c) {
    text += std::string(" | \"") + c + "\" s \"" + char(c - 32) + "\"";
  }
  text += "\nw ::= [a-z ]";
  for (int i = 1; i < 990; ++i) text += " | [a-z " + Utf8(0x100 + i) + "]";
  auto history = MustCompile(text);
  ASSERT_NE(history, nullptr);
  const std::vector<int32_t> some = Allowed(*history, "ab", vocab);
  EXPECT_GT(some.size(), 0u);
  EXPECT_LT(some.size(), tokens.size());  // every token leads on: the walk stopped
  // The walk goes in byte order: what it let through is the first tokens in that order.
  std::vector<int32_t> by_bytes(tokens.size());
  for (size_t i = 0; i < by_bytes.size(); ++i) by_bytes[i] = int32_t(i);
  std::sort(by_bytes.begin(), by_bytes.end(),
            [&](int32_t a, int32_t b) { return tokens[a] < tokens[b]; });
  by_bytes.resize(std::min(some.size(), by_bytes.size()));
  std::sort(by_bytes.begin(), by_bytes.end());
  EXPECT_EQ(some, by_bytes);
  for (size_t i = 0; i < some.size(); i += 37) {
    EXPECT_TRUE(history->LeadsOn("ab" + tokens[some[i]])) << tokens[some[i]];
  }
  EXPECT_TRUE(history->Accepts("ab" + Utf8(0x100 + 989) + "BA"));

  // Nested repetitions: the stacks after each letter differ by the count read (up to the
  // token's length), not by the letter, so these too are moved once per letter and count.
  auto nested = MustCompile("root ::= ([a-z ]{0,1000})*");
  ASSERT_NE(nested, nullptr);
  const std::string so_far(100, 'a');
  const std::vector<int32_t> allowed = Allowed(*nested, so_far, vocab);
  EXPECT_EQ(allowed.size(), tokens.size());
  // Again, its parse of so_far remembered now (read again, or made from what was remembered).
  EXPECT_EQ(Allowed(*nested, so_far, vocab), allowed);
  EXPECT_EQ(Allowed(*nested, so_far, vocab), allowed);
  EXPECT_TRUE(nested->Accepts(so_far + " b"));

  // Readings that multiply under one top (each "b" more read three ways): stacks are joined as
  // sets all the way down (Parse::Union), a node per way the stacks differ, so a thousand b's
  // are read (in about 0.1 s: two stacks more at each). Where a join kept its members' alike
  // tops apart, the graph doubled at every character and the bound stopped it at about 12.
  auto multiplying = MustCompile("root ::= r\nr ::= g r r r | \"\"\ng ::= \"b\"");
  ASSERT_NE(multiplying, nullptr);
  EXPECT_TRUE(multiplying->Accepts(std::string(1000, 'b')));
  EXPECT_FALSE(multiplying->LeadsOn(std::string(30, 'b') + "c"));
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

// Lists of words, as a grammar writes an enum. Alternatives that begin alike are read as a trie
// (FactorAlternatives): 5,000 words all beginning "w" open one stack, where with a stack per
// alternative they passed kMaxGrammarStacks and nothing was let through once in the list.
TEST(GrammarGuideTest, AListOfThousandsOfWordsIsFollowed) {
  std::string text = "root ::= item (\", \" item)*\nitem ::= \"w0\"";
  for (int i = 1; i < 5000; ++i) text += " | \"w" + std::to_string(i) + "\"";
  auto numbered = MustCompile(text);
  ASSERT_NE(numbered, nullptr);
  EXPECT_TRUE(numbered->Accepts("w4999"));
  EXPECT_TRUE(numbered->Accepts("w0, w17, w4999, w500"));
  EXPECT_FALSE(numbered->Accepts("w"));
  EXPECT_FALSE(numbered->LeadsOn("w5000"));
  EXPECT_FALSE(numbered->LeadsOn("w05"));
  EXPECT_FALSE(numbered->LeadsOn("w17, x"));
  // The next tokens are those a token-by-token check finds.
  std::vector<std::string> tokens = {"w", ", ", ", w", "x", ",", " "};
  for (int i = 0; i < 10000; i += 7) tokens.push_back(std::to_string(i));
  for (int i = 0; i < 600; i += 3) tokens.push_back(std::string("w") += std::to_string(i));
  TokenBytesIndex vocab(tokens);
  for (const std::string so_far : {"", "w", "w4", "w49", "w499", "w12, w3"}) {
    std::vector<int32_t> want;
    for (int32_t id = 0; id < int32_t(tokens.size()); ++id) {
      if (numbered->LeadsOn(so_far + tokens[id])) want.push_back(id);
    }
    EXPECT_FALSE(want.empty()) << so_far;
    EXPECT_EQ(Allowed(*numbered, so_far, vocab), want) << "after \"" << so_far << "\"";
  }

  // 3,000 words of the letters and é (so some begin with a split character), each a whole text
  // and none of its prefixes that is not a word too.
  std::mt19937 rng(3);
  std::set<std::string> words;
  while (words.size() < 3000) {
    std::string w;
    for (int n = 2 + int(rng() % 8); n > 0; --n) {
      w += rng() % 13 ? std::string(1, char('a' + rng() % 26)) : "é";
    }
    words.insert(w);
  }
  text = "root ::= word\nword ::= ";
  for (const std::string& w : words) text += (w == *words.begin() ? "\"" : " | \"") + w + "\"";
  auto lexicon = MustCompile(text);
  ASSERT_NE(lexicon, nullptr);
  for (const std::string& w : words) {
    ASSERT_TRUE(lexicon->Accepts(w)) << w;
    ASSERT_TRUE(lexicon->Complete(w) == (words.lower_bound(w + "a") == words.end() ||
                                         !words.lower_bound(w + "\x01")->starts_with(w)))
        << w;
    const std::string part = w.substr(0, w.size() - 1);
    if (!words.contains(part) && model::IsValidUtf8(part)) {
      ASSERT_FALSE(lexicon->Accepts(part)) << part;
    }
  }
  EXPECT_FALSE(lexicon->LeadsOn("qqqqqqqqqq"));
}

// A rule that would open more than kMaxGrammarStacks stacks as it begins (alternatives each
// beginning its own way, or a run of rules that may match nothing) is refused with its name:
// once in it, the guide could let nothing through.
TEST(GrammarGuideTest, ARuleThatBeginsTooManyWaysIsRefusedByName) {
  auto each_own_way = [](int n) {  // n alternatives, each beginning with its own character
    std::string text;
    for (int i = 0; i < n; ++i) text += (i ? " | \"" : "\"") + Utf8(0x4E00 + i) + "x\"";
    return text;
  };
  auto within = MustCompile("root ::= \"x\" r\nr ::= " + each_own_way(1000));
  ASSERT_NE(within, nullptr);
  EXPECT_TRUE(within->Accepts("x" + Utf8(0x4E00 + 999) + "x"));
  auto refused = [](const std::string& text, const std::string& rule) {
    auto g = GrammarGuide::Compile(text);
    if (g.ok()) return ::testing::AssertionFailure() << "compiled";
    const std::string want = "rule '" + rule + "' can begin more than 1024 ways at once";
    if (g.status().code() != absl::StatusCode::kInvalidArgument ||
        g.status().message().find(want) == std::string_view::npos) {
      return ::testing::AssertionFailure() << g.status();
    }
    return ::testing::AssertionSuccess();
  };
  EXPECT_TRUE(refused("root ::= \"x\" r\nr ::= " + each_own_way(1100), "r"));
  EXPECT_TRUE(refused("root ::= " + each_own_way(1100), "root"));
  EXPECT_TRUE(refused("root ::= \"x\" (" + each_own_way(1100) + ") \"y\"", "root"));
  // A list of rules, each beginning alike (a rule is not read into the one referring to it):
  // the list is named, not the rules around it.
  std::string listed = "root ::= \"(\" (list | \"-\")* \")\"\nlist ::= r0";
  for (int i = 1; i < 1100; ++i) listed += " | r" + std::to_string(i);
  for (int i = 0; i < 1100; ++i) {
    listed += "\nr" + std::to_string(i) + " ::= \"x" + std::to_string(i) + "\"";
  }
  EXPECT_TRUE(refused(listed, "list"));
  // Twenty rules in a row that may each match nothing, sixty ways to begin each.
  std::string run = "root ::= \"x\"";
  std::string rules;
  for (int i = 0; i < 20; ++i) {
    run += " n" + std::to_string(i);
    rules += "\nn" + std::to_string(i) + " ::= \"\"";
    for (int j = 0; j < 60; ++j) rules += " | \"" + Utf8(0x4E00 + 60 * i + j) + "\"";
  }
  EXPECT_TRUE(refused(run + " \"y\"" + rules, "root"));
  auto shorter = MustCompile(run.substr(0, run.find(" n16")) + " \"y\"" + rules);
  ASSERT_NE(shorter, nullptr);  // sixteen: 961 ways
  EXPECT_TRUE(shorter->Accepts("x" + Utf8(0x4E00 + 60 * 15) + "y"));

  // Not refused (a review's cases): where a rule may match nothing, what follows it is not
  // counted (here it opens the very tops counted already: 1,024 at run time)...
  auto exact = MustCompile("root ::= r x \"z\"\nr ::= \"q\" o\no ::= x \"!\" | \"\"\nx ::= " +
                           each_own_way(1024));
  ASSERT_NE(exact, nullptr);
  EXPECT_TRUE(exact->Accepts("q" + Utf8(0x4E00 + 5) + "xz"));
  EXPECT_TRUE(exact->Accepts("q" + Utf8(0x4E00 + 5) + "x!" + Utf8(0x4E00 + 1023) + "xz"));
  // ...and a grammar whose checks pass the work they may spend is let be (it was refused, its
  // start left with the checks' work spent): 5,300 ways to write "c", twice over.
  std::string costly = "root ::= \"b\" | \"a\" z\nz ::= (w)";
  for (int i = 1; i < 5300; ++i) costly += "|(w)";
  costly += "\nw ::= (c)";
  for (int i = 1; i < 5300; ++i) costly += "|(c)";
  auto let_be = MustCompile(costly + "\nc ::= \"c\"");
  ASSERT_NE(let_be, nullptr);
  EXPECT_TRUE(let_be->Accepts("b"));
}

// Stacks opened together by parses that began apart are not checked at compile: past
// kMaxGrammarStacks of them the output goes no further. Each of n rules reads "x" and then one of
// forty characters of its own; after "x", 40n stacks are open.
TEST(GrammarGuideTest, AnAmbiguityPastTheBoundEndsTheText) {
  auto ambiguous = [](int n) {
    std::string text = "root ::= p0";
    for (int i = 1; i < n; ++i) text += " | p" + std::to_string(i);
    for (int i = 0; i < n; ++i) {
      text += "\np" + std::to_string(i) + " ::= \"x\" c" + std::to_string(i);
      text += "\nc" + std::to_string(i) + " ::= \"" + Utf8(0x4E00 + 40 * i) + "\"";
      for (int j = 1; j < 40; ++j) text += " | \"" + Utf8(0x4E00 + 40 * i + j) + "\"";
    }
    return text;
  };
  auto within = MustCompile(ambiguous(25));
  ASSERT_NE(within, nullptr);
  EXPECT_TRUE(within->Accepts("x" + Utf8(0x4E00 + 999)));
  auto past = MustCompile(ambiguous(26));
  ASSERT_NE(past, nullptr);
  EXPECT_TRUE(past->LeadsOn(""));
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
