// Turns one row of logits into the next token: penalties, logit bias, temperature, top-k,
// top-p, min-p, seeded randomness, and top-n log-probabilities.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace thetaserve::scheduler {

// Temperatures below this sample greedily.
inline constexpr float kGreedyTemperature = 1e-5f;

struct SamplingParams {
  float temperature = 1.0f;  // below kGreedyTemperature (0 included): greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // 0 = off
  float min_p = 0.0f;        // [0, 1]
  float repetition_penalty = 1.0f;  // > 0; applies to prompt and output tokens
  float presence_penalty = 0.0f;    // output tokens only (OpenAI convention)
  float frequency_penalty = 0.0f;   // output tokens only
  std::optional<uint64_t> seed;     // same seed, same tokens
  int32_t logprobs = 0;             // top-n log-probabilities to return (0 = none)
  // (token, bias) added to the logits after the penalties, before the temperature; tokens
  // inside the vocabulary.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Only these tokens are sampled (sorted, no repeats, inside the vocabulary); null: any.
  // Shared, as bad_words: a call's prompts and completions all hold the same.
  std::shared_ptr<const std::vector<int32_t>> allowed_tokens;
  // Token sequences the output never completes: the last token of one is not sampled where
  // the output so far ends with the others (vLLM's bad_words, tokenized). None empty.
  std::shared_ptr<const std::vector<std::vector<int32_t>>> bad_words;
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;                         // of `token` under the model's distribution
  std::vector<std::pair<int32_t, float>> top;   // top-n (id, logprob), most likely first
};

// What a sampling step may choose from: top-k, then min-p, then top-p over `scaled` (logits
// after penalties and temperature). Fills `kept` with (token, weight) pairs, weight e^(x − max),
// in the order sampling walks them: most likely first when top-p cut the list (it needs that
// order), else in no particular order. Probabilities are normalized over the top-k survivors
// (the whole vocabulary without top-k), as the min-p and top-p cuts are. Sorts only as much
// as top-p needs: the prefix it keeps, found by selecting ever larger heads of the list, not
// the whole vocabulary. The same tokens and weights as sorting everything, except which of
// equal logits straddling a cut are kept. `scratch` is reused between calls.
void TruncateDistribution(std::span<const float> scaled, const SamplingParams& params,
                          std::vector<std::pair<float, int32_t>>& scratch,
                          std::vector<std::pair<int32_t, double>>& kept);

// The same cut made the obvious way, by sorting the whole vocabulary (most likely first): the
// reference TruncateDistribution is tested and benchmarked against (bench/sampler_bench.cc).
void TruncateDistributionBySorting(std::span<const float> scaled, const SamplingParams& params,
                                   std::vector<std::pair<int32_t, double>>& kept);

// The log-probability of `token` under the distribution of a row of logits (the model's own:
// no penalties, bias or temperature), the `top_n` most likely (id, log-probability), most
// likely first, in *top, and, when `rank` is given, the token's rank in *rank: 1 + how many
// tokens have a higher logit (vLLM's). A prompt token's score.
float ScoreToken(std::span<const float> logits, int32_t token, int32_t top_n,
                 std::vector<std::pair<int32_t, float>>* top, int32_t* rank = nullptr);

// One sampler per request: it owns the request's random generator.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // `logits` is modified in place (penalties, temperature). `prompt` and `output` are the
  // request's tokens so far (for the penalties and bad words). `banned` tokens are never
  // sampled (their log-probabilities are still reported): min_tokens' stop tokens. Neither
  // are tokens outside allowed_tokens, nor the bad words' last tokens where they would
  // complete one, nor, when `only` (ascending) is not empty, tokens outside it (a guided
  // choice's next tokens).
  SampleResult Sample(std::span<float> logits, std::span<const int32_t> prompt,
                      std::span<const int32_t> output, std::span<const int32_t> banned = {},
                      std::span<const int32_t> only = {});

  const SamplingParams& params() const { return params_; }
  // Whether Sample, given no `banned` or `only` tokens, returns nothing but the row's ArgMax
  // as it came (greedy; no penalty, bias, allowed tokens, bad words or log-probabilities): a
  // backend may then pick the token where the logits are (ForwardBatch::argmax).
  bool PicksArgmax() const;

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  // Vocabulary-sized buffers are per thread (sampler.cc), not per request.
};

}  // namespace thetaserve::scheduler
