#include "scheduler/guided_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "scheduler/guided_grammar.h"
#include "scheduler/guided_json.h"
#include "scheduler/guided_regex.h"
#include "scheduler/json_text_regex.h"
#include "scheduler/regex_syntax.h"
#include "scheduler/schema_scalars.h"

namespace thetaserve::scheduler {
namespace {

static_assert(kMaxJsonSchemaRecursions <= kMaxRegexRepeat);  // ParseRegex reads (?&N) as a count

using Json = SchemaJson;

// Keywords that only annotate: read past.
const std::set<std::string, std::less<>>& Annotations() {
  static const auto* keys = new std::set<std::string, std::less<>>{
      "title", "description", "$schema", "$id", "$comment", "default", "examples",
      "deprecated", "readOnly", "writeOnly", "$defs", "definitions"};
  return *keys;
}

// Keywords that constrain and are guided.
const std::set<std::string, std::less<>>& Constraints() {
  static const auto* keys = new std::set<std::string, std::less<>>{
      "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
      "properties", "required", "additionalProperties",
      "items", "prefixItems", "minItems", "maxItems",
      "minLength", "maxLength", "pattern", "format",
      "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
  return *keys;
}

// A JSON pointer's token for `key`.
std::string PointerToken(const std::string& key) {
  return absl::StrReplaceAll(key, {{"~", "~0"}, {"/", "~1"}});
}

// A $ref target that refers to itself (through other schemas or directly): a rule of the
// schema's grammar, called as (?&N) where it recurs (N its index).
struct RecursiveRef {
  std::string pointer;  // the target's, "#/$defs/node"
  std::string regex;    // its expression, calls included
};

class SchemaRegex {
 public:
  const std::vector<std::pair<std::string, int>>& counted() const { return counted_; }
  std::vector<RecursiveRef>& recursive() { return recursive_; }

  explicit SchemaRegex(const Json& root) : root_(root) {
    ws_ = absl::StrCat("[ \\t\\n\\r]{0,", kJsonSchemaWhitespace, "}");
    sep_ = absl::StrCat(ws_, ",", ws_);
  }

  absl::Status Value(const Json& s, const std::string& path, int depth, std::string* out) {
    if (depth > kMaxJsonSchemaNesting) {
      return Refuse(path, absl::StrFormat("schemas nest more than %d deep", kMaxJsonSchemaNesting));
    }
    if (s.is_boolean()) {
      if (s == false) return Refuse(path, "false matches nothing");
      *out = Any(kJsonSchemaAnyLevels);
      return Charge(path, *out);
    }
    if (!s.is_object()) return Refuse(path, "a schema must be an object");
    std::vector<std::string> constraining;
    for (const auto& [key, value] : s.items()) {
      if (Annotations().count(key)) continue;
      if (!Constraints().count(key)) {
        return Refuse(path, absl::StrCat("keyword ", key, " is not supported"));
      }
      constraining.push_back(key);
    }
    // $ref, anyOf, oneOf and allOf stand alone (beside them, other keywords would intersect).
    for (const char* alone : {"$ref", "anyOf", "oneOf", "allOf"}) {
      if (s.contains(alone) && constraining.size() > 1) {
        return Refuse(path, absl::StrCat(alone, " beside other keywords (",
                                         absl::StrJoin(constraining, ", "),
                                         ") is not supported"));
      }
    }
    if (s.contains("$ref")) return Ref(s["$ref"], path, depth, out);
    for (const char* any : {"anyOf", "oneOf"}) {
      if (!s.contains(any)) continue;
      const Json& list = s[any];
      const std::string at = absl::StrCat(path, "/", any);
      if (!list.is_array() || list.empty()) return Refuse(at, "must be a non-empty list");
      std::vector<std::string> alternatives(list.size());
      for (size_t i = 0; i < list.size(); ++i) {
        auto status = Value(list[i], absl::StrCat(at, "/", i), depth + 1, &alternatives[i]);
        if (!status.ok()) return status;
      }
      *out = RegexGroup(absl::StrJoin(alternatives, "|"));
      return Charge(path, *out);
    }
    if (s.contains("allOf")) {
      const Json& list = s["allOf"];
      if (!list.is_array() || list.size() != 1) {
        return Refuse(path + "/allOf", "only a list of one schema is supported");
      }
      return Value(list[0], path + "/allOf/0", depth + 1, out);
    }
    if (s.contains("const") || s.contains("enum")) return Enum(s, constraining, path, out);
    auto given = Types(s, path);
    if (!given.ok()) return given.status();
    std::vector<std::string> types = std::move(*given);
    if (types.empty()) {
      // No type: the one its keywords imply.
      for (const std::string& key : constraining) {
        const std::string type =
            key == "properties" || key == "required" || key == "additionalProperties" ? "object"
            : key == "items" || key == "prefixItems" || key == "minItems" ||
                    key == "maxItems"
                ? "array"
            : key == "minLength" || key == "maxLength" || key == "pattern" || key == "format"
                ? "string"
                : "number";
        if (std::find(types.begin(), types.end(), type) == types.end()) types.push_back(type);
      }
      if (types.empty()) {  // any value
          *out = Any(kJsonSchemaAnyLevels);
        return Charge(path, *out);
      }
      if (types.size() > 1) {
        return Refuse(path, absl::StrCat("no type, and keywords of several (",
                                         absl::StrJoin(types, ", "), "): give the type"));
      }
    }
    std::vector<std::string> alternatives(types.size());
    for (size_t i = 0; i < types.size(); ++i) {
      auto status = Typed(s, types[i], path, depth, &alternatives[i]);
      if (!status.ok()) return status;
    }
    *out = alternatives.size() == 1 ? alternatives[0]
                                    : RegexGroup(absl::StrJoin(alternatives, "|"));
    return Charge(path, *out);
  }

 private:
  static absl::Status Refuse(const std::string& path, std::string_view what) {
    return SchemaRefused(path, what);
  }

  // The names `type` gives (a name or a non-empty list of them); none when it is absent.
  static absl::StatusOr<std::vector<std::string>> Types(const Json& s, const std::string& path) {
    std::vector<std::string> types;
    if (!s.contains("type")) return types;
    const Json& type = s["type"];
    if (type.is_string()) {
      types.push_back(type.get<std::string>());
      return types;
    }
    if (!type.is_array() || type.empty()) {
      return Refuse(path + "/type", "must be a name or a list of names");
    }
    for (const Json& t : type) {
      if (!t.is_string()) return Refuse(path + "/type", "must be a name or a list of names");
      types.push_back(t.get<std::string>());
    }
    return types;
  }

  // Every piece of the expression built is counted as it is made: a schema that reuses a part
  // many times (a $ref in each of thousands of alternatives) is refused before its copies add
  // up, not after.
  absl::Status Charge(const std::string& path, const std::string& piece) {
    spent_ += piece.size();
    if (piece.size() > size_t(kMaxJsonSchemaRegexBytes)) {
      return Refuse(path, absl::StrFormat("the schema is too large: its regular expression "
                                          "would be over %d bytes", kMaxJsonSchemaRegexBytes));
    }
    if (spent_ > size_t(kMaxJsonSchemaWork)) {
      return Refuse(path, absl::StrFormat("the schema is too large: building its regular "
                                          "expression passed %d bytes here",
                                          kMaxJsonSchemaWork));
    }
    return absl::OkStatus();
  }

  // Any JSON value with at most `levels` objects and arrays nested in it (0: a string, a
  // number, true, false or null); an object's names any strings. Each level built once.
  const std::string& Any(int levels) {
    while (any_.size() <= size_t(levels)) {
      if (any_.empty()) {
        any_.push_back(RegexGroup(absl::StrCat("\"", kJsonStringChar, "*\"|", kJsonInteger,
                                               kJsonFraction, "|true|false|null")));
        continue;
      }
      const std::string& inner = any_.back();
      const std::string array =
          absl::StrCat("\\[", ws_, RegexGroup(List(inner, "*")), "?", ws_, "\\]");
      any_.push_back(RegexGroup(absl::StrCat(any_.front(), "|", Map(inner), "|", array)));
    }
    return any_[size_t(levels)];
  }

  // `item`, then more of it after commas, as many as `repeat` says (a regex quantifier).
  std::string List(const std::string& item, const std::string& repeat) const {
    return absl::StrCat(item, RegexGroup(absl::StrCat(sep_, item)), repeat);
  }

  // An object of any names, each value `value`.
  std::string Map(const std::string& value) const {
    const std::string member =
        absl::StrCat("\"", kJsonStringChar, "*\"", ws_, ":", ws_, value);
    return absl::StrCat("\\{", ws_, RegexGroup(List(member, "*")), "?", ws_, "\\}");
  }

  absl::Status Ref(const Json& ref, const std::string& path, int depth, std::string* out) {
    if (!ref.is_string() || ref.get<std::string>().rfind('#', 0) != 0) {
      return Refuse(path + "/$ref", "only references into this schema (\"#/...\") are supported");
    }
    const std::string target_path = ref.get<std::string>();
    const Json* target = nullptr;
    try {
      target = &root_.at(Json::json_pointer(target_path.substr(1)));
    } catch (const nlohmann::json::exception&) {
      return Refuse(path + "/$ref", absl::StrCat(target_path, " points at nothing in the schema"));
    }
    // A reference to a target being built: the target is a rule, called here (which no
    // regular expression can say: the schema is then guided by a grammar).
    if (std::find(expanding_.begin(), expanding_.end(), target) != expanding_.end()) {
      auto [it, added] = called_.emplace(target, int(recursive_.size()));
      if (added) {
        if (recursive_.size() >= size_t(kMaxJsonSchemaRecursions)) {
          return Refuse(path + "/$ref", absl::StrFormat("more than %d definitions are recursive",
                                                        kMaxJsonSchemaRecursions));
        }
        recursive_.push_back({target_path, ""});
      }
      *out = absl::StrCat("(?&", it->second, ")");
      return Charge(path, *out);
    }
    // A part referred to again is built once.
    if (auto it = refs_.find(target); it != refs_.end()) {
      *out = it->second;
      return Charge(path, *out);
    }
    return Expand(target, target_path, depth + 1, out);
  }

 public:
  // The whole schema, which "#" refers to.
  absl::Status Whole(std::string* out) { return Expand(&root_, "#", 0, out); }

 private:
  // `target`'s expression (at `depth`); a call of its rule where it proved recursive.
  absl::Status Expand(const Json* target, const std::string& target_path, int depth,
                      std::string* out) {
    expanding_.push_back(target);
    std::string body;
    auto status = Value(*target, target_path, depth, &body);
    expanding_.pop_back();
    if (!status.ok()) return status;
    if (auto it = called_.find(target); it != called_.end()) {
      recursive_[size_t(it->second)].regex = std::move(body);
      *out = absl::StrCat("(?&", it->second, ")");
    } else {
      *out = std::move(body);
    }
    refs_[target] = *out;
    return absl::OkStatus();
  }

  absl::Status Enum(const Json& s, const std::vector<std::string>& constraining,
                    const std::string& path, std::string* out) {
    for (const std::string& key : constraining) {
      if (key != "type" && key != "enum" && key != "const") {
        return Refuse(path, absl::StrCat(key, " beside enum or const is not supported"));
      }
    }
    if (s.contains("const") && s.contains("enum")) {
      return Refuse(path, "const and enum are both given; send one");
    }
    // Beside a type, only the values of that type.
    auto given = Types(s, path);
    if (!given.ok()) return given.status();
    const std::vector<std::string>& types = *given;
    auto typed = [&](const Json& v) {
      if (types.empty()) return true;
      for (const std::string& t : types) {
        if ((t == "string" && v.is_string()) || (t == "boolean" && v.is_boolean()) ||
            (t == "null" && v.is_null()) || (t == "object" && v.is_object()) ||
            (t == "array" && v.is_array()) || (t == "number" && v.is_number()) ||
            (t == "integer" && (v.is_number_integer() ||
                                (v.is_number_float() &&
                                 v.get<double>() == std::floor(v.get<double>()))))) {
          return true;
        }
      }
      return false;
    };
    std::vector<std::string> values;
    if (s.contains("const")) {
      if (!typed(s["const"])) return Refuse(path, "const is not of the type: it matches nothing");
      values.push_back(RegexLiteral(s["const"].dump()));
    } else {
      const Json& list = s["enum"];
      if (!list.is_array() || list.empty()) {
        return Refuse(path + "/enum", "must be a non-empty list");
      }
      for (const Json& v : list) {
        if (typed(v)) values.push_back(RegexLiteral(v.dump()));
      }
      if (values.empty()) return Refuse(path, "no enum value is of the type: it matches nothing");
    }
    *out = RegexGroup(absl::StrJoin(values, "|"));
    return Charge(path, *out);
  }

  absl::Status Typed(const Json& s, const std::string& type, const std::string& path, int depth,
                     std::string* out) {
    if (type == "string") return StringSchemaRegex(s, path, out, &counted_);
    if (type == "integer") return IntegerSchemaRegex(s, path, out);
    if (type == "number") return NumberSchemaRegex(s, path, out);
    if (type == "boolean") {
      *out = "(?:true|false)";
      return absl::OkStatus();
    }
    if (type == "null") {
      *out = "null";
      return absl::OkStatus();
    }
    if (type == "object") return Object(s, path, depth, out);
    if (type == "array") return Array(s, path, depth, out);
    return Refuse(path + "/type", absl::StrCat(type, " is not a JSON schema type"));
  }

  absl::Status Object(const Json& s, const std::string& path, int depth, std::string* out) {
    static const Json kNone = Json::object();
    const Json& props = s.contains("properties") ? s["properties"] : kNone;
    if (!props.is_object()) return Refuse(path + "/properties", "must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      const Json& list = s["required"];
      if (!list.is_array()) return Refuse(path + "/required", "must be a list of names");
      for (const Json& name : list) {
        if (!name.is_string()) return Refuse(path + "/required", "must be a list of names");
        if (!props.contains(name.get<std::string>())) {
          return Refuse(path + "/required",
                        absl::StrCat(name.dump(), " is not in properties (any property "
                                                  "cannot be guided)"));
        }
        required.insert(name.get<std::string>());
      }
    }
    if (s.contains("additionalProperties")) {
      const Json& extra = s["additionalProperties"];
      if (!extra.is_boolean() && !extra.is_object()) {
        return Refuse(path + "/additionalProperties", "must be a boolean or a schema");
      }
    }
    // Only the listed properties are written, which every additionalProperties allows.
    const std::string brace_open = absl::StrCat("\\{", ws_), brace_close = absl::StrCat(ws_, "\\}");
    if (props.empty()) {
      const Json& extra = s.contains("additionalProperties") ? s["additionalProperties"]
                                                             : Json(true);
      // Properties given, none listed: no properties ({"properties": {}} is how a function of
      // no arguments says so), unless additionalProperties describes the values of a map.
      if (extra == false || (s.contains("properties") && !extra.is_object())) {
        *out = absl::StrCat(brace_open, brace_close);
        return absl::OkStatus();
      }
      // A map: any names, each value what additionalProperties says (any value, nested at
      // most kJsonSchemaAnyLevels deep with the object).
      std::string value;
      if (extra == true) {
          value = Any(kJsonSchemaAnyLevels - 1);
      } else {
        auto status = Value(extra, path + "/additionalProperties", depth + 1, &value);
        if (!status.ok()) return status;
      }
      *out = Map(value);
      return Charge(path, *out);
    }
    std::vector<std::string> member;  // "key": value
    std::vector<bool> needed;
    for (const auto& [key, schema] : props.items()) {
      const std::string at = absl::StrCat(path, "/properties/", PointerToken(key));
      if (schema == false) {  // never present
        if (required.count(key)) return Refuse(at, "is required, and false matches nothing");
        continue;
      }
      std::string value;
      auto status = Value(schema, at, depth + 1, &value);
      if (!status.ok()) return status;
      member.push_back(absl::StrCat(RegexLiteral(Json(key).dump()), ws_, ":", ws_, value));
      if (status = Charge(at, member.back()); !status.ok()) return status;
      needed.push_back(required.count(key) > 0);
    }
    // after[j]: members j.. written after one already is, each after a comma.
    const size_t n = member.size();
    if (n == 0) {
      *out = absl::StrCat(brace_open, brace_close);
      return absl::OkStatus();
    }
    std::vector<std::string> after(n + 1);
    for (size_t j = n; j-- > 0;) {
      const std::string piece = absl::StrCat(sep_, member[j]);
      after[j] =
          absl::StrCat(needed[j] ? piece : absl::StrCat(RegexGroup(piece), "?"), after[j + 1]);
      if (auto status = Charge(path, after[j]); !status.ok()) return status;
    }
    // The first member written: any up to the first required one.
    std::vector<std::string> first;
    bool some_required = false;
    for (size_t k = 0; k < n && !some_required; ++k) {
      first.push_back(absl::StrCat(member[k], after[k + 1]));
      some_required = needed[k];
      if (auto status = Charge(path, first.back()); !status.ok()) return status;
    }
    *out = absl::StrCat(brace_open, RegexGroup(absl::StrJoin(first, "|")), some_required ? "" : "?",
                        brace_close);
    return Charge(path, *out);
  }

  absl::Status Array(const Json& s, const std::string& path, int depth, std::string* out) {
    const std::string open = absl::StrCat("\\[", ws_), close = absl::StrCat(ws_, "\\]");
    if (s.contains("prefixItems")) {
      const Json& list = s["prefixItems"];
      if ((s.contains("items") && s["items"] != false) || s.contains("minItems") ||
          s.contains("maxItems")) {
        return Refuse(path, "prefixItems beside items, minItems or maxItems is not supported");
      }
      if (!list.is_array()) return Refuse(path + "/prefixItems", "must be a list of schemas");
      std::vector<std::string> items(list.size());
      for (size_t i = 0; i < list.size(); ++i) {
        auto status = Value(list[i], absl::StrCat(path, "/prefixItems/", i), depth + 1, &items[i]);
        if (!status.ok()) return status;
      }
      *out = absl::StrCat(open, absl::StrJoin(items, sep_), close);
      return Charge(path, *out);
    }

    auto min = SchemaCount(s, "minItems", path);
    if (!min.ok()) return min.status();
    auto max = SchemaCount(s, "maxItems", path);
    if (!max.ok()) return max.status();
    const int lo = min->value_or(0);
    if (max->has_value() && **max < lo) return Refuse(path, "minItems is over maxItems");
    if (max->has_value() && **max == 0) {
      *out = absl::StrCat(open, close);
      return absl::OkStatus();
    }
    std::string item;
    if (s.contains("items")) {
      auto status = Value(s["items"], path + "/items", depth + 1, &item);
      if (!status.ok()) return status;
    } else {  // any values
      item = Any(kJsonSchemaAnyLevels - 1);
    }
    const int more_lo = std::max(lo, 1) - 1;
    const std::string repeat = max->has_value() ? absl::StrCat("{", more_lo, ",", **max - 1, "}")
                               : more_lo == 0   ? std::string("*")
                                                : absl::StrCat("{", more_lo, ",}");
    const std::string body = List(item, repeat);
    *out = absl::StrCat(open, lo == 0 ? absl::StrCat(RegexGroup(body), "?") : body, close);
    if (min->has_value() || max->has_value()) {
      counted_.push_back(
          {absl::StrCat(path, max->has_value() ? "/maxItems" : "/minItems"), max->value_or(lo)});
    }
    return Charge(path, *out);
  }

  const Json& root_;
  std::string ws_;   // whitespace between tokens
  std::string sep_;  // a comma between items, whitespace around it
  // The counted repeats (where the automaton and the grammar grow with the count) and their
  // counts: the ones to blame when the whole is too large.
  std::vector<std::pair<std::string, int>> counted_;
  std::vector<const Json*> expanding_;  // the $ref targets being expanded, for recursion
  std::map<const Json*, std::string> refs_;  // the $ref targets built
  std::map<const Json*, int> called_;        // the recursive ones: their index in recursive_
  std::vector<RecursiveRef> recursive_;
  std::vector<std::string> any_;             // [levels]: Any(levels)
  size_t spent_ = 0;                     // bytes of expression built, pieces included
};

// A schema's regular expression, with what to blame should it be too large (the parts with
// counted repeats), and its recursive definitions.
struct Built {
  std::string regex;
  std::vector<std::pair<std::string, int>> counted;  // where each count is, and its value
  std::vector<RecursiveRef> recursive;  // none: `regex` is the whole schema's
};

absl::StatusOr<Built> Build(std::string_view schema) {
  if (schema.size() > size_t(kMaxJsonSchemaBytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "guided_json: the schema has %d bytes; at most %d", schema.size(), kMaxJsonSchemaBytes));
  }
  // Nesting is checked before parsing: printing a value (const, enum) recurses.
  if (JsonNesting(schema) > 2 * kMaxJsonSchemaNesting) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "guided_json: the schema nests more than %d deep", 2 * kMaxJsonSchemaNesting));
  }
  const Json root = Json::parse(schema, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("guided_json: is not valid JSON");
  Built built;
  SchemaRegex builder(root);
  auto status = builder.Whole(&built.regex);
  if (!status.ok()) return status;
  built.counted = builder.counted();
  built.recursive = std::move(builder.recursive());
  return built;
}

// GBNF (grammar_syntax.h) written from patterns (ParseRegex's trees, calls included): a pattern
// becomes a rule; its alternations and counted repetitions rules of their own, each written
// once however often it recurs (whitespace, a string's character), so that the text has no
// groups and the grammar's parse expands each count once.
class GbnfWriter {
 public:
  // The grammar whose root matches `root`, and rule names[N] patterns[N], which calls (?&N)
  // in any of them call.
  static absl::StatusOr<std::string> Grammar(std::string_view root,
                                             const std::vector<std::string>& names,
                                             const std::vector<std::string>& patterns) {
    GbnfWriter w;
    w.call_names_ = names;
    for (size_t i = 0; i < names.size(); ++i) w.call_of_[names[i]] = i;
    w.calls_.resize(patterns.size());
    for (size_t i = 0; i < patterns.size(); ++i) {
      auto top = ParseRegex(patterns[i], &w.calls_[i].nodes, /*calls=*/true);
      if (!top.ok()) return top.status();
      w.calls_[i].top = *top;
    }
    std::vector<RegexNode> nodes;
    auto top = ParseRegex(root, &nodes, /*calls=*/true);
    if (!top.ok()) return top.status();
    std::string text = absl::StrCat("root ::= ", w.Write(nodes, *top), "\n");
    for (size_t i = 0; i < patterns.size(); ++i) {
      absl::StrAppend(&text, names[i], " ::= ", w.Write(w.calls_[i].nodes, w.calls_[i].top),
                      "\n");
    }
    return absl::StrCat(text, w.parts_);
  }

 private:
  // A code point in a literal or class: printable ASCII as itself (but for the characters
  // that would end or open something), the rest as \uHHHH or \UHHHHHHHH.
  static std::string Char(uint32_t cp, bool in_class) {
    if (!in_class && (cp == '"' || cp == '\\')) return std::string{'\\', char(cp)};
    const bool special = in_class && (cp == '"' || cp == '\\' || cp == ']' || cp == '-' ||
                                      cp == '^' || cp == '[');
    if (cp >= 0x20 && cp < 0x7F && !special) return std::string(1, char(cp));
    return cp < 0x10000 ? absl::StrFormat("\\u%04X", cp) : absl::StrFormat("\\U%08X", cp);
  }

  static std::string Class(const CodePointRanges& ranges) {
    if (ranges.empty()) return absl::StrFormat("[^\\u0000-\\U%08X]", kMaxCodePoint);  // none
    std::string out = "[";
    for (const auto& [lo, hi] : ranges) {
      absl::StrAppend(&out, Char(lo, true));
      if (hi != lo) absl::StrAppend(&out, "-", Char(hi, true));
    }
    return out + "]";
  }

  static bool OneChar(const RegexNode& n) {
    return n.kind == RegexNode::Kind::kClass && n.ranges.size() == 1 &&
           n.ranges[0].first == n.ranges[0].second;
  }

  // The rule whose one alternative or alternatives `body` is: one per body.
  std::string Named(std::string body) {
    auto [it, added] = named_.emplace(std::move(body), "");
    if (added) {
      it->second = absl::StrCat("p", ++parts_named_);
      absl::StrAppend(&parts_, it->second, " ::= ", it->first, "\n");
    }
    return it->second;
  }

  // A called rule's body as a sequence of items, where it is one (not an alternation) and
  // not being read already: what a leading call in an alternative is read as, so that
  // alternatives calling rules that begin alike part where the rules do.
  const std::vector<std::string>* CallItems(size_t n) {
    Call& call = calls_[n];
    if (call.state == Call::kUnread) {
      call.state = Call::kReading;
      if (call.nodes[size_t(call.top)].kind != RegexNode::Kind::kAlt) {
        call.items = Items(call.nodes, call.top);
      }
      call.state = Call::kRead;
    }
    return call.state == Call::kRead && !call.items.empty() ? &call.items : nullptr;
  }

  // An item that is a literal (`"..."`, not `""`).
  static bool Literal(const std::string& item) {
    return item.size() >= 3 && item.front() == '"' && item.back() == '"';
  }

  // The code point of an item that is one character's literal (Char's escapes).
  static bool OneCharItem(const std::string& item, uint32_t* cp) {
    if (!Literal(item)) return false;
    const std::string_view c = std::string_view(item).substr(1, item.size() - 2);
    if (c.size() == 1) {
      *cp = uint8_t(c[0]);
      return true;
    }
    if (c.size() == 2 && c[0] == '\\') {
      *cp = uint8_t(c[1]);
      return true;
    }
    if ((c.size() == 6 && c.starts_with("\\u")) || (c.size() == 10 && c.starts_with("\\U"))) {
      *cp = uint32_t(std::stoul(std::string(c.substr(2)), nullptr, 16));
      return true;
    }
    return false;
  }

  // Items in a row, literals next to each other one literal.
  static std::string Join(std::vector<std::string>::const_iterator begin,
                          std::vector<std::string>::const_iterator end) {
    std::vector<std::string> out;
    for (auto it = begin; it != end; ++it) {
      if (!out.empty() && Literal(out.back()) && Literal(*it)) {
        out.back().pop_back();
        out.back() += it->substr(1);
      } else {
        out.push_back(*it);
      }
    }
    return out.empty() ? "\"\"" : absl::StrJoin(out, " ");
  }

  // Alternatives (each a sequence of elements, a literal's characters each one) as one rule,
  // written as a trie: those that begin alike once up to where they part, so that a parse
  // holds one of them through the shared part. {"children": [...], "name": ...} |
  // {"children": [...], "version": ...} is {"children": [...], ("name": ... | "version": ...)
  // (else the parses would double at each level of a tree of either), and an enum of 2,000
  // strings is a tree of characters (else entering it would open 2,000 parses, past what a
  // parse may hold). Characters that part with the same rest after them are one class.
  std::string Alternatives(const std::vector<std::vector<std::string>>& given) {
    // The same alternatives are the same rule, named before it is written: a rule that holds
    // them again (a tree's children, under a leading call read as its rule) calls itself.
    std::string key;
    for (const auto& alternative : given) {
      absl::StrAppend(&key, absl::StrJoin(alternative, " "), "\n");
    }
    if (auto it = alternatives_named_.find(key); it != alternatives_named_.end()) {
      return it->second;
    }
    const std::string name = absl::StrCat("p", ++parts_named_);
    alternatives_named_[key] = name;
    // A leading call is read as its rule's items, and a leading rule of alternatives (written
    // whole before) as its alternatives, each then the rest: (X | Y) R is X R | Y R. So
    // alternatives that part only inside such a rule (two objects whose first members are
    // alternatives, each beginning with the same property) part there, not before it.
    // A call read here is not read again by the alternatives nested below (its rule's own
    // alternatives spread there would read it again, each time with more after it, without
    // end); and reads are counted, in all, against kMaxReads (unfolding calls of calls is
    // exponential).
    std::vector<std::vector<std::string>> alternatives;
    std::vector<size_t> read_calls;
    std::function<void(std::vector<std::string>, int)> read = [&](std::vector<std::string> a,
                                                                  int depth) {
      if (depth < kMaxCallsRead && !a.empty() && reads_ < kMaxReads) {
        if (auto call = call_of_.find(a[0]);
            call != call_of_.end() && !open_calls_.count(call->second)) {
          if (const std::vector<std::string>* items = CallItems(call->second)) {
            ++reads_;
            read_calls.push_back(call->second);
            a.erase(a.begin());
            a.insert(a.begin(), items->begin(), items->end());
            read(std::move(a), depth + 1);
            return;
          }
        }
        auto spread = alternatives_of_.find(a[0]);
        if (spread != alternatives_of_.end() &&
            alternatives.size() + spread->second.size() <= size_t(kMaxSpread)) {
          ++reads_;
          for (const std::vector<std::string>& b : spread->second) {
            std::vector<std::string> spread_a = b;
            spread_a.insert(spread_a.end(), a.begin() + 1, a.end());
            read(std::move(spread_a), depth + 1);
          }
          return;
        }
      }
      alternatives.push_back(std::move(a));
    };
    for (const auto& alternative : given) read(alternative, 0);
    std::vector<size_t> opened;
    for (size_t call : read_calls) {
      if (open_calls_.insert(call).second) opened.push_back(call);
    }
    std::vector<std::vector<size_t>> groups;  // by first item, in order
    std::map<std::string, size_t> group_of;
    for (size_t j = 0; j < alternatives.size(); ++j) {
      const std::string first = alternatives[j].empty() ? "" : alternatives[j][0];
      auto [it, added] = group_of.emplace(first, groups.size());
      if (added) groups.emplace_back();
      groups[it->second].push_back(j);
    }
    std::vector<std::string> bodies;
    // A rest after one character: its body's index, and the characters before it.
    std::map<std::string, std::pair<size_t, std::vector<uint32_t>>> char_then;
    for (const std::vector<size_t>& alike : groups) {
      const std::vector<std::string>& first = alternatives[alike[0]];
      if (first.empty()) {
        bodies.push_back("\"\"");
        continue;
      }
      if (alike.size() == 1) {
        uint32_t cp = 0;
        if (OneCharItem(first[0], &cp)) {
          const std::string rest = first.size() == 1 ? "" : Join(first.begin() + 1, first.end());
          auto [it, added] = char_then.emplace(rest, std::make_pair(bodies.size(),
                                                                    std::vector<uint32_t>()));
          if (added) bodies.emplace_back();
          it->second.second.push_back(cp);
          continue;
        }
        bodies.push_back(Join(first.begin(), first.end()));
        continue;
      }
      size_t shared = first.size();
      for (size_t j : alike) {
        size_t k = 0;
        while (k < shared && k < alternatives[j].size() && alternatives[j][k] == first[k]) ++k;
        shared = k;
      }
      std::vector<std::vector<std::string>> rests;
      for (size_t j : alike) {
        rests.emplace_back(alternatives[j].begin() + ptrdiff_t(shared), alternatives[j].end());
      }
      bodies.push_back(absl::StrCat(Join(first.begin(), first.begin() + ptrdiff_t(shared)), " ",
                                    Alternatives(rests)));
    }
    for (auto& [rest, at] : char_then) {
      std::vector<uint32_t>& chars = at.second;
      std::sort(chars.begin(), chars.end());
      CodePointRanges ranges;
      for (uint32_t cp : chars) {
        if (!ranges.empty() && ranges.back().second + 1 >= cp) {
          ranges.back().second = cp;
        } else {
          ranges.push_back({cp, cp});
        }
      }
      const std::string head = chars.size() == 1
                                   ? absl::StrCat("\"", Char(chars[0], false), "\"")
                                   : Class(ranges);
      bodies[at.first] = rest.empty() ? head : absl::StrCat(head, " ", rest);
    }
    for (size_t call : opened) open_calls_.erase(call);
    absl::StrAppend(&parts_, name, " ::= ", absl::StrJoin(bodies, " | "), "\n");
    alternatives_of_[name] = std::move(alternatives);
    return name;
  }

  // Node `n` as a sequence of GBNF elements, each character of a literal one.
  std::vector<std::string> Items(const std::vector<RegexNode>& nodes, int n) {
    const RegexNode& node = nodes[size_t(n)];
    if (node.kind == RegexNode::Kind::kEmpty) return {};
    if (node.kind != RegexNode::Kind::kConcat) return {Write(nodes, n)};
    std::vector<std::string> items;
    for (int kid : node.kids) {
      for (std::string& item : Items(nodes, kid)) items.push_back(std::move(item));
    }
    return items;
  }

  // Node `n` as GBNF elements in a row.
  std::string Write(const std::vector<RegexNode>& nodes, int n) {
    const RegexNode& node = nodes[size_t(n)];
    switch (node.kind) {
      case RegexNode::Kind::kEmpty:
        return "\"\"";
      case RegexNode::Kind::kClass:
        return OneChar(node) ? absl::StrCat("\"", Char(node.ranges[0].first, false), "\"")
                             : Class(node.ranges);
      case RegexNode::Kind::kCall:
        return call_names_[size_t(node.min)];
      case RegexNode::Kind::kConcat: {
        const std::vector<std::string> items = Items(nodes, n);
        return Join(items.begin(), items.end());
      }
      case RegexNode::Kind::kAlt: {
        std::vector<std::vector<std::string>> alternatives;
        for (int kid : node.kids) alternatives.push_back(Items(nodes, kid));
        return Alternatives(alternatives);
      }
      case RegexNode::Kind::kRepeat: {
        if (node.max == 0) return "\"\"";
        const RegexNode& kid = nodes[size_t(node.kids[0])];
        std::string item = Write(nodes, node.kids[0]);
        // One element (a class, a character, a rule) is repeated as it is; more, as a rule.
        if (!(kid.kind == RegexNode::Kind::kClass || kid.kind == RegexNode::Kind::kCall ||
              kid.kind == RegexNode::Kind::kAlt)) {
          item = Named(std::move(item));
        }
        if (node.min == 0 && node.max == 1) return item + "?";
        if (node.min == 0 && node.max < 0) return item + "*";
        if (node.min == 1 && node.max < 0) return item + "+";
        if (node.min == 1 && node.max == 1) return item;
        const std::string count = node.max < 0        ? absl::StrCat("{", node.min, ",}")
                                  : node.min == node.max ? absl::StrCat("{", node.min, "}")
                                                         : absl::StrCat("{", node.min, ",",
                                                                        node.max, "}");
        return Named(item + count);
      }
    }
    return "\"\"";
  }

  // Leading calls and rules of alternatives read as what they hold, one inside another, at
  // most; and the alternatives a rule of alternatives may be spread into.
  static constexpr int kMaxCallsRead = 4;
  static constexpr int kMaxSpread = 64;
  static constexpr int kMaxReads = 1024;  // calls read and rules spread, in all

  struct Call {  // a called rule
    std::vector<RegexNode> nodes;
    int top = 0;
    enum { kUnread, kReading, kRead } state = kUnread;
    std::vector<std::string> items;  // its body, where it is a sequence
  };
  std::vector<std::string> call_names_;
  std::map<std::string, size_t> call_of_;  // a called rule's name: its index
  std::vector<Call> calls_;
  std::map<std::string, std::string> named_;               // a part's body: its rule's name
  std::map<std::string, std::string> alternatives_named_;  // alternatives: their rule's name
  // A rule of alternatives written whole: its alternatives, as read.
  std::map<std::string, std::vector<std::vector<std::string>>> alternatives_of_;
  int parts_named_ = 0;
  std::string parts_;
  std::set<size_t> open_calls_;  // calls read by the alternatives being written
  int reads_ = 0;                // calls read and rules spread
};

// The rule name of recursive definition `i` at `pointer`: "ref<i>-" and the pointer's letters
// and digits ("#/$defs/tree_node" is ref0-defs-tree-node).
std::string RuleName(size_t i, const std::string& pointer) {
  std::string name = absl::StrCat("ref", i);
  for (char c : pointer) {
    const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!word && name.back() == '-') continue;
    name += word ? c : '-';
    if (name.size() >= 48) break;
  }
  while (name.back() == '-') name.pop_back();
  return name;
}

absl::StatusOr<std::string> BuiltGrammar(const Built& built, std::vector<std::string>* names) {
  names->clear();
  for (size_t i = 0; i < built.recursive.size(); ++i) {
    names->push_back(RuleName(i, built.recursive[i].pointer));
  }
  std::vector<std::string> patterns;
  for (const RecursiveRef& r : built.recursive) patterns.push_back(r.regex);
  return GbnfWriter::Grammar(built.regex, *names, patterns);
}

// `items` joined by ", ", at most three of them named.
std::string FirstFew(const std::vector<std::string>& items) {
  if (items.size() <= 3) return absl::StrJoin(items, ", ");
  return absl::StrCat(absl::StrJoin(items.begin(), items.begin() + 3, ", "), ", and ",
                      items.size() - 3, " more");
}

// A refusal of the schema's grammar (`text`, ParseGrammar's or GrammarGuide::Compile's `why`)
// said of the schema.
absl::Status GrammarRefused(const Built& built, const std::vector<std::string>& names,
                            const std::string& text, const std::string& why) {
  if (absl::StrContains(why, "no text matches rule 'root'")) {
    // The recursive definitions that never end: the rules left with no alternative once the
    // grammar is read with a root that matches the empty text or any of them.
    std::string probe = "root ::= \"\"";
    for (const std::string& name : names) absl::StrAppend(&probe, " | ", name);
    absl::StrAppend(&probe, "\n", text.substr(text.find('\n') + 1));
    std::vector<std::string> endless;
    if (auto g = ParseGrammar(probe, 2 * kMaxJsonSchemaGrammarBytes); g.ok()) {
      for (size_t i = 0; i < names.size(); ++i) {
        const auto it = std::find(g->names.begin(), g->names.end(), names[i]);
        if (it != g->names.end() && g->rules[size_t(it - g->names.begin())].empty()) {
          endless.push_back(built.recursive[i].pointer);
        }
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "guided_json: #: no JSON text matches the schema: its recursion never ends (",
        endless.empty() ? "a definition" : FirstFew(endless),
        endless.size() > 1 ? ": each" : "", " always holds itself again)"));
  }
  if (absl::StrContains(why, "elements with its repetitions expanded")) {
    // The counts, largest first.
    std::vector<std::pair<std::string, int>> counted = built.counted;
    std::stable_sort(counted.begin(), counted.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    std::vector<std::string> counts;
    for (const auto& [where, part] : counted) counts.push_back(where);
    return absl::InvalidArgumentError(absl::StrFormat(
        "guided_json: the schema is too large to guide: its grammar would hold more than %d "
        "classes and references with its counts expanded (a count of n costs about 3n%s)",
        kMaxGrammarElements, counts.empty() ? "" : absl::StrCat("; its counts: ",
                                                                FirstFew(counts))));
  }
  if (absl::StrContains(why, "parses open at once")) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "guided_json: the schema cannot be guided: more than %d of its alternatives (anyOf, "
        "enum, types), each beginning its own way, would be open at once where a part of it "
        "begins", kMaxGrammarStacks));
  }
  if (absl::StrContains(why, "guided_grammar has ")) {
    return absl::InvalidArgumentError(
        absl::StrCat("guided_json: the schema is too large to guide: its grammar ",
                     absl::StripPrefix(why, "guided_grammar ")));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "guided_json: the schema cannot be guided: its grammar: ",
      absl::StripPrefix(why, "guided_grammar: ")));
}

// The schema's grammar compiled, its refusals said of the schema.
absl::StatusOr<std::shared_ptr<const Guide>> CompileGrammar(const Built& built) {
  std::vector<std::string> names;
  auto text = BuiltGrammar(built, &names);
  if (!text.ok()) return text.status();
  auto guide = GrammarGuide::Compile(*text, kMaxJsonSchemaGrammarBytes);
  if (guide.ok()) return std::shared_ptr<const Guide>(std::move(*guide));
  return GrammarRefused(built, names, *text, std::string(guide.status().message()));
}

}  // namespace

absl::StatusOr<std::string> JsonSchemaRegex(std::string_view schema) {
  auto built = Build(schema);
  if (!built.ok()) return built.status();
  if (!built->recursive.empty()) {
    return SchemaRefused(built->recursive[0].pointer,
                         "is recursive, which no regular expression can say (JsonSchemaGrammar "
                         "can)");
  }
  return std::move(built->regex);
}

absl::StatusOr<std::string> JsonSchemaGrammar(std::string_view schema) {
  auto built = Build(schema);
  if (!built.ok()) return built.status();
  std::vector<std::string> names;
  return BuiltGrammar(*built, &names);
}

absl::Status CheckJsonSchema(std::string_view schema) {
  auto built = Build(schema);
  if (!built.ok() || built->recursive.empty()) return built.status();
  std::vector<std::string> names;
  auto text = BuiltGrammar(*built, &names);
  if (!text.ok()) return text.status();
  if (auto g = GrammarGuide::Compile(*text, kMaxJsonSchemaGrammarBytes); !g.ok()) {
    return GrammarRefused(*built, names, *text, std::string(g.status().message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Guide>> CompileJsonSchema(std::string_view schema) {
  auto built = Build(schema);
  if (!built.ok()) return built.status();
  if (!built->recursive.empty()) return CompileGrammar(*built);
  auto guide = RegexGuide::Compile(built->regex, kMaxJsonSchemaRegexBytes);
  if (guide.ok()) return std::shared_ptr<const Guide>(std::move(*guide));
  // An automaton too large (a long string's or list's count, any value in many places): the
  // grammar, which holds a count as a chain of its item and each part once; what it cannot
  // hold is the schema's bound.
  return CompileGrammar(*built);
}

}  // namespace thetaserve::scheduler
