// Guided output over the OpenAI-compatible HTTP API end to end (the real binary with SmolLM2):
// guided_choice, guided_regex, guided_grammar, response_format json_object and json_schema,
// guided_json, and tool calls; each answer checked against what guided it.
#include <algorithm>
#include <functional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "scheduler/guided_grammar.h"
#include "scheduler/guided_json.h"
#include "scheduler/guided_schema.h"
#include "tests/server/openai_http_e2e.h"

namespace thetaserve::testing {
namespace {

// guided_choice on the real model: the answer is one of the choices, whole, with finish_reason
// stop (greedy: the one the model prefers; sampled, streamed, n of them, a choice that is the
// start of another, chat with vLLM's structured_outputs.choice).
TEST_F(OpenAiHttpTest, GuidedChoiceAnswersWithOneOfTheChoices) {
  ASSERT_TRUE(server_->started());
  auto post = [&](const std::string& path, const Json& body) {
    HttpResult r = Post(path, body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? Json::parse(r.body) : Json();
  };
  const std::vector<std::string> cities = {" London", " Paris", " Berlin", " Rome"};
  Json j = post("/v1/completions", {{"prompt", "The capital of France is"}, {"max_tokens", 20},
                                    {"temperature", 0}, {"guided_choice", cities}});
  EXPECT_EQ(j["choices"][0]["text"], " Paris");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");

  const std::vector<std::string> answers = {"yes", "yes, absolutely", "no", "maybe", "I think so"};
  auto one_of = [&](const std::string& text) {
    return std::find(answers.begin(), answers.end(), text) != answers.end();
  };
  const Json sampled = {{"prompt", "Question: is the sea salty? Answer:"}, {"max_tokens", 20},
                        {"temperature", 1.5}, {"n", 4}, {"seed", 21},
                        {"guided_choice", answers}};
  j = post("/v1/completions", sampled);
  ASSERT_EQ(j["choices"].size(), 4u);
  std::set<std::string> seen;
  for (const Json& c : j["choices"]) {
    const std::string text = c["text"];
    EXPECT_TRUE(one_of(text)) << text;
    EXPECT_EQ(c["finish_reason"], "stop") << text;
    seen.insert(text);
  }
  EXPECT_GE(seen.size(), 2u) << "four draws at temperature 1.5 gave one answer (seed 21)";
  const StreamedChoices parts = StreamedAlike(sampled, j);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(parts.finishes[i], 1) << i;

  j = post("/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "Is this review positive or negative? "
                                                          "'I loved every minute of it.'"}}}},
            {"temperature", 0}, {"structured_outputs", {{"choice", {"positive", "negative"}}}}});
  const std::string label = j["choices"][0]["message"]["content"];
  EXPECT_TRUE(label == "positive" || label == "negative") << label;
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

// guided_regex on the real model: every answer matches the pattern whole (greedy; sampled at a
// high temperature, n of them, streamed alike; chat with structured_outputs.regex), ending with
// stop once nothing may follow; a pattern that may go on ends by EOS or max_tokens, a match or
// a prefix of one. A pattern the guide cannot take is refused, naming the field as sent.
TEST_F(OpenAiHttpTest, GuidedRegexAnswersMatchThePattern) {
  ASSERT_TRUE(server_->started());
  auto post = [&](const std::string& path, const Json& body) {
    HttpResult r = Post(path, body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? Json::parse(r.body) : Json();
  };
  const std::string phone = R"(\(\d{3}\) \d{3}-\d{4})";
  const std::regex phone_re(phone);
  Json j = post("/v1/completions", {{"prompt", "For reservations, call us at"}, {"max_tokens", 30},
                                    {"temperature", 0}, {"guided_regex", phone}});
  std::string text = j["choices"][0]["text"];
  EXPECT_TRUE(std::regex_match(text, phone_re)) << text;
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const std::string greedy_phone = text;

  const Json sampled = {{"prompt", "My favourite number is"}, {"max_tokens", 12},
                        {"temperature", 1.5}, {"n", 4}, {"seed", 5},
                        {"guided_regex", "[1-9][0-9]*( or [1-9][0-9]*)?"}};
  j = post("/v1/completions", sampled);
  ASSERT_EQ(j["choices"].size(), 4u);
  // A prefix of a match: digits, then perhaps " or" and digits.
  const std::regex prefix_re("[1-9][0-9]*( (o(r( [1-9][0-9]*)?)?)?)?");
  for (const Json& c : j["choices"]) {
    text = c["text"];
    EXPECT_TRUE(std::regex_match(text, prefix_re)) << text;
    EXPECT_TRUE(c["finish_reason"] == "stop" || c["finish_reason"] == "length") << text;
    if (c["finish_reason"] == "stop") {
      EXPECT_TRUE(std::regex_match(text, std::regex("[1-9][0-9]*( or [1-9][0-9]*)?"))) << text;
    }
  }
  StreamedAlike(sampled, j);

  const std::string verdict = "(yes|no), because [a-z ,]{10,60}\\.";
  j = post("/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "Is the sea salty? Explain briefly."}}}},
            {"temperature", 0}, {"max_tokens", 40},
            {"structured_outputs", {{"regex", verdict}}}});
  text = j["choices"][0]["message"]["content"];
  EXPECT_TRUE(std::regex_match(text, std::regex(verdict))) << text;
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");

  auto error_of = [&](const Json& body) {
    HttpResult r = Post("/v1/completions", body);
    EXPECT_EQ(r.status, 400) << r.body;
    return r.status == 400 ? Json::parse(r.body)["error"] : Json();
  };
  Json e = error_of({{"prompt", "x"}, {"guided_regex", "(?=a)b"}});
  EXPECT_TRUE(e["message"].get<std::string>().starts_with(
      "guided_regex: '(?' at position 0: look-arounds")) << e;
  EXPECT_EQ(e["param"], "guided_regex");
  e = error_of({{"prompt", "x"}, {"structured_outputs", {{"regex", "a{3,2}"}}}});
  EXPECT_EQ(e["message"],
            "structured_outputs.regex: {3,2} at position 1: the minimum is over the maximum");
  EXPECT_EQ(e["param"], "structured_outputs.regex");
  e = error_of({{"prompt", "x"}, {"guided_regex", "a"}, {"guided_choice", {"a"}}});
  EXPECT_EQ(e["message"], "guided_choice and guided_regex are both given; send one");
  EXPECT_EQ(error_of({{"prompt", "x"}, {"guided_regex", ""}})["message"], "guided_regex is empty");

  auto stub = server_->stub();
  v1::GenerateRequest bad = Prompt("x", 4);
  bad.mutable_sampling()->set_guided_regex("[ab");
  StreamResult refused = Generate(*stub, bad);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.status.error_message(),
            "sampling.guided_regex: unterminated character set at position 0");
  v1::GenerateRequest good = Prompt("For reservations, call us at", 30);
  good.mutable_sampling()->set_guided_regex(phone);
  StreamResult answered = Generate(*stub, good);
  ASSERT_TRUE(answered.status.ok()) << answered.status.error_message();
  EXPECT_EQ(answered.text, greedy_phone);  // the same guide over gRPC
  EXPECT_TRUE(std::regex_match(answered.text, phone_re)) << answered.text;
  EXPECT_EQ(answered.complete.finish_reason(), v1::FINISH_REASON_STOP);
}

// guided_grammar on the real model: a recursive grammar (arithmetic, nested brackets) guides
// every answer: whole texts of the grammar where they end with stop, the start of one where
// max_tokens cut them (greedy; sampled, n of them, streamed alike; chat with
// structured_outputs.grammar; gRPC's guided_grammar gives the greedy answer again). A grammar
// that cannot be read is refused with its line and column, naming the field as sent.
TEST_F(OpenAiHttpTest, GuidedGrammarAnswersAreTextsOfTheGrammar) {
  ASSERT_TRUE(server_->started());
  auto post = [&](const std::string& path, const Json& body) {
    HttpResult r = Post(path, body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? Json::parse(r.body) : Json();
  };
  const std::string arithmetic = R"g(root ::= expr " = " [0-9]{1,4}
expr ::= term ((" + " | " - ") term)*
term ::= factor (" * " factor)*
factor ::= [1-9] [0-9]? | "(" expr ")"
)g";
  auto guide = scheduler::GrammarGuide::Compile(arithmetic);
  ASSERT_TRUE(guide.ok()) << guide.status();
  auto check = [&](const scheduler::GrammarGuide& g, const Json& choice, const std::string& text) {
    if (choice["finish_reason"] == "stop") {
      EXPECT_TRUE(g.Accepts(text)) << text;
    } else {
      EXPECT_EQ(choice["finish_reason"], "length") << text;
      EXPECT_TRUE(g.LeadsOn(text)) << text;
    }
  };
  Json j = post("/v1/completions", {{"prompt", "Some sums: 2 + 3 = 5, 4 * 6 = 24, and"},
                                    {"max_tokens", 24}, {"temperature", 0},
                                    {"guided_grammar", arithmetic}});
  const std::string greedy = j["choices"][0]["text"];
  check(**guide, j["choices"][0], greedy);
  EXPECT_FALSE(greedy.empty());

  const Json sampled = {{"prompt", "A calculation:"}, {"max_tokens", 24}, {"temperature", 1.2},
                        {"n", 4}, {"seed", 3}, {"guided_grammar", arithmetic}};
  j = post("/v1/completions", sampled);
  ASSERT_EQ(j["choices"].size(), 4u);
  int whole = 0;
  for (const Json& c : j["choices"]) {
    check(**guide, c, c["text"]);
    whole += c["finish_reason"] == "stop";
  }
  EXPECT_GE(whole, 2) << "of 4 samples (seed 3), fewer than 2 ended whole";
  StreamedAlike(sampled, j);

  // Brackets nest as deep as the model likes: no regular expression writes this.
  const std::string nested = R"g(root ::= list
list ::= "[" (item (", " item)*)? "]"
item ::= list | [a-z]+
)g";
  auto lists = scheduler::GrammarGuide::Compile(nested);
  ASSERT_TRUE(lists.ok()) << lists.status();
  j = post("/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "Write a nested list of fruits."}}}},
            {"temperature", 0}, {"max_tokens", 40},
            {"structured_outputs", {{"grammar", nested}}}});
  check(**lists, j["choices"][0], j["choices"][0]["message"]["content"]);

  auto error_of = [&](const Json& body) {
    HttpResult r = Post("/v1/completions", body);
    EXPECT_EQ(r.status, 400) << r.body;
    return r.status == 400 ? Json::parse(r.body)["error"] : Json();
  };
  Json e = error_of({{"prompt", "x"}, {"guided_grammar", "root ::= expr\nexpr ::= expr \"+\" [0-9] | [0-9]"}});
  EXPECT_TRUE(e["message"].get<std::string>().starts_with(
      "guided_grammar: line 2, column 1: rule 'expr' is left-recursive (expr -> expr")) << e;
  EXPECT_EQ(e["param"], "guided_grammar");
  e = error_of({{"prompt", "x"}, {"structured_outputs", {{"grammar", "root ::= [a-"}}}});
  EXPECT_EQ(e["message"], "structured_outputs.grammar: line 1, column 10: a class without its "
                          "closing ]");
  EXPECT_EQ(e["param"], "structured_outputs.grammar");
  e = error_of({{"prompt", "x"}, {"grammar", "root ::= \"a\" b"}});  // llama.cpp's name
  EXPECT_EQ(e["message"], "grammar: line 1, column 14: rule 'b' is used but not defined");
  EXPECT_EQ(e["param"], "grammar");

  auto stub = server_->stub();
  v1::GenerateRequest bad = Prompt("x", 4);
  bad.mutable_sampling()->set_guided_grammar("root ::= \"a\" b");
  StreamResult refused = Generate(*stub, bad);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.status.error_message(),
            "sampling.guided_grammar: line 1, column 14: rule 'b' is used but not defined");
  v1::GenerateRequest good = Prompt("Some sums: 2 + 3 = 5, 4 * 6 = 24, and", 24);
  good.mutable_sampling()->set_guided_grammar(arithmetic);
  StreamResult answered = Generate(*stub, good);
  ASSERT_TRUE(answered.status.ok()) << answered.status.error_message();
  EXPECT_EQ(answered.text, greedy);  // the same guide over gRPC
  std::printf("greedy: \"%s\"; sampled whole: %d of 4\n", greedy.c_str(), whole);
}

// response_format json_object on the real model: greedy answers are JSON objects that end with
// stop when they close; sampled ones (n of them, streamed alike) are objects or, cut by
// max_tokens, the start of one; over gRPC too, and never with another guide.
TEST_F(OpenAiHttpTest, JsonObjectAnswersAreJsonObjects) {
  ASSERT_TRUE(server_->started());
  auto post = [&](const std::string& path, const Json& body) {
    HttpResult r = Post(path, body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? Json::parse(r.body) : Json();
  };
  auto ask = [](const std::string& content) {
    return Json{{"messages", {{{"role", "user"}, {"content", content}}}}, {"temperature", 0},
                {"max_tokens", 120}, {"response_format", {{"type", "json_object"}}}};
  };
  Json j = post("/v1/chat/completions", ask("Describe a cat as a JSON object with name and age."));
  std::string text = j["choices"][0]["message"]["content"];
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << text;
  ASSERT_TRUE(Json::accept(text)) << text;
  EXPECT_TRUE(Json::parse(text).is_object()) << text;
  const std::string greedy_cat = text;

  auto leads_on = [](const std::string& prefix) {
    scheduler::JsonObjectGuide::State state;
    return scheduler::JsonObjectGuide::Step({}, prefix, &state);
  };
  const Json sampled = {{"prompt", "A JSON object describing a book:"}, {"max_tokens", 40},
                        {"temperature", 1.0}, {"n", 3}, {"seed", 11},
                        {"structured_outputs", {{"json_object", true}}}};
  j = post("/v1/completions", sampled);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (const Json& c : j["choices"]) {
    text = c["text"];
    if (c["finish_reason"] == "stop") {
      EXPECT_TRUE(Json::accept(text) && Json::parse(text).is_object()) << text;
    } else {
      EXPECT_EQ(c["finish_reason"], "length") << text;
      EXPECT_TRUE(leads_on(text)) << text;
    }
  }
  StreamedAlike(sampled, j);

  auto stub = server_->stub();
  v1::GenerateRequest req = GreedyChat("Describe a cat as a JSON object with name and age.", 120);
  req.mutable_sampling()->set_json_object(true);
  StreamResult answered = Generate(*stub, req);
  ASSERT_TRUE(answered.status.ok()) << answered.status.error_message();
  EXPECT_EQ(answered.text, greedy_cat);
  req.mutable_sampling()->set_guided_regex("a+");
  StreamResult refused = Generate(*stub, req);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.status.error_message(),
            "sampling.json_object and sampling.guided_regex are both given; send one");
}

// A JSON schema guides the answer: by response_format json_schema on chat, guided_json on
// completions (sampled, streamed alike) and on gRPC; the answers parse, hold the schema's
// types and bounds, and keep its properties' order; a schema that cannot be guided is refused
// naming the field and where in the schema.
TEST_F(OpenAiHttpTest, JsonSchemaAnswersFollowTheSchema) {
  ASSERT_TRUE(server_->started());
  auto post = [&](const std::string& path, const std::string& body) {
    HttpResult r = HttpCall(http_port_, "POST", path, body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? Json::parse(r.body) : Json();
  };
  // Sent as text: the order of "name", "age", "indoor" is the order asked for.
  const std::string cat_schema =
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
          "age": {"type": "integer", "minimum": 0, "maximum": 30}, "indoor": {"type": "boolean"}},
          "required": ["name", "age", "indoor"]})";
  auto check_cat = [](const std::string& text) {
    ASSERT_TRUE(Json::accept(text)) << text;
    const auto cat = nlohmann::ordered_json::parse(text);
    std::vector<std::string> keys;
    for (const auto& [key, value] : cat.items()) keys.push_back(key);
    EXPECT_EQ(keys, std::vector<std::string>({"name", "age", "indoor"})) << text;
    EXPECT_TRUE(cat["name"].is_string() && cat["indoor"].is_boolean()) << text;
    ASSERT_TRUE(cat["age"].is_number_integer()) << text;
    EXPECT_GE(cat["age"].get<int>(), 0) << text;
    EXPECT_LE(cat["age"].get<int>(), 30) << text;
  };
  Json j = post("/v1/chat/completions", absl::StrCat(R"({"messages": [{"role": "user",
      "content": "Describe a cat as JSON."}], "temperature": 0, "max_tokens": 200,
      "response_format": {"type": "json_schema", "json_schema": {"name": "cat", "strict": true,
      "schema": )", cat_schema, "}}}"));
  std::string text = j["choices"][0]["message"]["content"];
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << text;
  check_cat(text);
  const std::string greedy_cat = text;

  // Sampled completions, an enum and an optional property among them.
  const std::string book_schema =
      R"({"type": "object", "properties": {"title": {"type": "string", "maxLength": 30},
          "genre": {"enum": ["novel", "poetry", "history"]},
          "pages": {"type": "integer", "minimum": 1, "maximum": 2000}},
          "required": ["title", "genre"]})";
  const std::string sampled = absl::StrCat(R"({"prompt": "A JSON object describing a book:",
      "max_tokens": 80, "temperature": 1.0, "n": 3, "seed": 5, "guided_json": )", book_schema,
                                           "}");
  j = post("/v1/completions", sampled);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (const Json& c : j["choices"]) {
    text = c["text"];
    ASSERT_EQ(c["finish_reason"], "stop") << text;
    ASSERT_TRUE(Json::accept(text)) << text;
    const Json book = Json::parse(text);
    EXPECT_TRUE(book["title"].is_string()) << text;
    EXPECT_TRUE(book["genre"] == "novel" || book["genre"] == "poetry" || book["genre"] == "history")
        << text;
    if (book.contains("pages")) {
      EXPECT_TRUE(book["pages"].is_number_integer()) << text;
    }
    EXPECT_EQ(book.size(), book.contains("pages") ? 3u : 2u) << text;
  }
  // Re-sent as parsed (a sorted body), the schema as text keeping its order.
  Json resent = Json::parse(sampled);
  resent["guided_json"] = book_schema;
  StreamedAlike(resent, j);

  // gRPC: the same schema gives the same greedy answer.
  auto stub = server_->stub();
  v1::GenerateRequest req = GreedyChat("Describe a cat as JSON.", 200);
  req.mutable_sampling()->set_guided_json(cat_schema);
  StreamResult answered = Generate(*stub, req);
  ASSERT_TRUE(answered.status.ok()) << answered.status.error_message();
  EXPECT_EQ(answered.text, greedy_cat);
  req.mutable_sampling()->set_guided_json(
      R"({"type": "object", "properties": {"a": {"type": "string", "format": "email"}}})");
  StreamResult refused = Generate(*stub, req);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.status.error_message(),
            "sampling.guided_json: #/properties/a/format: \"email\" is not supported (date, "
            "time, date-time, uuid)");
  HttpResult bad = HttpCall(http_port_, "POST", "/v1/chat/completions",
                            R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "x",
      "schema": {"type": "object", "properties": {"n": {"type": "number", "maximum": 3}}}}}})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(Json::parse(bad.body)["error"]["message"],
            "response_format.json_schema.schema: #/properties/n/maximum: bounds on a number "
            "other than minimum 0 are not supported (an integer takes any bounds)");
  EXPECT_EQ(Json::parse(bad.body)["error"]["param"], "response_format.json_schema.schema");
  // And the server serves on.
  EXPECT_EQ(post("/v1/completions", sampled)["choices"], j["choices"]);
}

// A recursive JSON schema (as pydantic writes a model that holds itself: sections of
// sections) guides the answer to whatever depth the model writes, through the schema's grammar:
// on chat's response_format json_schema (greedy, and over gRPC alike) and completions'
// guided_json (sampled, n of them, streamed alike). Answers that end with stop are instances
// (checked level by level); ones cut by max_tokens lead on in the schema's grammar. A string of
// 800 characters, more than an automaton holds, is guided too.
TEST_F(OpenAiHttpTest, RecursiveJsonSchemasAreGuidedToAnyDepth) {
  ASSERT_TRUE(server_->started());
  auto post = [&](const std::string& path, const std::string& body) {
    HttpResult r = HttpCall(http_port_, "POST", path, body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? Json::parse(r.body) : Json();
  };
  const std::string outline = R"({"$defs": {"Section": {"title": "Section", "type": "object",
      "properties": {"title": {"type": "string", "maxLength": 40},
                     "subsections": {"type": "array", "items": {"$ref": "#/$defs/Section"},
                                     "maxItems": 3}},
      "required": ["title", "subsections"]}}, "$ref": "#/$defs/Section"})";
  auto guide = scheduler::CompileJsonSchema(outline);
  ASSERT_TRUE(guide.ok()) << guide.status();
  // A section: its title, then at most 3 sections, in that order and nothing else.
  std::function<bool(const nlohmann::ordered_json&)> section =
      [&](const nlohmann::ordered_json& v) {
        if (!v.is_object() || v.size() != 2 || v.begin().key() != "title" ||
            !v["title"].is_string() || !v.contains("subsections") ||
            !v["subsections"].is_array() || v["subsections"].size() > 3) {
          return false;
        }
        for (const auto& kid : v["subsections"]) {
          if (!section(kid)) return false;
        }
        return true;
      };
  int deepest = 0;
  auto check = [&](const Json& choice, const std::string& text) {
    if (choice["finish_reason"] == "stop") {
      ASSERT_TRUE(Json::accept(text)) << text;
      EXPECT_TRUE(section(nlohmann::ordered_json::parse(text))) << text;
      EXPECT_TRUE((*guide)->Accepts(text)) << text;
    } else {
      EXPECT_EQ(choice["finish_reason"], "length") << text;
      auto grammar = std::dynamic_pointer_cast<const scheduler::GrammarGuide>(*guide);
      ASSERT_TRUE(grammar);
      EXPECT_TRUE(grammar->LeadsOn(text)) << text;
    }
    int depth = 0;
    for (char c : text) {
      depth += c == '{' ? 1 : c == '}' ? -1 : 0;
      deepest = std::max(deepest, depth);
    }
  };
  Json j = post("/v1/chat/completions", absl::StrCat(R"({"messages": [{"role": "user",
      "content": "Outline a short guide to baking bread as nested sections."}],
      "temperature": 0, "max_tokens": 160, "response_format": {"type": "json_schema",
      "json_schema": {"name": "outline", "schema": )", outline, "}}}"));
  const std::string greedy = j["choices"][0]["message"]["content"];
  check(j["choices"][0], greedy);

  const std::string sampled = absl::StrCat(R"({"prompt": "A book's table of contents as JSON:",
      "max_tokens": 120, "temperature": 1.0, "n": 3, "seed": 11, "guided_json": )", outline,
                                           "}");
  j = post("/v1/completions", sampled);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (const Json& c : j["choices"]) check(c, c["text"]);
  Json resent = Json::parse(sampled);
  resent["guided_json"] = outline;
  StreamedAlike(resent, j);
  EXPECT_GE(deepest, 2) << "no answer wrote a section inside a section";

  auto stub = server_->stub();
  v1::GenerateRequest req =
      GreedyChat("Outline a short guide to baking bread as nested sections.", 160);
  req.mutable_sampling()->set_guided_json(outline);
  StreamResult answered = Generate(*stub, req);
  ASSERT_TRUE(answered.status.ok()) << answered.status.error_message();
  EXPECT_EQ(answered.text, greedy);

  // Recursion with no end is refused, naming where.
  HttpResult bad = HttpCall(http_port_, "POST", "/v1/completions",
                            R"({"prompt": "x", "guided_json": {"type": "object",
      "properties": {"next": {"$ref": "#"}}, "required": ["next"]}})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_TRUE(Json::parse(bad.body)["error"]["message"].get<std::string>().starts_with(
      "guided_json: #: no JSON text matches the schema: its recursion never ends"))
      << bad.body;
  // A count past the automaton's bounds: guided by the grammar.
  const std::string bio_schema =
      R"({"type": "object", "properties": {"bio": {"type": "string", "maxLength": 800}},
          "required": ["bio"]})";
  auto bio_guide = scheduler::CompileJsonSchema(bio_schema);
  ASSERT_TRUE(bio_guide.ok()) << bio_guide.status();
  auto bio_grammar = std::dynamic_pointer_cast<const scheduler::GrammarGuide>(*bio_guide);
  ASSERT_TRUE(bio_grammar);
  j = post("/v1/completions", absl::StrCat(R"({"prompt": "A person, as JSON:", "max_tokens": 30,
      "temperature": 0, "guided_json": )", bio_schema, "}"));
  const std::string bio = j["choices"][0]["text"];
  if (j["choices"][0]["finish_reason"] == "stop") {
    EXPECT_TRUE(bio_grammar->Accepts(bio)) << bio;
  } else {
    EXPECT_TRUE(bio_grammar->LeadsOn(bio) && bio.find("\"bio\"") != std::string::npos) << bio;
  }
}

// Tools over real HTTP with the real model: a named function's call (streamed alike), calls
// when "required", and the result sent back as a tool message, answered as text.
TEST_F(OpenAiHttpTest, ToolCallsFollowTheirFunctionsParameters) {
  ASSERT_TRUE(server_->started());
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "The weather in a city", "parameters": {"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
      "required": ["city", "unit"]}}}, {"type": "function", "function": {"name": "get_time",
      "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength":
      20}}, "required": ["zone"]}}}])");
  Json ask = {{"messages", {{{"role", "user"}, {"content", "What is the weather in Paris?"}}}},
              {"temperature", 0}, {"max_tokens", 100}, {"tools", tools},
              {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}};
  HttpResult r = Post("/v1/chat/completions", ask);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json named = Json::parse(r.body);
  const Json& message = named["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null()) << r.body;
  ASSERT_EQ(message["tool_calls"].size(), 1u) << r.body;
  const Json& call = message["tool_calls"][0];
  EXPECT_EQ(call["function"]["name"], "get_weather");
  const std::string arguments = call["function"]["arguments"];
  ASSERT_TRUE(Json::accept(arguments)) << arguments;
  const Json args = Json::parse(arguments);
  EXPECT_TRUE(args["city"].is_string()) << arguments;
  EXPECT_TRUE(args["unit"] == "celsius" || args["unit"] == "fahrenheit") << arguments;
  EXPECT_EQ(named["choices"][0]["finish_reason"], "stop");

  // Streamed: the id and name first, then the same arguments in pieces.
  Json streamed = ask;
  streamed["stream"] = true;
  HttpResult s = Post("/v1/chat/completions", streamed);
  ASSERT_EQ(s.status, 200) << s.body;
  std::string pieces, id;
  const std::vector<std::string> lines = absl::StrSplit(s.body, '\n');
  for (const std::string& line : lines) {
    if (line.rfind("data: {", 0) != 0) continue;
    const Json chunk = Json::parse(line.substr(6));
    if (chunk["choices"].empty() || !chunk["choices"][0]["delta"].contains("tool_calls")) {
      continue;
    }
    const Json& d = chunk["choices"][0]["delta"]["tool_calls"][0];
    if (d.contains("id")) {
      EXPECT_TRUE(id.empty()) << "a second id";
      id = d["id"];
      EXPECT_EQ(d["function"]["name"], "get_weather");
    }
    pieces += d["function"]["arguments"].get<std::string>();
  }
  EXPECT_FALSE(id.empty());
  EXPECT_EQ(pieces, arguments);

  // "required": a list of calls, finish "tool_calls".
  Json required = ask;
  required["tool_choice"] = "required";
  r = Post("/v1/chat/completions", required);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json listed = Json::parse(r.body);
  EXPECT_EQ(listed["choices"][0]["finish_reason"], "tool_calls") << r.body;
  ASSERT_GE(listed["choices"][0]["message"]["tool_calls"].size(), 1u) << r.body;
  for (const Json& c : listed["choices"][0]["message"]["tool_calls"]) {
    EXPECT_TRUE(c["function"]["name"] == "get_weather" || c["function"]["name"] == "get_time");
    EXPECT_TRUE(Json::accept(c["function"]["arguments"].get<std::string>())) << r.body;
  }

  // A named function's schema that cannot be guided is named as the client sent it.
  Json unguided = ask;
  unguided["tools"][0]["function"]["parameters"]["properties"]["city"]["format"] = "email";
  r = Post("/v1/chat/completions", unguided);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Json::parse(r.body)["error"]["message"],
            "tools[0].function.parameters: #/properties/city: format beside pattern, "
            "minLength or maxLength is not supported");

  // A function of no arguments is called with {}.
  Json ping = ask;
  ping["tools"] = Json::parse(R"([{"type": "function", "function": {"name": "ping",
      "parameters": {"type": "object", "properties": {}}}}])");
  ping["tool_choice"] = {{"type", "function"}, {"function", {{"name", "ping"}}}};
  r = Post("/v1/chat/completions", ping);
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string ping_args =
      Json::parse(r.body)["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"];
  EXPECT_TRUE(Json::parse(ping_args).empty() && Json::parse(ping_args).is_object()) << ping_args;
  // Forty functions: a list of calls too large for an automaton, guided by the schema's
  // grammar.
  Json many = required;
  many["tools"] = Json::array();
  for (int i = 0; i < 40; ++i) {
    many["tools"].push_back(Json::parse(absl::StrCat(
        R"({"type": "function", "function": {"name": "f)", i, R"(", "parameters": {"type":
        "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"},
        "c": {"type": "boolean"}}, "required": ["a", "b", "c"]}}})")));
  }
  r = Post("/v1/chat/completions", many);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json many_answer = Json::parse(r.body)["choices"][0];
  EXPECT_EQ(many_answer["finish_reason"], "tool_calls") << r.body;
  for (const Json& c : many_answer["message"]["tool_calls"]) {
    const std::string name = c["function"]["name"];
    EXPECT_TRUE(name.size() >= 2 && name[0] == 'f' && std::stoi(name.substr(1)) < 40) << name;
    const Json args = Json::parse(c["function"]["arguments"].get<std::string>());
    EXPECT_TRUE(args.size() == 3 && args["a"].is_string() && args["b"].is_number_integer() &&
                args["c"].is_boolean())
        << args;
  }
  // Too large for the grammar too (each of 240 strings a count of its own): the message says
  // what to change.
  many["tools"] = Json::array();
  for (int i = 0; i < 80; ++i) {
    many["tools"].push_back(Json::parse(absl::StrCat(
        R"({"type": "function", "function": {"name": "f)", i, R"(", "parameters": {"type":
        "object", "properties": {"a": {"type": "string", "maxLength": )", 700 + 3 * i,
        R"(}, "b": {"type": "string", "maxLength": )", 701 + 3 * i,
        R"(}, "c": {"type": "string", "maxLength": )", 702 + 3 * i,
        R"(}}, "required": ["a", "b", "c"]}}})")));
  }
  r = Post("/v1/chat/completions", many);
  EXPECT_EQ(r.status, 400) << r.body;
  const std::string too_many = Json::parse(r.body)["error"]["message"];
  EXPECT_EQ(too_many.rfind("tools: with tool_choice \"required\" the functions' parameters, as "
                           "a list of calls, are too large to guide", 0), 0u)
      << too_many;
  // The largest counts named where the client sent them.
  EXPECT_NE(too_many.find("its counts: tools[79].function.parameters#/properties/c/maxLength, "
                          "tools[79].function.parameters#/properties/b/maxLength"),
            std::string::npos)
      << too_many;

  // The result goes back; the answer is text.
  Json answer = {{"messages", {{{"role", "user"}, {"content", "What is the weather in Paris?"}},
                               message,
                               {{"role", "tool"}, {"tool_call_id", call["id"]},
                                {"content", "18 C and sunny"}}}},
                 {"temperature", 0}, {"max_tokens", 24}};
  r = Post("/v1/chat/completions", answer);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json replied = Json::parse(r.body);
  EXPECT_TRUE(replied["choices"][0]["message"]["content"].is_string()) << r.body;
  EXPECT_FALSE(replied["choices"][0]["message"]["content"].get<std::string>().empty());
  EXPECT_FALSE(replied["choices"][0]["message"].contains("tool_calls"));
}

}  // namespace
}  // namespace thetaserve::testing
