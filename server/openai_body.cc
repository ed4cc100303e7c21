#include "server/openai_body.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"

namespace thetaserve::server {

bool ServedModel::Serves(std::string_view model) const {
  return std::find(names.begin(), names.end(), model) != names.end();
}

std::string ServedModel::Described() const {
  std::string out = absl::StrCat("'", names.front(), "'");
  for (size_t i = 1; i < names.size(); ++i) {
    absl::StrAppend(&out, i == 1 ? " (also '" : ", '", names[i], "'");
  }
  if (names.size() > 1) out += ")";
  return out;
}

}  // namespace thetaserve::server

namespace thetaserve::server::openai_body {
namespace {

// Why the parser refused `text`: its message (a number past double's range, a lone UTF-16
// surrogate, a syntax error and where), without the "[json.exception...] " tag. Read through
// the SAX interface, which hands the error over instead of throwing it.
std::string JsonParseError(std::string_view text) {
  struct Sax : nlohmann::json_sax<In> {
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override { return true; }
    bool key(string_t&) override { return true; }
    bool end_object() override { return true; }
    bool start_array(std::size_t) override { return true; }
    bool end_array() override { return true; }
    bool parse_error(std::size_t, const std::string&,
                     const nlohmann::detail::exception& e) override {
      what = e.what();
      return false;
    }
    std::string what;
  } sax;
  In::sax_parse(text, &sax);
  const size_t tag = sax.what.find("] ");
  return tag == std::string::npos ? sax.what : sax.what.substr(tag + 2);
}

}  // namespace

absl::Status Invalid(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(field + " " + what);
}

bool Given(const In& body, const char* key) {
  auto it = body.find(key);
  return it != body.end() && !it->is_null();
}

absl::StatusOr<double> Number(const In& body, const char* key) {
  const In& v = body.at(key);
  if (!v.is_number()) return Invalid(key, "must be a number");
  return v.get<double>();
}

absl::StatusOr<int64_t> Integer(const In& body, const char* key) {
  const In& v = body.at(key);
  // 2^63 and above would wrap to a negative number.
  constexpr uint64_t kMax = std::numeric_limits<int64_t>::max();
  if (v.is_number_unsigned() && v.get<uint64_t>() > kMax) {
    return Invalid(key, "must be an integer below 2^63");
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()) {
    // Read as a float: written with a fraction or exponent (2.0, 1e3), or past 64 bits. Below
    // 2^52 a whole float is the integer written (a fraction would have survived rounding).
    const double d = v.get<double>();
    if (std::fabs(d) < 0x1p52) return static_cast<int64_t>(d);
    if (d >= 0x1p63) return Invalid(key, "must be an integer below 2^63");
    // -2^63 - 1 and a little beyond round to -2^63 itself: written in digits, it is read exactly.
    if (d <= -0x1p63) {
      return Invalid(key, "must be an integer at or above -2^63, written in digits");
    }
    return Invalid(key, "must be an integer written in digits (no fraction or exponent) past 2^52");
  }
  return Invalid(key, "must be an integer");
}

absl::StatusOr<bool> Bool(const In& body, const char* key) {
  const In& v = body.at(key);
  if (!v.is_boolean()) return Invalid(key, "must be true or false");
  return v.get<bool>();
}

absl::StatusOr<std::string> String(const In& v, const std::string& field) {
  if (!v.is_string()) return Invalid(field, "must be a string");
  return v.get<std::string>();
}

// Refuses a parameter the server cannot honour unless it has its neutral value.
absl::Status Unsupported(const std::string& key, const std::string& why) {
  return absl::InvalidArgumentError(key + " is not supported: " + why);
}

// Token ids from a JSON array (the prompt, stop_token_ids).
absl::StatusOr<std::vector<uint32_t>> TokenIdArray(const In& v, const std::string& field) {
  std::vector<uint32_t> ids;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number_integer() || v[i].get<int64_t>() < 0 ||
        v[i].get<int64_t>() > std::numeric_limits<uint32_t>::max()) {
      return Invalid(absl::StrCat(field, "[", i, "]"), "must be a token id (an integer >= 0)");
    }
    ids.push_back(static_cast<uint32_t>(v[i].get<int64_t>()));
  }
  return ids;
}

namespace {

size_t SkipSpace(std::string_view t, size_t i) {
  while (i < t.size() && (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' || t[i] == '\r')) ++i;
  return i;
}

// Past the string that starts at t[i].
size_t SkipString(std::string_view t, size_t i) {
  for (++i; i < t.size(); ++i) {
    if (t[i] == '\\') {
      ++i;
    } else if (t[i] == '"') {
      return i + 1;
    }
  }
  return t.size();
}

// Past the value that starts at t[i] (valid JSON: the parse has seen it).
size_t SkipValue(std::string_view t, size_t i) {
  if (i < t.size() && t[i] == '"') return SkipString(t, i);
  if (i < t.size() && (t[i] == '{' || t[i] == '[')) {
    int depth = 0;
    while (i < t.size()) {
      const char c = t[i];
      if (c == '"') {
        i = SkipString(t, i);
        continue;
      }
      if (c == '{' || c == '[') {
        ++depth;
      } else if ((c == '}' || c == ']') && --depth == 0) {
        return i + 1;
      }
      ++i;
    }
    return t.size();
  }
  while (i < t.size() && std::string_view(",}] \t\n\r").find(t[i]) == std::string_view::npos) {
    ++i;
  }
  return i;
}

// The text of member `key` of the object whose text is `object`; empty when absent.
std::string_view Member(std::string_view object, std::string_view key) {
  std::string_view found;
  size_t i = SkipSpace(object, 1);
  while (i < object.size() && object[i] == '"') {
    const size_t key_end = SkipString(object, i);
    const std::string_view raw = object.substr(i + 1, key_end - i - 2);
    bool same = raw == key;
    if (!same && raw.find('\\') != std::string_view::npos) {  // an escaped name: decode it
      const In name = In::parse(object.substr(i, key_end - i), nullptr, false);
      same = name.is_string() && name.get_ref<const std::string&>() == key;
    }
    i = SkipSpace(object, SkipSpace(object, key_end) + 1);  // past ':'
    const size_t value_end = SkipValue(object, i);
    if (same) found = object.substr(i, value_end - i);
    i = SkipSpace(object, value_end);
    if (i >= object.size() || object[i] != ',') break;
    i = SkipSpace(object, i + 1);
  }
  return found;
}

}  // namespace

std::string_view RawValue(std::string_view body_text,
                          std::initializer_list<std::string_view> path) {
  std::string_view v = body_text;
  if (v.substr(0, 3) == "\xEF\xBB\xBF") v.remove_prefix(3);  // a BOM, which the parse skips
  v.remove_prefix(SkipSpace(v, 0));
  for (std::string_view key : path) {
    if (!v.empty() && v[0] == '[') {  // an index
      size_t index = 0;
      for (char c : key) {
        if (c < '0' || c > '9') return {};
        index = index * 10 + size_t(c - '0');
      }
      size_t i = SkipSpace(v, 1);
      for (; index > 0 && i < v.size() && v[i] != ']'; --index) {
        i = SkipSpace(v, SkipValue(v, i));
        if (i >= v.size() || v[i] != ',') return {};
        i = SkipSpace(v, i + 1);
      }
      if (i >= v.size() || v[i] == ']') return {};
      v = v.substr(i, SkipValue(v, i) - i);
      continue;
    }
    if (v.empty() || v[0] != '{') return {};
    v = Member(v, key);
  }
  return v;
}

absl::StatusOr<In> ParseBody(std::string_view body_text, const ServedModel& served_model) {
  In body = In::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body is not valid JSON: ", JsonParseError(body_text)));
  }
  if (!body.is_object()) {
    return absl::InvalidArgumentError("the request body must be a JSON object");
  }
  if (Given(body, "model")) {
    auto model = String(body["model"], "model");
    if (!model.ok()) return model.status();
    if (!served_model.Serves(*model)) {
      return absl::NotFoundError(absl::StrCat("the model '", *model, "' does not exist; this "
                                              "server serves ", served_model.Described()));
    }
  }
  return body;
}

}  // namespace thetaserve::server::openai_body
