#include "scheduler/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace thetaserve::scheduler {
namespace {

uint64_t SeedFor(const SamplingParams& params) {
  if (params.seed.has_value()) return *params.seed;
  return std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
}

// log-sum-exp of a row, for log-probabilities.
double LogSumExp(std::span<const float> x) {
  float m = -std::numeric_limits<float>::infinity();
  for (float v : x) m = std::max(m, v);
  double s = 0;
  for (float v : x) s += std::exp(double(v) - m);
  return m + std::log(s);
}

}  // namespace

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(SeedFor(params)) {}

SampleResult Sampler::Sample(std::span<float> logits, std::span<const int32_t> prompt,
                             std::span<const int32_t> output) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  SampleResult result;

  // Log-probabilities are reported for the model's own distribution, before penalties and
  // temperature (as vLLM does by default).
  double raw_lse = 0.0;
  std::vector<float> raw_for_logprob;
  if (params_.logprobs > 0) {
    raw_lse = LogSumExp(logits);
    raw_for_logprob.assign(logits.begin(), logits.end());
    const double lse = raw_lse;
    const int64_t n = std::min<int64_t>(params_.logprobs, vocab);
    candidates_.clear();
    for (int64_t i = 0; i < vocab; ++i) candidates_.push_back({logits[i], int32_t(i)});
    std::partial_sort(candidates_.begin(), candidates_.begin() + n, candidates_.end(),
                      [](auto& a, auto& b) { return a.first > b.first; });
    for (int64_t i = 0; i < n; ++i) {
      result.top.push_back({candidates_[i].second, float(candidates_[i].first - lse)});
    }
  }

  // Penalties.
  if (params_.repetition_penalty != 1.0f) {
    auto penalize = [&](int32_t t) {
      if (t < 0 || t >= vocab) return;
      float& l = logits[t];
      l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    };
    std::vector<uint8_t> seen(vocab, 0);
    for (int32_t t : prompt) if (t >= 0 && t < vocab && !seen[t]) { seen[t] = 1; penalize(t); }
    for (int32_t t : output) if (t >= 0 && t < vocab && !seen[t]) { seen[t] = 1; penalize(t); }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    counts_.assign(vocab, 0);
    for (int32_t t : output) if (t >= 0 && t < vocab) ++counts_[t];
    for (int64_t t = 0; t < vocab; ++t) {
      if (counts_[t] > 0) {
        logits[t] -= params_.presence_penalty + params_.frequency_penalty * counts_[t];
      }
    }
  }

  int32_t chosen = 0;
  if (params_.temperature <= 0.0f) {
    chosen = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  } else {
    candidates_.clear();
    candidates_.reserve(vocab);
    for (int64_t i = 0; i < vocab; ++i) {
      candidates_.push_back({logits[i] / params_.temperature, int32_t(i)});
    }
    auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first; };
    size_t n = candidates_.size();
    if (params_.top_k > 0 && size_t(params_.top_k) < n) {
      std::nth_element(candidates_.begin(), candidates_.begin() + params_.top_k,
                       candidates_.end(), by_logit);
      n = params_.top_k;
      candidates_.resize(n);
    }
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
    // Softmax over the survivors (sorted, most likely first).
    const float m = candidates_[0].first;
    std::vector<double> p(n);
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += p[i] = std::exp(double(candidates_[i].first - m));
    for (double& v : p) v /= sum;
    size_t keep = n;
    if (params_.min_p > 0.0f) {
      const double floor = params_.min_p * p[0];
      keep = 1;
      while (keep < n && p[keep] >= floor) ++keep;
    }
    if (params_.top_p < 1.0f) {
      double cum = 0;
      size_t k = 0;
      while (k < keep) {
        cum += p[k++];
        if (cum >= params_.top_p) break;
      }
      keep = std::max<size_t>(1, k);
    }
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += p[i];
    std::uniform_real_distribution<double> uni(0.0, total);
    double r = uni(rng_);
    size_t i = 0;
    for (; i + 1 < keep; ++i) {
      r -= p[i];
      if (r < 0) break;
    }
    chosen = candidates_[i].second;
  }
  result.token = chosen;
  if (params_.logprobs > 0) result.logprob = float(raw_for_logprob[chosen] - raw_lse);
  return result;
}

}  // namespace thetaserve::scheduler
