// vLLM's guided_regex: the whole output matches a regular expression. The pattern becomes a
// deterministic automaton over the output's bytes (its characters as UTF-8), built once when
// the request is checked; each step, the tokens whose bytes keep the output on a path to a
// match are found by walking the vocabulary in byte order, sharing the steps of common
// prefixes and skipping every token under a prefix that leads nowhere.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/guide_cache.h"
#include "scheduler/guided_choice.h"

namespace thetaserve::scheduler {

// Bounds on what one pattern may cost (checked as it is compiled).
constexpr int kMaxRegexBytes = 4096;
constexpr int kMaxRegexRepeat = 1000;      // m and n of {m,n}
constexpr int kMaxRegexNesting = 64;       // groups inside groups (parsed recursively)
constexpr int kMaxRegexNfaSize = 100000;   // the pattern's automaton's states and empty
                                           // moves, repeats expanded
constexpr int kMaxRegexDfaStates = 20000;  // the deterministic automaton's states
constexpr int kMaxRegexWork = 20000000;    // states and moves looked at while building it

class RegexGuide : public Guide {
 public:
  // Python's re syntax, matched whole (re.fullmatch): literals and escapes (\n \t \r \f \v
  // \xHH \uHHHH \UHHHHHHHH, an escaped punctuation character), '.' (any character but
  // newline), classes [a-z], [^…] with \d \w \s \D \W \S (ASCII meanings, as re.ASCII),
  // groups (…), (?:…), (?P<name>…), alternation, the quantifiers * + ? {m} {m,} {,n} {m,n}
  // (lazy and greedy alike: a whole match does not care), and ^ at the start and $ at the
  // end. Back-references, look-arounds, \b and inline flags are refused by name. A client's
  // pattern has at most kMaxRegexBytes; one built by the server (from a JSON schema) may be
  // longer, the automaton's bounds still holding.
  static absl::StatusOr<std::shared_ptr<const RegexGuide>> Compile(
      std::string_view pattern, size_t max_bytes = kMaxRegexBytes);

  void Allowed(std::string_view so_far, const TokenBytesIndex& vocab,
               std::vector<int32_t>* allowed) const override;
  bool Accepts(std::string_view so_far) const override;
  bool Complete(std::string_view so_far) const override;

  const std::string& pattern() const { return pattern_; }
  int num_states() const { return num_states_; }
  // Some match has `byte` in it.
  bool Emits(uint8_t byte) const;
  // The state after `bytes` from `state`, or kDead when no match can follow.
  int32_t Step(int32_t state, std::string_view bytes) const;
  static constexpr int32_t kDead = -1;
  static constexpr int32_t kStart = 0;

 private:
  RegexGuide() = default;
  int32_t Next(int32_t state, uint8_t byte) const {
    return next_[size_t(state) * num_classes_ + byte_class_[byte]];
  }

  std::string pattern_;
  int num_states_ = 0;
  int num_classes_ = 0;
  uint8_t byte_class_[256] = {};
  std::vector<int32_t> next_;      // [state * num_classes_ + class]: the next state or kDead
  std::vector<bool> accepting_;    // [state]
  std::vector<bool> leads_on_;     // [state]: some byte leads to a live state
  GuideCache<int32_t> cache_;      // next tokens by state
};

}  // namespace thetaserve::scheduler
