// The OpenAI-compatible API's requests, apart from any transport: a /v1/completions or
// /v1/chat/completions body becomes a v1::GenerateRequest (which then goes through BuildRequest,
// exactly as a gRPC request does, so both front ends validate alike). The responses are
// openai_response.h's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/openai_body.h"
#include "thetaserve/v1/generation.pb.h"

namespace thetaserve::server {

enum class OpenAiEndpoint { kCompletions, kChatCompletions };

// Completions of one /v1/completions call: its prompts × n.
constexpr int kMaxCompletionsPerCall = 1024;
// Prompt tokens of one call with a list of prompts, all prompts together (one prompt is
// bounded by the context).
constexpr int64_t kMaxPromptTokensPerCall = 262'144;

// One prompt of /v1/completions: text, or token ids.
struct OpenAiPrompt {
  std::string text;
  std::vector<uint32_t> token_ids;
  bool tokens = false;  // given as token ids
};

struct OpenAiCall {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  // Every parameter, and the prompt when there is one (not a list of several).
  v1::GenerateRequest request;
  // Completions: every prompt (a list of several gets n choices each, in order: choice
  // p * n + i is completion i of prompt p, as OpenAI and vLLM number them). Empty for chat.
  std::vector<OpenAiPrompt> prompts;
  // `request` with prompt p (0 <= p < prompts.size(); for chat, `request`).
  v1::GenerateRequest RequestFor(size_t p) const;
  size_t prompt_count() const { return std::max<size_t>(1, prompts.size()); }
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  // vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk also
  // carries its choice's usage so far.
  bool continuous_usage = false;
  // vLLM's return_token_ids: the response carries the prompt's token ids and each choice's
  // (streamed: the prompt's with a choice's first chunk, each chunk its own).
  bool return_token_ids = false;
  bool logprobs = false;       // return the sampled tokens' log-probabilities
  int top_logprobs = 0;        // and this many alternatives per token
  bool max_tokens_given = false;
  bool echo = false;           // completions: the prompt comes back before the completion
  // vLLM's prompt_logprobs: each prompt token's score, rank and this many alternatives
  // (-1: not asked).
  int prompt_logprobs = -1;
  // The guided choice / regex came as structured_outputs.choice / .regex (errors name them
  // so), not as guided_choice / guided_regex. (json_object's conflicts are refused while the
  // body is read, naming the client's own fields.)
  bool structured_choice = false;
  bool structured_regex = false;
  // The grammar's field as sent (guided_grammar, structured_outputs.grammar or llama.cpp's
  // grammar), named in its errors; empty: none.
  std::string grammar_field;
  // Where the JSON schema came from (guided_json, structured_outputs.json or
  // response_format.json_schema.schema), to name it in errors; empty: none.
  std::string schema_field;
  // Chat's tools, called when tool_choice names one (the output is its arguments) or is
  // "required" (the output is a list of calls, [{"name", "parameters"}]): the output is guided
  // to that JSON and answered as the message's tool_calls.
  enum class ToolCalls { kNone, kNamed, kRequired };
  ToolCalls tool_calls = ToolCalls::kNone;
  std::string tool_name;  // kNamed: the function
  // vLLM's request_id field: the call's id is the endpoint's prefix and this (cmpl-<it>); an
  // X-Request-Id header takes precedence. Empty: random.
  std::string request_id;
};

// The longest client-chosen request id (request_id, X-Request-Id) taken; they are visible
// ASCII.
inline constexpr size_t kMaxClientRequestIdBytes = 256;
// A client-chosen request id's check: `what` names where it came from.
absl::Status CheckClientRequestId(std::string_view id, std::string_view what);

// Parses a request body. INVALID_ARGUMENT names the field and what is allowed; NOT_FOUND when
// `model` is given and is not one `served_model` serves. Parameters the server cannot honour (best_of
// other than n, echo on chat, suffix, tools, ...) are refused rather than silently ignored;
// unknown fields are ignored, as vLLM does.
absl::StatusOr<OpenAiCall> ParseOpenAiRequest(std::string_view body, OpenAiEndpoint endpoint,
                                              const ServedModel& served_model);

// vLLM's POST /tokenize: {"prompt": text} or {"messages": [...]} (with add_generation_prompt
// and continue_final_message as on chat), add_special_tokens (default true for a prompt, false
// for messages, as vLLM's), model. INVALID_ARGUMENT / NOT_FOUND as ParseOpenAiRequest.
absl::StatusOr<v1::TokenizeRequest> ParseTokenizeRequest(std::string_view body,
                                                         const ServedModel& served_model);
// vLLM's POST /detokenize: {"tokens": [ids]}, each in [0, vocab_size).
absl::StatusOr<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body,
                                                            const ServedModel& served_model,
                                                            int64_t vocab_size);

// Error messages from BuildRequest name the gRPC fields ("stopping.max_tokens"); the HTTP API's
// names have no prefix.
std::string ToOpenAiFieldNames(std::string message);

// The request field an error message is about: its leading field path when that begins with
// a field of the API ("top_p", "messages[1].role", "prompt[1][2]", "stop_token_ids[0]"), else
// "" (a message about no one field: "the request body is not valid JSON").
std::string ErrorParam(std::string_view message);

// {"error": {"message", "type", "param", "code"}} for an HTTP status; param is ErrorParam's,
// or null.
std::string OpenAiErrorBody(int http_status, std::string_view message);
// The HTTP status for a Status code.
int HttpStatusFor(const absl::Status& status);

}  // namespace thetaserve::server
