// The CPU backend's default MatMulMode::kQuantized (int8 activations) against kExact (f32) on
// SmolLM2 Q4_1, for the five prompts of the transformers reference (reference_logits_test runs
// kExact against transformers itself), both modes fed the exact mode's greedy tokens for 32
// steps. Checked: every logits row is within kRelTol of the exact one, and the quantized mode's
// greedy pick is the exact mode's except at near-ties (exact top-two margin <= kTieTol of the
// row's max |logit|), of which there are few.
//
// Free-running greedy decoding in the quantized mode does NOT reproduce transformers' tokens
// for all five prompts: 'chat' and 'code' have a 0.3% near-tie at their first step and
// 'capital' one of 1.4% at step 5, which 8-bit activations flip (llama.cpp's Q8_1 activations
// behave the same). Perplexity on Austen moves from 24.457 (exact) to 24.537 (+0.33%).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "nlohmann/json.hpp"
#include "scheduler/sequence_runner.h"
#include "tests/test_util.h"

namespace thetaserve::kernels {
namespace {

// Measured on these 160 steps: worst max |Δ| / max |logit| 7.5e-2 (typical 2-4e-2); flipped
// near-ties had margins up to 1.4% of max |logit|; 6 flips.
constexpr double kRelTol = 0.1;
constexpr double kTieTol = 0.025;
constexpr int kMaxFlips = 12;

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float f : v) m = std::max(m, std::fabs(double(f)));
  return m;
}

double RelDiff(const std::vector<float>& got, const std::vector<float>& want) {
  double d = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double(got[i]) - double(want[i]));
    d = std::isnan(e) ? INFINITY : std::max(d, e);
  }
  return d / MaxAbs(want);
}

int32_t Argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Exact logit margin between the best and second-best token.
double TopTwoGap(const std::vector<float>& v) {
  float a = -INFINITY, b = -INFINITY;
  for (float f : v) {
    if (f > a) {
      b = a;
      a = f;
    } else if (f > b) {
      b = f;
    }
  }
  return double(a) - double(b);
}

TEST(QuantizedMatMulFidelityTest, LogitsAndGreedyTokensFollowExactMode) {
  auto model = model::Model::Load(testing::DefaultModelPath());
  ASSERT_TRUE(model.ok()) << model.status();
  // f32 KV pages in both: what differs is the matmul alone.
  auto exact = CreateBackend(**model, Device::kCpu, 0, MatMulMode::kExact, KvDtype::kF32);
  auto quant = CreateBackend(**model, Device::kCpu, 0, MatMulMode::kQuantized, KvDtype::kF32);
  ASSERT_TRUE(exact.ok() && quant.ok());
  const auto meta = nlohmann::json::parse(
      testing::ReadFileOrDie(testing::TestDataPath("reference/smollm2.json")));
  double worst = 0;
  int steps = 0, flips = 0;
  for (const auto& c : meta["cases"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const int64_t n = static_cast<int64_t>(c["greedy_ids"].size());
    auto er = scheduler::SequenceRunner::Create(**exact, prompt.size() + n + 1, 16);
    auto qr = scheduler::SequenceRunner::Create(**quant, prompt.size() + n + 1, 16);
    ASSERT_TRUE(er.ok() && qr.ok());
    // Both modes decode the exact mode's tokens, so the comparison stays aligned after a flip.
    auto el = er->Append(prompt);
    auto ql = qr->Append(prompt);
    ASSERT_TRUE(el.ok() && ql.ok());
    for (int64_t i = 0; i < n; ++i) {
      const double rel = RelDiff(*ql, *el);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, kRelTol) << "step " << i;
      const int32_t want = Argmax(*el);
      const int32_t got = Argmax(*ql);
      ++steps;
      if (got != want) {
        ++flips;
        const double gap = TopTwoGap(*el);
        EXPECT_LE(gap, kTieTol * MaxAbs(*el))
            << "step " << i << ": quantized picks " << got << ", exact " << want
            << " by a margin of " << gap;
        std::printf("%s step %lld: near-tie flipped (exact margin %.3g of max |logit| %.3g)\n",
                    name.c_str(), (long long)i, gap, MaxAbs(*el));
      }
      if (i + 1 < n) {
        el = er->Append(std::span<const int32_t>(&want, 1));
        ql = qr->Append(std::span<const int32_t>(&want, 1));
        ASSERT_TRUE(el.ok() && ql.ok());
      }
    }
  }
  std::printf("worst max|Δ| / max|logit|: %.2e over %d steps; %d greedy flips\n", worst, steps,
              flips);
  EXPECT_LE(flips, kMaxFlips) << "more near-ties flipped than 8-bit rounding explains";
}

}  // namespace
}  // namespace thetaserve::kernels
