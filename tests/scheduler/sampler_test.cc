#include "scheduler/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace thetaserve::scheduler {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.5f, -1.0f, 0.5f, 2.9f}; }

std::shared_ptr<const std::vector<int32_t>> Ids(std::vector<int32_t> ids) {
  return std::make_shared<const std::vector<int32_t>>(std::move(ids));
}
std::shared_ptr<const std::vector<std::vector<int32_t>>> Words(
    std::vector<std::vector<int32_t>> words) {
  return std::make_shared<const std::vector<std::vector<int32_t>>>(std::move(words));
}

std::vector<int32_t> Draw(SamplingParams p, int n) {
  Sampler s(p);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    auto l = Logits();
    out.push_back(s.Sample(l, {}, {}).token);
  }
  return out;
}

TEST(SamplerTest, ZeroTemperatureIsArgmax) {
  SamplingParams p;
  p.temperature = 0;
  for (int32_t t : Draw(p, 5)) EXPECT_EQ(t, 1);
}

// PicksArgmax (a GPU backend then picks the token where the logits are): greedy with nothing
// that changes the row or reports from it, whatever the truncation settings greedy ignores;
// each other setting says no, and those that change the row change the pick here (token 1 is
// the row's largest; the output so far is {1}, the prompt {1}).
TEST(SamplerTest, PicksArgmaxOnlyWhereSampleReturnsTheRowsArgmax) {
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.top_k = 2;
  greedy.top_p = 0.5f;
  greedy.min_p = 0.1f;
  greedy.seed = 7;
  for (float t : {0.0f, 1e-6f}) {
    greedy.temperature = t;
    Sampler s(greedy);
    EXPECT_TRUE(s.PicksArgmax());
    auto l = Logits();
    EXPECT_EQ(s.Sample(l, std::vector<int32_t>{1}, std::vector<int32_t>{1}).token, 1);
  }
  greedy.temperature = 0;
  struct Case {
    const char* what;
    void (*set)(SamplingParams&);
    bool changes_pick;
  };
  const Case cases[] = {
      {"temperature", [](SamplingParams& p) { p.temperature = 0.5f; }, false},
      {"logprobs", [](SamplingParams& p) { p.logprobs = 1; }, false},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = 4.0f; }, true},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = 1.0f; }, true},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = 1.0f; }, true},
      {"logit_bias", [](SamplingParams& p) { p.logit_bias = {{0, 5.0f}}; }, true},
      {"allowed_tokens", [](SamplingParams& p) { p.allowed_tokens = Ids({2, 4}); }, true},
      {"bad_words", [](SamplingParams& p) { p.bad_words = Words({{1, 1}}); }, true},
  };
  for (const Case& c : cases) {
    SamplingParams p = greedy;
    c.set(p);
    Sampler s(p);
    EXPECT_FALSE(s.PicksArgmax()) << c.what;
    if (c.changes_pick) {
      auto l = Logits();
      EXPECT_NE(s.Sample(l, std::vector<int32_t>{1}, std::vector<int32_t>{1}).token, 1) << c.what;
    }
  }
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDifferentTokens) {
  SamplingParams p;
  p.temperature = 1.5f;
  p.seed = 42;
  auto a = Draw(p, 64), b = Draw(p, 64);
  EXPECT_EQ(a, b);
  p.seed = 43;
  EXPECT_NE(Draw(p, 64), a);
}

TEST(SamplerTest, TopKOneAndTinyTopPAreGreedy) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 1;
  p.top_k = 1;
  for (int32_t t : Draw(p, 20)) EXPECT_EQ(t, 1);
  p.top_k = 0;
  p.top_p = 1e-6f;
  for (int32_t t : Draw(p, 20)) EXPECT_EQ(t, 1);
}

TEST(SamplerTest, TopKRestrictsToTheKMostLikely) {
  SamplingParams p;
  p.temperature = 5.0f;  // flat: every token would appear without top-k
  p.seed = 7;
  p.top_k = 3;
  const std::vector<int32_t> drawn = Draw(p, 300);
  // The three most likely, each of them (a sampler stuck on the first passes the bound).
  EXPECT_EQ(std::set<int32_t>(drawn.begin(), drawn.end()), (std::set<int32_t>{1, 2, 5}));
  p.top_k = 0;
  const std::vector<int32_t> free = Draw(p, 300);
  EXPECT_GT(std::set<int32_t>(free.begin(), free.end()).size(), 3u) << "top-k made no difference";
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 3;
  p.min_p = 0.5f;  // keeps tokens with p >= 0.5 * p_max: logits within ln 2 of the max
  const std::vector<int32_t> drawn = Draw(p, 300);
  EXPECT_EQ(std::set<int32_t>(drawn.begin(), drawn.end()), (std::set<int32_t>{1, 2, 5}));
}

TEST(SamplerTest, FrequencyDistributionFollowsSoftmax) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 11;
  const int n = 20000;
  std::map<int32_t, int> counts;
  for (int32_t t : Draw(p, n)) ++counts[t];
  auto l = Logits();
  double z = 0;
  for (float v : l) z += std::exp(v);
  for (int i = 0; i < 6; ++i) {
    const double expected = std::exp(l[i]) / z;
    EXPECT_NEAR(counts[i] / double(n), expected, 0.015) << "token " << i;
  }
}

TEST(SamplerTest, PenaltiesPushRepeatedTokensDown) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;  // 3.0 -> 1.5, below 2.9 and 2.5
  Sampler s(p);
  auto l = Logits();
  std::vector<int32_t> prompt = {1};
  EXPECT_EQ(s.Sample(l, prompt, {}).token, 5);

  SamplingParams q;
  q.temperature = 0;
  q.presence_penalty = 0.2f;
  q.frequency_penalty = 0.1f;  // token 1 seen twice: 3.0 - 0.2 - 0.2 = 2.6 < 2.9
  Sampler s2(q);
  l = Logits();
  std::vector<int32_t> out = {1, 1};
  EXPECT_EQ(s2.Sample(l, {}, out).token, 5);
}

// The penalties' per-thread buffers start clean for every call (they are reused, not
// reallocated): the same history gives the same result each time.
TEST(SamplerTest, PenaltiesDependOnlyOnThisCallsHistory) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 3; ++i) {
    auto l = Logits();
    EXPECT_EQ(s.Sample(l, prompt, {}).token, 5) << i;
  }
  auto l = Logits();
  EXPECT_EQ(s.Sample(l, {}, {}).token, 1);

  SamplingParams q;
  q.temperature = 0;
  q.frequency_penalty = 0.04f;  // twice: 3.0 - 0.08 = 2.92 > 2.9; counted twice over: 2.84
  Sampler s2(q);
  std::vector<int32_t> out = {1, 1};
  for (int i = 0; i < 3; ++i) {
    l = Logits();
    EXPECT_EQ(s2.Sample(l, {}, out).token, 1) << i;
  }
}

TEST(SamplerTest, LogprobsAreOfTheModelDistribution) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 2;
  Sampler s(p);
  auto l = Logits();
  SampleResult r = s.Sample(l, {}, {});
  double z = 0;
  for (float v : Logits()) z += std::exp(v);
  EXPECT_NEAR(r.logprob, 3.0 - std::log(z), 1e-5);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].first, 1);
  EXPECT_EQ(r.top[1].first, 5);
  EXPECT_NEAR(r.top[1].second, 2.9 - std::log(z), 1e-5);
}

// -100 bans a token (greedy or sampled), +100 forces one, a small bias shifts the softmax by
// e^bias; log-probabilities stay the model's own.
TEST(SamplerTest, LogitBiasBansForcesAndShiftsButLeavesLogprobsAlone) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 1;
  p.logit_bias = {{1, -100.0f}};  // the argmax
  Sampler greedy(p);
  auto l = Logits();
  const SampleResult r = greedy.Sample(l, {}, {});
  EXPECT_EQ(r.token, 5);  // the runner-up
  double z = 0;
  for (float v : Logits()) z += std::exp(v);
  EXPECT_NEAR(r.logprob, 2.9 - std::log(z), 1e-5);
  ASSERT_EQ(r.top.size(), 1u);
  EXPECT_EQ(r.top[0].first, 1) << "the top log-probability is the model's, before the bias";

  p.temperature = 1.0f;
  p.logprobs = 0;
  p.seed = 7;
  p.logit_bias = {{1, -100.0f}, {5, -100.0f}, {2, -100.0f}};
  for (int32_t t : Draw(p, 200)) EXPECT_TRUE(t != 1 && t != 5 && t != 2) << t;
  p.logit_bias = {{3, 100.0f}};  // the least likely
  for (int32_t t : Draw(p, 200)) EXPECT_EQ(t, 3);
  // +ln 4 on token 0 (e^1 of Σ e^x ≈ 48.5) makes it 4× as likely: ~19% of draws instead of ~6%.
  p.logit_bias = {{0, std::log(4.0f)}};
  p.seed = 11;
  const std::vector<int32_t> draws = Draw(p, 4000);
  double zb = 0;
  for (float v : Logits()) zb += std::exp(v);
  zb += 3 * std::exp(1.0);
  const double want = 4 * std::exp(1.0) / zb;
  const double got = double(std::count(draws.begin(), draws.end(), 0)) / draws.size();
  EXPECT_NEAR(got, want, 4 * std::sqrt(want * (1 - want) / draws.size())) << "want " << want;
}

// Banned tokens (min_tokens' stop tokens) are never sampled, greedy or not, even when the bias
// favours them; their log-probabilities are still the model's.
TEST(SamplerTest, BannedTokensAreNeverSampledButKeepTheirLogprobs) {
  const std::vector<int32_t> banned = {1, 5};
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 1;
  Sampler greedy(p);
  auto l = Logits();
  const SampleResult r = greedy.Sample(l, {}, {}, banned);
  EXPECT_EQ(r.token, 2);  // the best of the rest
  ASSERT_EQ(r.top.size(), 1u);
  EXPECT_EQ(r.top[0].first, 1);
  p.temperature = 2.0f;
  p.logprobs = 0;
  p.seed = 9;
  p.logit_bias = {{5, 100.0f}};
  Sampler s(p);
  for (int i = 0; i < 300; ++i) {
    auto row = Logits();
    const int32_t t = s.Sample(row, {}, {}, banned).token;
    ASSERT_TRUE(t != 1 && t != 5) << t;
  }
}

// A prompt token's score: its log-probability, the top n, and its rank (1 + the tokens with
// a higher logit: a tie shares the better rank, as vLLM counts).
TEST(SamplerTest, ScoreTokenGivesTheRankAmongTheWholeVocabulary) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.5f, -1.0f, 2.5f, 2.9f};
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l));
  const std::pair<int32_t, int32_t> token_rank[] = {{1, 1}, {5, 2}, {2, 3}, {4, 3}, {0, 5},
                                                    {3, 6}};
  for (const auto& [token, rank] : token_rank) {
    std::vector<std::pair<int32_t, float>> top;
    int32_t got = -1;
    const float lp = ScoreToken(logits, token, 2, &top, &got);
    EXPECT_EQ(got, rank) << "token " << token;
    EXPECT_NEAR(lp, logits[token] - std::log(sum), 1e-6) << "token " << token;
    ASSERT_EQ(top.size(), 2u);
    EXPECT_EQ(top[0].first, 1);
    EXPECT_EQ(top[1].first, 5);
  }
}

// allowed_tokens: nothing else is sampled, greedy or not (the best of the allowed wins
// greedily), and the log-probabilities stay the model's.
TEST(SamplerTest, OnlyAllowedTokensAreSampledAndLogprobsStayTheModels) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 2;
  p.allowed_tokens = Ids({0, 3, 4});
  Sampler greedy(p);
  auto l = Logits();
  const SampleResult r = greedy.Sample(l, {}, {});
  EXPECT_EQ(r.token, 0);  // logit 1.0: the best of {1.0, -1.0, 0.5}
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].first, 1);  // the model's best, though never sampled
  EXPECT_EQ(r.top[1].first, 5);
  p.temperature = 1.5f;
  p.seed = 4;
  p.allowed_tokens = Ids({3, 5});  // the least likely token and a likely one
  Sampler s(p);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 400; ++i) {
    auto row = Logits();
    ++seen[s.Sample(row, {}, {}).token];
  }
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[3], 0);
  EXPECT_GT(seen[5], seen[3]);
}

// `only` (a guided choice's next tokens) narrows what is sampled as allowed_tokens does, and
// the two together leave what both allow.
TEST(SamplerTest, OnlyTheGivenNextTokensAreSampled) {
  SamplingParams p;
  p.temperature = 0;
  const std::vector<int32_t> only = {0, 3, 4};
  Sampler s(p);
  auto l = Logits();
  EXPECT_EQ(s.Sample(l, {}, {}, {}, only).token, 0);
  p.allowed_tokens = Ids({3, 4, 5});
  Sampler both(p);
  l = Logits();
  EXPECT_EQ(both.Sample(l, {}, {}, {}, only).token, 4);  // 0.5: the better of {3, 4}
  p.temperature = 1.0f;
  p.seed = 3;
  Sampler sampled(p);
  for (int i = 0; i < 200; ++i) {
    auto row = Logits();
    const int32_t t = sampled.Sample(row, {}, {}, {}, only).token;
    ASSERT_TRUE(t == 3 || t == 4) << t;
  }
}

// The masks leave exactly the kept tokens (ascending, a repeat among them, ids past the row
// ignored) as they were and
// every other token of the row never: kept sets dense and sparse, with and without the row's
// first and last tokens, on a row larger than any run; and where none of the kept is
// possible, the kept (and only they) equally likely.
TEST(SamplerTest, ARowIsMaskedToExactlyTheKeptTokens) {
  constexpr int kVocab = 10007;
  const float never = -std::numeric_limits<float>::infinity();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> logit(-5.0f, 5.0f);
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  for (int round = 0; round < 24; ++round) {
    const double density = (round % 4 == 0) ? 0.999 : (round % 4 == 1) ? 0.5 : 0.01;
    std::vector<int32_t> keep;
    for (int32_t t = 0; t < kVocab; ++t) {
      if (std::bernoulli_distribution(density)(rng)) keep.push_back(t);
    }
    if (round % 3 == 0) keep.insert(keep.begin(), 0);
    if (round % 5 == 0) keep.push_back(kVocab - 1);
    keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
    if (keep.empty()) keep.push_back(kVocab / 2);
    if (keep.size() > 2) keep.insert(keep.begin() + 1, keep[1]);  // a repeat
    std::set<int32_t> kept(keep.begin(), keep.end());
    if (round % 4 == 2) keep.push_back(kVocab + 3);  // past the row (a larger tokenizer's id)
    std::vector<float> row(kVocab);
    for (float& l : row) l = logit(rng);
    const bool none = round % 6 == 5;  // none of the kept possible
    if (none) {
      for (int32_t t : kept) row[t] = never;
    }
    std::vector<float> masked = row;
    const int32_t token = s.Sample(masked, {}, {}, {}, keep).token;
    EXPECT_TRUE(kept.contains(token)) << "round " << round << ": " << token;
    int wrong = 0;
    for (int32_t t = 0; t < kVocab; ++t) {
      const float want = !kept.contains(t) ? never : none ? 0.0f : row[t];
      wrong += masked[t] != want;
    }
    EXPECT_EQ(wrong, 0) << "round " << round << ", " << kept.size() << " kept";
  }
}

// A mask that would leave no token at all is not applied: the more binding one holds (the
// guide over allowed_token_ids over bad words over min_tokens' bans), never token 0 of an
// all -inf row.
TEST(SamplerTest, AMaskThatWouldLeaveNothingIsNotApplied) {
  SamplingParams p;
  p.temperature = 0;
  p.allowed_tokens = Ids({4});
  p.bad_words = Words({{4}});
  Sampler bad_word_skipped(p);
  auto l = Logits();
  EXPECT_EQ(bad_word_skipped.Sample(l, {}, {}).token, 4);
  p.bad_words = nullptr;
  Sampler allowed_skipped(p);
  l = Logits();
  const std::vector<int32_t> only = {2, 3};
  EXPECT_EQ(allowed_skipped.Sample(l, {}, {}, {}, only).token, 2);  // the guide wins
  p.allowed_tokens = nullptr;
  Sampler ban_skipped(p);
  const std::vector<int32_t> banned = {3};
  const std::vector<int32_t> only_three = {3};
  l = Logits();
  EXPECT_EQ(ban_skipped.Sample(l, {}, {}, banned, only_three).token, 3);
  const std::vector<int32_t> ban_two = {2};
  l = Logits();
  EXPECT_EQ(ban_skipped.Sample(l, {}, {}, ban_two, only).token, 3);  // 3 is left: banned
  // The guide holds even where the row gives its tokens nothing: they become equally likely.
  l = Logits();
  l[2] = l[3] = -std::numeric_limits<float>::infinity();
  const int32_t t = ban_skipped.Sample(l, {}, {}, {}, only).token;
  EXPECT_TRUE(t == 2 || t == 3) << t;
  // Repeated ids in the guide's list mask nothing they should not.
  const std::vector<int32_t> repeated = {2, 2, 5};
  l = Logits();
  EXPECT_EQ(ban_skipped.Sample(l, {}, {}, {}, repeated).token, 5);
}

// A bad word's last token is banned exactly where it would complete the word: after the
// word's other tokens at the end of the output, not after part of them, and a one-token word
// always. Other tokens and the log-probabilities are untouched.
TEST(SamplerTest, BadWordsBanTheTokenThatWouldCompleteThem) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 1;
  p.bad_words = Words({{4, 1}, {2, 3, 5}});
  auto next = [&](std::vector<int32_t> output) {
    Sampler s(p);
    auto l = Logits();
    const SampleResult r = s.Sample(l, {}, output);
    EXPECT_EQ(r.top.at(0).first, 1);
    return r.token;
  };
  EXPECT_EQ(next({}), 1);            // no output: nothing to complete
  EXPECT_EQ(next({0, 4}), 5);        // 4 then 1 is banned; 5 (2.9) is next best
  EXPECT_EQ(next({4, 0}), 1);        // 4 is not at the end
  EXPECT_EQ(next({2, 3}), 1);        // 2, 3 then 5 is banned; 1 is not
  p.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(next({7, 2, 3}), 2);     // 1 biased away and 5 banned: 2 (2.5)
  EXPECT_EQ(next({3}), 5);           // only part of the prefix
  p.logit_bias.clear();
  p.bad_words = Words({{1}});
  EXPECT_EQ(next({}), 5);            // a one-token word: banned everywhere
  EXPECT_EQ(next({1, 1}), 5);
}

// TruncateDistribution sorts only the head top-p keeps; it must keep exactly the tokens, with
// exactly the weights, that sorting the whole vocabulary keeps.
TEST(SamplerTest, TruncationKeepsWhatSortingEverythingKeeps) {
  std::mt19937 rng(5);
  std::vector<std::pair<float, int32_t>> scratch;
  std::vector<std::pair<int32_t, double>> kept;
  int cases = 0, grew = 0;
  for (int vocab : {6, 100, 5000, 49152}) {
    // sigma 0.3: a flat row whose top-p nucleus is most of the vocabulary (the head grows
    // to the whole list); 4: a peaked one.
    for (float sigma : {0.3f, 4.0f}) {
      std::normal_distribution<float> normal(0.0f, sigma);
      std::vector<float> x(vocab);
      for (float& v : x) v = normal(rng);
      for (int top_k : {0, 1, 40, 3000}) {
        for (float top_p : {1.0f, 0.95f, 0.5f, 1e-6f}) {
          for (float min_p : {0.0f, 0.02f, 0.9f}) {
            SamplingParams p;
            p.top_k = top_k;
            p.top_p = top_p;
            p.min_p = min_p;
            SCOPED_TRACE(testing::Message() << "vocab " << vocab << " sigma " << sigma << " top_k "
                                            << top_k << " top_p " << top_p << " min_p " << min_p);
            TruncateDistribution(x, p, scratch, kept);
            std::map<int32_t, double> got, want;
            for (const auto& [id, w] : kept) got[id] = w;
            std::vector<std::pair<int32_t, double>> by_sorting;
            TruncateDistributionBySorting(x, p, by_sorting);
            for (const auto& [id, w] : by_sorting) want[id] = w;
            ASSERT_EQ(got.size(), kept.size()) << "a token kept twice";
            ASSERT_EQ(got, want);
            if (top_p < 1) {  // walked most likely first
              for (size_t i = 1; i < kept.size(); ++i) ASSERT_GE(kept[i - 1].second, kept[i].second);
            }
            ++cases;
            grew += top_p < 1 && kept.size() > 64;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 4 * 2 * 4 * 4 * 3);
  EXPECT_GT(grew, 0);  // some nuclei needed more than the first head
}

// Edge cases: one or two tokens, -inf logits, top-p a hair under 1, min-p 1, top-k at or past
// the vocabulary; and rows full of equal logits, where which of the tied tokens straddling a
// cut are kept is arbitrary both ways: there the kept weights must agree as a multiset.
TEST(SamplerTest, TruncationEdgeCasesAndTies) {
  const float inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(9);
  std::vector<std::pair<float, int32_t>> scratch;
  std::vector<std::pair<int32_t, double>> kept, by_sorting;
  int cases = 0;
  for (int vocab : {1, 2, 7, 300}) {
    for (int kind = 0; kind < 3; ++kind) {  // 0: distinct, 1: a third -inf, 2: ties (steps of 0.5)
      std::vector<float> x(vocab);
      std::normal_distribution<float> normal(0.0f, 2.0f);
      for (float& v : x) v = kind == 2 ? std::round(normal(rng)) * 0.5f : normal(rng);
      if (kind == 1) {
        for (int i = 0; i < vocab; ++i) if (i % 3 == 1) x[i] = -inf;
      }
      for (int top_k : {0, 1, 3, vocab, vocab + 5}) {
        for (float top_p : {1.0f, 0.99999994f, 0.9f, 0.3f}) {
          for (float min_p : {0.0f, 0.5f, 1.0f}) {
            SamplingParams p;
            p.top_k = top_k;
            p.top_p = top_p;
            p.min_p = min_p;
            SCOPED_TRACE(testing::Message() << "vocab " << vocab << " kind " << kind << " top_k " << top_k
                                            << " top_p " << top_p << " min_p " << min_p);
            TruncateDistribution(x, p, scratch, kept);
            TruncateDistributionBySorting(x, p, by_sorting);
            ASSERT_FALSE(kept.empty());
            std::vector<double> got, want;
            for (const auto& [id, w] : kept) {
              got.push_back(w);
              ASSERT_GT(w, 0.0);
              ASSERT_NE(x[id], -inf);
            }
            for (const auto& [id, w] : by_sorting) want.push_back(w);
            std::sort(got.begin(), got.end());
            std::sort(want.begin(), want.end());
            ASSERT_EQ(got, want);
            if (kind != 2) {
              std::map<int32_t, double> a(kept.begin(), kept.end()), b(by_sorting.begin(), by_sorting.end());
              ASSERT_EQ(a, b);
            }
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 4 * 3 * 5 * 4 * 3);
}

TEST(SamplerTest, BrokenRowsFallBackToTheArgmaxAndNaNIsNeverChosen) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  SamplingParams p;
  p.seed = 2;
  Sampler s(p);
  std::vector<float> l(8, -inf);  // nothing finite: the first
  EXPECT_EQ(s.Sample(l, {}, {}).token, 0);
  for (int i = 0; i < 50; ++i) {  // a NaN is never chosen, wherever it is
    l = {nan, 1.0f, 3.0f, nan, 2.5f};
    const int32_t t = s.Sample(l, {}, {}).token;
    EXPECT_TRUE(t == 1 || t == 2 || t == 4) << t;
  }
  SamplingParams g;
  g.temperature = 0;
  Sampler greedy(g);
  l = {nan, 1.0f, 3.0f, nan, 2.5f};
  EXPECT_EQ(greedy.Sample(l, {}, {}).token, 2);
  // Temperatures below kGreedyTemperature are greedy (dividing by 1e-39 would overflow every
  // logit); just above it, a row this flat still samples.
  for (float t : {1e-39f, 5e-6f}) {
    SamplingParams tiny;
    tiny.temperature = t;
    tiny.seed = 3;
    Sampler cold(tiny);
    l = {1.0f, 3.0f, 2.5f};
    EXPECT_EQ(cold.Sample(l, {}, {}).token, 1) << t;
  }
  SamplingParams warm;
  warm.temperature = 1e6f;
  warm.seed = 4;
  Sampler hot(warm);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 60; ++i) {
    l = {1.0f, 3.0f, 2.5f};
    ++seen[hot.Sample(l, {}, {}).token];
  }
  EXPECT_EQ(seen.size(), 3u);
}

}  // namespace
}  // namespace thetaserve::scheduler
