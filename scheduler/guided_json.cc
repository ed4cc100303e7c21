#include "scheduler/guided_json.h"

namespace thetaserve::scheduler {
namespace {

enum Mode : uint8_t {
  kStart,      // before the object: whitespace, '{'
  kObjectOpen,  // after '{': a key or '}'
  kKey,        // after ',' in an object: a key
  kColon,      // after a key
  kValue,      // after ':' or ',' in an array
  kArrayOpen,  // after '[': a value or ']'
  kAfter,      // after a value in a container: ',' or its closer
  kString,     // inside a string
  kEscape,     // after a backslash
  kHex,        // in \uXXXX, aux digits to go; `literal` holds the kHex* flags
  kLowSlash,   // after a high surrogate's \uD800..\uDBFF: the backslash of its low half
  kLowU,       // and its u
  kUtf8,       // in a character, aux continuation bytes to go
  kMinus,      // number: after '-'
  kZero,       // number: a leading 0
  kInt,        // number: integer digits
  kDot,        // number: after '.'
  kFraction,   // number: fraction digits
  kExponent,   // number: after 'e'
  kExpSign,    // number: after the exponent's sign
  kExpDigits,  // number: exponent digits
  kLiteral,    // inside true, false or null: aux bytes read
  kDone,       // the object is closed
};

constexpr std::string_view kLiterals[] = {"true", "false", "null"};

// In \uXXXX: what `literal` records about the code unit being read.
constexpr uint8_t kHexLowOwed = 1;   // it must be a low surrogate, DC00..DFFF
constexpr uint8_t kHexFirstD = 2;    // its first digit is D
constexpr uint8_t kHexHigh = 4;      // it is a high surrogate, D800..DBFF

int HexValue(uint8_t b) { return b <= '9' ? b - '0' : (b | 0x20) - 'a' + 10; }

bool IsSpace(uint8_t b) { return b == ' ' || b == '\n' || b == '\t' || b == '\r'; }
bool IsDigit(uint8_t b) { return b >= '0' && b <= '9'; }
bool IsHex(uint8_t b) {
  return IsDigit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
}

using State = JsonObjectGuide::State;

// A value has ended: the container it is in takes a ',' or its closer next; a closed top
// object ends it all.
State ValueDone(State s) {
  s.mode = s.depth == 0 ? kDone : kAfter;
  return s;
}

bool Top(const State& s) { return s.depth > 0 && (s.objects >> (s.depth - 1)) & 1u; }

// A value begins with b (whitespace handled by the caller).
bool BeginValue(State s, uint8_t b, State* out) {
  switch (b) {
    case '{':
    case '[':
      if (s.depth >= kMaxJsonDepth) return false;
      if (b == '{') {
        s.objects |= 1u << s.depth;
      } else {
        s.objects &= ~(1u << s.depth);
      }
      ++s.depth;
      s.mode = b == '{' ? kObjectOpen : kArrayOpen;
      break;
    case '"':
      s.mode = kString;
      s.key = false;
      break;
    case '-': s.mode = kMinus; break;
    case '0': s.mode = kZero; break;
    case 't':
    case 'f':
    case 'n':
      s.mode = kLiteral;
      s.literal = b == 't' ? 0 : b == 'f' ? 1 : 2;
      s.aux = 1;
      break;
    default:
      if (b < '1' || b > '9') return false;
      s.mode = kInt;
  }
  s.digits = 1;
  *out = s;
  return true;
}

// A container is closed by b, if b closes the one open.
bool Close(State s, uint8_t b, State* out) {
  if (s.depth == 0 || b != (Top(s) ? '}' : ']')) return false;
  --s.depth;
  *out = ValueDone(s);
  return true;
}

}  // namespace

bool JsonObjectGuide::Next(const State& in, uint8_t b, State* out) {
  State s = in;
  // Whitespace between tokens, a bounded run of it.
  switch (s.mode) {
    case kStart: case kObjectOpen: case kKey: case kColon: case kValue: case kArrayOpen:
    case kAfter:
      if (IsSpace(b)) {
        if (s.spaces >= kMaxJsonWhitespace) return false;
        ++s.spaces;
        *out = s;
        return true;
      }
      s.spaces = 0;
      break;
    default: break;
  }
  switch (s.mode) {
    case kStart:
      if (b != '{') return false;
      return BeginValue(s, b, out);
    case kObjectOpen:
      if (b == '}') return Close(s, b, out);
      [[fallthrough]];
    case kKey:
      if (b != '"') return false;
      s.mode = kString;
      s.key = true;
      *out = s;
      return true;
    case kColon:
      if (b != ':') return false;
      s.mode = kValue;
      *out = s;
      return true;
    case kArrayOpen:
      if (b == ']') return Close(s, b, out);
      [[fallthrough]];
    case kValue:
      return BeginValue(s, b, out);
    case kAfter:
      if (b == ',') {
        s.mode = Top(s) ? kKey : kValue;
        *out = s;
        return true;
      }
      return Close(s, b, out);
    case kString:
      if (b == '"') {
        if (s.key) {
          s.mode = kColon;
          s.key = false;
          *out = s;
        } else {
          *out = ValueDone(s);
        }
        return true;
      }
      if (b == '\\') {
        s.mode = kEscape;
      } else if (b < 0x20) {
        return false;  // control characters are escaped in JSON
      } else if (b >= 0x80) {
        // A character's lead byte, how many continuation bytes it announces, and the range of
        // the first where it is narrower than 80..BF (no overlong forms, surrogates or code
        // points past U+10FFFF: Unicode's Table 3-7).
        s.literal = 0;
        if (b >= 0xC2 && b <= 0xDF) {
          s.aux = 1;
        } else if (b >= 0xE0 && b <= 0xEF) {
          s.aux = 2;
          s.literal = b == 0xE0 ? 1 : b == 0xED ? 2 : 0;
        } else if (b >= 0xF0 && b <= 0xF4) {
          s.aux = 3;
          s.literal = b == 0xF0 ? 3 : b == 0xF4 ? 4 : 0;
        } else {
          return false;
        }
        s.mode = kUtf8;
      }
      *out = s;
      return true;
    case kUtf8: {
      static constexpr uint8_t kLow[] = {0x80, 0xA0, 0x80, 0x90, 0x80};
      static constexpr uint8_t kHigh[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
      if (b < kLow[s.literal] || b > kHigh[s.literal]) return false;
      s.literal = 0;
      if (--s.aux == 0) s.mode = kString;
      *out = s;
      return true;
    }
    case kEscape:
      if (b == 'u') {
        s.mode = kHex;
        s.aux = 4;
        s.literal = 0;
      } else if (std::string_view("\"\\/bfnrt").find(char(b)) != std::string_view::npos) {
        s.mode = kString;
      } else {
        return false;
      }
      *out = s;
      return true;
    case kHex: {
      // Surrogates come in pairs, \uD800..\uDBFF then \uDC00..\uDFFF, or a parser refuses
      // them; the first two digits tell which a code unit is.
      if (!IsHex(b)) return false;
      const bool low_owed = s.literal & kHexLowOwed;
      if (s.aux == 4) {
        const bool d = HexValue(b) == 0xD;
        if (low_owed && !d) return false;
        if (d) s.literal |= kHexFirstD;
      } else if (s.aux == 3 && (s.literal & kHexFirstD)) {
        const int v = HexValue(b);
        if (low_owed ? v < 0xC : v >= 0xC) return false;  // a low half only after a high one
        if (!low_owed && v >= 0x8) s.literal |= kHexHigh;
      }
      if (--s.aux == 0) {
        s.mode = s.literal & kHexHigh ? kLowSlash : kString;
        s.literal = 0;
      }
      *out = s;
      return true;
    }
    case kLowSlash:
      if (b != '\\') return false;
      s.mode = kLowU;
      *out = s;
      return true;
    case kLowU:
      if (b != 'u') return false;
      s.mode = kHex;
      s.aux = 4;
      s.literal = kHexLowOwed;
      *out = s;
      return true;
    case kLiteral: {
      const std::string_view lit = kLiterals[s.literal];
      if (b != uint8_t(lit[s.aux])) return false;
      ++s.aux;
      *out = s.aux == lit.size() ? ValueDone(s) : s;
      return true;
    }
    case kMinus:
      if (b == '0') {
        s.mode = kZero;
      } else if (IsDigit(b)) {
        s.mode = kInt;
      } else {
        return false;
      }
      s.digits = 1;
      *out = s;
      return true;
    case kDot:
      if (!IsDigit(b)) return false;
      s.mode = kFraction;
      s.digits = 1;
      *out = s;
      return true;
    case kExponent:
      if (b == '+' || b == '-') {
        s.mode = kExpSign;
        *out = s;
        return true;
      }
      [[fallthrough]];
    case kExpSign:
      if (!IsDigit(b)) return false;
      s.mode = kExpDigits;
      s.digits = 1;
      *out = s;
      return true;
    case kZero: case kInt: case kFraction: case kExpDigits:
      if (IsDigit(b) && s.mode != kZero) {
        if (s.digits >= (s.mode == kExpDigits ? kMaxJsonExponentDigits : kMaxJsonDigits)) {
          return false;
        }
        ++s.digits;
        *out = s;
        return true;
      }
      if (b == '.' && (s.mode == kZero || s.mode == kInt)) {
        s.mode = kDot;
        *out = s;
        return true;
      }
      if ((b == 'e' || b == 'E') && s.mode != kExpDigits) {
        s.mode = kExponent;
        *out = s;
        return true;
      }
      // Anything else ends the number (which is never the whole output: the top is an
      // object), and is read after it.
      return Next(ValueDone(s), b, out);
    case kDone:
    default:
      return false;
  }
}

bool JsonObjectGuide::Step(State s, std::string_view bytes, State* out) {
  for (char c : bytes) {
    if (!Next(s, uint8_t(c), &s)) return false;
  }
  *out = s;
  return true;
}

void JsonObjectGuide::Allowed(std::string_view so_far, const TokenBytesIndex& vocab,
                              std::vector<int32_t>* allowed) const {
  allowed->clear();
  State s;
  if (!Step(State{}, so_far, &s) || s.mode == kDone) return;
  // The state as a key: what is left from earlier parts (a number's digits once it has ended,
  // the kinds of containers closed) left out, so that equal states meet.
  const bool number = s.mode >= kMinus && s.mode <= kExpDigits;
  const uint64_t head = uint64_t(s.mode) | uint64_t(s.aux) << 8 | uint64_t(s.literal) << 16 |
                        uint64_t(s.spaces) << 24 | uint64_t(s.depth) << 32 |
                        uint64_t(s.key) << 40 | uint64_t(number ? s.digits : 0) << 48;
  const uint32_t open = uint32_t(s.objects & ((uint64_t(1) << s.depth) - 1));
  cache_.Allowed(vocab, std::make_pair(head, open), [&](std::vector<int32_t>* ids) {
    ids->clear();
    vocab.Walk(s, &JsonObjectGuide::Next, ids);
    vocab.SortIds(ids);
  }, allowed);
}

bool JsonObjectGuide::Accepts(std::string_view so_far) const {
  State s;
  return Step(State{}, so_far, &s) && s.mode == kDone;
}

}  // namespace thetaserve::scheduler
