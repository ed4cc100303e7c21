#include "server/openai_params.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/openai_tools.h"
#include "server/validation.h"

namespace thetaserve::server {

using openai_body::Bool;
using openai_body::Given;
using openai_body::In;
using openai_body::Integer;
using openai_body::Invalid;
using openai_body::Number;
using openai_body::RawValue;
using openai_body::String;
using openai_body::TokenIdArray;
using openai_body::Unsupported;

absl::Status ParseStop(const In& body, v1::GenerateRequest* out) {
  if (!Given(body, "stop")) return absl::OkStatus();
  const In& s = body["stop"];
  auto* st = out->mutable_stopping();
  if (s.is_string()) {
    st->add_stop(s.get<std::string>());
    return absl::OkStatus();
  }
  if (!s.is_array()) return Invalid("stop", "must be a string or a list of strings");
  for (size_t i = 0; i < s.size(); ++i) {
    if (!s[i].is_string()) return Invalid(absl::StrCat("stop[", i, "]"), "must be a string");
    st->add_stop(s[i].get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status ParseSampling(const In& body, std::string_view body_text, OpenAiCall* call) {
  auto* sp = call->request.mutable_sampling();
  auto* st = call->request.mutable_stopping();
  absl::Status status;
  auto number = [&](const char* key, auto set) {
    if (!status.ok() || !Given(body, key)) return;
    auto v = Number(body, key);
    if (!v.ok()) {
      status = v.status();
      return;
    }
    set(static_cast<float>(*v));
  };
  number("temperature", [&](float v) { sp->set_temperature(v); });
  number("top_p", [&](float v) { sp->set_top_p(v); });
  number("min_p", [&](float v) { sp->set_min_p(v); });
  number("repetition_penalty", [&](float v) { sp->set_repetition_penalty(v); });
  number("presence_penalty", [&](float v) { sp->set_presence_penalty(v); });
  number("frequency_penalty", [&](float v) { sp->set_frequency_penalty(v); });
  if (!status.ok()) return status;
  if (Given(body, "top_k")) {
    auto v = Integer(body, "top_k");
    if (!v.ok()) return v.status();
    // vLLM's "off" is -1; ours is 0.
    if (*v < -1 || *v > std::numeric_limits<int32_t>::max()) {
      return Invalid("top_k", absl::StrCat("= ", *v, "; it must be >= 0 (0 or -1 = off)"));
    }
    sp->set_top_k(*v == -1 ? 0 : static_cast<int32_t>(*v));
  }
  if (Given(body, "seed")) {
    // Any 64-bit integer, as vLLM takes it: -1 is no seed (vLLM's and llama.cpp's "random"),
    // another negative seed its two's-complement bits.
    const In& v = body["seed"];
    if (v.is_number_unsigned()) {
      sp->set_seed(v.get<uint64_t>());
    } else if (v.is_number_integer()) {
      if (v.get<int64_t>() != -1) sp->set_seed(static_cast<uint64_t>(v.get<int64_t>()));
    } else {
      // A whole float (7.0, 1e16) in range is that integer.
      const double d = v.is_number_float() ? v.get<double>() : 0.5;
      if (std::floor(d) != d || d < -0x1p63 || d >= 0x1p64) {
        return Invalid("seed", "must be an integer in [-2^63, 2^64)");
      }
      if (d != -1) sp->set_seed(d < 0 ? static_cast<uint64_t>(static_cast<int64_t>(d))
                                      : static_cast<uint64_t>(d));
    }
  }
  // n completions of the prompt. best_of (sample more, return the n most likely) only as n.
  int64_t n = 1;
  if (Given(body, "n")) {
    auto v = Integer(body, "n");
    if (!v.ok()) return v.status();
    if (*v < 1 || *v > kMaxChoices) {
      return Invalid("n", absl::StrCat("= ", *v, "; it must be in [1, ", kMaxChoices, "]"));
    }
    n = *v;
    call->request.set_n(static_cast<uint32_t>(n));
  }
  if (Given(body, "best_of")) {
    auto v = Integer(body, "best_of");
    if (!v.ok()) return v.status();
    if (*v != n) {
      return Unsupported("best_of", absl::StrCat("= ", *v, " with n = ", n, "; only best_of = n "
                                                 "(every completion sampled is returned)"));
    }
  }
  // echo (completions): the prompt, and with logprobs its tokens' scores, come back first.
  if (Given(body, "echo")) {
    auto v = Bool(body, "echo");
    if (!v.ok()) return v.status();
    call->echo = *v;
  }
  // max_tokens, or the chat API's newer max_completion_tokens; 0 with echo (score the prompt).
  for (const char* key : {"max_completion_tokens", "max_tokens"}) {
    if (!Given(body, key)) continue;
    auto v = Integer(body, key);
    if (!v.ok()) return v.status();
    if (*v < (call->echo ? 0 : 1) || *v > std::numeric_limits<int32_t>::max()) {
      return Invalid(key, absl::StrCat("= ", *v, "; it must be >= ", call->echo ? "0" : "1",
                                       call->echo ? "" : " (0 only with echo)"));
    }
    st->set_max_tokens(static_cast<uint32_t>(*v));
    call->max_tokens_given = true;
    break;
  }
  if (absl::Status s = ParseStop(body, &call->request); !s.ok()) return s;
  if (Given(body, "stop_token_ids")) {
    if (!body["stop_token_ids"].is_array()) return Invalid("stop_token_ids", "must be a list");
    auto ids = TokenIdArray(body["stop_token_ids"], "stop_token_ids");
    if (!ids.ok()) return ids.status();
    for (uint32_t id : *ids) st->add_stop_token_ids(id);
  }
  if (Given(body, "min_tokens")) {
    auto v = Integer(body, "min_tokens");
    if (!v.ok()) return v.status();
    if (*v < 0 || *v > std::numeric_limits<int32_t>::max()) {
      return Invalid("min_tokens", absl::StrCat("= ", *v, "; it must be >= 0"));
    }
    st->set_min_tokens(static_cast<uint32_t>(*v));
  }
  if (Given(body, "ignore_eos")) {
    auto v = Bool(body, "ignore_eos");
    if (!v.ok()) return v.status();
    st->set_ignore_eos(*v);
  }
  if (Given(body, "include_stop_str_in_output")) {
    auto v = Bool(body, "include_stop_str_in_output");
    if (!v.ok()) return v.status();
    st->set_include_stop_str_in_output(*v);
  }
  if (Given(body, "logit_bias")) {
    // {"token id": bias}: keys are token ids written as strings (JSON keys are strings).
    const In& bias = body["logit_bias"];
    if (!bias.is_object()) return Invalid("logit_bias", "must be an object of token ids to biases");
    for (auto it = bias.begin(); it != bias.end(); ++it) {
      uint32_t id = 0;
      if (!absl::SimpleAtoi(it.key(), &id)) {
        return Invalid("logit_bias", absl::StrCat("has the key '", it.key(),
                                                  "'; keys are token ids such as \"50256\""));
      }
      if (!it.value().is_number()) {
        return Invalid(absl::StrCat("logit_bias[", it.key(), "]"), "must be a number");
      }
      (*sp->mutable_logit_bias())[id] = static_cast<float>(it.value().get<double>());
    }
  }
  // vLLM's structured outputs, by either of their names (guided_choice or
  // structured_outputs.choice; guided_regex or structured_outputs.regex): the value given and
  // the name it came by, or null.
  std::string field;
  auto structured = [&](const std::string& old_key, const std::string& new_key,
                        bool* by_new_name) -> absl::StatusOr<const In*> {
    const bool old_name = Given(body, old_key.c_str());
    const bool new_name = Given(body, "structured_outputs") &&
                          Given(body["structured_outputs"], new_key.c_str());
    if (old_name && new_name) {
      return Invalid(old_key, absl::StrCat("and structured_outputs.", new_key,
                                           " are both given; send one"));
    }
    *by_new_name = new_name;
    field = old_name ? old_key : absl::StrCat("structured_outputs.", new_key);
    return old_name ? &body[old_key] : new_name ? &body["structured_outputs"][new_key] : nullptr;
  };
  auto choices = structured("guided_choice", "choice", &call->structured_choice);
  if (!choices.ok()) return choices.status();
  if (*choices) {
    const In& list = **choices;
    if (!list.is_array() || list.empty()) {
      return Invalid(field, "must be a non-empty list of strings");
    }
    for (size_t i = 0; i < list.size(); ++i) {
      auto choice = String(list[i], absl::StrCat(field, "[", i, "]"));
      if (!choice.ok()) return choice.status();
      sp->add_guided_choice(*choice);
    }
  }
  auto regex = structured("guided_regex", "regex", &call->structured_regex);
  if (!regex.ok()) return regex.status();
  if (*regex) {
    auto pattern = String(**regex, field);
    if (!pattern.ok()) return pattern.status();
    if (pattern->empty()) return Invalid(field, "is empty");
    sp->set_guided_regex(*pattern);
  }
  // One JSON object: response_format {"type": "json_object"} or structured_outputs.json_object.
  std::string json_field;
  if (Given(body, "response_format") && body["response_format"].is_object() &&
      body["response_format"].contains("type") &&
      body["response_format"]["type"] == "json_object") {
    json_field = "response_format";
  }
  if (Given(body, "structured_outputs") && Given(body["structured_outputs"], "json_object")) {
    const In& v = body["structured_outputs"]["json_object"];
    if (!v.is_boolean()) return Invalid("structured_outputs.json_object", "must be true or false");
    if (v == true) {
      if (!json_field.empty()) {
        return Invalid("response_format",
                       "and structured_outputs.json_object are both given; send one");
      }
      json_field = "structured_outputs.json_object";
    }
  }
  // The guide given before: a later one is refused beside it.
  auto earlier = [&]() -> std::string {
    if (sp->guided_choice_size() > 0) {
      return call->structured_choice ? "structured_outputs.choice" : "guided_choice";
    }
    if (!sp->guided_regex().empty()) {
      return call->structured_regex ? "structured_outputs.regex" : "guided_regex";
    }
    return sp->json_object() ? json_field : "";
  };
  if (!json_field.empty()) {
    if (const std::string other = earlier(); !other.empty()) {
      return Invalid(json_field, absl::StrCat("and ", other, " are both given; send one"));
    }
    sp->set_json_object(true);
  }
  // A JSON schema: guided_json or structured_outputs.json (an object, or a string holding
  // one), or response_format {"type": "json_schema", "json_schema": {"schema": ...}}. It is
  // read from the body's text, keeping its properties' order (the order they are written in).
  bool by_new_name = false;
  auto schema = structured("guided_json", "json", &by_new_name);
  if (!schema.ok()) return schema.status();
  std::string schema_field;
  std::string_view schema_text;
  std::string schema_string;
  if (*schema && !(by_new_name && **schema == false)) {  // structured_outputs.json false: none
    schema_field = field;
    if ((*schema)->is_string()) {
      schema_string = (*schema)->get<std::string>();
      schema_text = schema_string;
    } else if ((*schema)->is_object()) {
      schema_text = by_new_name ? RawValue(body_text, {"structured_outputs", "json"})
                                : RawValue(body_text, {"guided_json"});
    } else {
      return Invalid(field, "must be a JSON schema (an object, or a string holding one)");
    }
  }
  if (Given(body, "response_format") && body["response_format"].is_object() &&
      body["response_format"].contains("type") &&
      body["response_format"]["type"] == "json_schema") {
    if (!schema_field.empty()) {
      return Invalid("response_format", absl::StrCat("and ", schema_field,
                                                      " are both given; send one"));
    }
    const In& format = body["response_format"];
    if (!format.contains("json_schema") || !format["json_schema"].is_object()) {
      return Invalid("response_format.json_schema", "must be an object with the schema");
    }
    const In& spec = format["json_schema"];
    schema_field = "response_format.json_schema.schema";
    if (!Given(spec, "schema") || !spec["schema"].is_object()) {
      return Invalid(schema_field, "must be given, a JSON schema (an object)");
    }
    if (Given(spec, "strict") && !spec["strict"].is_boolean()) {
      return Invalid("response_format.json_schema.strict", "must be true or false");
    }
    schema_text = RawValue(body_text, {"response_format", "json_schema", "schema"});
  }
  if (!schema_field.empty()) {
    if (const std::string other = earlier(); !other.empty()) {
      return Invalid(schema_field, absl::StrCat("and ", other, " are both given; send one"));
    }
    if (schema_text.empty()) return Invalid(schema_field, "is empty");
    sp->set_guided_json(std::string(schema_text));
    call->schema_field = schema_field;
  }
  // A GBNF grammar: guided_grammar or structured_outputs.grammar (false: none), or llama.cpp
  // server's `grammar` (which its OpenAI-compatible routes take: dropped, a llama.cpp client's
  // answer would be unconstrained).
  bool grammar_by_new_name = false;
  auto grammar = structured("guided_grammar", "grammar", &grammar_by_new_name);
  if (!grammar.ok()) return grammar.status();
  if (Given(body, "grammar") && body["grammar"] != "") {  // llama.cpp's default: none
    if (*grammar && !(grammar_by_new_name && **grammar == false)) {
      return Invalid("grammar", absl::StrCat("and ", field, " are both given; send one"));
    }
    grammar = &body["grammar"];
    field = "grammar";
    grammar_by_new_name = false;
    // llama.cpp's lazy grammar applies from a trigger on; this one from the first token.
    if (Given(body, "grammar_lazy") && body["grammar_lazy"] != false) {
      return Unsupported("grammar_lazy", "the grammar applies from the first token (no "
                                         "triggers)");
    }
  }
  std::string grammar_field;
  if (*grammar && !(grammar_by_new_name && **grammar == false)) {
    grammar_field = field;
    auto text = String(**grammar, field);
    if (!text.ok()) return text.status();
    if (text->empty()) return Invalid(field, "is empty");
    if (const std::string other = !schema_field.empty() ? schema_field : earlier();
        !other.empty()) {
      return Invalid(field, absl::StrCat("and ", other, " are both given; send one"));
    }
    sp->set_guided_grammar(*text);
    call->grammar_field = field;
  }
  if (auto status = ParseToolCalls(body, body_text, call,
                                   !grammar_field.empty() ? grammar_field
                                   : !schema_field.empty() ? schema_field
                                                           : earlier());
      !status.ok()) {
    return status;
  }
  // vLLM's extensions that narrow what is sampled.
  if (Given(body, "allowed_token_ids")) {
    if (!body["allowed_token_ids"].is_array()) {
      return Invalid("allowed_token_ids", "must be a list of token ids");
    }
    auto ids = TokenIdArray(body["allowed_token_ids"], "allowed_token_ids");
    if (!ids.ok()) return ids.status();
    for (uint32_t id : *ids) sp->add_allowed_token_ids(id);
  }
  if (Given(body, "bad_words")) {
    const In& words = body["bad_words"];
    if (!words.is_array()) return Invalid("bad_words", "must be a list of strings");
    for (size_t i = 0; i < words.size(); ++i) {
      auto word = String(words[i], absl::StrCat("bad_words[", i, "]"));
      if (!word.ok()) return word.status();
      sp->add_bad_words(*word);
    }
  }
  if (Given(body, "truncate_prompt_tokens")) {
    auto v = Integer(body, "truncate_prompt_tokens");
    if (!v.ok()) return v.status();
    if ((*v < 1 && *v != -1) || *v > std::numeric_limits<int32_t>::max()) {
      return Invalid("truncate_prompt_tokens",
                     absl::StrCat("= ", *v, "; it must be >= 1 (the prompt's last k tokens are "
                                  "kept) or -1 (the model's context)"));
    }
    call->request.set_truncate_prompt_tokens(static_cast<int32_t>(*v));
  }
  if (Given(body, "cache_salt")) {
    auto v = String(body["cache_salt"], "cache_salt");
    if (!v.ok()) return v.status();
    call->request.set_cache_salt(*v);
  }
  if (Given(body, "priority")) {  // vLLM's: lower first, under --scheduling-policy priority
    auto v = Integer(body, "priority");
    if (!v.ok()) return v.status();
    call->request.set_priority(*v);
  }
  return absl::OkStatus();
}

absl::Status ParseLogprobs(const In& body, OpenAiCall* call) {
  if (call->endpoint == OpenAiEndpoint::kCompletions) {
    // logprobs: n = the sampled token's log-probability and the n most likely (0..5 at OpenAI;
    // up to 20 here).
    if (!Given(body, "logprobs")) return absl::OkStatus();
    auto v = Integer(body, "logprobs");
    if (!v.ok()) return v.status();
    if (*v < 0 || *v > kMaxLogprobs) {
      return Invalid("logprobs", absl::StrCat("= ", *v, "; it must be in [0, ", kMaxLogprobs, "]"));
    }
    call->logprobs = true;
    call->top_logprobs = static_cast<int>(*v);
  } else {
    if (Given(body, "logprobs")) {
      auto v = Bool(body, "logprobs");
      if (!v.ok()) return v.status();
      call->logprobs = *v;
    }
    if (Given(body, "top_logprobs")) {
      auto v = Integer(body, "top_logprobs");
      if (!v.ok()) return v.status();
      if (*v < 0 || *v > kMaxLogprobs) {
        return Invalid("top_logprobs",
                       absl::StrCat("= ", *v, "; it must be in [0, ", kMaxLogprobs, "]"));
      }
      if (*v > 0 && !call->logprobs) return Invalid("top_logprobs", "needs logprobs: true");
      call->top_logprobs = static_cast<int>(*v);
    }
  }
  // The engine reports the sampled token's log-probability with its top n; n >= 1.
  if (call->logprobs) {
    call->request.mutable_sampling()->set_logprobs(std::max(1, call->top_logprobs));
  }
  return absl::OkStatus();
}

absl::Status RefuseUnsupported(const In& body, OpenAiEndpoint endpoint) {
  if (Given(body, "echo") && body["echo"] != false &&
      endpoint == OpenAiEndpoint::kChatCompletions) {
    return Unsupported("echo", "not on chat completions");
  }
  if (Given(body, "suffix") && body["suffix"] != "") {
    return Unsupported("suffix", "no fill-in-the-middle");
  }
  // Tools are called when tool_choice names one or is "required" (chat: the output is guided
  // to the call's JSON); "none" calls none. "auto", the default with tools, would need the
  // model's own tool-call format read back out of free text, which this server does not do.
  const bool no_tools = Given(body, "tool_choice") && body["tool_choice"] == "none";
  const bool forced = Given(body, "tool_choice") &&
                      (body["tool_choice"] == "required" || body["tool_choice"].is_object());
  if (Given(body, "tool_choice") && !no_tools && !forced && body["tool_choice"] != "auto") {
    return Invalid("tool_choice", "must be \"none\", \"auto\", \"required\" or {\"type\": "
                                  "\"function\", \"function\": {\"name\": ...}}");
  }
  constexpr const char* kAuto = "tool_choice \"auto\" (the default with tools) is not supported: "
                                "name a function in tool_choice, or send \"required\" or \"none\"";
  if (forced && endpoint != OpenAiEndpoint::kChatCompletions) {
    return Unsupported("tool_choice", "chat completions only");
  }
  if (Given(body, "tools") && !(body["tools"].is_array() && body["tools"].empty()) && !no_tools &&
      !forced) {
    return Unsupported("tools", kAuto);
  }
  if (Given(body, "tool_choice") && !no_tools && !forced) {
    return Unsupported("tool_choice", kAuto);
  }
  if (Given(body, "function_call") && body["function_call"] != "none") {
    return Unsupported("function_call", "this server does not call functions");
  }
  if (Given(body, "functions") && !(body["functions"].is_array() && body["functions"].empty()) &&
      !(Given(body, "function_call") && body["function_call"] == "none")) {
    return Unsupported("functions", "this server does not call functions");
  }
  if (Given(body, "response_format") &&
      !(body["response_format"].is_object() && body["response_format"].contains("type") &&
        (body["response_format"]["type"] == "text" ||
         body["response_format"]["type"] == "json_object" ||
         body["response_format"]["type"] == "json_schema"))) {
    return Unsupported("response_format", "only {\"type\": \"text\"}, \"json_object\" and "
                                          "\"json_schema\"");
  }
  // vLLM's extensions that would change what is generated, were they dropped: a client that
  // trusts a constraint must not get unconstrained text with a 200.
  // JSON's whitespace is JSON's own (a bounded run of space, tab, CR and LF), never a pattern
  // of the client's.
  constexpr const char* kWhitespace =
      "JSON's own whitespace only (space, tab, CR and LF, in bounded runs: docs/api.md)";
  if (Given(body, "guided_whitespace_pattern")) {
    return Unsupported("guided_whitespace_pattern", kWhitespace);
  }
  if (Given(body, "structured_outputs")) {
    const In& so = body["structured_outputs"];
    if (!so.is_object()) return Invalid("structured_outputs", "must be an object");
    if (Given(so, "structural_tag") && so["structural_tag"] != false) {
      return Unsupported("structured_outputs.structural_tag",
                         "no structural tags; choice, regex, json, json_object and grammar are "
                         "taken");
    }
    if (Given(so, "whitespace_pattern")) {
      return Unsupported("structured_outputs.whitespace_pattern", kWhitespace);
    }
    if (Given(so, "disable_any_whitespace") && so["disable_any_whitespace"] != false) {
      return Unsupported("structured_outputs.disable_any_whitespace", kWhitespace);
    }
  }
  if (Given(body, "use_beam_search") && body["use_beam_search"] != false) {
    return Unsupported("use_beam_search", "sampling only");
  }
  if (endpoint == OpenAiEndpoint::kChatCompletions) {
    if (Given(body, "chat_template")) {
      return Unsupported("chat_template", "the model's own template only");
    }
    if (Given(body, "chat_template_kwargs") &&
        !(body["chat_template_kwargs"].is_object() && body["chat_template_kwargs"].empty())) {
      return Unsupported("chat_template_kwargs", "the model's own template only");
    }
  }
  return absl::OkStatus();
}

}  // namespace thetaserve::server
