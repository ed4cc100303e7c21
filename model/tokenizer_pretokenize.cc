#include "model/tokenizer_pretokenize.h"

#include <cstdint>

#include "model/tokenizer_utf8.h"
#include "model/unicode_tables.h"

namespace thetaserve::model {
namespace {

// `text` decoded once: code point, class bits and byte offset of every character.
class CodePoints {
 public:
  explicit CodePoints(std::string_view text) {
    cp_.reserve(text.size());
    cls_.reserve(text.size());
    off_.reserve(text.size() + 1);
    for (size_t i = 0; i < text.size();) {
      int len = 1;
      const uint32_t c = DecodeUtf8At(text, i, &len);
      cp_.push_back(c);
      cls_.push_back(c == kInvalidCodePoint ? 0 : UnicodeClass(c));
      off_.push_back(static_cast<uint32_t>(i));
      i += len;
    }
    off_.push_back(static_cast<uint32_t>(text.size()));
  }

  size_t size() const { return cp_.size(); }
  uint32_t cp(size_t i) const { return cp_[i]; }
  size_t offset(size_t i) const { return off_[i]; }
  bool L(size_t i) const { return cls_[i] & kUnicodeLetter; }
  bool N(size_t i) const { return cls_[i] & kUnicodeNumber; }
  bool S(size_t i) const { return cls_[i] & kUnicodeWhitespace; }
  // [^\s\p{L}\p{N}]
  bool Other(size_t i) const {
    return (cls_[i] & (kUnicodeLetter | kUnicodeNumber | kUnicodeWhitespace)) == 0;
  }
  bool Newline(size_t i) const { return cp_[i] == '\r' || cp_[i] == '\n'; }

 private:
  std::vector<uint32_t> cp_;   // [n]
  std::vector<uint8_t> cls_;   // [n] UnicodeClass bits
  std::vector<uint32_t> off_;  // [n + 1] byte offsets
};

// Oniguruma's (?i) applies simple case folding; U+017F LATIN SMALL LETTER LONG S folds to
// 's', the only non-ASCII character that folds into the contraction letters.
uint32_t FoldContraction(uint32_t c, bool ignore_case) {
  if (!ignore_case) return c;
  if (c >= 'A' && c <= 'Z') return c + ('a' - 'A');
  if (c == 0x17F) return 's';
  return c;
}

// 's|'t|'re|'ve|'m|'ll|'d at i; returns the end or 0.
size_t MatchContraction(const CodePoints& c, size_t i, bool ignore_case) {
  const size_t n = c.size();
  if (c.cp(i) != '\'' || i + 1 >= n) return 0;
  const uint32_t c1 = FoldContraction(c.cp(i + 1), ignore_case);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
  if (i + 2 >= n) return 0;
  const uint32_t c2 = FoldContraction(c.cp(i + 2), ignore_case);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
    return i + 3;
  }
  return 0;
}

// \s+(?!\S)|\s+ at i, where c.S(i): a whitespace run followed by a non-space gives its last
// character to the next piece (so " word" keeps its space), unless the run is one long.
size_t MatchWhitespaceRun(const CodePoints& c, size_t i) {
  size_t k = i;
  while (k < c.size() && c.S(k)) ++k;
  if (k == c.size() || k - i == 1) return k;
  return k - 1;
}

size_t MatchGpt2(const CodePoints& c, size_t i) {
  const size_t n = c.size();
  if (size_t e = MatchContraction(c, i, /*ignore_case=*/false)) return e;
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
  size_t j = c.cp(i) == ' ' ? i + 1 : i;
  if (j < n) {
    if (c.L(j)) {
      while (j < n && c.L(j)) ++j;
      return j;
    }
    if (c.N(j)) {
      while (j < n && c.N(j)) ++j;
      return j;
    }
    if (c.Other(j)) {
      while (j < n && c.Other(j)) ++j;
      return j;
    }
  }
  if (c.S(i)) return MatchWhitespaceRun(c, i);
  return i + 1;  // unreachable: every character is L, N, whitespace or other
}

size_t MatchLlama3(const CodePoints& c, size_t i, size_t max_digits) {
  const size_t n = c.size();
  if (size_t e = MatchContraction(c, i, /*ignore_case=*/true)) return e;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c.L(i) || (!c.Newline(i) && !c.N(i) && i + 1 < n && c.L(i + 1))) {
    size_t j = i + 1;
    while (j < n && c.L(j)) ++j;
    return j;
  }
  // \p{N}{1,max_digits}
  if (c.N(i)) {
    size_t j = i + 1;
    while (j < n && j - i < max_digits && c.N(j)) ++j;
    return j;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  size_t j = c.cp(i) == ' ' ? i + 1 : i;
  if (j < n && c.Other(j)) {
    while (j < n && c.Other(j)) ++j;
    while (j < n && c.Newline(j)) ++j;
    return j;
  }
  if (!c.S(i)) return i + 1;  // unreachable
  // \s*[\r\n]+ : the whitespace run up to and including its last newline.
  size_t k = i;
  size_t end_after_newline = 0;
  while (k < n && c.S(k)) {
    if (c.Newline(k)) end_after_newline = k + 1;
    ++k;
  }
  if (end_after_newline != 0) return end_after_newline;
  return MatchWhitespaceRun(c, i);
}

}  // namespace

std::string_view SplitRegexPattern(SplitRegex kind) {
  switch (kind) {
    case SplitRegex::kGpt2:
      return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
    case SplitRegex::kLlama3:
      return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    case SplitRegex::kQwen2:
      return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  }
  return {};
}

void SplitByRegex(std::string_view text, SplitRegex kind, std::vector<std::string_view>* out) {
  const CodePoints c(text);
  // Every character starts a match of these patterns, so there is never text between
  // matches to emit.
  for (size_t i = 0; i < c.size();) {
    size_t end = 0;
    switch (kind) {
      case SplitRegex::kGpt2:
        end = MatchGpt2(c, i);
        break;
      case SplitRegex::kLlama3:
        end = MatchLlama3(c, i, 3);
        break;
      case SplitRegex::kQwen2:
        end = MatchLlama3(c, i, 1);
        break;
    }
    out->push_back(text.substr(c.offset(i), c.offset(end) - c.offset(i)));
    i = end;
  }
}

void SplitDigits(std::string_view text, bool individual, std::vector<std::string_view>* out) {
  size_t start = 0;  // byte offset of the pending non-digit piece
  for (size_t i = 0; i < text.size();) {
    int len = 1;
    const uint32_t cp = DecodeUtf8At(text, i, &len);
    if (cp == kInvalidCodePoint || !IsUnicodeNumber(cp)) {
      i += len;
      continue;
    }
    if (start < i) out->push_back(text.substr(start, i - start));
    size_t end = i + len;
    while (!individual && end < text.size()) {
      int next_len = 1;
      const uint32_t next = DecodeUtf8At(text, end, &next_len);
      if (next == kInvalidCodePoint || !IsUnicodeNumber(next)) break;
      end += next_len;
    }
    out->push_back(text.substr(i, end - i));
    start = i = end;
  }
  if (start < text.size()) out->push_back(text.substr(start));
}

void SplitBeforeMarker(std::string_view text, std::string_view marker,
                       std::vector<std::string_view>* out) {
  size_t start = 0;
  size_t pos = marker.empty() ? std::string_view::npos : text.find(marker, 1);
  while (pos != std::string_view::npos) {
    out->push_back(text.substr(start, pos - start));
    start = pos;
    pos = text.find(marker, pos + marker.size());
  }
  if (start < text.size()) out->push_back(text.substr(start));
}

}  // namespace thetaserve::model
