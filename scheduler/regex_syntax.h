// The syntax half of guided_regex (guided_regex.h): a pattern in Python's re syntax parsed
// into a tree whose leaves are sets of code points; guided_regex.cc builds the automaton over
// their UTF-8 bytes.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace thetaserve::scheduler {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
using CodePointRanges = std::vector<std::pair<uint32_t, uint32_t>>;  // inclusive

// The pattern as a tree: nodes refer to their kids by index into one vector.
struct RegexNode {
  // kCall: a call of another pattern by number, `(?&N)` (PCRE's syntax for a call of a named
  // group), which only the JSON schema builder writes (guided_schema.cc: the recursion of a
  // schema, guided by a grammar).
  enum class Kind { kEmpty, kClass, kConcat, kAlt, kRepeat, kCall } kind = Kind::kEmpty;
  CodePointRanges ranges;  // kClass
  std::vector<int> kids;   // kConcat, kAlt; kRepeat: one
  int min = 0, max = 0;    // kRepeat; max -1: unbounded. kCall: min is N
};

// Parses `pattern` (valid UTF-8) into `nodes`: the root's index, or InvalidArgument naming
// what is wrong and where (RegexRefused's message). Holds it to guided_regex.h's
// kMaxRegexRepeat and kMaxRegexNesting. `(?&N)` is read as a call (kCall) only where `calls`.
absl::StatusOr<int> ParseRegex(std::string_view pattern, std::vector<RegexNode>* nodes,
                               bool calls = false);

// InvalidArgument("guided_regex: <what>"): how the pattern's refusals read.
absl::Status RegexRefused(std::string_view what);

}  // namespace thetaserve::scheduler
