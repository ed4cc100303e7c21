// The OpenAI-compatible API's responses: the engine's output for one call becomes completion
// objects and stream chunks (the request side is openai_api.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "scheduler/request.h"
#include "server/openai_api.h"

namespace thetaserve::server {

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
  // Each prompt's length in tokens, [prompts]: the usage that chunks carry with continuous
  // usage.
  void SetPromptLengths(std::vector<int64_t> lengths) { prompt_lengths_ = std::move(lengths); }
  // Each prompt's token ids, [prompts]: the ids return_token_ids returns (only it needs them).
  void SetPromptTokens(std::vector<std::vector<int32_t>> ids) { prompt_ids_ = std::move(ids); }

 private:
  struct Choice {
    std::string text;                  // the completion so far (after the echoed prompt)
    // The characters (code points) of the echoed prompt and of the tokens given out so far:
    // the next token's text_offset. Counted from the tokens, not from `text`, which lags them
    // while a possible start of a stop string is held back.
    size_t token_chars = 0;
    nlohmann::ordered_json logprobs;   // accumulated (not streaming)
    std::string echo;                  // with echo: its prompt's text
    bool echoed = false;               // the prompt's text (and scores) went out
    nlohmann::ordered_json prompt_logprobs;  // vLLM's prompt_logprobs, when asked
    std::string tool_id;               // a named tool call's id
    bool tool_started = false;         // streaming it: its id and name went out
    int64_t tokens = 0;                // generated tokens streamed so far
    std::vector<int32_t> token_ids;    // return_token_ids, not streaming: all of them
    bool prompt_ids_sent = false;      // return_token_ids, streaming: the prompt's went out
  };
  const std::vector<int32_t>& PromptIds(int index) const;
  // With call.continuous_usage, `chunk` gets choice `index`'s usage so far.
  void AddChoiceUsage(int index, nlohmann::ordered_json& chunk) const;
  // With echo: the prompt's text the first time a delta brings tokens or the prompt's scores,
  // and the scores' log-probabilities (the first token's null) when asked; else "" and null.
  // The text returned is added to c's text and counted in its token_chars.
  std::string EchoText(Choice& c, const scheduler::TokenDelta& delta);
  nlohmann::ordered_json PromptLogprobs(const scheduler::TokenDelta& delta) const;
  // vLLM's prompt_logprobs: per prompt token (the first null) {"<id>": {logprob, rank,
  // decoded_token}} for the token itself and the call's prompt_logprobs most likely.
  nlohmann::ordered_json VllmPromptLogprobs(const scheduler::PromptScores& scores) const;
  nlohmann::ordered_json Envelope(const char* object) const;
  // Each prompt once, the completion tokens of all.
  nlohmann::ordered_json Usage(const std::vector<scheduler::FinishInfo>& infos) const;
  // Log-probabilities of a delta's tokens in the endpoint's format; `offset` is the completion
  // text's length in characters before them (the completions format's text_offset, which
  // OpenAI and vLLM count in characters, as Python slices a str).
  nlohmann::ordered_json Logprobs(const scheduler::TokenDelta& delta, size_t* offset) const;
  static void AppendLogprobs(nlohmann::ordered_json& into, const nlohmann::ordered_json& more);

  OpenAiCall call_;
  std::string id_;
  int64_t created_;
  std::string model_;
  const model::Tokenizer* tokenizer_;
  std::vector<Choice> choices_;
  int per_prompt_ = 1;  // n: choices of each prompt
  std::vector<std::vector<int32_t>> prompt_ids_;  // [prompts]
  std::vector<int64_t> prompt_lengths_;           // [prompts]
};

// Serializes for the wire: invalid UTF-8 (a token's raw bytes) becomes U+FFFD.
std::string DumpJson(const nlohmann::ordered_json& j);

}  // namespace thetaserve::server
