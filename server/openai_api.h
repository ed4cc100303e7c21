// The OpenAI-compatible API's JSON, apart from any transport: a /v1/completions or
// /v1/chat/completions body becomes a v1::GenerateRequest (which then goes through BuildRequest,
// exactly as a gRPC request does, so both front ends validate alike), and the engine's output
// becomes completion objects and stream chunks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "scheduler/request.h"
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
  bool logprobs = false;       // return the sampled tokens' log-probabilities
  int top_logprobs = 0;        // and this many alternatives per token
  bool max_tokens_given = false;
  bool echo = false;           // completions: the prompt comes back before the completion
};

// Parses a request body. INVALID_ARGUMENT names the field and what is allowed; NOT_FOUND when
// `model` is given and is not `served_model`. Parameters the server cannot honour (best_of
// other than n, echo on chat or with n > 1, suffix, tools, ...) are refused rather than
// silently ignored; unknown fields are ignored, as vLLM does.
absl::StatusOr<OpenAiCall> ParseOpenAiRequest(std::string_view body, OpenAiEndpoint endpoint,
                                              const std::string& served_model);

// Error messages from BuildRequest name the gRPC fields ("stopping.max_tokens"); the HTTP API's
// names have no prefix.
std::string ToOpenAiFieldNames(std::string message);

// {"error": {"message", "type", "param", "code"}} for an HTTP status.
std::string OpenAiErrorBody(int http_status, std::string_view message);
// The HTTP status for a Status code.
int HttpStatusFor(const absl::Status& status);

// "stop" (stop strings, stop token ids and EOS), "length", or, as vLLM says, "abort" for a
// request cancelled by an Abort call.
const char* OpenAiFinishReason(scheduler::FinishReason reason);

// Builds one call's response objects, for its n completions (`choices`). Handler thread only.
class OpenAiResponseBuilder {
 public:
  // choices: call.prompt_count() × n. echo_texts: with call.echo, each prompt's text, which
  // its choices' texts begin with.
  OpenAiResponseBuilder(const OpenAiCall& call, std::string id, int64_t created,
                        std::string model, const model::Tokenizer& tokenizer, int choices = 1,
                        std::vector<std::string> echo_texts = {});

  // Streaming: for each completion the chat stream's first chunk (the assistant role), then
  // one chunk per delta and the chunk with the finish reason; last, if asked, a chunk with
  // the usage of them all.
  nlohmann::ordered_json RoleChunk(int index) const;
  nlohmann::ordered_json DeltaChunk(int index, const scheduler::TokenDelta& delta);
  // Whether a DeltaChunk has anything to send (text, or log-probabilities): tokens whose
  // text is not complete UTF-8 yet make chunks that do not.
  static bool Carries(const nlohmann::ordered_json& chunk);
  nlohmann::ordered_json FinishChunk(int index, const scheduler::FinishInfo& info) const;
  // infos: every completion's, [choices].
  nlohmann::ordered_json UsageChunk(const std::vector<scheduler::FinishInfo>& infos) const;

  // Not streaming: Add every delta, then Complete with every completion's FinishInfo.
  void Add(int index, const scheduler::TokenDelta& delta);
  nlohmann::ordered_json Complete(const std::vector<scheduler::FinishInfo>& infos) const;

  const std::string& id() const { return id_; }

 private:
  struct Choice {
    std::string text;                  // the completion so far (after the echoed prompt)
    size_t chars = 0;                  // its length in characters (code points), as text_offset
    void Append(const std::string& more);
    nlohmann::ordered_json logprobs;   // accumulated (not streaming)
    std::string echo;                  // with echo: its prompt's text
    bool echoed = false;               // the prompt's text (and scores) went out
  };
  // With echo: the prompt's text the first time a delta brings tokens or the prompt's scores,
  // and the scores' log-probabilities (the first token's null) when asked; else "" and null.
  std::string EchoText(Choice& c, const scheduler::TokenDelta& delta);
  nlohmann::ordered_json PromptLogprobs(const scheduler::TokenDelta& delta) const;
  nlohmann::ordered_json Envelope(const char* object) const;
  // Each prompt once, the completion tokens of all.
  nlohmann::ordered_json Usage(const std::vector<scheduler::FinishInfo>& infos) const;
  // Log-probabilities of a delta's tokens in the endpoint's format; `offset` is the completion
  // text's length in characters before them (the completions format's text_offset, which
  // OpenAI and vLLM count in characters, as Python slices a str).
  nlohmann::ordered_json Logprobs(const scheduler::TokenDelta& delta, size_t offset) const;
  static void AppendLogprobs(nlohmann::ordered_json& into, const nlohmann::ordered_json& more);

  OpenAiCall call_;
  std::string id_;
  int64_t created_;
  std::string model_;
  const model::Tokenizer* tokenizer_;
  std::vector<Choice> choices_;
  int per_prompt_ = 1;  // n: choices of each prompt
};

// Serializes for the wire: invalid UTF-8 (a token's raw bytes) becomes U+FFFD.
std::string DumpJson(const nlohmann::ordered_json& j);

}  // namespace thetaserve::server
