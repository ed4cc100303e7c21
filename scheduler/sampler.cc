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

// Index of the largest logit, ignoring NaN (0 when there is none).
int32_t ArgMax(std::span<const float> x) {
  int32_t best = 0;
  float m = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] > m) m = x[i], best = int32_t(i);
  }
  return best;
}

// Vocabulary-sized scratch, one per thread: a step samples its rows on several threads, and a
// request should not hold megabytes between its tokens.
struct Scratch {
  std::vector<std::pair<float, int32_t>> candidates;  // [≤ vocab] (logit, token)
  std::vector<std::pair<int32_t, double>> kept;       // [≤ vocab] TruncateDistribution's
  std::vector<float> raw;       // [vocab] logits before penalties (log-probabilities)
  std::vector<int32_t> counts;  // [vocab] output token counts, all 0 between calls
  std::vector<uint8_t> seen;    // [vocab] tokens already penalized, all 0 between calls
  std::vector<int32_t> completing;                   // bad words' last tokens, this step
  std::vector<std::pair<int32_t, float>> undo;       // banned tokens' logits before the ban
};
Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// The n most likely tokens of a row whose log-sum-exp is `lse`, most likely first.
void TopLogprobs(std::span<const float> logits, double lse, int32_t n,
                 std::vector<std::pair<float, int32_t>>& candidates,
                 std::vector<std::pair<int32_t, float>>* top) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  const int64_t count = std::min<int64_t>(n, vocab);
  top->clear();
  if (count <= 0) return;
  candidates.clear();
  for (int64_t i = 0; i < vocab; ++i) candidates.push_back({logits[i], int32_t(i)});
  std::partial_sort(candidates.begin(), candidates.begin() + count, candidates.end(),
                    [](auto& a, auto& b) { return a.first > b.first; });
  for (int64_t i = 0; i < count; ++i) {
    top->push_back({candidates[i].second, float(candidates[i].first - lse)});
  }
}

}  // namespace

float ScoreToken(std::span<const float> logits, int32_t token, int32_t top_n,
                 std::vector<std::pair<int32_t, float>>* top, int32_t* rank) {
  const double lse = LogSumExp(logits);
  TopLogprobs(logits, lse, top_n, ThreadScratch().candidates, top);
  if (rank) {
    const float own = logits[token];
    *rank = 1 + int32_t(std::count_if(logits.begin(), logits.end(),
                                      [own](float l) { return l > own; }));
  }
  return float(logits[token] - lse);
}

void TruncateDistribution(std::span<const float> scaled, const SamplingParams& params,
                          std::vector<std::pair<float, int32_t>>& c,
                          std::vector<std::pair<int32_t, double>>& kept) {
  kept.clear();
  const int64_t vocab = static_cast<int64_t>(scaled.size());
  if (vocab == 0) return;
  // min-p keeps weights >= min_p (the most likely token weighs 1); a weight of 0 (a logit of
  // -inf, or one that far below the max) is never chosen.
  const double floor = params.min_p;
  auto passes = [&](double w) { return w > 0 && w >= floor; };
  const bool top_k = params.top_k > 0 && params.top_k < vocab;
  const bool top_p = params.top_p < 1.0f;
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first; };

  // The candidates: the top-k survivors in c[0, n), or the whole vocabulary (not copied).
  int64_t n = vocab;
  float m;
  // NaN logits weigh nothing: they never pass (below), never reach a sort (its order would
  // be undefined), and the max and the total skip them.
  const float kNegInf = -std::numeric_limits<float>::infinity();
  if (top_k) {
    c.resize(vocab);
    for (int64_t i = 0; i < vocab; ++i) c[i] = {std::isnan(scaled[i]) ? kNegInf : scaled[i], int32_t(i)};
    std::nth_element(c.begin(), c.begin() + params.top_k, c.end(), by_logit);
    n = params.top_k;
    m = std::min_element(c.begin(), c.begin() + n, by_logit)->first;  // by_logit: most likely first
  } else {
    m = kNegInf;
    for (float x : scaled) m = x > m ? x : m;
  }
  if (!top_p) {  // no order needed
    for (int64_t k = 0; k < n; ++k) {
      const auto [x, id] = top_k ? c[k] : std::pair<float, int32_t>{scaled[k], int32_t(k)};
      if (const double w = std::exp(double(x - m)); passes(w)) kept.push_back({id, w});
    }
    return;
  }

  // top-p: the shortest most-likely-first prefix whose mass reaches top_p of the candidates'
  // total z, ended early by min-p. No token of weight below (1 − top_p)·z / (4n) is in it
  // (all of those together weigh less than (1 − top_p)·z), so only the others are sorted.
  double z = 0;
  if (top_k) {
    for (int64_t k = 0; k < n; ++k) z += std::exp(double(c[k].first - m));
  } else {
    for (float x : scaled) {
      if (const double w = std::exp(double(x - m)); w > 0) z += w;
    }
  }
  const double target = double(params.top_p) * z;
  const double small = (1.0 - double(params.top_p)) / (4.0 * double(n));
  const double cut = small * z > 0 ? double(m) + std::log(small * z) : -HUGE_VAL;
  if (top_k) {
    n = std::partition(c.begin(), c.begin() + n, [&](const auto& e) { return double(e.first) >= cut; }) -
        c.begin();
  } else {
    c.clear();
    for (int64_t i = 0; i < vocab; ++i) {
      if (double(scaled[i]) >= cut) c.push_back({scaled[i], int32_t(i)});
    }
    n = static_cast<int64_t>(c.size());
  }
  // c[0, sorted) is sorted; each round sorts a head 8× longer.
  double cum = 0;
  int64_t sorted = 0, k = 0;
  for (int64_t want = std::min<int64_t>(n, 64);; want = std::min(n, want * 8)) {
    if (want < n) std::nth_element(c.begin() + sorted, c.begin() + want, c.begin() + n, by_logit);
    std::sort(c.begin() + sorted, c.begin() + want, by_logit);
    sorted = want;
    for (; k < sorted; ++k) {
      const double w = std::exp(double(c[k].first - m));
      if (!passes(w)) return;
      kept.push_back({c[k].second, w});
      cum += w;
      if (cum >= target) return;
    }
    if (sorted == n) return;
  }
}

void TruncateDistributionBySorting(std::span<const float> scaled, const SamplingParams& params,
                                   std::vector<std::pair<int32_t, double>>& kept) {
  kept.clear();
  if (scaled.empty()) return;
  std::vector<std::pair<float, int32_t>> c;
  c.reserve(scaled.size());
  for (size_t i = 0; i < scaled.size(); ++i) c.push_back({scaled[i], int32_t(i)});
  std::sort(c.begin(), c.end(), [](auto& a, auto& b) { return a.first > b.first; });
  const size_t n = params.top_k > 0 ? std::min<size_t>(params.top_k, c.size()) : c.size();
  std::vector<double> w(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += w[i] = std::exp(double(c[i].first - c[0].first));
  size_t keep = n;
  if (params.min_p > 0) {
    keep = 1;
    while (keep < n && w[keep] / sum >= params.min_p * w[0] / sum) ++keep;
  }
  if (params.top_p < 1) {
    double cum = 0;
    size_t k = 0;
    while (k < keep) {
      cum += w[k++] / sum;
      if (cum >= params.top_p) break;
    }
    keep = std::max<size_t>(1, k);
  }
  for (size_t i = 0; i < keep; ++i) {
    if (w[i] > 0) kept.push_back({c[i].second, w[i]});
  }
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(SeedFor(params)) {}

SampleResult Sampler::Sample(std::span<float> logits, std::span<const int32_t> prompt,
                             std::span<const int32_t> output, std::span<const int32_t> banned,
                             std::span<const int32_t> only) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  SampleResult result;
  Scratch& sc = ThreadScratch();

  // Log-probabilities are reported for the model's own distribution, before penalties and
  // temperature (as vLLM does by default).
  double raw_lse = 0.0;
  if (params_.logprobs > 0) {
    raw_lse = LogSumExp(logits);
    sc.raw.assign(logits.begin(), logits.end());
    TopLogprobs(logits, raw_lse, params_.logprobs, sc.candidates, &result.top);
  }

  // Penalties, then the bias.
  if (params_.repetition_penalty != 1.0f) {
    auto penalize = [&](int32_t t) {
      if (t < 0 || t >= vocab) return;
      float& l = logits[t];
      l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    };
    // `seen` and `counts` are all zero between calls: each use clears what it set.
    std::vector<uint8_t>& seen = sc.seen;
    if (int64_t(seen.size()) != vocab) seen.assign(vocab, 0);
    for (int32_t t : prompt) if (t >= 0 && t < vocab && !seen[t]) { seen[t] = 1; penalize(t); }
    for (int32_t t : output) if (t >= 0 && t < vocab && !seen[t]) { seen[t] = 1; penalize(t); }
    for (int32_t t : prompt) if (t >= 0 && t < vocab) seen[t] = 0;
    for (int32_t t : output) if (t >= 0 && t < vocab) seen[t] = 0;
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    std::vector<int32_t>& counts = sc.counts;
    if (int64_t(counts.size()) != vocab) counts.assign(vocab, 0);
    for (int32_t t : output) if (t >= 0 && t < vocab) ++counts[t];
    for (int32_t t : output) {
      if (t >= 0 && t < vocab && counts[t] > 0) {  // once per distinct token
        logits[t] -= params_.presence_penalty + params_.frequency_penalty * counts[t];
        counts[t] = 0;
      }
    }
  }

  for (const auto& [t, bias] : params_.logit_bias) {
    if (t >= 0 && t < vocab) logits[t] += bias;
  }
  // The masks, the most binding first: a guided choice's next tokens, allowed_token_ids,
  // the bad words' last tokens, min_tokens' bans. One that would leave no token at all is
  // not applied (allowed_token_ids that a bad word empties, min_tokens banning a guided
  // choice's only way out), so the sampler never picks from a row of nothing but -inf; the
  // guided choice's always is.
  constexpr float kNever = -std::numeric_limits<float>::infinity();
  auto possible = [](float l) { return l > kNever; };  // NaN never is
  // Every token outside `keep` (ascending) never, if one in it is possible. `hard` (a guided
  // choice's next tokens, which must hold): if none is, they become equally likely instead.
  auto keep_only = [&](std::span<const int32_t> keep, bool hard) {
    const bool none = std::none_of(keep.begin(), keep.end(), [&](int32_t t) {
      return t >= 0 && t < vocab && possible(logits[t]);
    });
    if (none && !hard) return;
    // The gaps between kept tokens filled: a row that keeps most of the vocabulary (a guide
    // inside a string) has few gaps, one that keeps a few tokens few fills (a test per token of
    // the row was most of the mask's cost).
    int64_t from = 0;  // tokens [from, t) are not kept
    for (int32_t t : keep) {
      if (t < from || t >= vocab) continue;  // a repeat, or out of range
      std::fill(logits.begin() + from, logits.begin() + t, kNever);
      if (none) logits[t] = 0.0f;
      from = t + 1;
    }
    std::fill(logits.begin() + from, logits.end(), kNever);
  };
  // `ban` never, unless nothing else would be possible.
  std::vector<std::pair<int32_t, float>>& undo = sc.undo;
  auto ban_all = [&](std::span<const int32_t> ban) {
    undo.clear();
    for (int32_t t : ban) {
      if (t < 0 || t >= vocab || !possible(logits[t])) continue;
      undo.push_back({t, logits[t]});
      logits[t] = kNever;
    }
    if (!undo.empty() && std::none_of(logits.begin(), logits.end(), possible)) {
      for (const auto& [t, l] : undo) logits[t] = l;
    }
  };
  if (!only.empty()) keep_only(only, /*hard=*/true);
  if (params_.allowed_tokens) keep_only(*params_.allowed_tokens, /*hard=*/false);
  if (params_.bad_words) {
    std::vector<int32_t>& completing = sc.completing;
    completing.clear();
    for (const std::vector<int32_t>& word : *params_.bad_words) {
      const size_t rest = word.size() - 1;  // tokens the output must end with
      if (rest <= output.size() && std::equal(word.begin(), word.end() - 1, output.end() - rest)) {
        completing.push_back(word.back());
      }
    }
    ban_all(completing);
  }
  ban_all(banned);

  // Temperatures below kGreedyTemperature sample greedily (as vLLM does): dividing by them
  // could overflow the logits. A NaN logit (a broken row) is never chosen.
  int32_t chosen = 0;
  if (params_.temperature < kGreedyTemperature) {
    chosen = ArgMax(logits);
  } else {
    for (float& l : logits) l /= params_.temperature;
    TruncateDistribution(logits, params_, sc.candidates, sc.kept);
    if (sc.kept.empty()) {  // no finite weight (every logit -inf or NaN, or +inf ones)
      sc.kept.push_back({ArgMax(logits), 1.0});
    }
    double total = 0;
    for (const auto& [id, w] : sc.kept) total += w;
    std::uniform_real_distribution<double> uni(0.0, total);
    double r = uni(rng_);
    size_t i = 0;
    for (; i + 1 < sc.kept.size(); ++i) {
      r -= sc.kept[i].second;
      if (r < 0) break;
    }
    chosen = sc.kept[i].first;
  }
  result.token = chosen;
  if (params_.logprobs > 0) result.logprob = float(sc.raw[chosen] - raw_lse);
  return result;
}

bool Sampler::PicksArgmax() const {
  const SamplingParams& p = params_;
  return p.temperature < kGreedyTemperature && p.logprobs == 0 && p.repetition_penalty == 1.0f &&
         p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f && p.logit_bias.empty() &&
         !p.allowed_tokens && !p.bad_words;
}

}  // namespace thetaserve::scheduler
