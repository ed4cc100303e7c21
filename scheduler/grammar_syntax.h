// GBNF, the grammar format of llama.cpp that vLLM's xgrammar backend also reads (guided_grammar),
// parsed into rules: each rule a list of alternatives, each alternative a sequence of character
// classes (over code points) and references to rules. Groups and repetitions become rules of
// their own, as llama.cpp builds them: x* is S ::= x S | (empty), x? is R ::= x | (empty).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace thetaserve::scheduler {

// Bounds on what one grammar may cost (checked as it is parsed).
constexpr int kMaxGrammarBytes = 65536;
constexpr int kMaxGrammarElements = 200000;  // classes and references in all rules, repetitions
                                             // expanded
constexpr int kMaxGrammarNesting = 64;       // groups inside groups (parsed recursively)
constexpr int kMaxGrammarRepeat = 1000;      // m and n of {m,n}

// Code points, as sorted, disjoint, inclusive ranges.
struct CharClass {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  bool Contains(uint32_t cp) const;
  // Some code point in [lo, hi] is in the class.
  bool Overlaps(uint32_t lo, uint32_t hi) const;
};

struct GrammarElement {
  enum Kind : uint8_t {
    kClass,  // one character of classes[value]
    kRule,   // rules[value], whole
    kEnd,    // the end of an alternative
  };
  Kind kind = kEnd;
  int32_t value = 0;
};

struct Grammar {
  std::vector<GrammarElement> elements;     // every alternative, each ended by kEnd
  std::vector<std::vector<int32_t>> rules;  // [rule]: where each alternative begins in elements
  std::vector<std::string> names;           // [rule]: as written, or <rule>#<n> for a group or
                                            // repetition inside <rule>
  std::vector<CharClass> classes;
  int32_t root = 0;
};

// GBNF as llama.cpp's grammars/README.md describes it: `name ::= alternatives` (names of
// letters, digits, '-' and '_'; the grammar is `root`'s), "literals" and [classes] (with ^,
// ranges and the escapes \t \r \n \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH), '.' (any character),
// references to rules defined anywhere, (groups), '|', the repetitions * + ? {m} {m,} {,n} {m,n},
// and # comments. A rule goes on over lines until one begins another rule (`name ::=`), as
// xgrammar reads it (llama.cpp's own parser wants a rule's lines to end in ::= or '|').
// Refused, each with its line and column: a rule used but not defined or defined twice, no
// root, a root that matches no text, and left recursion (a rule that can reach itself again
// before reading a character, with more to read after: `expr ::= expr "+" term`; write it with a
// repetition, `expr ::= term ("+" term)*`). A client's grammar has at most kMaxGrammarBytes; one
// the server builds (from a JSON schema) may have up to `max_bytes`.
absl::StatusOr<Grammar> ParseGrammar(std::string_view text,
                                     size_t max_bytes = kMaxGrammarBytes);

// The same language with no rule holding two alternatives that begin with the same element:
// `r ::= "ab" | "ac" | x y | x z` becomes `r ::= "a" r#tail1 | x r#tail2`, `r#tail1 ::= "b" |
// "c"`, `r#tail2 ::= y | z` (and so on down each new rule), as a trie of the alternatives. A
// parse then opens one stack per way a rule can begin, not one per alternative: a list of
// 5,000 words open at once is at most a stack per first character.
void FactorAlternatives(Grammar* g);

}  // namespace thetaserve::scheduler
