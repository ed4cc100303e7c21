// Splits text on added/special tokens the way HF tokenizers' AddedVocabulary does:
// leftmost-longest matches, honoring lstrip/rstrip/single_word, special tokens ignored
// (their text stays text) when special-token parsing is off.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer_spec.h"

namespace thetaserve::model {

class AddedTokenMatcher {
 public:
  struct Segment {
    std::string_view text;  // the text, or the matched token text (with stripped spaces)
    int32_t id;             // -1 for plain text
  };

  // `content` is the string matched (the token's content, normalized for normalized ones).
  void Add(std::string content, const AddedTokenSpec& token);
  bool empty() const { return patterns_.empty(); }

  // Appends the segments of `text` in order; plain-text segments are never empty.
  void Split(std::string_view text, bool parse_special, std::vector<Segment>* out) const;

 private:
  struct Pattern {
    std::string content;
    AddedTokenSpec token;
  };
  std::vector<Pattern> patterns_;
  // Patterns by first byte, longest first, so the first hit at a position is the longest.
  std::array<std::vector<int>, 256> by_first_byte_;
};

}  // namespace thetaserve::model
