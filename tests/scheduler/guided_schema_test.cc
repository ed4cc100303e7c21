// JSON schemas as guides: what each keyword lets through and keeps out; integer bounds exact;
// random texts walked through a schema's automaton are JSON that the schema describes (checked
// by a small validator here, and parsed by nlohmann's parser); what cannot be guided is refused
// with where it is in the schema.
#include "scheduler/guided_schema.h"

#include <functional>
#include <initializer_list>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/tokenizer_utf8.h"
#include "nlohmann/json.hpp"

namespace thetaserve::scheduler {
namespace {

using Json = nlohmann::ordered_json;

std::shared_ptr<const RegexGuide> Guide(std::string_view schema) {
  auto guide = CompileJsonSchema(schema);
  EXPECT_TRUE(guide.ok()) << schema << ": " << guide.status();
  return guide.ok() ? *guide : nullptr;
}

void ExpectTakes(std::string_view schema, std::initializer_list<const char*> good,
                 std::initializer_list<const char*> bad) {
  auto guide = Guide(schema);
  if (!guide) return;
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
    auto guide = Guide(schema.dump());
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
  auto guide = Guide(usable.dump());
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
      {R"({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
           "$ref": "#/$defs/n"})",
       "guided_json: #/$defs/n/items/$ref: #/$defs/n is recursive"},
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
      // Counts the automaton cannot hold are named, not left to a position in the expression.
      {R"({"properties": {"bio": {"type": "string", "maxLength": 800}}})",
       "guided_json: #/properties/bio/maxLength: the count is too large to guide"},
      {R"({"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 400})",
       "guided_json: #/maxItems: the count is too large to guide"},
  };
  for (const auto& [schema, message] : refused) {
    auto guide = CompileJsonSchema(schema);
    ASSERT_FALSE(guide.ok()) << schema;
    EXPECT_NE(std::string(guide.status().message()).find(message), std::string::npos)
        << schema << " → " << guide.status().message();
  }
}

}  // namespace
}  // namespace thetaserve::scheduler
