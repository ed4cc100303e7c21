// Turns one row of logits into the next token: penalties, temperature, top-k, top-p, min-p,
// seeded randomness, and top-n log-probabilities.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace thetaserve::scheduler {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // 0 = off
  float min_p = 0.0f;        // [0, 1]
  float repetition_penalty = 1.0f;  // > 0; applies to prompt and output tokens
  float presence_penalty = 0.0f;    // output tokens only (OpenAI convention)
  float frequency_penalty = 0.0f;   // output tokens only
  std::optional<uint64_t> seed;     // same seed, same tokens
  int32_t logprobs = 0;             // top-n log-probabilities to return (0 = none)
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;                         // of `token` under the model's distribution
  std::vector<std::pair<int32_t, float>> top;   // top-n (id, logprob), most likely first
};

// One sampler per request: it owns the request's random generator.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // `logits` is modified in place (penalties, temperature). `prompt` and `output` are the
  // request's tokens so far (for the penalties).
  SampleResult Sample(std::span<float> logits, std::span<const int32_t> prompt,
                      std::span<const int32_t> output);

  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int32_t> counts_;            // output token counts, sized to the vocabulary
  std::vector<std::pair<float, int32_t>> candidates_;
};

}  // namespace thetaserve::scheduler
