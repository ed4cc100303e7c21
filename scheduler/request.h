// What the API hands the engine (Request: immutable once submitted) and what the engine hands
// back (TokenSink callbacks).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/guided_choice.h"
#include "scheduler/sampler.h"

namespace thetaserve::scheduler {

using Clock = std::chrono::steady_clock;

struct StoppingCriteria {
  int32_t max_tokens = 16;
  std::vector<std::string> stop;         // stop strings; matched across tokens, not emitted
  // Unless this: the matched string ends the output, and a stop token id's text is emitted.
  bool include_stop_str = false;
  std::vector<int32_t> stop_token_ids;   // end generation when sampled (emitted as ids only)
  bool ignore_eos = false;
  // Output tokens before EOS, stop_token_ids or stop strings may end generation (<= max_tokens).
  int32_t min_tokens = 0;
};

struct Request {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  StoppingCriteria stopping;
  // Prefix caching: cached blocks are shared only among requests with the same salt.
  std::string cache_salt;
  // Several completions of one prompt (the APIs' n) are a group: requests with the same
  // group_id and prompt, indices 0..n-1. Engine::Cancel(group_id) cancels them all. With
  // prefix caching, index 0 computes the prompt and the others wait until it has, then adopt
  // its blocks: the prompt's K and V are computed and stored once, not n times.
  std::string group_id;  // empty: no group
  int32_t group_index = 0;
  // The prompts of one API call that carries several (the HTTP API's list of prompts, each
  // its own request or group): Engine::Cancel(call_id) cancels them all.
  std::string call_id;  // empty: a call of one prompt
  // Log-probabilities of the prompt's tokens (each given the tokens before it) with this many
  // alternatives each; -1: none. Such a request computes its whole prompt (it adopts no
  // prefix-cache blocks: their logits are needed). With it, stopping.max_tokens may be 0:
  // score the prompt, generate nothing.
  int32_t prompt_logprobs = -1;
  // vLLM's structured outputs (guided_choice, guided_regex, json_object): what the whole
  // output must be; null: unguided. Shared by a call's prompts and completions.
  std::shared_ptr<const Guide> guide;
  // Under the priority scheduling policy (SchedulingPolicy::kPriority), lower goes first (vLLM's
  // priority); the first-come policy takes only 0 (Engine::Submit refuses another).
  int64_t priority = 0;
  // The output text leaves special tokens out (vLLM's skip_special_tokens); token ids carry
  // them either way.
  bool skip_special_tokens = true;
  Clock::time_point arrival = Clock::now();
  std::optional<Clock::time_point> deadline;
};

enum class FinishReason { kStop, kLength, kEos, kCancelled, kError };
const char* FinishReasonName(FinishReason r);

// Request::prompt_logprobs: the prompt's tokens and, for tokens 1 … P−1 (the first has
// nothing before it), each one's log-probability, the top n, and its rank (1 + how many
// tokens the model found likelier).
struct PromptScores {
  std::vector<int32_t> token_ids;                            // [P]
  std::vector<float> logprobs;                               // [P − 1]: entry i is token i + 1's
  std::vector<std::vector<std::pair<int32_t, float>>> top;   // [P − 1], as logprobs
  std::vector<int32_t> ranks;                                // [P − 1], as logprobs
};

struct TokenDelta {
  std::vector<int32_t> token_ids;
  std::string text;                                          // complete UTF-8 only
  std::vector<float> logprobs;                               // per token, when asked
  std::vector<std::vector<std::pair<int32_t, float>>> top;   // per token top-n, when asked
  // Request::prompt_logprobs, in the request's first delta. Shared, never changed: the
  // completions of one prompt that all carry its scores hold one copy.
  std::shared_ptr<const PromptScores> prompt;
};

struct FinishInfo {
  FinishReason reason = FinishReason::kLength;
  absl::Status status;          // why, for kCancelled (deadline, abort) and kError
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double queue_seconds = 0;     // arrival to first scheduled
  double ttft_seconds = 0;      // arrival to first token; meaningful only with has_ttft()
  double total_seconds = 0;     // arrival to finish
  int64_t preemptions = 0;

  // Whether a first token came (a request cancelled while queued, or refused, has none: its
  // ttft_seconds is not a time to first token).
  bool has_ttft() const { return completion_tokens > 0; }
};

// Receives a request's output. Called on the engine thread only: implementations must not
// block (push into a buffer and return).
class TokenSink {
 public:
  virtual ~TokenSink() = default;
  virtual void OnTokens(const TokenDelta& delta) = 0;
  // Called exactly once, last.
  virtual void OnFinish(const FinishInfo& info) = 0;
};

}  // namespace thetaserve::scheduler
