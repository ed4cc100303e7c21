// JsonObjectGuide: the objects it accepts are those a JSON parser (nlohmann's) accepts, within
// its bounds; every prefix of one leads on; the tokens it lets through.
#include "scheduler/guided_json.h"

#include <cctype>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace thetaserve::scheduler {
namespace {

bool Accepts(std::string_view s) { return JsonObjectGuide().Accepts(s); }
bool LeadsOn(std::string_view s) {
  JsonObjectGuide::State out;
  return JsonObjectGuide::Step({}, s, &out);
}

TEST(JsonObjectGuideTest, AcceptsJsonObjectsAndNothingElse) {
  for (const char* ok : {
           "{}",
           R"({"a": 1})",
           R"({"a":[1,2.5,-0.1e+3,0,1E9,true,false,null,"x\u00e9\n\"",{"b":{}},[]]})",
           "{\n  \"name\": \"Ada\",\n  \"tags\": [\n    \"x\"\n  ]\n}",
           R"({"é😀": "ok ü", "": ""})",
           "  {\"a\": {}}",
       }) {
    EXPECT_TRUE(Accepts(ok)) << ok;
  }
  for (const char* bad : {
           "[]", "\"a\"", "1", R"({"a" 1})", R"({"a": 01})", R"({"a": 1,})", R"({"a": tru})",
           "{'a': 1}", "{\"a\": \"\x01\"}", R"({"a": 1}})", R"({"a": 1} )", R"({"a": 1.})",
           R"({"a": -})", R"({"a": .5})", R"({"a": "\x"})", R"({"a": [1 2]})", R"({a: 1})",
           R"({"a": 1e})", R"({"a": "\u12g4"})", "{\"a\": \"\xff\"}", R"({"a": [}])",
       }) {
    EXPECT_FALSE(Accepts(bad)) << bad;
  }
  // A prefix of an object leads on; what no object begins with does not.
  EXPECT_TRUE(LeadsOn(R"({"a": [1, {"b": "x\u00)"));
  EXPECT_TRUE(LeadsOn("{\"a\": \"\xc3"));  // half of é
  // Only well-formed UTF-8 (Table 3-7): no overlong forms, surrogates or past U+10FFFF.
  for (const char* bad : {"\xe0\x80", "\xed\xa0", "\xf0\x80", "\xf4\x90", "\xc0", "\xf5"}) {
    EXPECT_FALSE(LeadsOn(std::string("{\"a\": \"") + bad)) << bad;
  }
  for (const char* good : {"\xe0\xa0\x80", "\xed\x9f\xbf", "\xf0\x90\x80\x80",
                           "\xf4\x8f\xbf\xbf", "\xe1\x80\x80"}) {
    EXPECT_TRUE(Accepts(std::string("{\"a\": \"") + good + "\"}")) << good;
  }
  // \u surrogates only in pairs, high then low, as a parser wants them.
  for (const char* good :
       {R"(\ud83d\ude00)", R"(\uDBFF\uDFFF)", R"(\ud7ff\ue000)", R"(\uD000)"}) {
    EXPECT_TRUE(Accepts(std::string("{\"a\": \"") + good + "\"}")) << good;
  }
  for (const char* bad : {R"(\ud800")", R"(\udc00)", R"(\ud83d\u0041)", R"(\ud83d\n)",
                          R"(\ud83d\ud83d)", R"(\uDFFF)"}) {
    EXPECT_FALSE(LeadsOn(std::string("{\"a\": \"") + bad)) << bad;
  }
  EXPECT_FALSE(LeadsOn(R"({"a": 1]})"));
  EXPECT_FALSE(LeadsOn(R"({"a": 1} )"));  // nothing after the object, not even a space
}

TEST(JsonObjectGuideTest, DepthWhitespaceAndDigitsAreBounded) {
  // A number's parts have at most kMaxJsonDigits digits, its exponent kMaxJsonExponentDigits.
  EXPECT_TRUE(Accepts(R"({"a": -1234567890123456789.1234567890123456789e-123})"));
  for (const char* bad : {R"({"a": 12345678901234567890})", R"({"a": 0.12345678901234567890})",
                          R"({"a": 1e1234})", R"({"a": -12345678901234567890})"}) {
    EXPECT_FALSE(Accepts(bad)) << bad;
  }
  std::string deep = "{\"a\": ";
  for (int i = 1; i < kMaxJsonDepth; ++i) deep += "[";
  EXPECT_TRUE(LeadsOn(deep));
  EXPECT_FALSE(LeadsOn(deep + "["));
  EXPECT_TRUE(LeadsOn("{" + std::string(kMaxJsonWhitespace, ' ')));
  EXPECT_FALSE(LeadsOn("{" + std::string(kMaxJsonWhitespace + 1, ' ')));
}

// Random objects (random nesting, strings with escapes and multibyte characters, numbers of
// every form, random whitespace) are accepted, and so is every prefix of one led on; random
// one-byte edits of them are accepted exactly when nlohmann's parser takes them as an object
// (edits that only add whitespace at the end, which the guide does not allow, aside).
TEST(JsonObjectGuideTest, AgreesWithAJsonParserOnRandomObjectsAndEdits) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return int(rng() % uint32_t(n)); };
  auto space = [&] {
    static const char* kSpaces[] = {"", "", " ", "\n  ", "\t"};
    return std::string(kSpaces[pick(5)]);
  };
  auto string = [&] {
    static const char* kParts[] = {"a", "Z", " ", "é", "😀", "\\n", "\\\"", "\\\\", "\\u00e9",
                                   "\\/", "9", "{", "]", ":", ",", "\\ud83d\\ude00"};
    std::string s = "\"";
    for (int n = pick(5); n > 0; --n) s += kParts[pick(16)];
    return s + "\"";
  };
  // Appends to `out` (GCC 12 warns falsely about chains of + on strings).
  auto append = [](std::string& out, std::initializer_list<std::string> parts) {
    for (const std::string& p : parts) out += p;
  };
  std::function<std::string(int)> value = [&](int depth) -> std::string {
    const int kind = depth >= 4 ? pick(4) : pick(6);
    std::string v;
    switch (kind) {
      case 0:
      case 3: return string();
      case 1: {
        static const char* kNumbers[] = {"0", "-0", "12", "-3.25", "1e5", "2.5E-3", "0.0",
                                         "-10e+2", "7"};
        return kNumbers[pick(9)];
      }
      case 2: {
        static const char* kLiterals[] = {"true", "false", "null"};
        return kLiterals[pick(3)];
      }
      case 4:
        append(v, {"[", space()});
        for (int n = pick(4), i = 0; i < n; ++i) {
          if (i) append(v, {",", space()});
          append(v, {value(depth + 1), space()});
        }
        v += "]";
        return v;
      default:
        append(v, {"{", space()});
        for (int n = pick(4), i = 0; i < n; ++i) {
          if (i) append(v, {",", space()});
          append(v, {string(), space(), ":", space(), value(depth + 1), space()});
        }
        v += "}";
        return v;
    }
  };
  const std::string alphabet = "{}[]\":,01-.eE \\ntrufalsé";
  int edits_accepted = 0;
  for (int round = 0; round < 300; ++round) {
    std::string obj;
    append(obj, {"{", space()});
    for (int n = 1 + pick(3), i = 0; i < n; ++i) {
      if (i) append(obj, {",", space()});
      append(obj, {string(), ":", space(), value(1)});
    }
    append(obj, {space(), "}"});
    ASSERT_TRUE(nlohmann::json::accept(obj)) << obj;
    EXPECT_TRUE(Accepts(obj)) << obj << " (seed " << seed << ")";
    for (size_t k = 0; k < obj.size(); ++k) {
      ASSERT_TRUE(LeadsOn(obj.substr(0, k))) << obj.substr(0, k) << " (seed " << seed << ")";
    }
    std::string edited = obj;
    const size_t at = size_t(pick(int(obj.size())));
    switch (pick(3)) {
      case 0: edited.erase(at, 1); break;
      case 1: edited.insert(at, 1, alphabet[pick(int(alphabet.size()))]); break;
      default: edited[at] = alphabet[pick(int(alphabet.size()))]; break;
    }
    if (edited.empty() || std::isspace(static_cast<unsigned char>(edited.back()))) continue;
    bool parsed = nlohmann::json::accept(edited);
    if (parsed) parsed = nlohmann::json::parse(edited).is_object();
    EXPECT_EQ(Accepts(edited), parsed) << edited << " (from " << obj << ", seed " << seed << ")";
    edits_accepted += parsed;
  }
  EXPECT_GT(edits_accepted, 0);  // the edits test both answers
}

TEST(JsonObjectGuideTest, TheNextTokensContinueAnObject) {
  //                        0     1    2     3     4    5     6     7     8        9
  TokenBytesIndex vocab({"{", "}", "\"", "tr", ":", "1", "[", ", ", "{\"a", "\"}"});
  JsonObjectGuide g;
  std::vector<int32_t> ids;
  g.Allowed("", vocab, &ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 8}));
  g.Allowed(R"({"a": )", vocab, &ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 2, 3, 5, 6, 8, 9}));  // "} inside a string
  g.Allowed(R"({"a": 1)", vocab, &ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 5, 7}));
  g.Allowed(R"({"a": "x)", vocab, &ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 9}));  // not {"a: a after "x{"
  g.Allowed(R"({"a": 1})", vocab, &ids);
  EXPECT_TRUE(ids.empty());
  EXPECT_TRUE(g.Complete(R"({"a": 1})"));
}

}  // namespace
}  // namespace thetaserve::scheduler
