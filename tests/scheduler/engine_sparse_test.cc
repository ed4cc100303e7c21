// The engine and the sequence runner under Top-θ's V policies on the real model: sparse stores
// fewer V rows and its greedy outputs do not depend on the load, offload gives the full policy's
// logits with the sparse policy's rows in the pool, and a mass budget admits long prompts that
// dense must run one at a time.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/scheduler/engine_fixture.h"

namespace thetaserve::scheduler {

namespace {
// The test prompts six times over (~600 tokens): prefills of many 64-token chunks.
std::string SixTimes(const std::vector<std::string>& prompts) {
  std::string text;
  for (const auto& p : prompts) text += p + " ";
  return text + text + text + text + text + text;
}
}  // namespace

void EngineTest::ExpectOffloadGivesTheFullPolicysLogits(kernels::KvDtype kv_dtype) {
  const model::ThetaTable table = ConstantPostTheta(0.02f);
  auto backend = TopThetaBackend(table, kv_dtype);
  ASSERT_TRUE(backend.ok());
  const cache::SparsePolicy sparse = MassBudgetPolicy();
  const cache::SparsePolicy offload = MassBudgetPolicy(/*offload=*/true);
  std::string text;
  for (const auto& p : Prompts()) text += p + " ";
  const std::vector<int32_t> prompt = model_->tokenizer().Encode(text + text + text, true);
  ASSERT_GT(prompt.size(), 200u);
  constexpr int kDecode = 32;

  struct Run {
    std::vector<std::vector<float>> logits;  // every prompt token's, then each decode step's
    std::vector<int32_t> tokens;             // greedy under the full policy
    int64_t resident = 0, offloaded = 0, dropped = 0, dense = 0;
    kernels::AttentionStats stats;
  };
  // Runs one policy to the end before the next starts: runners on one backend share its pool.
  auto run = [&](const cache::SparsePolicy& policy, const std::vector<int32_t>* tokens) {
    Run r;
    r.stats.Reset(model_->config().num_layers);
    auto runner = SequenceRunner::Create(**backend, prompt.size() + kDecode, 16, policy);
    EXPECT_TRUE(runner.ok());
    auto logits = runner->Append(prompt, true, 64, &r.stats);
    EXPECT_TRUE(logits.ok());
    r.logits.push_back(*logits);  // [prompt, vocab]
    const int64_t vocab = model_->config().vocab_size;
    logits->erase(logits->begin(), logits->end() - vocab);  // the last token's
    for (int i = 0; i < kDecode; ++i) {
      r.logits.push_back(*logits);
      const int32_t t = tokens ? (*tokens)[i]
                               : static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) -
                                                      logits->begin());
      r.tokens.push_back(t);
      logits = runner->Append(std::span<const int32_t>(&t, 1), false, 64, &r.stats);
      EXPECT_TRUE(logits.ok());
    }
    r.logits.push_back(*logits);
    r.resident = runner->v_rows_resident();
    r.offloaded = runner->rows_offloaded();
    r.dropped = runner->rows_dropped();
    r.dense = runner->v_rows_dense();
    return r;
  };
  const Run full = run(cache::SparsePolicy{}, nullptr);
  const Run drop = run(sparse, &full.tokens);
  const Run off = run(offload, &full.tokens);

  ASSERT_EQ(off.logits.size(), full.logits.size());
  for (size_t i = 0; i < full.logits.size(); ++i) {
    ASSERT_EQ(off.logits[i], full.logits[i]) << "offload differs from full at step " << i;
  }
  bool sparse_differs = false;
  for (size_t i = 0; i < full.logits.size(); ++i) sparse_differs |= drop.logits[i] != full.logits[i];
  EXPECT_TRUE(sparse_differs) << "the sparse policy's dropped rows were never retained";
  EXPECT_GT(drop.stats.retained_but_evicted, 0);

  // The KV pool holds what the sparse policy holds, the host pool the rows it drops. Not to
  // the row: which rows a budget keeps depends on the retained mass, which the two runs
  // compute from slightly different activations (the sparse run's attention misses rows).
  EXPECT_NEAR(double(off.resident), double(drop.resident), 0.01 * double(drop.resident));
  EXPECT_LT(off.resident, off.dense / 2);
  EXPECT_NEAR(double(off.offloaded), double(drop.dropped), 0.01 * double(drop.dropped));
  EXPECT_EQ(off.dropped, 0);
  EXPECT_EQ(off.resident + off.offloaded, off.dense);
  // Rows retained after they left the KV pool were read from the host pool instead of being
  // compensated for, and counted as such: the full policy's reads, some from the host.
  EXPECT_EQ(off.stats.retained_but_evicted, 0);
  EXPECT_GT(off.stats.v_rows_read_host, 0);
  EXPECT_NEAR(double(off.stats.v_rows_read_host), double(drop.stats.retained_but_evicted),
              0.01 * double(drop.stats.retained_but_evicted));
  EXPECT_EQ(off.stats.v_rows_read, full.stats.v_rows_read);
}

// With fixed compaction (serve --fixed-compaction) what the sparse V store keeps, and so a
// greedy output, does not depend on the load: a prompt is compacted at fixed positions
// (SparseChunkEnd: multiples of the step's budget, and its end), whatever chunks the budget
// and long_prefill_tokens cut while steps are shared. Prompts of four lengths generate the same all at once, and with one arriving while
// another's prompt runs, as each alone in the engine, and as the sequence runner does (the
// budget's chunks, then a token at a time: what eval measures). The engine compacted at
// every chunk's end (as it still does by default), and outputs changed with the load (7 of 17
// in a test run on 2026-12-06; 4 of 4 here, all at once).
void EngineTest::ExpectSparseOutputsIndependentOfTheLoad(cache::SparsePolicy policy) {
  policy.fixed_compaction = true;  // serve --fixed-compaction
  const model::ThetaTable table = ConstantPostTheta(0.02f);
  auto backend = TopThetaBackend(table);
  ASSERT_TRUE(backend.ok());
  constexpr int kStride = 64, kTokens = 24;
  const std::vector<std::string> p = Prompts();
  const std::string six = SixTimes(p);
  const std::string mixed = p[2] + " " + p[1] + " " + p[4] + " " + p[0] + " ";
  const std::string other = p[1] + " " + p[6] + " " + p[3] + " " + p[2] + " " + p[5] + " ";
  const std::vector<std::string> texts = {six, mixed + mixed + mixed + p[7],
                                          six.substr(0, six.size() / 2),
                                          other + other + p[0]};
  std::vector<Request> requests;
  for (size_t i = 0; i < texts.size(); ++i) {
    requests.push_back(MakeRequest(absl::StrCat("r", i), texts[i], kTokens));
    requests.back().stopping.ignore_eos = true;
    SCOPED_TRACE(absl::StrCat("prompt ", i, ": ", requests.back().prompt.size(), " tokens"));
    ASSERT_GT(requests.back().prompt.size(), size_t(kStride));  // several compaction points
    ASSERT_NE(requests.back().prompt.size() % kStride, 0u);    // and an end between two
  }

  // The sequence runner, alone: the prompt in chunks of the stride, then a token at a time.
  auto runner_greedy = [&](const std::vector<int32_t>& prompt, const cache::SparsePolicy& pol) {
    auto runner = SequenceRunner::Create(**backend, prompt.size() + kTokens, 16, pol);
    EXPECT_TRUE(runner.ok());
    auto logits = runner->Append(prompt, false, kStride);
    std::vector<int32_t> out;
    for (int k = 0; k < kTokens && logits.ok(); ++k) {
      out.push_back(int32_t(std::max_element(logits->begin(), logits->end()) - logits->begin()));
      logits = runner->Append(std::span<const int32_t>(&out.back(), 1), false, kStride);
    }
    EXPECT_TRUE(logits.ok()) << logits.status();
    return out;
  };
  std::vector<std::vector<int32_t>> runner_out;
  int differ_from_full = 0;
  for (const Request& r : requests) {
    runner_out.push_back(runner_greedy(r.prompt, policy));
    differ_from_full += runner_out.back() != runner_greedy(r.prompt, cache::SparsePolicy{});
  }
  // Else the dropped rows never mattered, and this could not fail.
  EXPECT_GT(differ_from_full, 0) << "the sparse policy changed no output";

  EngineConfig config;
  config.kv_cache_bytes = int64_t(256) << 20;
  config.scheduler.max_num_batched_tokens = kStride;
  config.scheduler.long_prefill_tokens = 24;  // shared steps cut chunks that cross the stride
  config.sparse = policy;
  auto engine = Engine::Create(config, **backend);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto submit = [&](const Request& r) {
    auto sink = std::make_shared<CollectingSink>();
    EXPECT_TRUE((*engine)->Submit(r, sink).ok());
    return sink;
  };
  auto expect_runner_output = [&](size_t i, CollectingSink& sink, const char* how) {
    ASSERT_TRUE(sink.Wait(300)) << how;
    EXPECT_EQ(sink.tokens, runner_out[i]) << how << ": prompt " << i << " ("
                                          << requests[i].prompt.size() << " tokens)";
  };
  for (size_t i = 0; i < requests.size(); ++i) {
    auto sink = submit(requests[i]);
    expect_runner_output(i, *sink, "alone");
  }
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (const Request& r : requests) sinks.push_back(submit(r));
  for (size_t i = 0; i < requests.size(); ++i) expect_runner_output(i, *sinks[i], "all at once");
  // One arriving while another's prompt is part-way: the first's chunks are cut where the
  // second takes the budget.
  sinks.clear();
  sinks.push_back(submit(requests[0]));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  for (size_t i = 1; i < requests.size(); ++i) sinks.push_back(submit(requests[i]));
  for (size_t i = 0; i < requests.size(); ++i) expect_runner_output(i, *sinks[i], "staggered");
  ASSERT_TRUE((*engine)->WaitIdle(10));
  EXPECT_GT((*engine)->Stats().counters.v_rows_evicted, 0);
  EXPECT_EQ((*engine)->pool_for_tests().num_free(), (*engine)->pool_for_tests().num_pages());
}

namespace {

TEST_F(EngineTest, SparsePolicyOutputDoesNotDependOnTheLoad) {
  cache::SparsePolicy policy;  // the recency rule: rows the last 16 queries retained
  policy.enabled = true;
  policy.local_window = 32;
  policy.sink_tokens = 4;
  policy.obs_window = 16;
  ExpectSparseOutputsIndependentOfTheLoad(policy);
}

// The same with a mass budget (10% of the rows leaving the tail together, by mean retained
// probability): the rows ranked together are those between two compaction points. (Threads
// add a row's mass in no fixed order; in fixed point, base/mass_units.h, its sum is the same.)
TEST_F(EngineTest, MassBudgetOutputDoesNotDependOnTheLoad) {
  cache::SparsePolicy policy = MassBudgetPolicy();
  policy.keep_fraction = 0.1;
  ExpectSparseOutputsIndependentOfTheLoad(policy);
}

TEST_F(EngineTest, SparsePolicyStoresFewerVRowsAndReturnsEveryPage) {
  const model::ThetaTable table = ConstantPostTheta(0.02f);
  auto backend = TopThetaBackend(table);
  ASSERT_TRUE(backend.ok());
  EngineConfig config;
  config.kv_cache_bytes = int64_t(256) << 20;
  config.sparse.enabled = true;
  config.sparse.local_window = 32;
  config.sparse.sink_tokens = 4;
  config.sparse.obs_window = 16;
  auto engine = Engine::Create(config, **backend);
  ASSERT_TRUE(engine.ok());
  std::atomic<int64_t> min_resident_ratio_permille{1000};
  (*engine)->SetObserver([&](const EngineStats& s, const StepStats*) {
    if (s.v_rows_dense_equivalent > 0 && s.running > 0) {
      const int64_t r = 1000 * s.v_rows_resident / s.v_rows_dense_equivalent;
      if (r < min_resident_ratio_permille.load()) min_resident_ratio_permille.store(r);
    }
  });
  std::string text;
  for (const auto& p : Prompts()) text += p + " ";
  text += text;  // ~200 tokens
  ASSERT_NO_FATAL_FAILURE(RunFixedLength(**engine, "s", text, 4, 48));
  ASSERT_TRUE((*engine)->WaitIdle(10));
  const EngineStats s = (*engine)->Stats();
  EXPECT_LT(min_resident_ratio_permille.load(), 700) << "the sparse store should hold well under the dense rows";
  EXPECT_GT(s.counters.v_rows_evicted, 0);
  EXPECT_LT(s.counters.v_rows_read, s.counters.v_rows_read_dense);
  EXPECT_EQ((*engine)->pool_for_tests().num_free(), (*engine)->pool_for_tests().num_pages())
      << "pages leaked under the sparse policy";
}

// The runner applies the sparse policy itself after every chunk, as the engine does after
// every step: one Append in chunks of 64 leaves the same cache and logits as separate Appends
// of 64 tokens (each compacted), every V row is either resident or counted as dropped, the
// cache holds well under the dense rows, and decoding goes on from the compacted cache.
TEST_F(EngineTest, SequenceRunnerCompactsAfterEveryChunkUnderASparsePolicy) {
  const model::ThetaTable table = ConstantPostTheta(0.02f);
  auto backend = TopThetaBackend(table);
  ASSERT_TRUE(backend.ok());
  const cache::SparsePolicy policy = MassBudgetPolicy();
  std::string text;
  for (const auto& p : Prompts()) text += p + " ";
  const std::vector<int32_t> prompt = model_->tokenizer().Encode(text + text + text, true);
  ASSERT_GT(prompt.size(), 200u);
  const std::span<const int32_t> all(prompt);

  auto whole = SequenceRunner::Create(**backend, prompt.size() + 40, 16, policy);
  ASSERT_TRUE(whole.ok());
  auto logits = whole->Append(all, false, 64);
  ASSERT_TRUE(logits.ok());
  EXPECT_GT(whole->rows_dropped(), 0);
  EXPECT_EQ(whole->v_rows_resident() + whole->rows_dropped(), whole->v_rows_dense());
  EXPECT_LT(whole->v_rows_resident(), whole->v_rows_dense() / 2)
      << "window 32 + 5% of the older rows should hold well under half the dense rows";

  // The same prompt in separate calls of one chunk each: compaction after every call. Were
  // Append to compact once per call (or not at all), the two caches would differ.
  auto parts = SequenceRunner::Create(**backend, prompt.size() + 40, 16, policy);
  ASSERT_TRUE(parts.ok());
  absl::StatusOr<std::vector<float>> last;
  for (size_t i = 0; i < prompt.size(); i += 64) {
    last = parts->Append(all.subspan(i, std::min<size_t>(64, prompt.size() - i)), false, 64);
    ASSERT_TRUE(last.ok());
  }
  EXPECT_EQ(parts->rows_dropped(), whole->rows_dropped());
  EXPECT_EQ(parts->v_rows_resident(), whole->v_rows_resident());
  EXPECT_EQ(*last, *logits);

  // Decoding continues from the compacted cache; 32 more tokens push two more blocks out of
  // the window, and the budget drops most of their rows.
  const int64_t dropped_after_prompt = whole->rows_dropped();
  for (int i = 0; i < 32; ++i) {
    const auto best = std::max_element(logits->begin(), logits->end());
    const int32_t t = static_cast<int32_t>(best - logits->begin());
    logits = whole->Append(std::span<const int32_t>(&t, 1));
    ASSERT_TRUE(logits.ok());
    for (float x : *logits) ASSERT_TRUE(std::isfinite(x));
  }
  EXPECT_GT(whole->rows_dropped(), dropped_after_prompt);
  EXPECT_EQ(whole->v_rows_resident() + whole->rows_dropped(), whole->v_rows_dense());
  whole->Reset();
  EXPECT_EQ(whole->rows_dropped(), 0);
  EXPECT_EQ(whole->v_rows_resident(), 0);
}

// The offload policy stores in the KV pool what the sparse policy does, and moves the rows the
// sparse policy drops to the host pool, where attention still reads them: its logits are the
// full policy's, bit for bit, for every prompt token (64-token chunks, compacted after each)
// and every decode step. The sparse run
// beside it must differ from full (else the rows moved were never needed and this could not
// fail).
TEST_F(EngineTest, OffloadPolicyGivesTheFullPolicysLogitsWithTheSparsePolicysVRows) {
  ExpectOffloadGivesTheFullPolicysLogits(kernels::KvDtype::kAuto);
}

TEST_F(EngineTest, OffloadPolicyGivesTheFullPolicysLogitsWithF16Pages) {
  ExpectOffloadGivesTheFullPolicysLogits(kernels::KvDtype::kF16);
}

TEST_F(EngineTest, OffloadPolicyGivesTheFullPolicysLogitsWithFp8Pages) {
  ExpectOffloadGivesTheFullPolicysLogits(kernels::KvDtype::kFp8E4M3);
}

// q8_0 rows are longer than head_dim (their scales): the sparse store's moves and the host
// copies carry whole rows.
TEST_F(EngineTest, OffloadPolicyGivesTheFullPolicysLogitsWithQ8_0Pages) {
  ExpectOffloadGivesTheFullPolicysLogits(kernels::KvDtype::kQ8_0);
}

// In the engine, concurrent requests under the offload policy generate what each generates
// alone under the full policy; every page of both pools comes back. With a host pool too small
// for what is moved, the rest is dropped (as under the sparse policy), and again nothing leaks.
TEST_F(EngineTest, OffloadPolicyInTheEngineMatchesFullPolicyRunsAndReturnsHostPages) {
  const model::ThetaTable table = ConstantPostTheta(0.02f);
  auto backend = TopThetaBackend(table);
  ASSERT_TRUE(backend.ok());
  std::string text;
  for (const auto& p : Prompts()) text += p + " ";
  text += text;  // ~200 tokens
  const std::vector<int32_t> prompt = model_->tokenizer().Encode(text, true);
  constexpr int kTokens = 40;
  const std::vector<int32_t> alone = GreedyAlone(**backend, prompt, kTokens);

  for (const int64_t host_bytes : {int64_t(64) << 20, int64_t(256) << 10}) {
    SCOPED_TRACE(absl::StrCat("offload bytes ", host_bytes));
    EngineConfig config;
    config.kv_cache_bytes = int64_t(256) << 20;
    config.sparse = MassBudgetPolicy(/*offload=*/true);
    config.offload_bytes = host_bytes;
    auto engine = Engine::Create(config, **backend);
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::atomic<int64_t> max_host_pages{0};
    (*engine)->SetObserver([&](const EngineStats& s, const StepStats*) {
      max_host_pages.store(std::max(max_host_pages.load(), s.host_pages_used));
    });
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (int i = 0; i < 3; ++i) {
      Request r = MakeRequest(absl::StrCat("o", i), text, kTokens);
      r.stopping.ignore_eos = true;
      sinks.push_back(std::make_shared<CollectingSink>());
      ASSERT_TRUE((*engine)->Submit(r, sinks.back()).ok());
    }
    for (auto& sk : sinks) ASSERT_TRUE(sk->Wait(300));
    ASSERT_TRUE((*engine)->WaitIdle(10));
    const EngineStats s = (*engine)->Stats();
    const int64_t page_bytes = s.page_bytes;
    EXPECT_EQ(s.host_pages_total, host_bytes / page_bytes);
    EXPECT_GT(s.counters.v_rows_offloaded, 0);
    EXPECT_GT(max_host_pages.load(), 0);
    EXPECT_EQ(s.host_pages_used, 0) << "host pages leaked";
    EXPECT_EQ(s.v_rows_host_resident, 0);
    EXPECT_EQ((*engine)->pool_for_tests().num_free(), (*engine)->pool_for_tests().num_pages())
        << "pages leaked under the offload policy";
    const int64_t tables = model_->config().num_layers * model_->config().num_kv_heads;
    const int64_t blocks = (int64_t(prompt.size()) + kTokens + config.block_size - 1) / config.block_size;
    const bool fits = host_bytes / page_bytes >= 3 * (blocks + 1) * tables;
    // The large pool is meant to hold every row, the small one not (else a branch below,
    // and what it checks, would silently go untested).
    ASSERT_EQ(fits, host_bytes == int64_t(64) << 20) << page_bytes << " bytes per page";
    if (fits) {
      // Room for every row: nothing dropped, and every request is its full-policy self.
      EXPECT_EQ(s.counters.v_rows_evicted, 0);
      EXPECT_EQ(s.counters.v_rows_retained_but_evicted, 0);
      for (auto& sk : sinks) EXPECT_EQ(sk->tokens, alone);
    } else {
      EXPECT_EQ(max_host_pages.load(), s.host_pages_total) << "the small host pool filled up";
      EXPECT_GT(s.counters.v_rows_evicted, 0) << "what did not fit was dropped";
    }
  }
}

// The K and V pages, in bytes, of one dense sequence of `text` and 8 generated tokens.
int64_t DenseKvBytes(const kernels::Backend& backend, const EngineConfig& config,
                     const std::string& text) {
  const int64_t tokens = int64_t(backend.model().tokenizer().Encode(text).size()) + 8;
  return Engine::KvBytesForSequence(backend, config.block_size, tokens);
}

// With a mass budget the engine compacts between prefill chunks and admission reserves the
// bounded V store: two long prompts that the pool cannot hold together dense run together.
TEST_F(EngineTest, MassBudgetAdmitsLongPromptsThatDenseMustRunOneAtATime) {
  const model::ThetaTable table = ConstantPostTheta(0.02f);
  const std::string text = SixTimes(Prompts());

  auto run = [&](bool sparse, int* max_running, int64_t* preemptions) {
    auto backend = TopThetaBackend(table);
    ASSERT_TRUE(backend.ok());
    EngineConfig config;
    config.scheduler.max_num_batched_tokens = 64;  // many prefill chunks
    config.kv_cache_bytes = DenseKvBytes(**backend, config, text) * 7 / 5;  // 1.4 dense prompts
    if (sparse) config.sparse = MassBudgetPolicy();
    auto engine = Engine::Create(config, **backend);
    ASSERT_TRUE(engine.ok());
    std::atomic<int> most{0};
    (*engine)->SetObserver([&](const EngineStats& s, const StepStats*) {
      most.store(std::max<int>(most.load(), static_cast<int>(s.running)));
    });
    ASSERT_NO_FATAL_FAILURE(RunFixedLength(**engine, "long", text, 2, 8));
    ASSERT_TRUE((*engine)->WaitIdle(10));
    *max_running = most.load();
    *preemptions = (*engine)->Stats().counters.preemptions;
    EXPECT_EQ((*engine)->pool_for_tests().num_free(), (*engine)->pool_for_tests().num_pages())
        << "pages leaked (sparse " << sparse << ")";
  };
  int dense_running = 0, sparse_running = 0;
  int64_t dense_preempt = 0, sparse_preempt = 0;
  run(false, &dense_running, &dense_preempt);
  run(true, &sparse_running, &sparse_preempt);
  EXPECT_EQ(dense_running, 1) << "the pool was meant to hold one dense prompt";
  EXPECT_EQ(sparse_running, 2);
  EXPECT_EQ(dense_preempt, 0);
  EXPECT_EQ(sparse_preempt, 0) << "the reservation must cover what the prompts grow to";
}

// A prompt whose dense K and V outgrow the whole pool: refused up front without a mass budget;
// with one it runs (dense K and the budget's bound on V, what admission reserves), where the
// check on arrival used to count dense V and refuse it too.
TEST_F(EngineTest, MassBudgetRunsAPromptWhoseDenseKvOutgrowsThePool) {
  const model::ThetaTable table = ConstantPostTheta(0.02f);
  const std::string text = SixTimes(Prompts());
  for (bool sparse : {false, true}) {
    SCOPED_TRACE(sparse ? "mass budget" : "dense V");
    auto backend = TopThetaBackend(table);
    ASSERT_TRUE(backend.ok());
    EngineConfig config;
    config.scheduler.max_num_batched_tokens = 64;
    // K alone is half of that; the budget bounds V (window 32 + a 64-token chunk, 5% kept)
    // near a sixth of it.
    config.kv_cache_bytes = DenseKvBytes(**backend, config, text) * 4 / 5;
    if (sparse) config.sparse = MassBudgetPolicy();
    auto engine = Engine::Create(config, **backend);
    ASSERT_TRUE(engine.ok());
    Request r = MakeRequest("big", text, 8);
    r.stopping.ignore_eos = true;
    auto sink = std::make_shared<CollectingSink>();
    const absl::Status st = (*engine)->Submit(r, sink);
    if (!sparse) {
      EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
      EXPECT_NE(st.message().find("the whole cache has"), std::string::npos) << st;
      continue;
    }
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_TRUE(sink->Wait(300));
    EXPECT_EQ(sink->info.reason, FinishReason::kLength);
    EXPECT_EQ(sink->info.completion_tokens, 8);
    ASSERT_TRUE((*engine)->WaitIdle(10));
    EXPECT_EQ((*engine)->Stats().counters.preemptions, 0);
    EXPECT_EQ((*engine)->pool_for_tests().num_free(), (*engine)->pool_for_tests().num_pages());
  }
}

}  // namespace
}  // namespace thetaserve::scheduler
