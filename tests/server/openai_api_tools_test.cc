// The OpenAI-compatible API's tool calls: tool_choice (a named function, or "required") guides
// the output to the call's JSON, the tools' errors name them, and earlier calls and results in
// a chat's history reach the template as text; the output answers as the message's tool_calls,
// whole or streamed.
#include "server/openai_api.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/guided_schema.h"
#include "scheduler/request.h"
#include "server/openai_response.h"
#include "tests/server/openai_api_test_util.h"

namespace thetaserve::server {
namespace {

using testing::Chat;
using testing::Completion;
using Json = testing::OrderedJson;
using testing::OpenAiResponseTest;
using testing::RefusedWith;
using testing::kServed;

// Chat's tools: a function named in tool_choice, or "required" (one call or more), guides
// the output to the call's JSON, whose errors name the tool; earlier calls and results in the
// history reach the template as text.
TEST(OpenAiApiTest, ToolChoiceGuidesTheCall) {
  const std::string tools = R"("tools": [
      {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
          "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}},
      {"type": "function", "function": {"name": "get_weather", "description": "The weather",
          "parameters": {"type": "object", "properties": {"unit": {"enum": ["c", "f"]},
          "city": {"type": "string"}}, "required": ["unit", "city"]}}}])";
  auto chat = [&](const std::string& rest) {
    return Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )", tools,
                             rest, "}"));
  };
  auto named =
      chat(R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->tool_calls, OpenAiCall::ToolCalls::kNamed);
  EXPECT_EQ(named->tool_name, "get_weather");
  EXPECT_EQ(named->schema_field, "tools[1].function.parameters");
  // The parameters as sent: "unit" before "city".
  EXPECT_EQ(named->request.sampling().guided_json(),
            R"({"type": "object", "properties": {"unit": {"enum": ["c", "f"]},
          "city": {"type": "string"}}, "required": ["unit", "city"]})");
  auto required = chat(R"(, "tool_choice": "required", "parallel_tool_calls": false)");
  ASSERT_TRUE(required.ok()) << required.status();
  EXPECT_EQ(required->tool_calls, OpenAiCall::ToolCalls::kRequired);
  auto guide = scheduler::CompileJsonSchema(required->request.sampling().guided_json());
  ASSERT_TRUE(guide.ok()) << guide.status();
  EXPECT_TRUE((*guide)->Accepts(R"([{"name": "get_time", "parameters": {"zone": "UTC"}}])"));
  EXPECT_FALSE((*guide)->Accepts(R"([{"name": "get_time", "parameters": {"unit": "c"}}])"));
  EXPECT_FALSE((*guide)->Accepts(R"([{"name": "get_time", "parameters": {"zone": "UTC"}},
      {"name": "get_time", "parameters": {"zone": "UTC"}}])"));  // one: not parallel
  EXPECT_FALSE((*guide)->Accepts("[]"));
  const std::pair<std::string, std::string> refused[] = {
      {R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}})",
       "tool_choice.function.name 'nope' is not in tools"},
      {R"(, "tool_choice": "auto")", "tools is not supported: tool_choice \"auto\""},
      {"", "tools is not supported: tool_choice \"auto\" (the default with tools)"},
      {R"(, "tool_choice": "required", "stream": true)",
       "tool_choice is not supported: \"required\" is not streamed"},
      {R"(, "tool_choice": "required", "guided_regex": "a")",
       "tool_choice and guided_regex are both given; send one"},
      {R"(, "tool_choice": {"type": "function"})", "tool_choice must be \"none\", \"required\""},
  };
  for (const auto& [rest, message] : refused) {
    EXPECT_TRUE(RefusedWith(chat(rest), message)) << rest;
  }
  auto with_tools = [](const std::string& tools_json) {
    return Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], "tools": )",
                             tools_json, R"(, "tool_choice": "required"})"));
  };
  EXPECT_TRUE(RefusedWith(with_tools(R"([{"type": "function", "function": {"name": "a b"}}])"),
                          "tools[0].function.name must be 1 to 64 letters, digits, _ or -"));
  EXPECT_TRUE(RefusedWith(with_tools(R"([{"type": "function", "function": {"name": "a"}},
      {"type": "function", "function": {"name": "a"}}])"), "tools[1].function.name repeats 'a'"));
  EXPECT_TRUE(RefusedWith(with_tools(R"([{"type": "function", "function": {"name": "a",
      "parameters": {"type": "object", "properties": {"n": {"type": "number", "maximum": 1}}}}}])"),
      "tools[0].function.parameters: #/properties/n/maximum: bounds on a number"));
  EXPECT_TRUE(RefusedWith(with_tools("[]"), "tools must be a non-empty list of functions"));
  EXPECT_TRUE(RefusedWith(Completion(R"({"prompt": "x", "tool_choice": "required"})"),
                          "tool_choice is not supported: chat completions only"));
  // A function without parameters takes none: {} only.
  auto bare = with_tools(R"([{"type": "function", "function": {"name": "ping"}}])");
  ASSERT_TRUE(bare.ok()) << bare.status();
  auto bare_guide = scheduler::CompileJsonSchema(bare->request.sampling().guided_json());
  ASSERT_TRUE(bare_guide.ok());
  EXPECT_TRUE((*bare_guide)->Accepts(R"([{"name": "ping", "parameters": {}}])"));

  // History: an assistant's calls (content null) and a tool's result.
  auto history = Chat(R"({"messages": [{"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]})");
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->request.chat().messages_size(), 3);
  EXPECT_EQ(history->request.chat().messages(1).content(),
            R"({"name":"get_weather","arguments":{"city":"Paris"}})");
  EXPECT_EQ(history->request.chat().messages(2).role(), "tool");
  EXPECT_TRUE(RefusedWith(Chat(R"({"messages": [{"role": "user", "content": "x",
      "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]})"),
      "messages[0].tool_calls must be a list, on an assistant message"));
  EXPECT_TRUE(Chat(R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})").ok());

  // A function of no arguments ({"properties": {}}, {} or none) is called with {}.
  for (const char* parameters : {R"(, "parameters": {"type": "object", "properties": {}})",
                                 R"(, "parameters": {})", ""}) {
    auto none = Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "ping")", parameters, R"(}}],
        "tool_choice": {"type": "function", "function": {"name": "ping"}}})"));
    ASSERT_TRUE(none.ok()) << none.status() << parameters;
    auto g = scheduler::CompileJsonSchema(none->request.sampling().guided_json());
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE((*g)->Accepts("{}")) << parameters;
    EXPECT_TRUE((*g)->Accepts("{ }")) << parameters;
    EXPECT_FALSE((*g)->Accepts(R"({"a": 1})")) << parameters;
    EXPECT_FALSE((*g)->Accepts(R"("text")")) << parameters;
  }
  // Only a function that may be called is checked; response_format gives way to a call.
  auto other_unsupported = chat(R"(, "tool_choice": {"type": "function", "function":
      {"name": "get_time"}}, "response_format": {"type": "json_object"})");
  const std::string mail = R"({"type": "function", "function": {"name": "mail", "parameters":
      {"type": "object", "properties": {"to": {"type": "string", "format": "email"}}}}})";
  auto skipped = Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [)", mail, R"(, {"type": "function", "function": {"name": "get_time"}}],
      "tool_choice": {"type": "function", "function": {"name": "get_time"}},
      "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "null"}}}})"));
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(skipped->schema_field, "tools[1].function.parameters");
  EXPECT_FALSE(skipped->request.sampling().json_object());
  EXPECT_TRUE(RefusedWith(Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [)", mail, R"(], "tool_choice": "required"})")),
      "tools[0].function.parameters: #/properties/to/format: \"email\" is not supported"));
  EXPECT_TRUE(RefusedWith(chat(R"(, "tool_choice": 5)"), "tool_choice must be \"none\""));
  EXPECT_TRUE(RefusedWith(chat(R"(, "tool_choice": "bogus")"), "tool_choice must be \"none\""));
  // "required": each function's references find its own definitions in the list's schema
  // (two functions may define one name alike, or two ways).
  const std::string point = R"({"type": "object", "properties": {"x": {"type": "integer"}},
      "required": ["x"]})";
  auto with_defs = [&](const std::string& second_point) {
    return Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], "tools": [
        {"type": "function", "function": {"name": "a", "parameters": {"$defs": {"P": )", point,
        R"(}, "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "required": ["p"]}}},
        {"type": "function", "function": {"name": "b", "parameters": {"$defs": {"P": )",
        second_point, R"(}, "type": "object", "properties": {"q": {"$ref": "#/$defs/P"}},
        "required": ["q"]}}}], "tool_choice": "required"})"));
  };
  auto shared = with_defs(point);
  ASSERT_TRUE(shared.ok()) << shared.status();
  auto shared_guide = scheduler::CompileJsonSchema(shared->request.sampling().guided_json());
  ASSERT_TRUE(shared_guide.ok()) << shared_guide.status();
  EXPECT_TRUE((*shared_guide)->Accepts(R"([{"name": "a", "parameters": {"p": {"x": 1}}},
      {"name": "b", "parameters": {"q": {"x": 2}}}])"));
  auto apart = with_defs(R"({"type": "string"})");
  ASSERT_TRUE(apart.ok()) << apart.status();
  auto apart_guide = scheduler::CompileJsonSchema(apart->request.sampling().guided_json());
  ASSERT_TRUE(apart_guide.ok()) << apart_guide.status();
  EXPECT_TRUE((*apart_guide)->Accepts(R"([{"name": "a", "parameters": {"p": {"x": 1}}},
      {"name": "b", "parameters": {"q": "two"}}])"));
  EXPECT_FALSE((*apart_guide)->Accepts(R"([{"name": "b", "parameters": {"q": {"x": 2}}}])"));
  EXPECT_FALSE((*apart_guide)->Accepts(R"([{"name": "a", "parameters": {"p": "one"}}])"));
  // Alike functions whose definitions refer to "#" (each its own parameters).
  const std::string own = R"({"$defs": {"node": {"anyOf": [{"type": "null"}, {"$ref": "#"}]}},
      "type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}, "required": ["next"]})";
  auto twins = Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], "tools": [
      {"type": "function", "function": {"name": "a", "parameters": )", own, R"(}},
      {"type": "function", "function": {"name": "b", "parameters": )", own, R"(}}],
      "tool_choice": "required"})"));
  ASSERT_TRUE(twins.ok()) << twins.status();
  auto twins_guide = scheduler::CompileJsonSchema(twins->request.sampling().guided_json());
  ASSERT_TRUE(twins_guide.ok()) << twins_guide.status();
  EXPECT_TRUE((*twins_guide)->Accepts(
      R"([{"name": "b", "parameters": {"next": {"next": {"next": null}}}}])"));
  // A recursive definition (a tree of files) is guided in the list's schema too, to any depth.
  auto tree = Chat(R"({"messages": [{"role": "user", "content": "x"}], "tools": [
      {"type": "function", "function": {"name": "make", "parameters": {"$defs": {"Entry":
          {"type": "object", "properties": {"name": {"type": "string"}, "inside": {"type":
          "array", "items": {"$ref": "#/$defs/Entry"}}}, "required": ["name"]}},
          "type": "object", "properties": {"root": {"$ref": "#/$defs/Entry"}},
          "required": ["root"]}}}], "tool_choice": "required"})");
  ASSERT_TRUE(tree.ok()) << tree.status();
  auto tree_guide = scheduler::CompileJsonSchema(tree->request.sampling().guided_json());
  ASSERT_TRUE(tree_guide.ok()) << tree_guide.status();
  EXPECT_TRUE((*tree_guide)->Accepts(R"([{"name": "make", "parameters": {"root": {"name": "/",
      "inside": [{"name": "a", "inside": [{"name": "b", "inside": [{"name": "c"}]}]}]}}}])"));
  EXPECT_FALSE((*tree_guide)->Accepts(R"([{"name": "make", "parameters": {"root": {"name": "/",
      "inside": [{"name": "a", "inside": [{"inside": []}]}]}}}])"));
  // A function's parameters that refer to themselves ("#": a linked list) are found where
  // they are in the list's schema, not at its top.
  auto list = Chat(R"({"messages": [{"role": "user", "content": "x"}], "tools": [
      {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}},
      {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
          "properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#"},
          {"type": "null"}]}, "const": {"$ref": "#/properties/v"}},
          "required": ["v", "next"]}}}], "tool_choice": "required"})");
  ASSERT_TRUE(list.ok()) << list.status();
  auto list_guide = scheduler::CompileJsonSchema(list->request.sampling().guided_json());
  ASSERT_TRUE(list_guide.ok()) << list_guide.status();
  EXPECT_TRUE((*list_guide)->Accepts(
      R"([{"name": "f", "parameters": {"v": 1, "next": {"v": 2, "next": null, "const": 3}}}])"));
  EXPECT_FALSE((*list_guide)->Accepts(R"([{"name": "f", "parameters": {"v": 1, "next":
      [{"name": "f", "parameters": {"v": 2, "next": null}}]}}])"));
  EXPECT_FALSE((*list_guide)->Accepts(
      R"([{"name": "f", "parameters": {"v": 1, "next": null, "const": "x"}}])"));
  // Recursion with no end is refused naming the function.
  EXPECT_TRUE(RefusedWith(
      Chat(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
          "function": {"name": "f", "parameters": {"type": "object", "properties": {"p":
          {"$ref": "#/$defs/L"}}, "required": ["p"], "$defs": {"L": {"type": "array",
          "minItems": 1, "items": {"$ref": "#/$defs/L"}}}}}}], "tool_choice": "required"})"),
      "tools[0].function.parameters: #: no JSON text matches the schema: its recursion never "
      "ends (#/$defs/L always holds itself again"));
  ASSERT_TRUE(other_unsupported.ok()) << other_unsupported.status();
  EXPECT_EQ(other_unsupported->tool_calls, OpenAiCall::ToolCalls::kNamed);
}

// A named call answers with the message's tool_calls (content null, finish "stop"), streamed
// as the call's id and name, then its arguments; "required" reads the list of calls back.
TEST_F(OpenAiResponseTest, ToolCallsAnswerAsTheMessagesToolCalls) {
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}])";
  auto call = Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )", tools,
      R"(, "tool_choice": {"type": "function", "function": {"name": "f"}}})"));
  ASSERT_TRUE(call.ok()) << call.status();
  scheduler::TokenDelta part1, part2;
  part1.token_ids = {1};
  part1.text = std::string("{\"a\": ");
  part2.token_ids = {2};
  part2.text = std::string("1}");
  OpenAiResponseBuilder whole(*call, "chatcmpl-1", 1700000000, kServed, model_->tokenizer());
  whole.Add(0, part1);
  whole.Add(0, part2);
  const Json done = whole.Complete({Finished(scheduler::FinishReason::kStop)});
  const Json& message = done["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());
  ASSERT_EQ(message["tool_calls"].size(), 1u);
  const Json& tc = message["tool_calls"][0];
  EXPECT_EQ(tc["type"], "function");
  EXPECT_EQ(tc["function"]["name"], "f");
  EXPECT_EQ(tc["function"]["arguments"], "{\"a\": 1}");
  EXPECT_EQ(tc["id"].get<std::string>().substr(0, 5), "call_");
  EXPECT_EQ(tc["id"].get<std::string>().size(), 29u);
  EXPECT_EQ(done["choices"][0]["finish_reason"], "stop");

  OpenAiResponseBuilder streamed(*call, "chatcmpl-2", 1700000000, kServed, model_->tokenizer());
  const Json first = streamed.DeltaChunk(0, part1);
  const Json& d1 = first["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(d1["index"], 0);
  EXPECT_EQ(d1["function"]["name"], "f");
  EXPECT_EQ(d1["function"]["arguments"], "{\"a\": ");
  EXPECT_TRUE(d1.contains("id"));
  const Json second = streamed.DeltaChunk(0, part2);
  const Json& d2 = second["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_FALSE(d2.contains("id"));
  EXPECT_EQ(d2["function"]["arguments"], "1}");
  EXPECT_TRUE(OpenAiResponseBuilder::Carries(second));
  scheduler::TokenDelta nothing;
  EXPECT_FALSE(OpenAiResponseBuilder::Carries(streamed.DeltaChunk(0, nothing)));

  auto required = Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )",
                                    tools, R"(, "tool_choice": "required"})"));
  ASSERT_TRUE(required.ok()) << required.status();
  scheduler::TokenDelta calls;
  calls.token_ids = {1};
  calls.text =
      std::string(R"([{"name": "f", "parameters": {"a": 2}}, {"name": "f", "parameters": {}}])");
  OpenAiResponseBuilder listed(*required, "chatcmpl-3", 1700000000, kServed, model_->tokenizer());
  listed.Add(0, calls);
  const Json two = listed.Complete({Finished(scheduler::FinishReason::kStop)});
  ASSERT_EQ(two["choices"][0]["message"]["tool_calls"].size(), 2u);
  EXPECT_EQ(two["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"a\":2}");
  EXPECT_EQ(two["choices"][0]["finish_reason"], "tool_calls");
  // Cut short, the calls stay text.
  OpenAiResponseBuilder cut(*required, "chatcmpl-4", 1700000000, kServed, model_->tokenizer());
  cut.Add(0, part1);
  const Json text = cut.Complete({Finished(scheduler::FinishReason::kLength)});
  EXPECT_EQ(text["choices"][0]["message"]["content"], "{\"a\": ");
  EXPECT_FALSE(text["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(text["choices"][0]["finish_reason"], "length");
}

}  // namespace
}  // namespace thetaserve::server
