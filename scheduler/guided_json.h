// vLLM's response_format {"type": "json_object"}: the output is one JSON object (RFC 8259).
// JSON nests, so the guide is a pushdown automaton over the output's bytes: a lexer mode and
// a stack of the open objects and arrays, small enough to copy at every byte, walked through
// the vocabulary in byte order like a regular expression's automaton.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "scheduler/guide_cache.h"
#include "scheduler/guided_choice.h"

namespace thetaserve::scheduler {

constexpr int kMaxJsonDepth = 32;          // objects and arrays open at once
constexpr int kMaxJsonWhitespace = 32;     // whitespace bytes in a row (a newline and 31
                                           // spaces of indentation)
// Digits in a number's integer part and in its fraction (int64's 19), and in its exponent: a
// model cannot write zeros forever.
constexpr int kMaxJsonDigits = 19;
constexpr int kMaxJsonExponentDigits = 3;

class JsonObjectGuide : public Guide {
 public:
  // Where the output is in its JSON.
  struct State {
    uint8_t mode = 0;    // JsonObjectGuide::Mode
    uint8_t aux = 0;     // hex digits or UTF-8 bytes still owed; a literal's next byte
    uint8_t literal = 0;  // which of true, false, null; in a character, its 2nd byte's range;
                        // in \uXXXX, what is known of the surrogates
    uint8_t spaces = 0;  // whitespace bytes in a row
    uint8_t depth = 0;   // containers open
    uint8_t digits = 0;  // in a number, the digits of the part being read
    bool key = false;    // the string being read is an object's key
    uint32_t objects = 0;  // bit d: the container at depth d + 1 is an object (else an array)
  };

  void Allowed(std::string_view so_far, const TokenBytesIndex& vocab,
               std::vector<int32_t>* allowed) const override;
  // The object is closed: nothing may follow.
  bool Accepts(std::string_view so_far) const override;
  bool Complete(std::string_view so_far) const override { return Accepts(so_far); }

  // The state after `bytes` from `s`; false where no JSON object has them next.
  static bool Step(State s, std::string_view bytes, State* out);
  static bool Next(const State& s, uint8_t b, State* out);

 private:
  GuideCache<std::pair<uint64_t, uint32_t>> cache_;  // next tokens by state
};

}  // namespace thetaserve::scheduler
