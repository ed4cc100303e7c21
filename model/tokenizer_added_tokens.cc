#include "model/tokenizer_added_tokens.h"

#include <algorithm>

#include "model/tokenizer_utf8.h"
#include "model/unicode_tables.h"

namespace thetaserve::model {
namespace {

// Rust's regex \w (what HF's single_word checks): letters, marks, numbers, connector
// punctuation and the joiners; numbers other than No (², ½).
bool IsWordChar(uint32_t cp) {
  if (cp == '_' || cp == 0x200C || cp == 0x200D || cp == 0x203F || cp == 0x2040 ||
      cp == 0x2054 || cp == 0xFE33 || cp == 0xFE34 || (cp >= 0xFE4D && cp <= 0xFE4F) ||
      cp == 0xFF3F) {
    return true;
  }
  if (cp == kInvalidCodePoint) return false;
  const uint8_t c = UnicodeClass(cp);
  return (c & (kUnicodeLetter | kUnicodeMark)) != 0 ||
         ((c & kUnicodeNumber) != 0 && (c & kUnicodeOtherNumber) == 0);
}

bool IsSpace(uint32_t cp) { return cp != kInvalidCodePoint && IsUnicodeWhitespace(cp); }

// The character that ends text[0, end) (end > 0).
uint32_t LastChar(std::string_view text, size_t end) {
  size_t i = end - 1;
  while (i > 0 && end - i < 4 && (static_cast<uint8_t>(text[i]) & 0xC0) == 0x80) --i;
  int len = 1;
  const uint32_t cp = DecodeUtf8At(text, i, &len);
  return i + len == end ? cp : kInvalidCodePoint;
}

}  // namespace

void AddedTokenMatcher::Add(std::string content, const AddedTokenSpec& token) {
  if (content.empty()) return;
  const auto first = static_cast<uint8_t>(content[0]);
  patterns_.push_back(Pattern{std::move(content), token});
  auto& list = by_first_byte_[first];
  list.push_back(static_cast<int>(patterns_.size()) - 1);
  std::stable_sort(list.begin(), list.end(), [&](int a, int b) {
    return patterns_[a].content.size() > patterns_[b].content.size();
  });
}

void AddedTokenMatcher::Split(std::string_view text, bool parse_special,
                              std::vector<Segment>* out) const {
  size_t emitted = 0;  // end of the last segment pushed
  size_t i = 0;
  while (i < text.size()) {
    const Pattern* hit = nullptr;
    for (int p : by_first_byte_[static_cast<uint8_t>(text[i])]) {
      if (text.substr(i).starts_with(patterns_[p].content)) {
        hit = &patterns_[p];
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t start = i;
    size_t stop = i + hit->content.size();
    i = stop;  // a skipped match still consumes its text (non-overlapping iteration)
    const AddedTokenSpec& tok = hit->token;
    if (tok.special && !parse_special) continue;
    if (tok.single_word) {
      const bool word_before = start > 0 && IsWordChar(LastChar(text, start));
      int len = 1;
      const bool word_after = stop < text.size() && IsWordChar(DecodeUtf8At(text, stop, &len));
      if (word_before || word_after) continue;
    }
    if (tok.lstrip) {
      // Whitespace run ending at `start`, but not reaching into the previous segment.
      size_t s = emitted;
      for (size_t k = emitted; k < start;) {
        int len = 1;
        const uint32_t cp = DecodeUtf8At(text, k, &len);
        k += len;
        if (!IsSpace(cp)) s = k;
      }
      start = s;
    }
    if (tok.rstrip) {
      while (stop < text.size()) {
        int len = 1;
        if (!IsSpace(DecodeUtf8At(text, stop, &len))) break;
        stop += len;
      }
      i = stop;
    }
    if (emitted < start) out->push_back({text.substr(emitted, start - emitted), -1});
    out->push_back({text.substr(start, stop - start), tok.id});
    emitted = stop;
  }
  if (emitted < text.size()) out->push_back({text.substr(emitted), -1});
}

}  // namespace thetaserve::model
