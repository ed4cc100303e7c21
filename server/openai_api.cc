#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "server/openai_body.h"
#include "server/openai_params.h"
#include "server/openai_response.h"
#include "server/validation.h"

namespace thetaserve::server {
namespace {

using openai_body::Bool;
using openai_body::Given;
using openai_body::In;
using openai_body::Integer;
using openai_body::Invalid;
using openai_body::ParseBody;
using openai_body::String;
using openai_body::TokenIdArray;
using openai_body::Unsupported;
using Json = nlohmann::ordered_json;

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
    if (*role == "function") {
      return Unsupported("a message with role 'function'", "send the result as role 'tool'");
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
    // An assistant's earlier tool calls reach the model as its text, after any content: one
    // {"name", "arguments"} per line (the chat template has no tools of its own).
    if (Given(m, "tool_calls") && !(m["tool_calls"].is_array() && m["tool_calls"].empty())) {
      const In& calls = m["tool_calls"];
      if (*role != "assistant" || !calls.is_array()) {
        return Invalid(field + ".tool_calls", "must be a list, on an assistant message");
      }
      for (size_t k = 0; k < calls.size(); ++k) {
        const std::string at = absl::StrCat(field, ".tool_calls[", k, "]");
        const In& c = calls[k];
        if (!c.is_object() || !Given(c, "function") || !c["function"].is_object() ||
            !Given(c["function"], "name") || !c["function"]["name"].is_string() ||
            !Given(c["function"], "arguments") || !c["function"]["arguments"].is_string()) {
          return Invalid(at, "must be {\"function\": {\"name\": ..., \"arguments\": ...}}");
        }
        const std::string arguments = c["function"]["arguments"];
        Json args = Json::parse(arguments, nullptr, /*allow_exceptions=*/false);
        if (args.is_discarded()) args = arguments;
        if (!content.empty()) content += "\n";
        content += Json{{"name", c["function"]["name"]}, {"arguments", args}}.dump(
            -1, ' ', false, Json::error_handler_t::replace);
      }
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

absl::StatusOr<OpenAiCall> ParseOpenAiRequest(std::string_view body_text, OpenAiEndpoint endpoint,
                                              const ServedModel& served_model) {
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
  if (absl::Status s = ParseSampling(body, body_text, &call); !s.ok()) return s;
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
  // vLLM's tokenization switches: BOS before the prompt (default true; on chat false, as its
  // template writes the special tokens), and special tokens left out of the text (default
  // true).
  if (Given(body, "add_special_tokens")) {
    auto v = Bool(body, "add_special_tokens");
    if (!v.ok()) return v.status();
    call.request.set_add_special_tokens(*v);
  }
  if (Given(body, "skip_special_tokens")) {
    auto v = Bool(body, "skip_special_tokens");
    if (!v.ok()) return v.status();
    call.request.set_skip_special_tokens(*v);
  }
  if (Given(body, "return_token_ids")) {
    auto v = Bool(body, "return_token_ids");
    if (!v.ok()) return v.status();
    call.return_token_ids = *v;
  }
  if (Given(body, "request_id")) {
    auto v = String(body["request_id"], "request_id");
    if (!v.ok()) return v.status();
    if (absl::Status s = CheckClientRequestId(*v, "request_id"); !s.ok()) return s;
    call.request_id = *v;
  }
  if (Given(body, "stream")) {
    auto v = Bool(body, "stream");
    if (!v.ok()) return v.status();
    call.stream = *v;
  }
  if (call.stream && call.tool_calls == OpenAiCall::ToolCalls::kRequired) {
    return Unsupported("tool_choice", "\"required\" is not streamed (the calls are read from "
                                      "the whole answer): send stream false, or name a function");
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
    if (Given(so, "continuous_usage_stats")) {
      if (!so["continuous_usage_stats"].is_boolean()) {
        return Invalid("stream_options.continuous_usage_stats", "must be true or false");
      }
      call.continuous_usage = call.include_usage && so["continuous_usage_stats"].get<bool>();
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

absl::Status CheckClientRequestId(std::string_view id, std::string_view what) {
  const bool visible = std::all_of(id.begin(), id.end(), [](char c) { return c > ' ' && c < 127; });
  if (id.empty() || id.size() > kMaxClientRequestIdBytes || !visible) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(what), " must be 1 to ", kMaxClientRequestIdBytes,
        " visible ASCII characters (no spaces), got ", id.size(), " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::TokenizeRequest> ParseTokenizeRequest(std::string_view body_text,
                                                         const ServedModel& served_model) {
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
  // Unset, the Tokenize RPC's defaults (vLLM's): BOS before a prompt, none before a chat.
  if (Given(body, "add_special_tokens")) {
    auto v = Bool(body, "add_special_tokens");
    if (!v.ok()) return v.status();
    request.set_add_special_tokens(*v);
  }
  return request;
}

absl::StatusOr<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body_text,
                                                            const ServedModel& served_model,
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
  return absl::StrReplaceAll(message, {{"stopping.", ""},
                                       {"sampling.", ""},
                                       {"prompt_token_ids", "prompt"},
                                       {"chat.messages", "messages"},
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

std::string ErrorParam(std::string_view message) {
  // The fields either route reads (completions, chat, /tokenize, /detokenize), refused ones
  // included.
  static const std::set<std::string_view> kFields = {
      "add_generation_prompt", "add_special_tokens", "allowed_token_ids", "bad_words",
      "best_of", "cache_salt", "chat_template", "chat_template_kwargs",
      "continue_final_message", "echo", "frequency_penalty", "function_call", "functions",
      "grammar", "grammar_lazy",
      "guided_choice", "guided_grammar", "guided_json", "guided_regex",
      "guided_whitespace_pattern", "ignore_eos",
      "include_stop_str_in_output", "logit_bias", "logprobs", "max_completion_tokens",
      "max_tokens", "messages", "min_p", "min_tokens", "model", "n", "presence_penalty",
      "parallel_tool_calls", "priority", "prompt", "prompt_logprobs", "repetition_penalty",
      "request_id", "response_format", "return_token_ids", "seed", "skip_special_tokens", "stop",
      "stop_token_ids", "stream", "stream_options", "structured_outputs", "suffix",
      "temperature", "tokens", "tool_choice", "tools", "top_k", "top_logprobs", "top_p",
      "truncate_prompt_tokens", "use_beam_search"};
  std::string_view path = message.substr(0, message.find(' '));
  while (!path.empty() && (path.back() == ':' || path.back() == ',')) path.remove_suffix(1);
  const std::string_view root = path.substr(0, path.find_first_of("[."));
  return kFields.count(root) ? std::string(path) : std::string();
}

std::string OpenAiErrorBody(int http_status, std::string_view message) {
  const char* type = http_status == 401   ? "authentication_error"
                     : http_status == 404 ? "not_found_error"
                     : http_status == 429 ? "rate_limit_error"
                     : http_status < 500  ? "invalid_request_error"
                                          : "server_error";
  const std::string param = ErrorParam(message);
  Json j = {{"error",
             {{"message", std::string(message)},
              {"type", type},
              {"param", param.empty() ? Json(nullptr) : Json(param)},
              {"code", http_status}}}};
  return DumpJson(j);
}

}  // namespace thetaserve::server
