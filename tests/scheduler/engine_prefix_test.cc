// The engine's prefix cache and request groups on the real model: shared blocks are computed
// once and change no output, n completions compute their prompt once, prompt logprobs score
// every token even from cached blocks, and the cache gives way to new work.
#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/scheduler/engine_fixture.h"

namespace thetaserve::scheduler {
namespace {

// Prefix caching: requests that begin with the same long preamble adopt its blocks instead
// of computing them, and every request's tokens, text and log-probabilities are the same bits
// as without the cache (the CPU computes a row with the same instructions whatever else is in
// the batch), dense and under Top-θ with VMC, whose V sums the backend rebuilds for the
// adopted rows.
TEST_F(EngineTest, PrefixCachingSkipsSharedBlocksAndChangesNoOutput) {
  std::string preamble = "You are a careful assistant. Read the passage and continue it. ";
  for (const auto& p : Prompts()) preamble += p + " ";
  const std::vector<std::string> questions = {
      "Question: what comes next?", "Question: who is speaking?", "Continue:",
      "Summary:", "Question: where does this happen?", "In other words,"};
  std::vector<Request> requests;
  for (size_t i = 0; i < questions.size(); ++i) {
    Request r = MakeRequest(absl::StrCat("q", i), preamble + questions[i], 12);
    r.stopping.ignore_eos = true;
    r.sampling.logprobs = 2;
    requests.push_back(r);
  }
  Request again = requests[0];
  again.id = "again";
  const model::ThetaTable table = ConstantPostTheta(0.02f);

  for (bool top_theta : {false, true}) {
    SCOPED_TRACE(top_theta ? "top-theta" : "dense");
    auto run = [&](bool caching, EngineStats* stats) {
      auto backend = top_theta ? TopThetaBackend(table)
                               : kernels::CreateBackend(*model_, kernels::Device::kCpu, 0);
      EXPECT_TRUE(backend.ok());
      EngineConfig config;
      config.kv_cache_bytes = int64_t(128) << 20;
      config.prefix_caching = caching;
      auto engine = Engine::Create(config, **backend);
      EXPECT_TRUE(engine.ok()) << engine.status();
      EXPECT_EQ((*engine)->prefix_caching(), caching);
      std::vector<std::shared_ptr<CollectingSink>> sinks;
      auto submit = [&](const Request& r) {
        sinks.push_back(std::make_shared<CollectingSink>());
        EXPECT_TRUE((*engine)->Submit(r, sinks.back()).ok());
      };
      // The first alone (it fills the cache), then the others together, then the first again.
      submit(requests[0]);
      EXPECT_TRUE(sinks[0]->Wait(300));
      for (size_t i = 1; i < requests.size(); ++i) submit(requests[i]);
      for (auto& sk : sinks) EXPECT_TRUE(sk->Wait(300));
      submit(again);
      EXPECT_TRUE(sinks.back()->Wait(300));
      EXPECT_TRUE((*engine)->WaitIdle(10));
      *stats = (*engine)->Stats();
      return sinks;
    };
    EngineStats plain, cached;
    const auto want = run(false, &plain);
    const auto got = run(true, &cached);
    ASSERT_EQ(want.size(), got.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i]->tokens.size(), 12u) << i;
      EXPECT_EQ(got[i]->tokens, want[i]->tokens) << "request " << i;
      EXPECT_EQ(got[i]->text, want[i]->text) << "request " << i;
      EXPECT_EQ(got[i]->logprobs, want[i]->logprobs) << "request " << i;
    }

    // Each later request finds at least the whole blocks it shares with the first, and the
    // repeat all of its prompt but the last token's block.
    const int64_t bs = 16;
    int64_t asked = 0, at_least = 0;
    for (const Request& r : requests) {
      asked += int64_t(r.prompt.size());
      if (&r == &requests[0]) continue;
      const auto diverge = std::mismatch(r.prompt.begin(), r.prompt.end(), requests[0].prompt.begin());
      at_least += int64_t(diverge.first - r.prompt.begin()) / bs * bs;
    }
    asked += int64_t(again.prompt.size());
    at_least += (int64_t(again.prompt.size()) - 1) / bs * bs;
    ASSERT_GT(at_least, 5 * 64) << "the preamble was meant to span several blocks";
    EXPECT_EQ(plain.counters.prefix_query_tokens, 0);
    EXPECT_EQ(plain.counters.prefix_hit_tokens, 0);
    EXPECT_EQ(cached.counters.prefix_query_tokens, asked);
    EXPECT_GE(cached.counters.prefix_hit_tokens, at_least);
    // What was found was not computed.
    EXPECT_EQ(cached.counters.prompt_tokens,
              plain.counters.prompt_tokens - cached.counters.prefix_hit_tokens);
    // Idle: no request holds a page, the cache holds some, and they count as free.
    EXPECT_EQ(cached.pages_used_k + cached.pages_used_v, 0);
    EXPECT_GT(cached.pages_cached, 0);
    EXPECT_GT(cached.prefix_cache_blocks, 0);
    EXPECT_EQ(cached.pages_free, cached.pages_total);
    EXPECT_EQ(plain.pages_cached, 0);
  }
}

// A group (the APIs' n): the first completion computes the prompt, the others adopt its
// blocks, so the prompt is computed once and its pages held once; each completion gets the
// tokens it gets alone; one Cancel of the group's id ends them all and every page returns.
TEST_F(EngineTest, AGroupComputesItsPromptOnceAndCancelsTogether) {
  std::string text = "You are a careful assistant. Read the passage and continue it. ";
  for (const auto& p : Prompts()) text += p + " ";
  constexpr int kN = 4;  // completions per group
  // `text` changes for the last group below: read it at each call.
  auto group = [&](const std::string& id, int max_tokens) {
    return MakeGroup(id, text, kN, max_tokens, 40);
  };
  auto backend = kernels::CreateBackend(*model_, kernels::Device::kCpu, 0);
  ASSERT_TRUE(backend.ok());
  EngineConfig config;
  config.kv_cache_bytes = int64_t(128) << 20;
  config.prefix_caching = true;
  auto engine = Engine::Create(config, **backend);
  ASSERT_TRUE(engine.ok()) << engine.status();

  const std::vector<Request> requests = group("g", 10);
  const int64_t prompt = int64_t(requests[0].prompt.size());
  const int64_t bs = config.block_size;
  ASSERT_GT(prompt, 4 * bs) << "the prompt was meant to span several blocks";
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  ASSERT_TRUE(SubmitGroup(**engine, requests, &sinks).ok());
  for (auto& sk : sinks) ASSERT_TRUE(sk->Wait(300));
  ASSERT_TRUE((*engine)->WaitIdle(10));
  const EngineStats stats = (*engine)->Stats();
  // The later three found all but the last token's block in the cache and computed the rest.
  const int64_t shared = (prompt - 1) / bs * bs;
  EXPECT_EQ(stats.counters.prefix_hit_tokens, (kN - 1) * shared);
  EXPECT_EQ(stats.counters.prompt_tokens, prompt + (kN - 1) * (prompt - shared));

  // Each completion alone (no group, no prefix cache) gives the same tokens; seeds differ, so
  // the completions differ.
  EngineConfig plain_config;
  plain_config.kv_cache_bytes = int64_t(128) << 20;
  auto plain = Engine::Create(plain_config, **backend);
  ASSERT_TRUE(plain.ok());
  for (int i = 0; i < kN; ++i) {
    Request alone = requests[i];
    alone.group_id.clear();
    alone.group_index = 0;
    auto sink = std::make_shared<CollectingSink>();
    ASSERT_TRUE((*plain)->Submit(alone, sink).ok());
    ASSERT_TRUE(sink->Wait(300));
    EXPECT_EQ(sinks[i]->info.reason, FinishReason::kLength) << i;
    EXPECT_EQ(sinks[i]->tokens, sink->tokens) << "completion " << i;
  }
  EXPECT_NE(sinks[0]->tokens, sinks[1]->tokens);
  EXPECT_NE(sinks[2]->tokens, sinks[3]->tokens);

  // Cancelling the group's id cancels every completion: at once (the later ones still wait
  // for the prompt), and once all of them generate.
  for (bool at_once : {true, false}) {
    SCOPED_TRACE(at_once ? "cancelled at once" : "cancelled while generating");
    const std::string id = at_once ? "h" : "i";
    std::vector<std::shared_ptr<CollectingSink>> long_sinks;
    ASSERT_TRUE(SubmitGroup(**engine, group(id, 400), &long_sinks).ok());
    while (!at_once && long_sinks[kN - 1]->count() < 2 && !long_sinks[kN - 1]->finished) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    (*engine)->Cancel(id);
    for (auto& sk : long_sinks) {
      ASSERT_TRUE(sk->Wait(300));
      EXPECT_EQ(sk->info.reason, FinishReason::kCancelled);
      EXPECT_LT(sk->info.completion_tokens, 400);
    }
  }
  ASSERT_TRUE((*engine)->WaitIdle(10));

  // When the first completion goes before computing the prompt, the next takes its place: the
  // other two adopt its blocks (a new prompt, so nothing is cached before).
  text = "Another passage altogether, about rivers and mills and weather. " + text;
  const std::vector<Request> second = group("j", 4);
  const int64_t second_shared = (int64_t(second[0].prompt.size()) - 1) / bs * bs;
  const int64_t hits_before = (*engine)->Stats().counters.prefix_hit_tokens;
  std::vector<std::shared_ptr<CollectingSink>> second_sinks;
  ASSERT_TRUE(SubmitGroup(**engine, second, &second_sinks).ok());
  (*engine)->Cancel("j/0");
  for (auto& sk : second_sinks) ASSERT_TRUE(sk->Wait(300));
  for (int i = 1; i < kN; ++i) EXPECT_EQ(second_sinks[i]->info.reason, FinishReason::kLength) << i;
  EXPECT_GE((*engine)->Stats().counters.prefix_hit_tokens - hits_before, 2 * second_shared);
  ASSERT_TRUE((*engine)->WaitIdle(10));
  const EngineStats idle = (*engine)->Stats();
  EXPECT_EQ(idle.pages_used_k + idle.pages_used_v, 0) << "pages leaked";
  EXPECT_EQ(idle.pages_free, idle.pages_total);
}

// A group whose first completion ends in its prompt's step (one token, as for classification
// or a first-token sample): the rest go together in the next step, adopting its blocks. They
// waited for whichever member led next, so the lead passed on one completion per step (n = 128
// took 127 steps through the server).
TEST_F(EngineTest, AGroupWhoseFirstCompletionEndsWithItsPromptRunsTheRestTogether) {
  std::string text = "Read the passage and answer in one word. ";
  for (const auto& p : Prompts()) text += p + " ";
  constexpr int kN = 8;
  const std::vector<Request> requests = MakeGroup("one", text, kN, 1, 7);
  auto backend = kernels::CreateBackend(*model_, kernels::Device::kCpu, 0);
  ASSERT_TRUE(backend.ok());
  EngineConfig config;
  config.kv_cache_bytes = int64_t(128) << 20;
  config.prefix_caching = true;
  auto engine = Engine::Create(config, **backend);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const int64_t prompt = int64_t(requests[0].prompt.size());
  const int64_t bs = config.block_size;
  ASSERT_GT(prompt, 4 * bs);
  ASSERT_LE(prompt + (kN - 1) * bs, config.scheduler.max_num_batched_tokens)
      << "each step's token budget was meant to hold the prompt, and then the rest at once";

  std::vector<std::shared_ptr<CollectingSink>> collecting;
  ASSERT_TRUE(SubmitGroup(**engine, requests, &collecting).ok());
  for (auto& sk : collecting) ASSERT_TRUE(sk->Wait(300));
  ASSERT_TRUE((*engine)->WaitIdle(10));
  const EngineStats stats = (*engine)->Stats();
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(collecting[i]->info.reason, FinishReason::kLength) << i;
    EXPECT_EQ(collecting[i]->info.completion_tokens, 1) << i;
  }
  // Step 1: the first computes the prompt and ends; step 2: the other seven.
  EXPECT_EQ(stats.counters.steps, 2);
  const int64_t shared = (prompt - 1) / bs * bs;
  EXPECT_EQ(stats.counters.prefix_hit_tokens, (kN - 1) * shared) << "the prompt computed once";
  EXPECT_EQ(stats.pages_used_k + stats.pages_used_v, 0) << "pages leaked";
}

// Prompt log-probabilities: every prompt token is scored once (in chunks of at most
// kMaxScoredTokensPerStep, batched with other requests' tokens, and also when the prefix cache
// holds the prompt's blocks: a scoring request computes them), as the model scores it
// computed alone; max_tokens = 0 scores without generating.
TEST_F(EngineTest, PromptLogprobsScoreEveryPromptTokenEvenWhenItsBlocksAreCached) {
  std::string text = "A careful reader notes every detail. ";
  for (int round = 0; round < 2; ++round) {
    for (const auto& p : Prompts()) text += p + " ";
  }
  const Request plain = MakeRequest("plain", text, 4);
  const std::vector<int32_t>& prompt = plain.prompt;
  const int64_t P = int64_t(prompt.size());
  const int64_t vocab = model_->config().vocab_size;
  ASSERT_GT(P, kMaxScoredTokensPerStep) << "the prompt was meant to take several steps";
  // Alone: every position's logits in one pass.
  auto runner = SequenceRunner::Create(*solo_backend_, P);
  ASSERT_TRUE(runner.ok());
  auto rows = runner->Append(prompt, /*all_logits=*/true);
  ASSERT_TRUE(rows.ok());
  std::vector<float> want(P - 1);
  std::vector<int32_t> want_top1(P - 1);
  // The rank: 1 + tokens with a higher logit. Batched rows differ from these in the last
  // bits, so it may be anywhere between the counts of tokens clearly and barely higher.
  std::vector<int32_t> rank_lo(P - 1, 1), rank_hi(P - 1, 1);
  for (int64_t i = 1; i < P; ++i) {
    const float* row = rows->data() + (i - 1) * vocab;
    double m = -1e30, sum = 0;
    for (int64_t v = 0; v < vocab; ++v) m = std::max<double>(m, row[v]);
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - m);
    want[i - 1] = float(row[prompt[i]] - (m + std::log(sum)));
    want_top1[i - 1] = int32_t(std::max_element(row, row + vocab) - row);
    const float own = row[prompt[i]];
    for (int64_t v = 0; v < vocab; ++v) {
      rank_lo[i - 1] += row[v] > own + 1e-3f;
      rank_hi[i - 1] += row[v] > own - 1e-3f && v != prompt[i];
    }
  }

  EngineConfig config;
  config.kv_cache_bytes = int64_t(128) << 20;
  config.prefix_caching = true;
  auto engine = CpuEngine(config);
  ASSERT_NE(engine, nullptr);
  // Each scoring request runs beside three others (their rows are in the same steps).
  auto run = [&](const Request& r) {
    std::vector<std::shared_ptr<CollectingSink>> others;
    for (int i = 0; i < 3; ++i) {
      Request other = MakeRequest(absl::StrCat(r.id, "-other", i), Prompts()[i], 8);
      others.push_back(std::make_shared<CollectingSink>());
      EXPECT_TRUE(engine->Submit(other, others.back()).ok());
    }
    auto sink = std::make_shared<CollectingSink>();
    EXPECT_TRUE(engine->Submit(r, sink).ok());
    EXPECT_TRUE(sink->Wait(300));
    for (auto& o : others) EXPECT_TRUE(o->Wait(300));
    return sink;
  };
  const auto first = run(plain);  // caches the prompt's blocks
  EXPECT_EQ(first->prompt_deliveries, 0) << "scores nobody asked for";

  Request score = plain;
  score.id = "score";
  score.prompt_logprobs = 2;
  score.stopping.max_tokens = 0;
  const int64_t steps_before = engine->Stats().counters.steps;
  const auto scored = run(score);
  EXPECT_EQ(scored->info.reason, FinishReason::kLength);
  EXPECT_EQ(scored->info.completion_tokens, 0);
  EXPECT_TRUE(scored->tokens.empty());
  EXPECT_GE(engine->Stats().counters.steps - steps_before,
            (P + kMaxScoredTokensPerStep - 1) / kMaxScoredTokensPerStep);
  EXPECT_EQ(scored->prompt_deliveries, 1);
  EXPECT_EQ(scored->prompt_token_ids, prompt);
  ASSERT_EQ(int64_t(scored->prompt_logprobs.size()), P - 1);
  ASSERT_EQ(int64_t(scored->prompt_top.size()), P - 1);
  ASSERT_EQ(int64_t(scored->prompt_ranks.size()), P - 1);
  int64_t ranked_first = 0;
  for (int64_t i = 0; i < P - 1; ++i) {
    EXPECT_NEAR(scored->prompt_logprobs[i], want[i], 1e-4) << "prompt token " << i + 1;
    EXPECT_GE(scored->prompt_ranks[i], rank_lo[i]) << "prompt token " << i + 1;
    EXPECT_LE(scored->prompt_ranks[i], rank_hi[i]) << "prompt token " << i + 1;
    ranked_first += scored->prompt_ranks[i] == 1;
    ASSERT_EQ(scored->prompt_top[i].size(), 2u);
    EXPECT_EQ(scored->prompt_top[i][0].first, want_top1[i]) << "prompt token " << i + 1;
    EXPECT_GE(scored->prompt_top[i][0].second, scored->prompt_top[i][1].second);
  }
  // Not every token the model's first choice, nor none of them (the prompt repeats itself).
  EXPECT_GT(ranked_first, 0);
  EXPECT_LT(ranked_first, P - 1);

  // Scores and tokens together: the tokens are the plain request's.
  Request both = plain;
  both.id = "both";
  both.prompt_logprobs = 0;
  const auto with_tokens = run(both);
  EXPECT_EQ(with_tokens->tokens, first->tokens);
  EXPECT_EQ(with_tokens->prompt_deliveries, 1);
  ASSERT_EQ(int64_t(with_tokens->prompt_logprobs.size()), P - 1);
  EXPECT_TRUE(with_tokens->prompt_top[0].empty());
  for (int64_t i = 0; i < P - 1; ++i) {
    EXPECT_NEAR(with_tokens->prompt_logprobs[i], want[i], 1e-4) << "prompt token " << i + 1;
  }
  ASSERT_TRUE(engine->WaitIdle(10));
  EXPECT_EQ(engine->Stats().pages_used_k + engine->Stats().pages_used_v, 0);
}

// Preempted in the middle of its prompt, a scoring request recomputes the prompt but scores
// each token once: a pool of 14 blocks of 4 rows per table, 4 tokens per step (a long
// prefill) and two requests that decode long force it. (Mutation-checked: without the skip
// of scored positions this fails on the scores' count.)
TEST_F(EngineTest, PromptLogprobsSurvivePreemptionWithoutRepeats) {
  const auto& c = model_->config();
  auto backend = kernels::CreateBackend(*model_, kernels::Device::kCpu, 0);
  ASSERT_TRUE(backend.ok());
  EngineConfig config;
  config.block_size = 4;
  const int64_t page_bytes = config.block_size * (*backend)->kv_row_bytes();
  config.kv_cache_bytes = 2 * 14 * c.num_layers * c.num_kv_heads * page_bytes;
  config.scheduler.max_num_batched_tokens = 4;
  config.scheduler.max_num_seqs = 4;
  auto engine = Engine::Create(config, **backend);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const auto prompts = Prompts();
  std::vector<Request> requests;
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  std::vector<std::shared_ptr<TokenSink>> as_sinks;
  // Two short prompts that decode long, two longer prompts to score; queued together (one
  // SubmitAll), so that the engine's schedule, and the preemption, is the same every run.
  for (auto [i, tokens, score] : {std::tuple{4, 28, false}, std::tuple{1, 4, true},
                                  std::tuple{0, 28, false}, std::tuple{2, 3, true}}) {
    requests.push_back(MakeRequest(absl::StrCat("s", i), prompts[i], tokens));
    requests.back().prompt_logprobs = score ? 1 : -1;
    requests.back().stopping.ignore_eos = true;
    sinks.push_back(std::make_shared<CollectingSink>());
    as_sinks.push_back(sinks.back());
  }
  ASSERT_TRUE((*engine)->SubmitAll(requests, as_sinks).ok());
  for (auto& sk : sinks) ASSERT_TRUE(sk->Wait(300));
  EXPECT_GT((*engine)->Stats().counters.preemptions, 0) << "the pool was meant to force preemption";
  EXPECT_GT(sinks[3]->info.preemptions, 0) << "the longer prompt to score was meant to be preempted";
  for (size_t r = 0; r < requests.size(); ++r) {
    const std::vector<int32_t>& prompt = requests[r].prompt;
    const int64_t P = int64_t(prompt.size());
    EXPECT_EQ(sinks[r]->tokens,
              GreedyAlone(*solo_backend_, prompt, requests[r].stopping.max_tokens))
        << "request " << r;
    if (requests[r].prompt_logprobs < 0) {
      EXPECT_EQ(sinks[r]->prompt_deliveries, 0) << r;
      continue;
    }
    auto runner = SequenceRunner::Create(*solo_backend_, P);
    ASSERT_TRUE(runner.ok());
    auto rows = runner->Append(prompt, /*all_logits=*/true);
    ASSERT_TRUE(rows.ok());
    EXPECT_EQ(sinks[r]->prompt_deliveries, 1) << r;
    ASSERT_EQ(int64_t(sinks[r]->prompt_logprobs.size()), P - 1) << "request " << r;
    for (int64_t i = 1; i < P; ++i) {
      std::vector<std::pair<int32_t, float>> top;
      const float want = ScoreToken(std::span<const float>(rows->data() + (i - 1) * c.vocab_size,
                                                           c.vocab_size),
                                    prompt[i], 1, &top);
      EXPECT_NEAR(sinks[r]->prompt_logprobs[i - 1], want, 1e-4) << "request " << r << " token " << i;
    }
  }
}

// A pool of 8 blocks per table: cached blocks must give way to new work (evicted least
// recently used first), preempted sequences find their own blocks again, and every request
// still gets the tokens it gets alone — dense, and under Top-θ with VMC, where a re-admitted
// sequence's V sums come from SumVRows (θ = 0.1 past 4 rows, so that short rows drop some).
TEST_F(EngineTest, PrefixCacheGivesWayToNewWorkInATinyPool) {
  const model::ThetaTable table = ConstantPostTheta(0.1f, 4);
  // Dense; Top-θ (both over the CPU's default, f16 pages, whose V sums SumVRows reads back
  // from 16-bit rows); Top-θ over q8_0 pages, whose rows SumVRows dequantizes.
  for (auto [top_theta, kv_dtype] : {std::pair{false, kernels::KvDtype::kAuto},
                                     std::pair{true, kernels::KvDtype::kAuto},
                                     std::pair{true, kernels::KvDtype::kQ8_0}}) {
    SCOPED_TRACE(absl::StrCat(top_theta ? "top-theta" : "dense", ", KV ",
                              std::string(kernels::KvDtypeName(kv_dtype))));
    auto make_backend = [&] {
      return top_theta ? TopThetaBackend(table, kv_dtype)
                       : kernels::CreateBackend(*model_, kernels::Device::kCpu, 0);
    };
    auto backend = make_backend();
    ASSERT_TRUE(backend.ok());
    auto solo_backend = make_backend();
    ASSERT_TRUE(solo_backend.ok());
    const auto& c = model_->config();
    EngineConfig config;
    config.block_size = 4;
    const int64_t page_bytes = config.block_size * (*backend)->kv_row_bytes();
    config.kv_cache_bytes = 2 * 8 * c.num_layers * c.num_kv_heads * page_bytes;
    config.scheduler.max_num_batched_tokens = 6;
    config.scheduler.max_num_seqs = 4;
    config.prefix_caching = true;
    auto engine = Engine::Create(config, **backend);
    ASSERT_TRUE(engine.ok()) << engine.status();

    const auto prompts = Prompts();
    // Four at once (two prompts, twice each): the pool forces preemption.
    std::vector<Request> requests;
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (int i = 0; i < 4; ++i) {
      requests.push_back(MakeRequest(absl::StrCat("p", i), prompts[i % 2 ? 0 : 4], 14));
      requests.back().stopping.ignore_eos = true;
      sinks.push_back(std::make_shared<CollectingSink>());
      ASSERT_TRUE((*engine)->Submit(requests.back(), sinks.back()).ok());
    }
    for (auto& s : sinks) ASSERT_TRUE(s->Wait(300));
    EXPECT_GT((*engine)->Stats().counters.preemptions, 0) << "the pool was meant to force preemption";
    // Then one after another: each needs pages that only evicting the last one's blocks frees.
    for (int i : {0, 3, 5, 6, 7, 3}) {
      requests.push_back(MakeRequest(absl::StrCat("s", requests.size()), prompts[i], 10));
      requests.back().stopping.ignore_eos = true;
      sinks.push_back(std::make_shared<CollectingSink>());
      ASSERT_TRUE((*engine)->Submit(requests.back(), sinks.back()).ok());
      ASSERT_TRUE(sinks.back()->Wait(300));
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(sinks[i]->info.reason, FinishReason::kLength) << i << ": " << sinks[i]->info.status;
      EXPECT_EQ(sinks[i]->tokens,
                GreedyAlone(**solo_backend, requests[i].prompt, requests[i].stopping.max_tokens))
          << "request " << i;
    }
    ASSERT_TRUE((*engine)->WaitIdle(10));
    const EngineStats s = (*engine)->Stats();
    EXPECT_GT(s.counters.prefix_hit_tokens, 0);
    EXPECT_GT(s.counters.prefix_evicted_blocks, 0);
    EXPECT_EQ(s.pages_free, s.pages_total);
    const auto& pool = (*engine)->pool_for_tests();
    EXPECT_EQ(pool.num_free() + pool.num_cached_only(), pool.num_pages());
  }
}

}  // namespace
}  // namespace thetaserve::scheduler
