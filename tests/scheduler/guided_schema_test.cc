// JSON schemas as guides: what each keyword lets through and keeps out; integer bounds exact;
// random texts walked through a schema's automaton are JSON that the schema describes (checked
// by a small validator here, and parsed by nlohmann's parser); what cannot be guided is refused
// with where it is in the schema. Recursive schemas (and those too large for an automaton) are
// guided by their GBNF grammar, which agrees with the automaton wherever both exist.
#include "scheduler/guided_schema.h"

#include <functional>
#include <initializer_list>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "scheduler/guided_grammar.h"
#include "scheduler/guided_regex.h"
#include "model/tokenizer_utf8.h"
#include "nlohmann/json.hpp"

namespace thetaserve::scheduler {
namespace {

using Json = nlohmann::ordered_json;

std::shared_ptr<const scheduler::Guide> Compiled(std::string_view schema) {
  auto guide = CompileJsonSchema(schema);
  EXPECT_TRUE(guide.ok()) << schema << ": " << guide.status();
  return guide.ok() ? *guide : nullptr;
}

// The schema's guide, which must be an automaton (not a grammar).
std::shared_ptr<const RegexGuide> Automaton(std::string_view schema) {
  auto guide = std::dynamic_pointer_cast<const RegexGuide>(Compiled(schema));
  EXPECT_TRUE(guide) << schema << " is not guided by an automaton";
  return guide;
}

enum class By { kAutomaton, kGrammar };

// The schema's guide, of the kind said, takes each good text whole and no bad one.
void ExpectTakes(std::string_view schema, std::initializer_list<const char*> good,
                 std::initializer_list<const char*> bad, By by = By::kAutomaton) {
  auto guide = Compiled(schema);
  if (!guide) return;
  EXPECT_EQ(std::dynamic_pointer_cast<const GrammarGuide>(guide) != nullptr, by == By::kGrammar)
      << schema;
  for (const char* text : good) EXPECT_TRUE(guide->Accepts(text)) << schema << " ⊭ " << text;
  for (const char* text : bad) EXPECT_FALSE(guide->Accepts(text)) << schema << " ⊨ " << text;
}

TEST(JsonSchemaGuideTest, EachKeywordLetsThroughWhatItDescribes) {
  ExpectTakes(R"({"type": "object", "properties": {"name": {"type": "string"},
                 "age": {"type": "integer"}}, "required": ["name", "age"]})",
              {R"({"name": "Ada", "age": 36})", "{\n  \"name\": \"\\u00e9\\n\",\n  \"age\": -1\n}",
               R"({"name":"","age":0})"},
              {R"({"age": 36, "name": "Ada"})", R"({"name": "Ada"})",
               R"({"name": "Ada", "age": 3.5})",
               R"({"name": 1, "age": 1})", R"({"name": "Ada", "age": 1, "x": 1})",
               R"({"name": "\ud800", "age": 1})", R"({"name": "Ada", "age": 01})"});
  // Optional properties may be left out, in any combination, order kept.
  ExpectTakes(R"({"properties": {"a": {"type": "boolean"}, "b": {"type": "null"},
                 "c": {"type": "number"}}, "required": ["b"]})",
              {R"({"b": null})", R"({"a": true, "b": null})", R"({"b": null, "c": 1.5e-3})",
               R"({"a": false, "b": null, "c": -0.0})"},
              {"{}", R"({"a": true})", R"({"a": true, "c": 1})", R"({"b": null, "a": true})",
               R"({"b": null,})", R"({, "b": null})"});
  ExpectTakes(R"({"type": "object", "properties": {"a": {"type": "integer"},
                 "b": {"type": "integer"}}})",
              {"{}", R"({"a": 1})", R"({"b": 2})", R"({"a": 1, "b": 2})"},
              {R"({"b": 2, "a": 1})", R"({"a": 1,})", R"({,"b": 2})"});
  ExpectTakes(R"({"type": "array", "items": {"type": "string", "maxLength": 2},
                 "minItems": 1, "maxItems": 3})",
              {R"(["a"])", R"(["ab", "", "😀"])", "[ \"\\n\" ]"},
              {"[]", R"(["abc"])", R"(["a","b","c","d"])", R"(["a",])"});
  ExpectTakes(R"({"type": "array", "items": {"enum": ["x", 1, null, {"k": [true]}]}})",
              {"[]", R"(["x", 1, null, {"k":[true]}])"},
              {R"(["y"])", R"([2])", R"([{"k": [true]}])"});
  ExpectTakes(R"({"prefixItems": [{"type": "integer"}, {"const": "end"}]})",
              {R"([1, "end"])"}, {R"([1])", R"([1, "end", 2])", R"(["end", 1])"});
  ExpectTakes(R"({"anyOf": [{"type": "string", "minLength": 3}, {"type": "null"}]})",
              {R"("abc")", "null"}, {R"("ab")", "1"});
  ExpectTakes(R"({"type": ["integer", "boolean"]})", {"12", "true"}, {R"("12")", "1.5"});
  ExpectTakes(R"({"type": "number", "minimum": 0})", {"0", "1.5", "2e10"}, {"-1", "-0.5"});
  ExpectTakes(R"({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}},
                 "required": ["x"]}}, "type": "array", "items": {"$ref": "#/$defs/point"}})",
              {R"([{"x": 1}, {"x": 2}])"}, {R"([{"y": 1}])"});
  // Patterns search (unanchored) unless anchored.
  ExpectTakes(R"({"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"})", {R"("555-1234")"},
              {R"("x555-1234")", R"("555-12345")"});
  ExpectTakes(R"({"type": "string", "pattern": "[0-9]{3}"})", {R"("ab123cd")", R"("123")"},
              {R"("12")"});
  ExpectTakes(R"({"type": "string", "pattern": "^ab"})", {R"("abc")"}, {R"("cab")"});
  ExpectTakes(R"({"type": "string", "format": "date-time"})", {R"("2026-12-04T09:30:00Z")",
              R"("2026-12-04T09:30:00.5+01:00")"}, {R"("2026-13-04T09:30:00Z")",
              R"("2026-12-04 09:30:00Z")"});
  ExpectTakes(R"({"type": "string", "format": "uuid"})",
              {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123e4567")"});
  ExpectTakes(R"({"type": "object", "properties": {}, "additionalProperties": false})",
              {"{}", "{ }"}, {R"({"a": 1})"});
  // Keys and strings with characters a regular expression would read as syntax.
  ExpectTakes(R"({"type": "object", "properties": {"a.b (c)*": {"const": "$x|y^"}},
                 "required": ["a.b (c)*"]})",
              {R"({"a.b (c)*": "$x|y^"})"},
              {R"({"aXb (c)*": "$x|y^"})", R"({"a.b (c)*": "$xy^"})"});
}

// Where a schema allows any value, any JSON with at most kJsonSchemaAnyLevels objects and
// arrays nested; a map's values what additionalProperties says.
TEST(JsonSchemaGuideTest, AnyValueAndMaps) {
  static_assert(kJsonSchemaAnyLevels == 2);
  for (const char* any : {"{}", "true", R"({"description": "anything"})"}) {
    ExpectTakes(any, {"1", R"("x")", "null", R"({"a": [1, "b"], "c": {}})", "[[1], {\"k\": 2}]"},
                {R"({"a": {"b": {}}})", "[[[1]]]", "tru", R"({"a" 1})"});
  }
  ExpectTakes(R"({"type": "object"})", {"{}", R"({"a": 1, "b": [true, null], "c": {"d": "e"}})"},
              {"[1]", R"({"a": {"b": {"c": 1}}})", R"({"a": {"b": [1]}})"});
  ExpectTakes(R"({"type": "array"})", {"[]", R"([1, "a", {"k": null}, []])"},
              {"{}", "[[[]]]"});
  ExpectTakes(R"({"type": "object", "additionalProperties": {"type": "integer"}})",
              {"{}", R"({"x": 1, "y z": -2})"}, {R"({"x": "1"})", R"({"x": 1.5})"});
  ExpectTakes(R"({"type": "object", "properties": {"name": {"type": "string"},
                 "args": {"type": "object"}}, "required": ["name", "args"]})",
              {R"({"name": "f", "args": {"x": [1, 2], "y": "z"}})"},
              {R"({"name": "f"})", R"({"name": "f", "args": [1]})"});
}

// Integer bounds are exact: every integer in [-1500, 1500] against random bounds.
TEST(JsonSchemaGuideTest, IntegerBoundsAreExact) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  for (int round = 0; round < 40; ++round) {
    const int a = int(rng() % 2401) - 1200, b = int(rng() % 2401) - 1200;
    const int kind = round % 4;  // both bounds, lower only, upper only, exclusive both
    Json schema = {{"type", "integer"}};
    int lo = std::min(a, b), hi = std::max(a, b);
    if (kind == 0 || kind == 1) schema["minimum"] = lo;
    if (kind == 0 || kind == 2) schema["maximum"] = hi;
    if (kind == 3) {
      schema["exclusiveMinimum"] = lo - 1;
      schema["exclusiveMaximum"] = hi + 1;
    }
    auto guide = Automaton(schema.dump());
    ASSERT_TRUE(guide) << "seed " << seed;
    for (int n = -1500; n <= 1500; ++n) {
      const bool in = (kind == 2 || n >= lo) && (kind == 1 || n <= hi);
      ASSERT_EQ(guide->Accepts(std::to_string(n)), in)
          << schema.dump() << " n=" << n << " seed " << seed;
    }
    EXPECT_FALSE(guide->Accepts("-0")) << schema.dump();
    EXPECT_FALSE(guide->Accepts("007")) << schema.dump();
  }
  // Large bounds, and bounds that are not whole.
  ExpectTakes(R"({"type": "integer", "minimum": 999999999999, "maximum": 1000000000001})",
              {"999999999999", "1000000000000", "1000000000001"},
              {"999999999998", "1000000000002", "10000000000000"});
  ExpectTakes(R"({"type": "integer", "minimum": -2.5, "exclusiveMaximum": 3})",
              {"-2", "0", "2"}, {"-3", "3"});
  ExpectTakes(R"({"type": "integer", "minimum": 1})", {"1", "9", "10", "123456789"}, {"0", "-1"});
  // Digits are bounded as json_object bounds them (a model cannot write zeros forever).
  ExpectTakes(R"({"type": "integer"})", {"1234567890123456789", "-1000000000000000000"},
              {"12345678901234567890", "-10000000000000000000"});
  ExpectTakes(R"({"type": "integer", "minimum": 5})", {"1234567890123456789"},
              {"12345678901234567890"});
  ExpectTakes(R"({"type": "integer", "maximum": -5})", {"-1234567890123456789"},
              {"-12345678901234567890"});
  ExpectTakes(R"({"type": "number"})", {"1.5e308", "0.1234567890123456789", "-2E-999"},
              {"1e1000", "0.12345678901234567890", "12345678901234567890.5"});
}

// A minimal validator for the keywords the guide takes (oneOf as anyOf: the schemas below keep
// its alternatives apart). Key order is checked too: the guide writes the schema's.
bool Valid(const Json& v, const Json& s, const Json& root) {
  if (s.contains("$ref")) {
    return Valid(v, root.at(Json::json_pointer(s["$ref"].get<std::string>().substr(1))), root);
  }
  for (const char* any : {"anyOf", "oneOf"}) {
    if (s.contains(any)) {
      for (const Json& alt : s[any]) {
        if (Valid(v, alt, root)) return true;
      }
      return false;
    }
  }
  if (s.contains("const")) return v == s["const"];
  if (s.contains("enum")) {
    for (const Json& e : s["enum"]) {
      if (v == e) return true;
    }
    return false;
  }
  if (!s.contains("type")) return true;  // any value
  std::vector<std::string> types;
  if (s["type"].is_string()) {
    types.push_back(s["type"]);
  } else {
    for (const Json& t : s["type"]) types.push_back(t);
  }
  for (const std::string& type : types) {
    if (type == "null" && v.is_null()) return true;
    if (type == "boolean" && v.is_boolean()) return true;
    if ((type == "integer" && v.is_number_integer()) || (type == "number" && v.is_number())) {
      const double x = v.get<double>();
      if (s.contains("minimum") && x < s["minimum"].get<double>()) return false;
      if (s.contains("maximum") && x > s["maximum"].get<double>()) return false;
      return true;
    }
    if (type == "string" && v.is_string()) {
      const std::string text = v.get<std::string>();
      size_t chars = 0;
      for (char c : text) chars += (uint8_t(c) & 0xC0) != 0x80;
      if (s.contains("minLength") && chars < s["minLength"].get<size_t>()) return false;
      if (s.contains("maxLength") && chars > s["maxLength"].get<size_t>()) return false;
      if (s.contains("pattern") &&
          !std::regex_search(text, std::regex(s["pattern"].get<std::string>()))) {
        return false;
      }
      return true;
    }
    if (type == "array" && v.is_array()) {
      if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
      for (const Json& item : v) {
        if (!Valid(item, s["items"], root)) return false;
      }
      return true;
    }
    if (type == "object" && v.is_object() && !s.contains("properties")) {  // a map
      for (const auto& [key, value] : v.items()) {
        if (s.contains("additionalProperties") && !Valid(value, s["additionalProperties"], root)) {
          return false;
        }
      }
      return true;
    }
    if (type == "object" && v.is_object()) {
      const Json& props = s["properties"];
      for (const Json& name : s.value("required", Json::array())) {
        if (!v.contains(name.get<std::string>())) return false;
      }
      int last = -1;
      for (const auto& [key, value] : v.items()) {
        int index = 0;
        auto it = props.begin();
        while (it != props.end() && it.key() != key) ++it, ++index;
        if (it == props.end() || index <= last || !Valid(value, *it, root)) return false;
        last = index;
      }
      return true;
    }
  }
  return false;
}

// Random texts the guide leads to (bytes chosen at random among those it allows, closing ones
// favoured so that texts end) parse and satisfy the schema.
TEST(JsonSchemaGuideTest, RandomTextsItAcceptsAreValidInstances) {
  const Json schema = Json::parse(R"({
    "type": "object",
    "properties": {
      "id": {"type": "integer", "minimum": -50, "maximum": 1200},
      "name": {"type": "string", "minLength": 1, "maxLength": 8},
      "score": {"type": ["number", "null"]},
      "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"},
               "maxItems": 4},
      "kind": {"enum": ["a", "b", 3]},
      "nested": {"type": "object", "properties": {"ok": {"type": "boolean"},
                 "when": {"type": "string", "format": "date"}}, "required": ["ok"]},
      "either": {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "string", "maxLength": 2}]},
      "counts": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
      "anything": {}
    },
    "required": ["id", "name"]
  })");
  const Json& usable = schema;
  auto guide = Automaton(usable.dump());
  ASSERT_TRUE(guide);
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::map<std::string, int> seen;  // samples with each property
  for (int sample = 0; sample < 300; ++sample) {
    std::string text;
    int32_t state = RegexGuide::kStart;
    int digits = 0;
    while (true) {
      std::vector<uint8_t> next, closing, non_digit;
      for (int b = 0; b < 256; ++b) {
        if (guide->Step(state, std::string(1, char(b))) == RegexGuide::kDead) continue;
        next.push_back(uint8_t(b));
        if (b == '"' || b == ']' || b == '}') closing.push_back(uint8_t(b));
        if (b < '0' || b > '9') non_digit.push_back(uint8_t(b));
      }
      if (guide->Accepts(text) && (next.empty() || rng() % 4 == 0)) break;
      ASSERT_FALSE(next.empty()) << text << " seed " << seed;
      const std::vector<uint8_t>& from = !closing.empty() && rng() % 6 == 0 ? closing
                                         : digits >= 2 && !non_digit.empty() ? non_digit
                                                                             : next;
      const uint8_t b = from[rng() % from.size()];
      digits = b >= '0' && b <= '9' ? digits + 1 : 0;
      text += char(b);
      state = guide->Step(state, std::string(1, char(b)));
      ASSERT_LT(text.size(), 20000u) << "seed " << seed;
    }
    ASSERT_TRUE(model::IsValidUtf8(text)) << text;
    const Json v = Json::parse(text, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << text << " seed " << seed;
    EXPECT_TRUE(Valid(v, usable, usable)) << text << " seed " << seed;
    for (const auto& [key, value] : v.items()) ++seen[key];
  }
  for (const auto& [key, value] : usable["properties"].items()) {
    EXPECT_GT(seen[key], 0) << key << " never written (seed " << seed << ")";
  }
}

TEST(JsonSchemaGuideTest, WhatCannotBeGuidedIsRefusedWithWhere) {
  const std::pair<const char*, const char*> refused[] = {
      {"false", "guided_json: #: false matches nothing"},
      {R"({"type": "object", "additionalProperties": {"type": "strin"}})",
       "guided_json: #/additionalProperties/type: strin is not a JSON schema type"},
      {R"({"properties": {"a": {"type": "string", "multipleOf": 2}}})",
       "guided_json: #/properties/a: keyword multipleOf is not supported"},
      {R"({"properties": {"a/b": {"type": "strin"}}})",
       "guided_json: #/properties/a~1b/type: strin is not a JSON schema type"},
      {R"({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]})",
       "guided_json: #: no JSON text matches the schema: its recursion never ends (#"},
      {R"({"$ref": "#/$defs/missing"})", "#/$defs/missing points at nothing"},
      {R"({"type": "number", "maximum": 5})", "guided_json: #/maximum: bounds on a number"},
      {R"({"type": "integer", "minimum": 5, "maximum": 4})", "no integer lies within"},
      {R"({"type": "string", "pattern": "a.c"})", "guided_json: #/pattern: it may match '\"'"},
      {R"({"type": "string", "pattern": "a(b"})", "guided_json: #/pattern: missing )"},
      {R"({"type": "string", "format": "email"})", "#/format: \"email\" is not supported"},
      {R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]})",
       "#/required: \"b\" is not in properties"},
      {R"({"allOf": [{"type": "integer"}, {"minimum": 1}]})", "only a list of one schema"},
      {R"({"type": "string", "anyOf": [{"maxLength": 1}]})", "anyOf beside other keywords"},
      {R"({"type": "array", "items": {"type": "integer"}, "maxItems": 5000})",
       "#/maxItems: over 1000 is not supported"},
      {"{\"type\": ", "guided_json: is not valid JSON"},
  };
  for (const auto& [schema, message] : refused) {
    auto guide = CompileJsonSchema(schema);
    ASSERT_FALSE(guide.ok()) << schema;
    EXPECT_EQ(guide.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(guide.status().message()).find(message), std::string::npos)
        << schema << " → " << guide.status().message();
  }
  // Deep nesting is refused before it is parsed or walked.
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += R"({"type": "array", "items": )";
  deep += R"({"type": "null"})";
  for (int i = 0; i < 100; ++i) deep += "}";
  auto guide = CompileJsonSchema(deep);
  ASSERT_FALSE(guide.ok());
  EXPECT_NE(std::string(guide.status().message()).find("nests more than"), std::string::npos)
      << guide.status();
  // Many optional properties make an expression that grows with their square: a bound, not a
  // hang.
  Json wide = {{"type", "object"}, {"properties", Json::object()}};
  for (int i = 0; i < 400; ++i) {
    wide["properties"][absl::StrCat("field_", i)] = {{"type", "string"}, {"maxLength", 20}};
  }
  auto too_big = CompileJsonSchema(wide.dump());
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(std::string(too_big.status().message()).find("is too large"), std::string::npos)
      << too_big.status();
  // A part reused many times (each $ref used 8 times at each of 4 levels, then 2937 times): a
  // 64 KiB schema whose expression would be gigabytes is refused as its pieces add up (it took
  // 36 s and 6.5 GB before they were counted).
  Json bomb = {{"$defs", {{"d0", {{"type", "string"}}}}}};
  for (int k = 1; k <= 4; ++k) {
    Json items = Json::array();
    for (int i = 0; i < 8; ++i) items.push_back({{"$ref", absl::StrCat("#/$defs/d", k - 1)}});
    bomb["$defs"][absl::StrCat("d", k)] = {{"type", "array"}, {"prefixItems", items}};
  }
  bomb["anyOf"] = Json::array();
  const size_t one_ref = Json({{"$ref", "#/$defs/d4"}}).dump().size() + 1;
  for (size_t n = (kMaxJsonSchemaBytes - bomb.dump().size() - 20) / one_ref; n > 0; --n) {
    bomb["anyOf"].push_back({{"$ref", "#/$defs/d4"}});
  }
  ASSERT_LE(bomb.dump().size(), size_t(kMaxJsonSchemaBytes));
  auto bombed = CompileJsonSchema(bomb.dump());
  ASSERT_FALSE(bombed.ok());
  EXPECT_NE(std::string(bombed.status().message()).find("is too large"), std::string::npos)
      << bombed.status();
  // Many optional properties: the expression grows with their square, and is counted so.
  Json flat = {{"type", "object"}, {"properties", Json::object()}};
  for (int i = 0; i < 2600; ++i) flat["properties"][std::to_string(i)] = {{"type", "string"}};
  ASSERT_LE(flat.dump().size(), size_t(kMaxJsonSchemaBytes));
  auto flattened = CompileJsonSchema(flat.dump());
  ASSERT_FALSE(flattened.ok());
  EXPECT_NE(std::string(flattened.status().message()).find("is too large"), std::string::npos)
      << flattened.status();
}

// Points an earlier review found: bounds past 2^53 exact, enum values of the type only,
// calendar dates, anchors inside a pattern named, properties whose schema is false.
TEST(JsonSchemaGuideTest, ReviewedEdges) {
  ExpectTakes(R"({"type": "integer", "minimum": 9007199254740993})",
              {"9007199254740993", "9007199254740994"}, {"9007199254740992"});
  ExpectTakes(R"({"type": "integer", "maximum": 999999999999999999})", {"999999999999999999"},
              {"1000000000000000000"});
  ExpectTakes(R"({"type": "integer", "exclusiveMaximum": 9007199254740995})",
              {"9007199254740994"}, {"9007199254740995", "9007199254740996"});
  ExpectTakes(R"({"type": "string", "enum": ["a", 1, "b"]})", {R"("a")", R"("b")"}, {"1"});
  ExpectTakes(R"({"type": "integer", "enum": [1, 2.0, 2.5, "3"]})", {"1", "2.0"},
              {"2.5", R"("3")"});
  ExpectTakes(R"({"type": "string", "format": "date"})",
              {R"("2024-02-29")", R"("2000-02-29")", R"("2023-01-31")", R"("2023-04-30")"},
              {R"("2023-02-29")", R"("1900-02-29")", R"("2023-04-31")", R"("2023-02-30")",
               R"("2023-00-10")", R"("2023-01-00")"});
  ExpectTakes(R"({"type": "string", "format": "date-time"})",
              {R"("2016-12-31t23:59:60z")", R"("2024-02-29T00:00:00.123456789-05:30")"},
              {R"("2016-12-31T23:59:61Z")", R"("2016-12-31T24:00:00Z")"});
  ExpectTakes(R"({"type": "string", "maxLength": 500})", {R"("ok")"}, {});
  ExpectTakes(R"({"type": "object", "properties": {"a": false, "b": {"type": "null"}}})",
              {"{}", R"({"b": null})"}, {R"({"a": null})"});
  const std::pair<const char*, const char*> refused[] = {
      {R"({"type": "string", "const": 5})", "guided_json: #: const is not of the type"},
      {R"({"type": "boolean", "enum": [1, "x"]})", "guided_json: #: no enum value is of the type"},
      {R"({"type": "string", "pattern": "a$|b"})",
       "guided_json: #/pattern: ^ or $ inside the pattern"},
      {R"x({"type": "string", "pattern": "(^a)"})x",
       "guided_json: #/pattern: ^ or $ inside the pattern"},
      {R"({"properties": {"a": false}, "required": ["a"]})",
       "guided_json: #/properties/a: is required, and false matches nothing"},
      {R"({"type": "integer", "minimum": 1000000000000000001})",
       "#/minimum: must be a number"},
  };
  for (const auto& [schema, message] : refused) {
    auto guide = CompileJsonSchema(schema);
    ASSERT_FALSE(guide.ok()) << schema;
    EXPECT_NE(std::string(guide.status().message()).find(message), std::string::npos)
        << schema << " → " << guide.status().message();
  }
}


// Recursive schemas, as pydantic writes them for a model that holds itself: guided by the
// schema's grammar, to any depth.
TEST(JsonSchemaGuideTest, RecursiveSchemasAreGuidedByAGrammar) {
  const char* tree = R"({"$defs": {"Node": {"title": "Node", "type": "object",
      "properties": {"value": {"type": "integer"},
                     "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
      "required": ["value", "children"]}}, "$ref": "#/$defs/Node"})";
  auto guide = Compiled(tree);
  ASSERT_TRUE(guide);
  EXPECT_TRUE(std::dynamic_pointer_cast<const GrammarGuide>(guide));
  std::string deep = R"({"value": 0, "children": []})";
  for (int i = 1; i <= 40; ++i) {
    deep = absl::StrCat(R"({"value": )", i, R"(, "children": [)", deep, ", ", deep.size() < 200 ? deep : "{\"value\": 1, \"children\": []}", "]}");
  }
  EXPECT_TRUE(guide->Accepts(deep));
  ExpectTakes(tree,
              {R"({"value": 1, "children": []})",
               R"({"value": 1, "children": [{"value": 2, "children": [{"value": 3, "children": []}]}]})"},
              {R"({"value": 1})", R"({"value": 1, "children": [{"value": 2}]})",
               R"({"value": 1, "children": [{"value": "2", "children": []}]})",
               R"({"value": 1, "children": [[]]})"},
              By::kGrammar);
  // The whole schema ("#") recurs: a linked list.
  ExpectTakes(R"({"type": "object", "properties": {"v": {"type": "string"},
                 "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["v", "next"]})",
              {R"({"v": "a", "next": null})", R"({"v": "a", "next": {"v": "b", "next": null}})"},
              {R"({"v": "a", "next": {"v": "b"}})", R"({"v": "a", "next": 1})"}, By::kGrammar);
  // Definitions that hold each other: an expression of terms, a term a number or a bracketed
  // expression.
  const char* expression = R"({"$defs": {
      "expr": {"type": "object", "properties": {"terms": {"type": "array", "minItems": 1,
               "items": {"$ref": "#/$defs/term"}}}, "required": ["terms"]},
      "term": {"anyOf": [{"type": "number"}, {"$ref": "#/$defs/expr"}]}},
      "$ref": "#/$defs/expr"})";
  ExpectTakes(expression,
              {R"({"terms": [1]})", R"({"terms": [1, {"terms": [2.5, {"terms": [3]}]}]})"},
              {R"({"terms": []})", R"({"terms": [{"terms": []}]})", R"({"terms": ["1"]})"},
              By::kGrammar);
  // Its grammar, as JsonSchemaGrammar writes it: each recursive definition a rule.
  auto grammar = JsonSchemaGrammar(expression);
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  EXPECT_NE(grammar->find("root ::= ref0-defs-expr\nref0-defs-expr ::= \"{\" "),
            std::string::npos)
      << *grammar;
  EXPECT_EQ(grammar->find("ref1"), std::string::npos) << *grammar;  // term is written in expr
  EXPECT_TRUE(GrammarGuide::Compile(*grammar, kMaxJsonSchemaGrammarBytes).ok());
  // A regular expression cannot say it.
  auto regex = JsonSchemaRegex(tree);
  ASSERT_FALSE(regex.ok());
  EXPECT_NE(std::string(regex.status().message()).find("#/$defs/Node: is recursive"),
            std::string::npos)
      << regex.status();
  // A definition that is one of its own alternatives adds nothing to the others.
  ExpectTakes(R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}},
                 "$ref": "#/$defs/a"})",
              {"null"}, {"1", "[]", R"("a")"}, By::kGrammar);
}

// Dir and Pkg objects nested 40 deep (each holding the next in its children, a Pkg
// innermost, Dir and Pkg by turns): each level taken whole, the deepest into *nested.
void ExpectDirPkgTreesNest(const scheduler::Guide& guide, const std::string& what,
                           std::string* nested) {
  *nested = R"({"children": [], "version": 1})";
  for (int level = 1; level <= 40; ++level) {
    *nested = absl::StrCat(R"({"children": [)", *nested, "], ",
                           level % 2 ? R"("name": "d")" : R"("version": 2)", "}");
    ASSERT_TRUE(guide.Accepts(*nested)) << "level " << level << ", " << what << ": " << *nested;
  }
}

// A union of objects that begin alike (pydantic's Dir | Pkg, both with their children first):
// the alternatives are written once up to where they part, so a parse does not hold both
// through each level (before the guide joined stacks with the same top, that doubled the
// parses at every level: past 1,024, about ten levels down, no deeper text was let through).
TEST(JsonSchemaGuideTest, AlikeAlternativesAroundARecursionNestDeep) {
  const char* tree = R"({"$defs": {
      "Dir": {"type": "object", "properties": {"children": {"type": "array",
              "items": {"$ref": "#/$defs/Node"}}, "name": {"type": "string"}},
              "required": ["children", "name"]},
      "Pkg": {"type": "object", "properties": {"children": {"type": "array",
              "items": {"$ref": "#/$defs/Node"}}, "version": {"type": "integer"}},
              "required": ["children", "version"]},
      "Node": {"anyOf": [{"$ref": "#/$defs/Dir"}, {"$ref": "#/$defs/Pkg"}]}},
      "$ref": "#/$defs/Node"})";
  auto guide = Compiled(tree);
  ASSERT_TRUE(guide);
  std::string deep;
  ExpectDirPkgTreesNest(*guide, "Node", &deep);
  EXPECT_FALSE(guide->Accepts(absl::StrCat(R"({"children": [)", deep, R"(], "size": 1})")));
  // Its grammar writes the shared beginning once.
  auto grammar = JsonSchemaGrammar(tree);
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  size_t children = 0;
  for (size_t at = grammar->find("children"); at != std::string::npos;
       at = grammar->find("children", at + 1)) {
    ++children;
  }
  EXPECT_EQ(children, 1u) << *grammar;
  // As pydantic writes Union[Dir, Pkg] with children: list[Union[Dir, Pkg]]: each a recursive
  // definition of its own, the union's alternatives calls of them; and with children optional
  // (pydantic's default []), where the objects' first members are alternatives themselves.
  for (const char* children : {R"("required": ["children", "name"])", R"("required": ["name"])"}) {
    const std::string pydantic = absl::StrCat(R"({"$defs": {
        "Dir": {"properties": {"children": {"items": {"anyOf": [{"$ref": "#/$defs/Dir"},
                {"$ref": "#/$defs/Pkg"}]}, "type": "array"}, "name": {"type": "string"}},
                )", children, R"(, "type": "object"},
        "Pkg": {"properties": {"children": {"items": {"anyOf": [{"$ref": "#/$defs/Dir"},
                {"$ref": "#/$defs/Pkg"}]}, "type": "array"}, "version": {"type": "integer"}},
                )", absl::StrReplaceAll(children, {{"name", "version"}}), R"(, "type": "object"}},
        "anyOf": [{"$ref": "#/$defs/Dir"}, {"$ref": "#/$defs/Pkg"}], "title": "Tree"})");
    auto union_guide = Compiled(pydantic);
    ASSERT_TRUE(union_guide);
    std::string nested;
    ExpectDirPkgTreesNest(*union_guide, children, &nested);
  }
  // A union of definitions that each hold themselves (pydantic's Union[X, Y] with
  // a: Optional[X] in X and Optional[Y] in Y; required, and with pydantic's default null):
  // reading the union's calls as their definitions once, not again below (which did not end:
  // the grammar grew until memory ran out).
  for (const char* a : {R"("required": ["a", "x"])", R"("required": ["x"])"}) {
    const std::string xy = absl::StrCat(R"({"$defs": {
        "X": {"type": "object", "properties": {"a": {"anyOf": [{"$ref": "#/$defs/X"},
              {"type": "null"}], "default": null}, "x": {"type": "integer"}}, )", a, R"(},
        "Y": {"type": "object", "properties": {"a": {"anyOf": [{"$ref": "#/$defs/Y"},
              {"type": "null"}], "default": null}, "y": {"type": "integer"}}, )",
        absl::StrReplaceAll(a, {{"x", "y"}}), R"(}},
        "anyOf": [{"$ref": "#/$defs/X"}, {"$ref": "#/$defs/Y"}]})");
    auto text = JsonSchemaGrammar(xy);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_LT(text->size(), 4096u) << *text;
    auto xy_guide = Compiled(xy);
    ASSERT_TRUE(xy_guide);
    std::string x = R"({"a": null, "x": 0})", y = R"({"a": null, "y": 0})";
    for (int level = 1; level <= 40; ++level) {
      x = absl::StrCat(R"({"a": )", x, R"(, "x": 1})");
      y = absl::StrCat(R"({"a": )", y, R"(, "y": 1})");
      ASSERT_TRUE(xy_guide->Accepts(x) && xy_guide->Accepts(y)) << "level " << level << ", " << a;
    }
    EXPECT_FALSE(xy_guide->Accepts(R"({"a": {"a": null, "y": 0}, "x": 1})")) << a;
  }
  // Two array forms of the same items, one of at most two: the writer cannot join them (their
  // counts differ), so both go on into the item at every level; the guide joins their parses
  // (stacks with the same top are one), where apart they doubled at each level and stopped
  // about ten down.
  auto arrays = Compiled(R"({"$defs": {"T": {"anyOf": [
      {"type": "array", "items": {"$ref": "#/$defs/T"}},
      {"type": "array", "items": {"$ref": "#/$defs/T"}, "maxItems": 2},
      {"type": "integer"}]}}, "$ref": "#/$defs/T"})");
  ASSERT_TRUE(arrays);
  std::string nested = "0";
  for (int level = 1; level <= 60; ++level) {
    nested = level % 3 ? absl::StrCat("[", nested, "]") : absl::StrCat("[1, ", nested, ", 2]");
    ASSERT_TRUE(arrays->Accepts(nested)) << "level " << level << ": " << nested;
  }
  auto grammar_guide = std::dynamic_pointer_cast<const GrammarGuide>(arrays);
  ASSERT_TRUE(grammar_guide);
  EXPECT_FALSE(grammar_guide->LeadsOn(absl::StrCat(nested, "]")));
  EXPECT_FALSE(grammar_guide->LeadsOn(absl::StrCat(nested, ", 1")));
}

// Enums of thousands of values in a grammar: a tree of their characters, so that entering one
// opens a parse per next character (past 1,024 parses the guide would let nothing through);
// values of one character each with the same rest are one class.
TEST(JsonSchemaGuideTest, LargeEnumsInAGrammarAreTreesOfTheirCharacters) {
  Json values = Json::array();
  for (int i = 0; i < 2000; ++i) values.push_back(absl::StrCat("v", i));
  const Json schema = {{"type", "object"},
                       {"properties", {{"e", {{"enum", values}}},
                                       {"x", {{"type", "string"}, {"maxLength", 900}}}}},
                       {"required", {"e"}}};
  auto guide = std::dynamic_pointer_cast<const GrammarGuide>(Compiled(schema.dump()));
  ASSERT_TRUE(guide);
  EXPECT_TRUE(guide->LeadsOn(R"({"e": "v)"));
  for (const char* good : {R"({"e": "v0"})", R"({"e": "v1234"})", R"({"e": "v1999", "x": "a"})"}) {
    EXPECT_TRUE(guide->Accepts(good)) << good;
  }
  for (const char* bad : {R"({"e": "v2000"})", R"({"e": "v01"})", R"({"e": "v"})"}) {
    EXPECT_FALSE(guide->Accepts(bad)) << bad;
  }
  // 1,100 values of one character each (CJK), in a recursive schema: one class.
  Json cjk = Json::array();
  std::string last;
  for (uint32_t cp = 0x4E00; cp < 0x4E00 + 1100; ++cp) {
    std::string ch;
    ch += char(0xE0 | (cp >> 12));
    ch += char(0x80 | ((cp >> 6) & 0x3F));
    ch += char(0x80 | (cp & 0x3F));
    cjk.push_back(ch);
    last = ch;
  }
  const Json tree = {{"type", "object"},
                     {"properties", {{"c", {{"enum", cjk}}},
                                     {"kids", {{"type", "array"}, {"items", {{"$ref", "#"}}}}}}},
                     {"required", {"c", "kids"}}};
  auto text = JsonSchemaGrammar(tree.dump());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_NE(text->find(R"([\u4E00-\u524B])"), std::string::npos) << text->substr(0, 2000);
  auto cjk_guide = Compiled(tree.dump());
  ASSERT_TRUE(cjk_guide);
  EXPECT_TRUE(cjk_guide->Accepts(absl::StrCat(R"({"c": ")", last, R"(", "kids": [{"c": ")",
                                              cjk[0].get<std::string>(), R"(", "kids": []}]})")));
  EXPECT_FALSE(cjk_guide->Accepts(R"({"c": "a", "kids": []})"));
}

// Random texts walked through a recursive schema's grammar (bytes chosen among those it lets
// through) are valid instances, nested more than an automaton's any-value could be.
TEST(JsonSchemaGuideTest, RandomTextsOfARecursiveSchemaAreValidInstances) {
  const Json schema = Json::parse(R"({"$defs": {"Node": {"type": "object",
      "properties": {"name": {"type": "string", "maxLength": 3},
                     "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "maxItems": 3},
                     "weight": {"type": ["integer", "null"], "minimum": -5, "maximum": 5}},
      "required": ["name"]}}, "$ref": "#/$defs/Node"})");
  auto guide = std::dynamic_pointer_cast<const GrammarGuide>(Compiled(schema.dump()));
  ASSERT_TRUE(guide);
  std::vector<std::string> bytes;  // a vocabulary of the 256 bytes: token b is byte b
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
  const TokenBytesIndex vocab(std::move(bytes));
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  int deepest = 0;
  for (int sample = 0; sample < 60; ++sample) {
    std::string text;
    int depth = 0, digits = 0;
    while (true) {
      std::vector<uint8_t> next, closing, non_digit;
      std::vector<int32_t> allowed;
      guide->Allowed(text, vocab, &allowed);
      for (int32_t b : allowed) {
        next.push_back(uint8_t(b));
        if (b == '"' || b == ']' || b == '}') closing.push_back(uint8_t(b));
        if (b < '0' || b > '9') non_digit.push_back(uint8_t(b));
      }
      if (guide->Accepts(text) && (next.empty() || rng() % 4 == 0)) break;
      ASSERT_FALSE(next.empty()) << text << " seed " << seed;
      // Opening favoured while the text is shallow, closing the deeper it is (so that texts
      // end), whitespace seldom.
      std::vector<uint8_t> opening, solid;
      for (uint8_t b : next) {
        if (b == '{' || b == '[' || b == ',' || b == 'k') opening.push_back(b);
        if (b != ' ' && b != '\t' && b != '\n' && b != '\r') solid.push_back(b);
      }
      const int roll = int(rng() % 12);
      const std::vector<uint8_t>& from =
          !closing.empty() && roll < depth - 2              ? closing
          : !opening.empty() && depth < 6 && roll >= 6      ? opening
          : digits >= 1 && !non_digit.empty()               ? non_digit
          : !solid.empty() && rng() % 10 != 0               ? solid
                                                            : next;
      const uint8_t b = from[rng() % from.size()];
      digits = b >= '0' && b <= '9' ? digits + 1 : 0;
      depth += b == '{' ? 1 : b == '}' ? -1 : 0;
      deepest = std::max(deepest, depth);
      text += char(b);
      ASSERT_LT(text.size(), 20000u) << "seed " << seed;
    }
    const Json v = Json::parse(text, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << text << " seed " << seed;
    EXPECT_TRUE(Valid(v, schema, schema)) << text << " seed " << seed;
  }
  EXPECT_GT(deepest, kJsonSchemaAnyLevels + 1) << "seed " << seed;
}

// Where a schema's automaton exists, its grammar (JsonSchemaGrammar, as a recursive schema's
// is written) agrees with it: on texts the automaton leads to, every prefix of them, and the
// same texts with a byte changed, added or taken out.
TEST(JsonSchemaGuideTest, GrammarAgreesWithTheAutomaton) {
  const char* schemas[] = {
      R"({"type": "object", "properties": {"name": {"type": "string"},
         "age": {"type": "integer"}}, "required": ["name", "age"]})",
      R"({"properties": {"a": {"type": "boolean"}, "b": {"type": "null"},
         "c": {"type": "number"}}, "required": ["b"]})",
      R"({"type": "array", "items": {"type": "string", "maxLength": 2}, "minItems": 1,
         "maxItems": 3})",
      R"({"type": "array", "items": {"enum": ["x", 1, null, {"k": [true]}]}})",
      R"({"prefixItems": [{"type": "integer"}, {"const": "end"}]})",
      R"({"anyOf": [{"type": "string", "minLength": 3}, {"type": "null"}]})",
      R"({"type": ["integer", "boolean"]})",
      "{}",
      R"({"type": "object", "additionalProperties": {"type": "integer", "minimum": -3}})",
      R"({"type": "integer", "minimum": -37, "maximum": 1234})",
      R"({"type": "integer", "exclusiveMinimum": 99, "exclusiveMaximum": 100000})",
      R"({"type": "number"})",
      R"({"type": "string", "format": "date-time"})",
      R"({"type": "string", "format": "uuid"})",
      R"({"type": "string", "pattern": "^[a-z]+(-[0-9]{2,3})?$"})",
      R"({"properties": {"é😀": {"const": "q\"\\\u0001"}, "a\"b": {"type": "boolean"}}})",
  };
  // A pattern whose classes hold the characters GBNF's classes escape, a negated class, a
  // count of none, characters past U+FFFF.
  const std::string pattern =
      Json({{"type", "string"},
            {"pattern", R"(^[\]\-^\[#a-c]+(?:[^\x00-\x1f"\\x-z\d]{0}|[😀-😂]{1,2}|\.)?é?$)"}})
          .dump();
  std::vector<std::string> all(std::begin(schemas), std::end(schemas));
  all.push_back(pattern);
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  const std::string palette = "{}[],:\"\\0123456789-.eE+ \ntruefalsnl\x01\xc3\xa9\xf0\x9f";
  for (const std::string& schema : all) {
    auto automaton = Automaton(schema);
    auto text = JsonSchemaGrammar(schema);
    ASSERT_TRUE(automaton && text.ok()) << schema << ": " << text.status();
    auto grammar = GrammarGuide::Compile(*text, kMaxJsonSchemaGrammarBytes);
    ASSERT_TRUE(grammar.ok()) << schema << ": " << grammar.status() << "\n" << *text;
    auto leads = [&](const std::string& t) {
      return automaton->Step(RegexGuide::kStart, t) != RegexGuide::kDead;
    };
    auto agree = [&](const std::string& t) {
      ASSERT_EQ((*grammar)->LeadsOn(t), leads(t)) << schema << " on '" << t << "' seed " << seed
                                                  << "\n" << *text;
      ASSERT_EQ((*grammar)->Accepts(t), automaton->Accepts(t))
          << schema << " on '" << t << "' seed " << seed << "\n" << *text;
    };
    for (int sample = 0; sample < 25; ++sample) {
      std::string t;
      int32_t state = RegexGuide::kStart;
      while (true) {
        std::vector<uint8_t> next, closing;
        for (int b = 0; b < 256; ++b) {
          if (automaton->Step(state, std::string(1, char(b))) == RegexGuide::kDead) continue;
          next.push_back(uint8_t(b));
          if (b == '"' || b == ']' || b == '}') closing.push_back(uint8_t(b));
        }
        if (automaton->Accepts(t) && (next.empty() || rng() % 4 == 0)) break;
        ASSERT_FALSE(next.empty());
        const auto& from = !closing.empty() && rng() % 5 == 0 ? closing : next;
        const uint8_t b = from[rng() % from.size()];
        t += char(b);
        state = automaton->Step(state, std::string(1, char(b)));
        if (t.size() > 400) break;
      }
      for (size_t n = 0; n <= t.size(); ++n) agree(t.substr(0, n));
      for (int m = 0; m < 8; ++m) {
        std::string changed = t;
        const size_t at = changed.empty() ? 0 : rng() % changed.size();
        const char c = palette[rng() % palette.size()];
        if (m % 3 == 0 && !changed.empty()) {
          changed[at] = c;
        } else if (m % 3 == 1) {
          changed.insert(changed.begin() + ptrdiff_t(at), c);
        } else if (!changed.empty()) {
          changed.erase(at, 1);
        }
        agree(changed);
      }
    }
  }
}

// A count too large for an automaton (a string of 800 characters, 400 items) is guided by the
// grammar, exactly; counts too large for the grammar too are refused, the largest named.
TEST(JsonSchemaGuideTest, CountsTooLargeForAnAutomatonAreGuidedByTheGrammar) {
  auto bio = Compiled(R"({"properties": {"bio": {"type": "string", "maxLength": 800}}})");
  ASSERT_TRUE(bio);
  EXPECT_TRUE(std::dynamic_pointer_cast<const GrammarGuide>(bio));
  EXPECT_TRUE(bio->Accepts(absl::StrCat(R"({"bio": ")", std::string(800, 'x'), "\"}")));
  EXPECT_TRUE(bio->Accepts(absl::StrCat(R"({"bio": ")", std::string(400, 'x'), "\\n\"}")));
  EXPECT_FALSE(bio->Accepts(absl::StrCat(R"({"bio": ")", std::string(801, 'x'), "\"}")));
  EXPECT_TRUE(bio->Accepts("{}"));
  auto list = Compiled(
      R"({"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 400})");
  ASSERT_TRUE(list);
  std::string items = "[\"a\"";
  for (int i = 1; i < 400; ++i) items += ", \"b\"";
  EXPECT_TRUE(list->Accepts(items + "]"));
  EXPECT_FALSE(list->Accepts(items + ", \"c\"]"));
  EXPECT_FALSE(list->Accepts(R"(["123456789012345678901"])"));
  // Every count different and required: the grammar's expanded counts pass its bound too.
  Json many = {{"type", "object"}, {"properties", Json::object()}, {"required", Json::array()}};
  for (int i = 0; i < 80; ++i) {
    const std::string name = absl::StrCat("f", i);
    many["properties"][name] = {{"type", "string"}, {"maxLength", 900 + i}};
    many["required"].push_back(name);
  }
  const std::string too_large =
      "guided_json: the schema is too large to guide: its grammar would hold more than 200000 "
      "classes and references with its counts expanded (a count of n costs about 3n; its "
      "counts: #/properties/f79/maxLength, #/properties/f78/maxLength, "
      "#/properties/f77/maxLength, and 77 more)";
  auto refused = CompileJsonSchema(many.dump());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), too_large);
  // The same in a recursive schema (a grammar from the start).
  many["properties"]["kids"] = {{"type", "array"}, {"items", {{"$ref", "#"}}}};
  refused = CompileJsonSchema(many.dump());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), too_large);
  EXPECT_EQ(CheckJsonSchema(many.dump()).message(), refused.status().message());
}

// Recursion that never ends, in many definitions: each found in one reading of the grammar,
// three of them named.
TEST(JsonSchemaGuideTest, EndlessRecursionNamesItsDefinitions) {
  Json schema = {{"$defs", Json::object()}, {"type", "object"}, {"properties", Json::object()},
                 {"required", Json::array()}};
  for (int i = 0; i < 200; ++i) {
    const std::string name = absl::StrCat("d", i);
    schema["$defs"][name] = {{"type", "object"},
                             {"properties", {{"n", {{"$ref", "#/$defs/" + name}}}}},
                             {"required", {"n"}}};
    schema["properties"][name] = {{"$ref", "#/$defs/" + name}};
    schema["required"].push_back(name);
  }
  auto refused = CompileJsonSchema(schema.dump());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "guided_json: #: no JSON text matches the schema: its recursion never ends "
            "(#/$defs/d0, #/$defs/d1, #/$defs/d2, and 197 more: each always holds itself "
            "again)");
  EXPECT_EQ(CheckJsonSchema(schema.dump()).message(), refused.status().message());
  // Not required, the endless definitions are never written; the rest is guided.
  Json optional = {{"$defs", schema["$defs"]}, {"type", "object"},
                   {"properties", Json::object()}};
  for (int i = 0; i < 5; ++i) {
    optional["properties"][absl::StrCat("d", i)] = {{"$ref", absl::StrCat("#/$defs/d", i)}};
  }
  optional["properties"]["ok"] = {{"type", "boolean"}};
  auto guide = CompileJsonSchema(optional.dump());
  ASSERT_TRUE(guide.ok()) << guide.status();
  EXPECT_TRUE((*guide)->Accepts(R"({"ok": true})"));
  EXPECT_FALSE((*guide)->Accepts(R"({"d0": {"n": {}}, "ok": true})"));
}

}  // namespace
}  // namespace thetaserve::scheduler
