#include "model/tokenizer_utf8.h"

#include <array>

#include "model/unicode_tables.h"

namespace thetaserve::model {
namespace {

// Length of the well-formed prefix of the sequence at s[i] (Unicode Table 3-7), and the
// sequence length its lead byte announces (0 for a byte that cannot lead).
struct SequenceCheck {
  int valid;   // bytes that are a valid prefix of a sequence
  int needed;  // full length announced by the lead byte
};

SequenceCheck CheckSequence(std::string_view s, size_t i) {
  Utf8Lead lead;
  if (!Utf8LeadOf(static_cast<uint8_t>(s[i]), &lead)) return {0, 0};
  const int needed = lead.length;
  int valid = 1;
  for (int k = 1; k < needed && i + k < s.size(); ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    const uint8_t l = k == 1 ? lead.second_lo : 0x80;
    const uint8_t h = k == 1 ? lead.second_hi : 0xBF;
    if (b < l || b > h) break;
    ++valid;
  }
  return {valid, needed};
}

}  // namespace

bool Utf8LeadOf(uint8_t b, Utf8Lead* lead) {
  *lead = Utf8Lead();
  if (b < 0x80) return true;
  if (b >= 0xC2 && b <= 0xDF) {
    lead->length = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    lead->length = 3;
    if (b == 0xE0) lead->second_lo = 0xA0;
    if (b == 0xED) lead->second_hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    lead->length = 4;
    if (b == 0xF0) lead->second_lo = 0x90;
    if (b == 0xF4) lead->second_hi = 0x8F;
  } else {
    return false;
  }
  return true;
}

namespace {

struct ByteTables {
  std::array<uint32_t, 256> to_unicode{};
  std::array<int16_t, 324> to_byte{};  // code points < 0x144
};

const ByteTables& Tables() {
  static const ByteTables tables = [] {
    ByteTables t;
    t.to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t.to_unicode[b] = printable ? b : 0x100 + extra++;
      t.to_byte[t.to_unicode[b]] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

}  // namespace

uint32_t DecodeUtf8At(std::string_view s, size_t i, int* len) {
  const SequenceCheck c = CheckSequence(s, i);
  if (c.needed == 0 || c.valid < c.needed) {
    *len = 1;
    return kInvalidCodePoint;
  }
  *len = c.needed;
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (c.needed == 1) return b0;
  uint32_t cp = b0 & (0x7F >> c.needed);
  for (int k = 1; k < c.needed; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  return cp;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const SequenceCheck c = CheckSequence(bytes, i);
    if (c.needed != 0 && c.valid == c.needed) {
      out.append(bytes.substr(i, c.needed));
      i += c.needed;
    } else {
      out.append("\xEF\xBF\xBD");
      i += c.valid > 0 ? c.valid : 1;
    }
  }
  return out;
}

bool IsValidUtf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const SequenceCheck c = CheckSequence(bytes, i);
    if (c.needed == 0 || c.valid < c.needed) return false;
    i += c.needed;
  }
  return true;
}

size_t Utf8CompletePrefix(std::string_view bytes) {
  // Only the last three bytes can start a character that is still incomplete.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    const SequenceCheck c = CheckSequence(bytes, i);
    if (c.needed > 1 && c.valid == static_cast<int>(back) && c.valid < c.needed) return i;
  }
  return n;
}

uint32_t ByteToUnicode(uint8_t b) { return Tables().to_unicode[b]; }

int UnicodeToByte(uint32_t cp) {
  const auto& t = Tables().to_byte;
  return cp < t.size() ? t[cp] : -1;
}

bool ByteLevelToBytes(std::string_view piece, std::string* bytes) {
  bytes->clear();
  for (size_t i = 0; i < piece.size();) {
    int len = 1;
    const uint32_t cp = DecodeUtf8At(piece, i, &len);
    const int b = cp == kInvalidCodePoint ? -1 : UnicodeToByte(cp);
    if (b < 0) return false;
    bytes->push_back(static_cast<char>(b));
    i += len;
  }
  return true;
}

std::string BytesToByteLevel(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendUtf8(ByteToUnicode(static_cast<uint8_t>(c)), &out);
  return out;
}

bool IsPythonSpace(uint32_t cp) {
  return (cp >= 0x1C && cp <= 0x1F) || (cp != kInvalidCodePoint && IsUnicodeWhitespace(cp));
}

std::string_view PythonLStrip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    int len = 1;
    if (!IsPythonSpace(DecodeUtf8At(s, begin, &len))) break;
    begin += len;
  }
  return s.substr(begin);
}

std::string_view PythonRStrip(std::string_view s) {
  size_t end = 0;  // end of the last character that is not a space
  for (size_t i = 0; i < s.size();) {
    int len = 1;
    const uint32_t cp = DecodeUtf8At(s, i, &len);
    i += len;
    if (!IsPythonSpace(cp)) end = i;
  }
  return s.substr(0, end);
}

}  // namespace thetaserve::model
