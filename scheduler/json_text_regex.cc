#include "scheduler/json_text_regex.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace thetaserve::scheduler {
namespace {

// Decimal integers from `lo` to `hi`, both with the same number of digits.
std::string SameLength(const std::string& lo, const std::string& hi) {
  const size_t n = lo.size();
  if (n == 0) return "";
  if (lo == hi) return lo;
  auto digits = [](size_t k) -> std::string {
    return k == 0 ? "" : k == 1 ? "[0-9]" : absl::StrCat("[0-9]{", k, "}");
  };
  auto range = [](char a, char b) -> std::string {
    return a == b ? std::string(1, a) : absl::StrCat("[", std::string(1, a), "-",
                                                     std::string(1, b), "]");
  };
  const std::string lo_rest = lo.substr(1), hi_rest = hi.substr(1);
  if (lo[0] == hi[0]) {
    return absl::StrCat(std::string(1, lo[0]), RegexGroup(SameLength(lo_rest, hi_rest)));
  }
  const bool zeros = lo_rest == std::string(n - 1, '0');
  const bool nines = hi_rest == std::string(n - 1, '9');
  std::vector<std::string> parts;
  char first = lo[0], last = hi[0];
  if (!zeros) {
    parts.push_back(absl::StrCat(std::string(1, lo[0]),
                                 RegexGroup(SameLength(lo_rest, std::string(n - 1, '9')))));
    ++first;
  }
  if (!nines) --last;
  if (first <= last) parts.push_back(absl::StrCat(range(first, last), digits(n - 1)));
  if (!nines) {
    parts.push_back(absl::StrCat(std::string(1, hi[0]),
                                 RegexGroup(SameLength(std::string(n - 1, '0'), hi_rest))));
  }
  return absl::StrJoin(parts, "|");
}

// Decimal integers from `lo` to `hi` (none: no end), without leading zeros.
std::string NonNegative(uint64_t lo, std::optional<uint64_t> hi) {
  const std::string lo_text = std::to_string(lo);
  const size_t lo_len = lo_text.size();
  const size_t hi_len = hi ? std::to_string(*hi).size() : lo_len;
  std::vector<std::string> parts;
  for (size_t len = lo_len; len <= hi_len; ++len) {
    const std::string from = len == lo_len ? lo_text : absl::StrCat("1", std::string(len - 1, '0'));
    const std::string to = hi && len == hi_len ? std::to_string(*hi) : std::string(len, '9');
    parts.push_back(SameLength(from, to));
  }
  // With no upper bound, more digits, up to kMaxJsonDigits.
  if (!hi && lo_len < size_t(kMaxJsonDigits)) {
    parts.push_back(absl::StrCat("[1-9][0-9]{", lo_len, ",", kMaxJsonDigits - 1, "}"));
  }
  return RegexGroup(absl::StrJoin(parts, "|"));
}

}  // namespace

std::string RegexLiteral(std::string_view text) {
  std::string out;
  for (char c : text) {
    const auto b = uint8_t(c);
    if (b >= 0x80 || (b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') ||
        (b >= 'A' && b <= 'Z')) {
      out += c;
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", b);
    }
  }
  return out;
}

std::string RegexGroup(const std::string& alternatives) {
  return absl::StrCat("(?:", alternatives, ")");
}

std::string IntegerRangeRegex(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (!lo && !hi) return kJsonInteger;
  std::vector<std::string> parts;
  if (!lo || *lo < 0) {  // negatives: their magnitudes
    const uint64_t from = hi && *hi < 0 ? uint64_t(-*hi) : 1;
    parts.push_back(absl::StrCat(
        "-", NonNegative(from, lo ? std::optional<uint64_t>(uint64_t(-*lo)) : std::nullopt)));
  }
  if (!hi || *hi >= 0) {
    parts.push_back(NonNegative(lo && *lo > 0 ? uint64_t(*lo) : 0,
                                hi ? std::optional<uint64_t>(uint64_t(*hi)) : std::nullopt));
  }
  return RegexGroup(absl::StrJoin(parts, "|"));
}

bool HasTopLevelBar(std::string_view p) {
  int depth = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '\\') {
      ++i;
    } else if (p[i] == '[') {
      ++i;
      if (i < p.size() && p[i] == '^') ++i;
      if (i < p.size() && p[i] == ']') ++i;
      while (i < p.size() && p[i] != ']') i += p[i] == '\\' ? 2 : 1;
    } else if (p[i] == '(') {
      ++depth;
    } else if (p[i] == ')') {
      --depth;
    } else if (p[i] == '|' && depth == 0) {
      return true;
    }
  }
  return false;
}

int JsonNesting(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace thetaserve::scheduler
