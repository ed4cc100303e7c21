#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "server/openai_response.h"
#include "server/validation.h"

namespace thetaserve::server {
namespace {

// Requests parse into nlohmann::json (a sorted map: ordered_json inserts a key by scanning the
// others, so a body with many keys would cost quadratic time); responses keep the field order
// OpenAI documents.
using In = nlohmann::json;
using Json = nlohmann::ordered_json;

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
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
      std::fabs(v.get<double>()) < 9e15) {
    return static_cast<int64_t>(v.get<double>());
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

// One prompt: text, or a list of token ids.
absl::StatusOr<OpenAiPrompt> OnePrompt(const In& p, const std::string& field) {
  OpenAiPrompt prompt;
  if (p.is_string()) {
    prompt.text = p.get<std::string>();
    return prompt;
  }
  if (!p.is_array()) return Invalid(field, "must be a string or a list of token ids");
  auto ids = TokenIdArray(p, field);
  if (!ids.ok()) return ids.status();
  prompt.token_ids = std::move(*ids);
  prompt.tokens = true;
  return prompt;
}

// A string, a list of token ids, or a list of several of either (each gets n choices).
absl::Status ParsePrompt(const In& body, OpenAiCall* call) {
  if (!Given(body, "prompt")) return Invalid("prompt", "is required");
  const In& p = body["prompt"];
  if (p.is_array() && p.empty()) return Invalid("prompt", "is empty");
  if (!p.is_string() && !p.is_array()) {
    return Invalid("prompt", "must be a string, a list of token ids, or a list of several of "
                             "either");
  }
  if (p.is_string() || !(p[0].is_string() || p[0].is_array())) {
    auto one = OnePrompt(p, "prompt");
    if (!one.ok()) return one.status();
    call->prompts.push_back(std::move(*one));
  } else {
    if (p.size() > size_t(kMaxCompletionsPerCall)) {
      return Invalid("prompt", absl::StrCat("holds ", p.size(), " prompts; at most ",
                                            kMaxCompletionsPerCall, " in one request"));
    }
    for (size_t i = 0; i < p.size(); ++i) {
      auto one = OnePrompt(p[i], absl::StrCat("prompt[", i, "]"));
      if (!one.ok()) return one.status();
      call->prompts.push_back(std::move(*one));
    }
  }
  // One prompt goes in `request`; several stay out of it (RequestFor copies it for each).
  if (call->prompts.size() == 1) call->request = call->RequestFor(0);
  return absl::OkStatus();
}

absl::Status ParseMessages(const In& body, v1::ChatMessages* chat) {
  if (!Given(body, "messages")) return Invalid("messages", "is required");
  const In& msgs = body["messages"];
  if (!msgs.is_array() || msgs.empty()) return Invalid("messages", "must be a non-empty list");
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string field = absl::StrCat("messages[", i, "]");
    const In& m = msgs[i];
    if (!m.is_object()) return Invalid(field, "must be an object with role and content");
    if (!Given(m, "role")) return Invalid(field + ".role", "is required");
    auto role = String(m["role"], field + ".role");
    if (!role.ok()) return role.status();
    // "developer" is the newer name of the system role.
    if (*role == "developer") *role = "system";
    if (*role == "tool" || *role == "function") {
      return Unsupported("a message with role 'tool'", "this server does not call tools");
    }
    std::string content;
    if (Given(m, "content")) {
      const In& c = m["content"];
      if (c.is_string()) {
        content = c.get<std::string>();
      } else if (c.is_array()) {
        // Content parts: text only.
        for (size_t k = 0; k < c.size(); ++k) {
          const std::string part = absl::StrCat(field, ".content[", k, "]");
          if (!c[k].is_object() || !c[k].contains("type") || c[k]["type"] != "text" ||
              !c[k].contains("text") || !c[k]["text"].is_string()) {
            return Invalid(part, "must be {\"type\": \"text\", \"text\": ...}; this model reads "
                                 "text only");
          }
          // Joined by newlines, as vLLM joins them ("Hello" and "world" are not "Helloworld").
          if (k > 0) content += "\n";
          content += c[k]["text"].get<std::string>();
        }
      } else {
        return Invalid(field + ".content", "must be a string or a list of text parts");
      }
    } else if (*role != "assistant") {
      // Only an assistant turn may come without content (OpenAI: one that called tools).
      return Invalid(field + ".content", "is required");
    }
    if (Given(m, "tool_calls") && !(m["tool_calls"].is_array() && m["tool_calls"].empty())) {
      return Unsupported("tool_calls", "this server does not call tools");
    }
    auto* msg = chat->add_messages();
    msg->set_role(*role);
    msg->set_content(content);
  }
  // vLLM's: the reply may continue the last message (an assistant's prefill) instead of
  // opening a new turn.
  for (const char* key : {"add_generation_prompt", "continue_final_message"}) {
    if (!Given(body, key)) continue;
    auto v = Bool(body, key);
    if (!v.ok()) return v.status();
    if (key == std::string_view("add_generation_prompt")) {
      chat->set_add_generation_prompt(*v);
    } else {
      chat->set_continue_final_message(*v);
    }
  }
  if (chat->continue_final_message() && chat->has_add_generation_prompt() &&
      chat->add_generation_prompt()) {
    return Invalid("continue_final_message",
                   "cannot be true with add_generation_prompt true (it opens no new turn)");
  }
  return absl::OkStatus();
}

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

absl::Status ParseSampling(const In& body, OpenAiCall* call) {
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
  if (call->logprobs) call->request.mutable_sampling()->set_logprobs(std::max(1, call->top_logprobs));
  return absl::OkStatus();
}

// Parameters with no counterpart here: refused unless neutral (absent, null, empty, or the
// value that asks for nothing), so a client never believes it got what it asked for.
absl::Status RefuseUnsupported(const In& body, OpenAiEndpoint endpoint) {
  if (Given(body, "echo") && body["echo"] != false && endpoint == OpenAiEndpoint::kChatCompletions) {
    return Unsupported("echo", "not on chat completions");
  }
  if (Given(body, "suffix") && body["suffix"] != "") {
    return Unsupported("suffix", "no fill-in-the-middle");
  }
  // Tools (and the legacy functions) only with tool_choice "none", which calls none of them.
  const bool no_tools = Given(body, "tool_choice") && body["tool_choice"] == "none";
  if (Given(body, "tools") && !(body["tools"].is_array() && body["tools"].empty()) && !no_tools) {
    return Unsupported("tools", "this server does not call tools (tool_choice \"none\" only)");
  }
  if (Given(body, "tool_choice") && !no_tools) {
    return Unsupported("tool_choice", "this server does not call tools");
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
        body["response_format"]["type"] == "text")) {
    return Unsupported("response_format", "only {\"type\": \"text\"}");
  }
  // vLLM's extensions that would change what is generated, were they dropped: a client that
  // trusts a constraint must not get unconstrained text with a 200.
  for (const char* key : {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                          "structured_outputs"}) {
    if (Given(body, key)) return Unsupported(key, "no constrained decoding here");
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

v1::GenerateRequest OpenAiCall::RequestFor(size_t p) const {
  v1::GenerateRequest r = request;
  if (p >= prompts.size()) return r;
  r.clear_prompt();
  r.clear_prompt_token_ids();
  const OpenAiPrompt& prompt = prompts[p];
  if (prompt.tokens) {
    r.mutable_prompt_token_ids()->mutable_ids()->Add(prompt.token_ids.begin(),
                                                     prompt.token_ids.end());
  } else {
    r.set_prompt(prompt.text);
  }
  return r;
}

namespace {

// A request body: a JSON object whose `model`, when given, is the served one.
absl::StatusOr<In> ParseBody(std::string_view body_text, const std::string& served_model) {
  In body = In::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body is not valid JSON: ", JsonParseError(body_text)));
  }
  if (!body.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  if (Given(body, "model")) {
    auto model = String(body["model"], "model");
    if (!model.ok()) return model.status();
    if (*model != served_model) {
      return absl::NotFoundError(absl::StrCat("the model '", *model, "' does not exist; this "
                                              "server serves '", served_model, "'"));
    }
  }
  return body;
}

}  // namespace

absl::StatusOr<OpenAiCall> ParseOpenAiRequest(std::string_view body_text, OpenAiEndpoint endpoint,
                                              const std::string& served_model) {
  auto parsed = ParseBody(body_text, served_model);
  if (!parsed.ok()) return parsed.status();
  const In& body = *parsed;
  OpenAiCall call;
  call.endpoint = endpoint;
  if (absl::Status s = RefuseUnsupported(body, endpoint); !s.ok()) return s;
  if (endpoint == OpenAiEndpoint::kCompletions) {
    if (absl::Status s = ParsePrompt(body, &call); !s.ok()) return s;
  } else {
    if (absl::Status s = ParseMessages(body, call.request.mutable_chat()); !s.ok()) return s;
  }
  if (absl::Status s = ParseSampling(body, &call); !s.ok()) return s;
  if (const int64_t n = std::max<uint32_t>(1, call.request.n());
      int64_t(call.prompt_count()) * n > kMaxCompletionsPerCall) {
    return Invalid("n", absl::StrCat("= ", n, " with ", call.prompt_count(), " prompts asks for ",
                                     int64_t(call.prompt_count()) * n, " completions; at most ",
                                     kMaxCompletionsPerCall, " in one request"));
  }
  if (absl::Status s = ParseLogprobs(body, &call); !s.ok()) return s;
  // echo with logprobs scores the prompt too; so does echo of a prompt alone (max_tokens 0,
  // which the engine takes only for a request that scores its prompt).
  const bool nothing_to_generate = call.request.stopping().has_max_tokens() &&
                                   call.request.stopping().max_tokens() == 0;
  if (call.echo && (call.logprobs || nothing_to_generate)) {
    call.request.mutable_sampling()->set_prompt_logprobs(uint32_t(call.top_logprobs));
  }
  if (Given(body, "stream")) {
    auto v = Bool(body, "stream");
    if (!v.ok()) return v.status();
    call.stream = *v;
  }
  if (Given(body, "stream_options")) {
    const In& so = body["stream_options"];
    if (!so.is_object()) return Invalid("stream_options", "must be an object");
    if (!call.stream) return Invalid("stream_options", "is only allowed with stream: true");
    if (Given(so, "include_usage")) {
      if (!so["include_usage"].is_boolean()) {
        return Invalid("stream_options.include_usage", "must be true or false");
      }
      call.include_usage = so["include_usage"].get<bool>();
    }
  }
  // vLLM's prompt_logprobs (not streamed, as vLLM's; 0 with stream is taken and returns
  // nothing there too).
  if (Given(body, "prompt_logprobs")) {
    auto v = Integer(body, "prompt_logprobs");
    if (!v.ok()) return v.status();
    if (call.stream && *v != 0) {
      return Invalid("prompt_logprobs", "is not available with stream: true");
    }
    if (*v < 0 || *v > kMaxLogprobs) {
      return Invalid("prompt_logprobs",
                     absl::StrCat("= ", *v, "; it must be in [0, ", kMaxLogprobs, "] (-1, the ",
                                  "whole vocabulary, is more than this server returns)"));
    }
    if (!call.stream) {
      call.prompt_logprobs = static_cast<int>(*v);
      // One scoring serves echo's alternatives and these.
      v1::SamplingParams* sp = call.request.mutable_sampling();
      sp->set_prompt_logprobs(std::max<uint32_t>(sp->prompt_logprobs(), uint32_t(*v)));
    }
  }
  return call;
}

absl::StatusOr<v1::TokenizeRequest> ParseTokenizeRequest(std::string_view body_text,
                                                         const std::string& served_model) {
  auto parsed = ParseBody(body_text, served_model);
  if (!parsed.ok()) return parsed.status();
  const In& body = *parsed;
  const bool chat = Given(body, "messages");
  if (chat == Given(body, "prompt")) {
    return absl::InvalidArgumentError("give one of prompt (a string) or messages");
  }
  v1::TokenizeRequest request;
  if (chat) {
    if (absl::Status s = ParseMessages(body, request.mutable_chat()); !s.ok()) return s;
  } else {
    auto text = String(body["prompt"], "prompt");
    if (!text.ok()) return text.status();
    request.set_text(*text);
  }
  // vLLM's defaults: special tokens (BOS) for a prompt, none for a chat (its template writes
  // them).
  bool add_special = !chat;
  if (Given(body, "add_special_tokens")) {
    auto v = Bool(body, "add_special_tokens");
    if (!v.ok()) return v.status();
    add_special = *v;
  }
  request.set_add_special_tokens(add_special);
  return request;
}

absl::StatusOr<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body_text,
                                                            const std::string& served_model,
                                                            int64_t vocab_size) {
  auto parsed = ParseBody(body_text, served_model);
  if (!parsed.ok()) return parsed.status();
  const In& body = *parsed;
  if (!Given(body, "tokens")) return Invalid("tokens", "is required");
  if (!body["tokens"].is_array()) return Invalid("tokens", "must be a list of token ids");
  auto ids = TokenIdArray(body["tokens"], "tokens");
  if (!ids.ok()) return ids.status();
  std::vector<int32_t> tokens;
  for (size_t i = 0; i < ids->size(); ++i) {
    if ((*ids)[i] >= vocab_size) {
      return Invalid(absl::StrCat("tokens[", i, "] = ", (*ids)[i]),
                     absl::StrCat("is outside the vocabulary [0, ", vocab_size, ")"));
    }
    tokens.push_back(static_cast<int32_t>((*ids)[i]));
  }
  return tokens;
}

std::string ToOpenAiFieldNames(std::string message) {
  return absl::StrReplaceAll(message, {{"stopping.", ""}, {"sampling.", ""},
                                       {"prompt_token_ids", "prompt"}, {"chat.messages", "messages"},
                                       {"chat has no messages", "messages is empty"}});
}

int HttpStatusFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition: return 400;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kAlreadyExists: return 409;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kUnavailable: return 503;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

std::string OpenAiErrorBody(int http_status, std::string_view message) {
  const char* type = http_status == 401   ? "authentication_error"
                     : http_status == 404 ? "not_found_error"
                     : http_status == 429 ? "rate_limit_error"
                     : http_status < 500  ? "invalid_request_error"
                                          : "server_error";
  Json j = {{"error",
             {{"message", std::string(message)}, {"type", type}, {"param", nullptr},
              {"code", http_status}}}};
  return DumpJson(j);
}

}  // namespace thetaserve::server
