// UTF-8 helpers for the tokenizer: lenient decoding (invalid bytes stay single units so
// byte-level models still see every byte), Rust-compatible lossy conversion, and the GPT-2
// byte <-> unicode table.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace thetaserve::model {

// This abseil build has its own string_view type; StrCat and the hash maps take that one.
inline absl::string_view AsAbsl(std::string_view s) { return {s.data(), s.size()}; }

// Returned by DecodeUtf8At for a byte that does not start a valid sequence; it belongs to
// no Unicode class, like punctuation.
inline constexpr uint32_t kInvalidCodePoint = 0xFFFFFFFFu;

// Decodes the character at s[i] (i < s.size()) and stores its byte length in *len. An
// ill-formed or truncated sequence yields kInvalidCodePoint with *len = 1.
uint32_t DecodeUtf8At(std::string_view s, size_t i, int* len);

void AppendUtf8(uint32_t cp, std::string* out);

// What a character's first byte says (RFC 3629, Unicode Table 3-7): the bytes the character
// has in all, and the range its second byte must be in (which keeps out overlong forms,
// surrogates and code points past U+10FFFF). False for a byte no character begins with (a
// continuation byte, C0, C1, F5–FF). An ASCII byte is a character of 1.
struct Utf8Lead {
  int length = 1;
  uint8_t second_lo = 0x80, second_hi = 0xBF;
};
bool Utf8LeadOf(uint8_t b, Utf8Lead* lead);

// Like Rust's String::from_utf8_lossy (and Python's errors="replace"): every maximal
// ill-formed subsequence becomes one U+FFFD.
std::string Utf8Lossy(std::string_view bytes);
bool IsValidUtf8(std::string_view bytes);

// Length of the longest prefix of `bytes` that does not end inside a character that could
// still be completed by more bytes; ill-formed bytes count as complete (they will not heal).
size_t Utf8CompletePrefix(std::string_view bytes);

// Python's str.isspace() for one character, which str.strip() and Jinja's trim use: Unicode
// White_Space plus the separators U+001C..U+001F.
bool IsPythonSpace(uint32_t cp);
// Python's str.lstrip() and str.rstrip(); ill-formed bytes are not spaces.
std::string_view PythonLStrip(std::string_view s);
std::string_view PythonRStrip(std::string_view s);

// GPT-2's bytes_to_unicode: the printable byte b maps to U+00b, the others to U+0100+k.
uint32_t ByteToUnicode(uint8_t b);
// Inverse of ByteToUnicode; -1 for code points outside the table.
int UnicodeToByte(uint32_t cp);
// The bytes a byte-level piece stands for; false (and `bytes` unspecified) when a character
// of `piece` is outside the table, e.g. a plain-text added token.
bool ByteLevelToBytes(std::string_view piece, std::string* bytes);
// The byte-level piece for raw bytes (each byte mapped through ByteToUnicode).
std::string BytesToByteLevel(std::string_view bytes);

}  // namespace thetaserve::model
