// Pre-tokenizers: the splitting regexes of GPT-2, Llama 3 and Qwen2 as hand-written matchers
// over code points (std::regex has no \p{L}), and HF's Digits and Metaspace splitters.
// Matches follow Oniguruma's leftmost-first alternation, which HF tokenizers uses.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace thetaserve::model {

enum class SplitRegex {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
  //  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  // As kLlama3 with \p{N} (one digit per piece).
  kQwen2,
};

// The regex source text HF tokenizer.json files use for each kind.
std::string_view SplitRegexPattern(SplitRegex kind);

// Appends the matches of `kind` in `text` (HF Split behavior "Isolated": matches and the
// text between them both become pieces, in order). Pieces point into `text`.
void SplitByRegex(std::string_view text, SplitRegex kind, std::vector<std::string_view>* out);

// HF Digits: every \p{N} character (individual) or run of them becomes its own piece.
void SplitDigits(std::string_view text, bool individual, std::vector<std::string_view>* out);

// HF Metaspace split: pieces end before each occurrence of `marker` (the marker starts the
// next piece; "MergedWithNext").
void SplitBeforeMarker(std::string_view text, std::string_view marker,
                       std::vector<std::string_view>* out);

}  // namespace thetaserve::model
