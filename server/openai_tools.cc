// Chat's tools and tool_choice: the called function's parameters, or a list of calls, as the
// output's guide (see openai_tools.h).
#include "server/openai_tools.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "scheduler/guided_schema.h"

namespace thetaserve::server {

using openai_body::Bool;
using openai_body::Given;
using openai_body::In;
using openai_body::Invalid;
using openai_body::RawValue;
using openai_body::String;

namespace {

// A function's parameters schema, checked alone so that an error names the function's own
// (with tool_choice "required" they are guided inside a list's schema, compiled once).
absl::Status CheckParameters(const std::string& at, const std::string& schema) {
  if (auto status = scheduler::CheckJsonSchema(schema); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        at, ".function.parameters: ", absl::StripPrefix(status.message(), "guided_json: ")));
  }
  return absl::OkStatus();
}

// A function's references into its own parameters ("#", "#/properties/...", "#/$defs/...")
// made references to where the parameters are in the list's schema (`at`), definitions
// included: each function keeps its own. Values (const, enum, default, examples) are data,
// not schemas, and are left as they are.
void RebaseRefs(const std::string& at, nlohmann::ordered_json* schema) {
  if (schema->is_array()) {
    for (auto& item : *schema) RebaseRefs(at, &item);
    return;
  }
  if (!schema->is_object()) return;
  for (auto& [key, value] : schema->items()) {
    if (key == "const" || key == "enum" || key == "default" || key == "examples") continue;
    if (key == "$ref" && value.is_string()) {
      const std::string ref = value.get<std::string>();
      if (ref == "#" || ref.starts_with("#/")) value = absl::StrCat(at, ref.substr(1));
      continue;
    }
    if ((key == "properties" || key == "$defs" || key == "definitions") && value.is_object()) {
      // Names, each a schema (a property may be called "const").
      for (auto& [name, sub] : value.items()) RebaseRefs(at, &sub);
      continue;
    }
    RebaseRefs(at, &value);
  }
}

}  // namespace

absl::Status ParseToolCalls(const In& body, std::string_view body_text, OpenAiCall* call,
                            const std::string& other_guide) {
  if (!Given(body, "tool_choice") || body["tool_choice"] == "none") return absl::OkStatus();
  const In& choice = body["tool_choice"];
  auto* sp = call->request.mutable_sampling();
  if (absl::StartsWith(other_guide, "response_format")) {
    sp->set_json_object(false);
    sp->clear_guided_json();
    call->schema_field.clear();
  } else if (!other_guide.empty()) {
    return Invalid("tool_choice", absl::StrCat("and ", other_guide, " are both given; send one"));
  }
  if (!Given(body, "tools") || !body["tools"].is_array() || body["tools"].empty()) {
    return Invalid("tools", "must be a non-empty list of functions when tool_choice calls one");
  }
  if (choice.is_object() &&
      (!choice.contains("type") || choice["type"] != "function" || !Given(choice, "function") ||
       !choice["function"].is_object() || !Given(choice["function"], "name") ||
       !choice["function"]["name"].is_string())) {
    return Invalid("tool_choice", "must be \"none\", \"required\" or {\"type\": \"function\", "
                                  "\"function\": {\"name\": ...}}");
  }
  const std::string wanted = choice.is_object() ? choice["function"]["name"] : "";
  // Each function's name and parameters (JSON schema text in the order sent; none, or {}: no
  // parameters, the object {}).
  const In& tools = body["tools"];
  std::vector<std::string> names, parameters;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = absl::StrCat("tools[", i, "]");
    const In& t = tools[i];
    if (!t.is_object() || !t.contains("type") || t["type"] != "function" ||
        !Given(t, "function") || !t["function"].is_object()) {
      return Invalid(at, "must be {\"type\": \"function\", \"function\": {...}}");
    }
    const In& f = t["function"];
    auto name = Given(f, "name") ? String(f["name"], at + ".function.name")
                                 : absl::StatusOr<std::string>(Invalid(at + ".function.name",
                                                                       "is required"));
    if (!name.ok()) return name.status();
    if (name->empty() || name->size() > 64 ||
        name->find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                "0123456789_-") != std::string::npos) {
      return Invalid(at + ".function.name", "must be 1 to 64 letters, digits, _ or -");
    }
    if (std::find(names.begin(), names.end(), *name) != names.end()) {
      return Invalid(at + ".function.name", absl::StrCat("repeats '", *name, "'"));
    }
    std::string schema =
        R"({"type": "object", "properties": {}, "additionalProperties": false})";
    if (Given(f, "parameters")) {
      if (!f["parameters"].is_object()) {
        return Invalid(at + ".function.parameters", "must be a JSON schema (an object)");
      }
      if (!f["parameters"].empty()) {
        schema = std::string(
            RawValue(body_text, {"tools", std::to_string(i), "function", "parameters"}));
      }
    }
    // A named function's schema is checked where the request is (its errors then name
    // call->schema_field); any other is not, as it is not called: a client sends its whole
    // tool list.
    if (wanted.empty()) {
      if (auto status = CheckParameters(at, schema); !status.ok()) return status;
    }
    names.push_back(*name);
    parameters.push_back(std::move(schema));
  }
  if (!wanted.empty()) {
    auto it = std::find(names.begin(), names.end(), wanted);
    if (it == names.end()) {
      return Invalid("tool_choice.function.name", absl::StrCat("'", wanted, "' is not in tools"));
    }
    const size_t i = size_t(it - names.begin());
    sp->set_guided_json(parameters[i]);
    call->schema_field = absl::StrCat("tools[", i, "].function.parameters");
    call->tool_calls = OpenAiCall::ToolCalls::kNamed;
    call->tool_name = wanted;
    return absl::OkStatus();
  }
  // "required": one call or more (one with parallel_tool_calls false), each a function's name
  // and its parameters, whose references ("#/$defs/...") are rebased to where the parameters
  // are in the list's schema.
  auto parallel = Given(body, "parallel_tool_calls") ? Bool(body, "parallel_tool_calls")
                                                     : absl::StatusOr<bool>(true);
  if (!parallel.ok()) return parallel.status();
  using Ordered = nlohmann::ordered_json;
  std::vector<std::string> alternatives;
  for (size_t i = 0; i < names.size(); ++i) {
    Ordered schema = Ordered::parse(parameters[i], nullptr, /*allow_exceptions=*/false);
    RebaseRefs(absl::StrCat("#/items/anyOf/", i, "/properties/parameters"), &schema);
    alternatives.push_back(absl::StrCat(
        R"({"type": "object", "properties": {"name": {"const": )", In(names[i]).dump(),
        R"(}, "parameters": )", schema.dump(), R"(}, "required": ["name", "parameters"]})"));
  }
  std::string list = absl::StrCat(R"({"type": "array", "minItems": 1, )",
                                  *parallel ? "" : R"("maxItems": 1, )",
                                  R"("items": {"anyOf": [)", absl::StrJoin(alternatives, ", "),
                                  "]}}");
  sp->set_guided_json(std::move(list));
  call->schema_field = "tools";
  call->tool_calls = OpenAiCall::ToolCalls::kRequired;
  return absl::OkStatus();
}


}  // namespace thetaserve::server
