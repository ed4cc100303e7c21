#include "scheduler/schema_scalars.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "model/tokenizer_utf8.h"
#include "scheduler/guided_regex.h"
#include "scheduler/json_text_regex.h"

namespace thetaserve::scheduler {
namespace {

// A string that the pattern finds (JSON schema's patterns search: unanchored, they match
// anywhere in the string).
absl::Status PatternRegex(const SchemaJson& p, const std::string& path, std::string* out) {
  if (!p.is_string()) return SchemaRefused(path, "must be a string");
  std::string body = p.get<std::string>();
  const bool start = !body.empty() && body.front() == '^';
  if (start) body.erase(0, 1);
  size_t backslashes = 0;
  while (body.size() >= backslashes + 2 && body[body.size() - 2 - backslashes] == '\\') {
    ++backslashes;
  }
  const bool end = !body.empty() && body.back() == '$' && backslashes % 2 == 0;
  if (end) body.pop_back();
  if ((start || end) && HasTopLevelBar(body)) {
    return SchemaRefused(path, "an anchor beside a top-level | is not supported; group the "
                        "alternatives: ^(?:a|b)$");
  }
  auto alone = RegexGuide::Compile(body);
  if (!alone.ok()) {
    std::string why(alone.status().message());
    absl::StrReplaceAll({{"guided_regex: ", ""}}, &why);
    return SchemaRefused(path, why);
  }
  // The pattern is matched against the JSON text, so what JSON would escape is kept out.
  bool escaped = (*alone)->Emits('"') || (*alone)->Emits('\\');
  for (int b = 0; b < 0x20; ++b) escaped = escaped || (*alone)->Emits(uint8_t(b));
  if (escaped) {
    return SchemaRefused(path, "it may match '\"', '\\' or a control character, which JSON escapes; "
                        "keep them out of it (e.g. [^\"\\\\\\x00-\\x1f] for .)");
  }
  // Anchors are taken at its ends only (with text around it, one inside would be refused
  // later, without saying where).
  if (!RegexGuide::Compile(absl::StrCat("x", RegexGroup(body), "x")).ok()) {
    return SchemaRefused(path, "^ or $ inside the pattern (not at its start or end) is not supported");
  }
  const std::string any = absl::StrCat(kJsonStringChar, "*");
  *out = absl::StrCat("\"", start ? "" : any, RegexGroup(body), end ? "" : any, "\"");
  return absl::OkStatus();
}

// A bound of an integer: a whole number (rounded inwards) within ±1e18.
absl::StatusOr<std::optional<int64_t>> Bound(const SchemaJson& s, const char* key, bool lower,
                                             bool exclusive, const std::string& path) {
  if (!s.contains(key)) return std::optional<int64_t>();
  const SchemaJson& v = s[key];
  if (v.is_boolean()) {
    return SchemaRefused(path + "/" + key, "as a boolean (draft 4) is not supported; give the bound");
  }
  constexpr int64_t kLimit = 1000000000000000000;  // 1e18
  if (!v.is_number() || !(std::fabs(v.get<double>()) <= 1e18) ||
      (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(kLimit))) {
    return SchemaRefused(path + "/" + key, "must be a number within ±1e18");
  }
  if (v.is_number_integer()) {  // exactly, not through a double (2^53 < 1e18)
    const int64_t x = v.get<int64_t>();
    if (x < -kLimit || x > kLimit) {
      return SchemaRefused(path + "/" + key, "must be a number within ±1e18");
    }
    return std::optional<int64_t>(exclusive ? x + (lower ? 1 : -1) : x);
  }
  const double x = v.get<double>();
  double bound = lower ? std::ceil(x) : std::floor(x);
  if (exclusive && bound == x) bound += lower ? 1 : -1;
  return std::optional<int64_t>(int64_t(bound));
}

}  // namespace

absl::Status SchemaRefused(const std::string& path, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("guided_json: ", path, ": ", model::AsAbsl(what)));
}

absl::StatusOr<std::optional<int>> SchemaCount(const SchemaJson& s, const char* key,
                                               const std::string& path) {
  if (!s.contains(key)) return std::optional<int>();
  const SchemaJson& v = s[key];
  if (!v.is_number() || v.get<double>() < 0 || v.get<double>() != std::floor(v.get<double>())) {
    return SchemaRefused(path + "/" + key, "must be a whole number >= 0");
  }
  if (v.get<double>() > kMaxRegexRepeat) {
    return SchemaRefused(path + "/" + key, absl::StrFormat("over %d is not supported", kMaxRegexRepeat));
  }
  return std::optional<int>(int(v.get<double>()));
}

absl::Status StringSchemaRegex(const SchemaJson& s, const std::string& path, std::string* out,
                               std::vector<std::pair<std::string, int>>* counted) {
  auto min = SchemaCount(s, "minLength", path);
  if (!min.ok()) return min.status();
  auto max = SchemaCount(s, "maxLength", path);
  if (!max.ok()) return max.status();
  const bool lengths = min->has_value() || max->has_value();
  if (s.contains("format")) {
    if (lengths || s.contains("pattern")) {
      return SchemaRefused(path, "format beside pattern, minLength or maxLength is not supported");
    }
    const SchemaJson& f = s["format"];
    const std::string name = f.is_string() ? f.get<std::string>() : "";
    const char* body = nullptr;
    if (name == "date") {
      body = kJsonDate;
    } else if (name == "time") {
      body = kJsonTime;
    } else if (name == "date-time") {
      *out = absl::StrCat("\"", kJsonDate, "[Tt]", kJsonTime, "\"");
      return absl::OkStatus();
    } else if (name == "uuid") {
      body = kJsonUuid;
    } else {
      return SchemaRefused(path + "/format",
                    absl::StrCat(f.dump(), " is not supported (date, time, date-time, uuid)"));
    }
    *out = absl::StrCat("\"", body, "\"");
    return absl::OkStatus();
  }
  if (s.contains("pattern")) {
    if (lengths) return SchemaRefused(path, "pattern beside minLength or maxLength is not supported");
    return PatternRegex(s["pattern"], path + "/pattern", out);
  }
  const int lo = min->value_or(0);
  if (max->has_value() && **max < lo) return SchemaRefused(path, "minLength is over maxLength");
  const std::string repeat = max->has_value() ? absl::StrCat("{", lo, ",", **max, "}")
                             : lo == 0        ? std::string("*")
                                              : absl::StrCat("{", lo, ",}");
  *out = absl::StrCat("\"", kJsonStringChar, repeat, "\"");
  if (min->has_value() || max->has_value()) {
    counted->push_back({absl::StrCat(path, max->has_value() ? "/maxLength" : "/minLength"),
                        max->value_or(lo)});
  }
  return absl::OkStatus();
}

absl::Status IntegerSchemaRegex(const SchemaJson& s, const std::string& path, std::string* out) {
  std::optional<int64_t> lo, hi;
  for (auto [key, lower, exclusive] : {std::tuple{"minimum", true, false},
                                       {"exclusiveMinimum", true, true},
                                       {"maximum", false, false},
                                       {"exclusiveMaximum", false, true}}) {
    auto bound = Bound(s, key, lower, exclusive, path);
    if (!bound.ok()) return bound.status();
    if (!bound->has_value()) continue;
    std::optional<int64_t>& b = lower ? lo : hi;
    b = !b ? **bound : lower ? std::max(*b, **bound) : std::min(*b, **bound);
  }
  if (lo && hi && *lo > *hi) return SchemaRefused(path, "no integer lies within its bounds");
  *out = IntegerRangeRegex(lo, hi);
  return absl::OkStatus();
}

absl::Status NumberSchemaRegex(const SchemaJson& s, const std::string& path, std::string* out) {
  for (const char* key : {"maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
    if (s.contains(key)) {
      return SchemaRefused(path + "/" + key, "bounds on a number other than minimum 0 are not "
                                      "supported (an integer takes any bounds)");
    }
  }
  if (s.contains("minimum")) {
    if (!s["minimum"].is_number() || s["minimum"].get<double>() != 0) {
      return SchemaRefused(path + "/minimum", "bounds on a number other than minimum 0 are not "
                                       "supported (an integer takes any bounds)");
    }
    *out = absl::StrCat(kJsonNonNegative, kJsonFraction);
    return absl::OkStatus();
  }
  *out = absl::StrCat(kJsonInteger, kJsonFraction);
  return absl::OkStatus();
}

}  // namespace thetaserve::scheduler
