// The engine on the real model: concurrent greedy requests equal their solo runs, chunked
// prefill and preemption (tiny pools) change nothing, and every page comes back.
#include "scheduler/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/sequence_runner.h"
#include "model/model.h"
#include "model/theta_table.h"
#include "tests/scheduler/collecting_sink.h"
#include "tests/test_util.h"

namespace thetaserve::scheduler {
namespace {

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = model::Model::Load(testing::DefaultModelPath());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m).release();
    auto b = kernels::CreateBackend(*model_, kernels::Device::kCpu, 0);
    ASSERT_TRUE(b.ok());
    solo_backend_ = std::move(*b).release();
  }
  static void TearDownTestSuite() {
    delete solo_backend_;
    delete model_;
  }

  // Greedy continuation computed alone, without the engine.
  static std::vector<int32_t> Solo(const std::vector<int32_t>& prompt, int max_tokens) {
    auto runner = scheduler::SequenceRunner::Create(*solo_backend_, prompt.size() + max_tokens);
    EXPECT_TRUE(runner.ok());
    auto logits = runner->Append(prompt);
    std::vector<int32_t> out;
    const auto& stops = model_->tokenizer().stop_ids();
    while (true) {
      int32_t t = static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) -
                                       logits->begin());
      out.push_back(t);
      if (std::find(stops.begin(), stops.end(), t) != stops.end()) break;
      if (static_cast<int>(out.size()) >= max_tokens) break;
      logits = runner->Append(std::span<const int32_t>(&t, 1));
    }
    return out;
  }

  // Exactly `n` greedy tokens of `prompt` computed alone on `backend` (EOS ignored).
  static std::vector<int32_t> GreedyAlone(kernels::Backend& backend,
                                          const std::vector<int32_t>& prompt, int n) {
    auto runner = scheduler::SequenceRunner::Create(backend, prompt.size() + n);
    EXPECT_TRUE(runner.ok());
    auto logits = runner->Append(prompt);
    std::vector<int32_t> out;
    for (int k = 0; k < n; ++k) {
      int32_t t = static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
      out.push_back(t);
      logits = runner->Append(std::span<const int32_t>(&t, 1));
    }
    return out;
  }

  static std::vector<std::string> Prompts() {
    return {"The capital of France is",
            "In the beginning God created the heaven and the earth. And the earth was",
            "It is a truth universally acknowledged, that a single man in possession of a good "
            "fortune, must be in want of a",
            "def fibonacci(n):",
            "Once upon a time",
            "The three primary colors are",
            "Water boils at a temperature of",
            "My favourite book is"};
  }

  static Request MakeRequest(const std::string& id, const std::string& text, int max_tokens) {
    Request r;
    r.id = id;
    r.prompt = model_->tokenizer().Encode(text, true);
    r.sampling.temperature = 0;
    r.stopping.max_tokens = max_tokens;
    return r;
  }

  // n completions of `text` as the APIs split them: ids "<id>/<i>" in group `id`, sampled at
  // temperature 0.8 with seed first_seed + i, past EOS.
  static std::vector<Request> MakeGroup(const std::string& id, const std::string& text, int n,
                                        int max_tokens, uint64_t first_seed) {
    std::vector<Request> requests;
    for (int i = 0; i < n; ++i) {
      Request r = MakeRequest(absl::StrCat(id, "/", i), text, max_tokens);
      r.sampling.temperature = 0.8f;
      r.sampling.seed = first_seed + i;
      r.stopping.ignore_eos = true;
      r.group_id = id;
      r.group_index = i;
      requests.push_back(r);
    }
    return requests;
  }

  // SubmitAll of `requests`, each with a new sink appended to `sinks`.
  static absl::Status SubmitGroup(Engine& engine, const std::vector<Request>& requests,
                                  std::vector<std::shared_ptr<CollectingSink>>* sinks) {
    std::vector<std::shared_ptr<TokenSink>> as_sinks;
    for (size_t i = 0; i < requests.size(); ++i) {
      sinks->push_back(std::make_shared<CollectingSink>());
      as_sinks.push_back(sinks->back());
    }
    return engine.SubmitAll(requests, as_sinks);
  }

  // The same post-softmax θ everywhere (layers 0-1 dense up to 512 rows, k = 16 after, or
  // `k`): rows past k keep keys with probability > theta.
  static model::ThetaTable ConstantPostTheta(float theta, int32_t k = 16) {
    const auto& c = model_->config();
    model::ThetaTable table(c.num_layers, c.num_heads, model::ThetaTable::DefaultBuckets(4096));
    for (int32_t l = 0; l < c.num_layers; ++l) {
      table.k_per_layer[l] = l < 2 ? 512 : k;
      for (int32_t h = 0; h < c.num_heads; ++h) {
        for (size_t b = 0; b < table.buckets().size(); ++b) table.theta_at(l, h, b) = theta;
      }
    }
    table.Finalize();
    return table;
  }

  // The sparse policy with a mass budget the tests share: 32 recent rows, 4 sinks, 5% of the
  // older rows; with `offload`, the rows it drops go to the host pool instead.
  static cache::SparsePolicy MassBudgetPolicy(bool offload = false) {
    cache::SparsePolicy policy;
    policy.enabled = true;
    policy.local_window = 32;
    policy.sink_tokens = 4;
    policy.keep_fraction = 0.05;
    policy.offload = offload;
    return policy;
  }

  // A CPU backend over the test model whose attention applies `table` (which must outlive it),
  // its KV pages of `kv_dtype`.
  static absl::StatusOr<std::unique_ptr<kernels::Backend>> TopThetaBackend(
      const model::ThetaTable& table, kernels::KvDtype kv_dtype = kernels::KvDtype::kAuto) {
    auto backend = kernels::CreateBackend(*model_, kernels::Device::kCpu, 0,
                                          kernels::MatMulMode::kQuantized, kv_dtype);
    if (!backend.ok()) return backend.status();
    kernels::TopThetaConfig cfg;
    cfg.table = &table;
    (*backend)->SetTopTheta(cfg);
    return backend;
  }

  // Submits `count` requests of `text` that each generate exactly `tokens` tokens (EOS
  // ignored) and waits until every one finished with that many.
  static void RunFixedLength(Engine& engine, const std::string& id_prefix, const std::string& text,
                             int count, int tokens) {
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (int i = 0; i < count; ++i) {
      Request r = MakeRequest(absl::StrCat(id_prefix, i), text, tokens);
      r.stopping.ignore_eos = true;
      sinks.push_back(std::make_shared<CollectingSink>());
      ASSERT_TRUE(engine.Submit(r, sinks.back()).ok());
    }
    for (auto& sk : sinks) {
      ASSERT_TRUE(sk->Wait(300));
      EXPECT_EQ(sk->info.reason, FinishReason::kLength);
      EXPECT_EQ(sk->info.completion_tokens, tokens);
    }
  }

  // An engine with `config` over a new CPU backend that the fixture keeps until the test ends;
  // null, with the failure recorded, when either cannot be made.
  std::unique_ptr<Engine> CpuEngine(const EngineConfig& config) {
    auto backend = kernels::CreateBackend(*model_, kernels::Device::kCpu, 0);
    if (!backend.ok()) {
      ADD_FAILURE() << backend.status();
      return nullptr;
    }
    backends_.push_back(std::move(*backend));
    auto engine = Engine::Create(config, *backends_.back());
    if (!engine.ok()) {
      ADD_FAILURE() << engine.status();
      return nullptr;
    }
    return std::move(*engine);
  }

  // The offload policy's logits equal the full policy's to the bit, with the sparse policy's
  // V rows in the KV pool, on one backend whose KV pages are `kv_dtype` (the host pool's rows
  // are copies of them).
  static void ExpectOffloadGivesTheFullPolicysLogits(kernels::KvDtype kv_dtype);

  static model::Model* model_;
  static kernels::Backend* solo_backend_;
  std::vector<std::unique_ptr<kernels::Backend>> backends_;  // CpuEngine's, outliving its engines
};

model::Model* EngineTest::model_ = nullptr;
kernels::Backend* EngineTest::solo_backend_ = nullptr;

TEST_F(EngineTest, SixtyFourConcurrentGreedyRequestsMatchTheirSoloRuns) {
  EngineConfig config;
  config.kv_cache_bytes = int64_t(512) << 20;
  config.scheduler.max_num_seqs = 64;
  config.scheduler.max_num_batched_tokens = 256;
  auto engine = CpuEngine(config);
  ASSERT_NE(engine, nullptr);

  const auto prompts = Prompts();
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  std::vector<Request> requests;
  for (int i = 0; i < 64; ++i) {
    // Mixed prompt lengths (repeat a prompt up to 3 times) and output lengths 4..19.
    std::string text = prompts[i % prompts.size()];
    for (int r = 0; r < i % 3; ++r) text += " " + prompts[(i + r + 1) % prompts.size()];
    requests.push_back(MakeRequest(absl::StrCat("r", i), text, 4 + (i * 7) % 16));
  }
  for (auto& r : requests) {
    sinks.push_back(std::make_shared<CollectingSink>());
    ASSERT_TRUE(engine->Submit(r, sinks.back()).ok());
  }
  for (auto& s : sinks) ASSERT_TRUE(s->Wait(600)) << "request did not finish";
  for (size_t i = 0; i < requests.size(); ++i) {
    std::vector<int32_t> want = Solo(requests[i].prompt, requests[i].stopping.max_tokens);
    EXPECT_EQ(sinks[i]->tokens, want) << "request " << i;
    EXPECT_EQ(sinks[i]->text, model_->tokenizer().Decode(
                                  std::vector<int32_t>(want.begin(), want.end() - (sinks[i]->info.reason == FinishReason::kEos ? 1 : 0)),
                                  /*skip_special=*/true))
        << "request " << i;
  }
  const auto& pool = engine->pool_for_tests();
  ASSERT_TRUE(engine->WaitIdle(10));
  EXPECT_EQ(pool.num_free(), pool.num_pages()) << "pages leaked";
}

// Sampling with a temperature, seeded, several rows at a time on a pool of 4 sampling
// threads: every request gets exactly the tokens (and log-probabilities) it gets alone on one
// thread. Covers the rows' mapping to logits and that no two rows share state.
TEST_F(EngineTest, SeededSamplingOnParallelThreadsMatchesEachRequestAlone) {
  const auto prompts = Prompts();
  std::vector<Request> requests;
  for (int i = 0; i < 8; ++i) {
    Request r = MakeRequest(absl::StrCat("s", i), prompts[i], 10);
    r.stopping.ignore_eos = true;
    r.sampling.temperature = 0.6f + 0.1f * i;
    r.sampling.top_p = i % 2 ? 0.9f : 1.0f;
    r.sampling.top_k = i % 3 == 1 ? 40 : 0;
    r.sampling.min_p = i == 4 ? 0.05f : 0.0f;
    r.sampling.repetition_penalty = i == 5 ? 1.2f : 1.0f;
    r.sampling.logprobs = i % 4 == 3 ? 3 : 0;
    r.sampling.seed = 1000 + i;
    requests.push_back(r);
  }
  auto run = [&](const std::vector<Request>& batch, int threads) {
    auto backend = kernels::CreateBackend(*model_, kernels::Device::kCpu, 0);
    EXPECT_TRUE(backend.ok());
    EngineConfig config;
    config.kv_cache_bytes = int64_t(128) << 20;
    config.sampling_threads = threads;
    auto engine = Engine::Create(config, **backend);
    EXPECT_TRUE(engine.ok()) << engine.status();
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (const Request& r : batch) {
      sinks.push_back(std::make_shared<CollectingSink>());
      EXPECT_TRUE((*engine)->Submit(r, sinks.back()).ok());
    }
    for (auto& sk : sinks) EXPECT_TRUE(sk->Wait(300));
    return sinks;
  };
  const auto together = run(requests, 4);
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto alone = run({requests[i]}, 1);
    ASSERT_EQ(together[i]->tokens.size(), 10u);
    EXPECT_EQ(together[i]->tokens, alone[0]->tokens) << "request " << i;
    EXPECT_EQ(together[i]->text, alone[0]->text) << "request " << i;
    EXPECT_EQ(together[i]->logprobs, alone[0]->logprobs) << "request " << i;
    EXPECT_EQ(together[i]->logprobs.size(), requests[i].sampling.logprobs ? 10u : 0u);
  }
  // Not all greedy: with these temperatures some request leaves the argmax path somewhere.
  int differs = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    Request greedy = requests[i];
    greedy.sampling = SamplingParams{};
    greedy.sampling.temperature = 0;
    differs += run({greedy}, 1)[0]->tokens != together[i]->tokens;
  }
  EXPECT_GT(differs, 0);
}

// The same --kv-cache-memory holds twice the pages in f16 (or bf16) as in f32 (four times in
// fp8, 3.76 times in q8_0), and concurrent requests over those pages generate what each
// generates alone on them.
TEST_F(EngineTest, NarrowPagesHoldMoreTokensAndBatchingChangesNothing) {
  EngineConfig config;
  config.kv_cache_bytes = int64_t(64) << 20;
  auto f32 = kernels::CreateBackend(*model_, kernels::Device::kCpu, 0,
                                    kernels::MatMulMode::kQuantized, kernels::KvDtype::kF32);
  ASSERT_TRUE(f32.ok());
  auto f32_engine = Engine::Create(config, **f32);
  ASSERT_TRUE(f32_engine.ok()) << f32_engine.status();
  const int64_t f32_pages = (*f32_engine)->Stats().pages_total;
  (*f32_engine)->Stop();
  const int64_t d = model_->config().head_dim;
  EXPECT_EQ(f32_pages, config.kv_cache_bytes / (config.block_size * 4 * d));
  // 16-bit pages hold twice the tokens of f32 pages, 8-bit ones four times, q8_0 ones (a code
  // per element and an f16 scale per 32) 64/17 times.
  for (auto [dtype, row_bytes] : {std::pair{kernels::KvDtype::kF16, 2 * d},
                                  std::pair{kernels::KvDtype::kBf16, 2 * d},
                                  std::pair{kernels::KvDtype::kFp8E4M3, d},
                                  std::pair{kernels::KvDtype::kFp8E5M2, d},
                                  std::pair{kernels::KvDtype::kQ8_0, d + d / 16}}) {
    SCOPED_TRACE(std::string(kernels::KvDtypeName(dtype)));
    auto backend = kernels::CreateBackend(*model_, kernels::Device::kCpu, 0,
                                          kernels::MatMulMode::kQuantized, dtype);
    ASSERT_TRUE(backend.ok());
    EXPECT_EQ((*backend)->kv_dtype(), dtype);
    EXPECT_EQ((*backend)->kv_row_bytes(), row_bytes);
    auto solo = kernels::CreateBackend(*model_, kernels::Device::kCpu, 0,
                                       kernels::MatMulMode::kQuantized, dtype);
    ASSERT_TRUE(solo.ok());
    auto engine = Engine::Create(config, **backend);
    ASSERT_TRUE(engine.ok()) << engine.status();
    EXPECT_EQ((*engine)->Stats().pages_total, config.kv_cache_bytes / (config.block_size * row_bytes));
    const auto prompts = Prompts();
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Request r = MakeRequest(absl::StrCat("h", i), prompts[i], 12);
      r.stopping.ignore_eos = true;
      sinks.push_back(std::make_shared<CollectingSink>());
      ASSERT_TRUE((*engine)->Submit(r, sinks.back()).ok());
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(sinks[i]->Wait(300));
      EXPECT_EQ(sinks[i]->tokens,
                GreedyAlone(**solo, model_->tokenizer().Encode(prompts[i], true), 12))
          << "prompt " << i;
    }
    ASSERT_TRUE((*engine)->WaitIdle(10));
    const EngineStats st = (*engine)->Stats();
    EXPECT_EQ(st.pages_free, st.pages_total);
  }
}

TEST_F(EngineTest, TinyPoolForcesChunkedPrefillAndPreemptionWithIdenticalOutput) {
  auto backend = kernels::CreateBackend(*model_, kernels::Device::kCpu, 0);
  ASSERT_TRUE(backend.ok());
  const auto& c = model_->config();
  EngineConfig config;
  config.block_size = 4;
  // Room for 8 blocks of 4 tokens per (layer, KV head), K and V: 32 tokens in all, while
  // each request needs up to ~30: they must take turns.
  const int64_t page_bytes = config.block_size * (*backend)->kv_row_bytes();
  config.kv_cache_bytes = 2 * 8 * c.num_layers * c.num_kv_heads * page_bytes;
  config.scheduler.max_num_batched_tokens = 6;  // prompts take several chunks
  config.scheduler.max_num_seqs = 4;
  auto engine = Engine::Create(config, **backend);
  ASSERT_TRUE(engine.ok()) << engine.status();

  const auto prompts = Prompts();
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
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(sinks[i]->tokens, GreedyAlone(*solo_backend_, requests[i].prompt, 14)) << "request " << i;
    EXPECT_EQ(sinks[i]->info.reason, FinishReason::kLength);
  }
  ASSERT_TRUE((*engine)->WaitIdle(10));
  EXPECT_EQ((*engine)->pool_for_tests().num_free(), (*engine)->pool_for_tests().num_pages());
}

// What a sink's OnFinish sees in the engine's stats (the status RPC and the metrics read
// them): its own pages already free and its request counted. Before this held, a client that
// asked for the status right after its stream ended could find its pages still in use.
class StatsAtFinishSink : public CollectingSink {
 public:
  void OnFinish(const FinishInfo& i) override {
    const EngineStats s = engine->Stats();
    pages_free = s.pages_free;
    pages_total = s.pages_total;
    running = s.running;
    requests_finished = s.counters.requests_finished;
    CollectingSink::OnFinish(i);
  }
  Engine* engine = nullptr;
  int64_t pages_free = -1, pages_total = -1, running = -1, requests_finished = -1;
};

TEST_F(EngineTest, StatsAreCurrentWhenASinkHearsItsRequestFinish) {
  EngineConfig config;
  config.kv_cache_bytes = int64_t(64) << 20;
  auto engine = CpuEngine(config);
  ASSERT_NE(engine, nullptr);
  const auto prompts = Prompts();
  // Alone: when it finishes nothing else holds pages. Then three at once, finishing at
  // different steps, and one cancelled while it runs.
  auto sink = std::make_shared<StatsAtFinishSink>();
  sink->engine = engine.get();
  ASSERT_TRUE(engine->Submit(MakeRequest("alone", prompts[0], 6), sink).ok());
  ASSERT_TRUE(sink->Wait(300));
  EXPECT_EQ(sink->pages_free, sink->pages_total);
  EXPECT_EQ(sink->running, 0);
  EXPECT_EQ(sink->requests_finished, 1);

  std::vector<std::shared_ptr<StatsAtFinishSink>> sinks;
  for (int i = 0; i < 4; ++i) {
    Request r = MakeRequest(absl::StrCat("m", i), prompts[i + 1], i == 3 ? 200 : 4 + 6 * i);
    r.stopping.ignore_eos = true;
    sinks.push_back(std::make_shared<StatsAtFinishSink>());
    sinks.back()->engine = engine.get();
    ASSERT_TRUE(engine->Submit(r, sinks.back()).ok());
  }
  while (sinks[3]->count() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_TRUE(sinks[2]->Wait(300));  // the three short ones are done
  engine->Cancel("m3");
  for (auto& sk : sinks) ASSERT_TRUE(sk->Wait(300));
  EXPECT_EQ(sinks[3]->info.reason, FinishReason::kCancelled);
  for (int i = 0; i < 4; ++i) {
    // Requests finish in order of length; each sees itself and those before it counted.
    EXPECT_EQ(sinks[i]->requests_finished, 2 + i) << i;
    EXPECT_EQ(sinks[i]->running, 3 - i) << i;
  }
  EXPECT_EQ(sinks[3]->pages_free, sinks[3]->pages_total);
}

TEST_F(EngineTest, CancellingHalfMidwayReturnsEveryPage) {
  EngineConfig config;
  config.kv_cache_bytes = int64_t(128) << 20;
  auto engine = CpuEngine(config);
  ASSERT_NE(engine, nullptr);
  const auto prompts = Prompts();
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (int i = 0; i < 16; ++i) {
    Request r = MakeRequest(absl::StrCat("c", i), prompts[i % prompts.size()], 40);
    r.stopping.ignore_eos = true;
    sinks.push_back(std::make_shared<CollectingSink>());
    ASSERT_TRUE(engine->Submit(r, sinks.back()).ok());
  }
  // Cancel the even ones once they have produced a few tokens.
  for (int i = 0; i < 16; i += 2) {
    while (sinks[i]->count() < 3 && !sinks[i]->finished) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    engine->Cancel(absl::StrCat("c", i));
  }
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(sinks[i]->Wait(300));
    if (i % 2 == 0) {
      EXPECT_EQ(sinks[i]->info.reason, FinishReason::kCancelled) << i;
      EXPECT_LT(sinks[i]->info.completion_tokens, 40) << i;
    } else {
      EXPECT_EQ(sinks[i]->info.reason, FinishReason::kLength) << i;
      EXPECT_EQ(sinks[i]->info.completion_tokens, 40) << i;
    }
  }
  ASSERT_TRUE(engine->WaitIdle(10));
  const auto& pool = engine->pool_for_tests();
  EXPECT_EQ(pool.num_free(), pool.num_pages()) << "pages leaked";
  EXPECT_EQ(engine->Stats().running, 0);
}

// A cancel reaches the requests submitted before it, never one submitted after it with the
// same id (a client that retries at once with the id of a request that just ended).
TEST_F(EngineTest, ACancelReachesOnlyRequestsSubmittedBeforeIt) {
  EngineConfig config;
  config.kv_cache_bytes = int64_t(64) << 20;
  auto engine = CpuEngine(config);
  ASSERT_NE(engine, nullptr);
  // Keep the engine stepping, so that what follows lands in its inbox between two steps.
  Request busy = MakeRequest("busy", "Once upon a time", 400);
  busy.stopping.ignore_eos = true;
  auto busy_sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(busy, busy_sink).ok());
  while (busy_sink->count() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const Request first = MakeRequest("r", "The capital of France is", 2);
  auto first_sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(first, first_sink).ok());
  ASSERT_TRUE(first_sink->Wait(300));
  ASSERT_EQ(first_sink->info.reason, FinishReason::kLength);
  for (int round = 0; round < 5; ++round) {
    // A late cancel for the finished "r", then a new "r" at once.
    engine->Cancel("r");
    Request again = MakeRequest("r", "The capital of France is", 4);
    auto again_sink = std::make_shared<CollectingSink>();
    ASSERT_TRUE(engine->Submit(again, again_sink).ok());
    ASSERT_TRUE(again_sink->Wait(300));
    EXPECT_EQ(again_sink->info.reason, FinishReason::kLength) << "round " << round;
    EXPECT_EQ(again_sink->info.completion_tokens, 4) << "round " << round;
  }
  // A cancel right after its submission still lands.
  Request doomed = MakeRequest("doomed", "Tell me a long story", 300);
  doomed.stopping.ignore_eos = true;
  auto doomed_sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(doomed, doomed_sink).ok());
  engine->Cancel("doomed");
  ASSERT_TRUE(doomed_sink->Wait(300));
  EXPECT_EQ(doomed_sink->info.reason, FinishReason::kCancelled);
  engine->Cancel("busy");
  ASSERT_TRUE(busy_sink->Wait(300));
  EXPECT_EQ(busy_sink->info.reason, FinishReason::kCancelled);
}

TEST_F(EngineTest, RejectsARequestThatCanNeverFitThePool) {
  auto backend = kernels::CreateBackend(*model_, kernels::Device::kCpu, 0);
  ASSERT_TRUE(backend.ok());
  const auto& c = model_->config();
  EngineConfig config;
  config.kv_cache_bytes = 2 * 4 * c.num_layers * c.num_kv_heads * 16 *
                          (*backend)->kv_row_bytes();  // 64 tokens
  auto engine = Engine::Create(config, **backend);
  ASSERT_TRUE(engine.ok());
  Request big = MakeRequest("big", "hello", 100);
  absl::Status st = (*engine)->Submit(big, std::make_shared<CollectingSink>());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("--kv-cache-memory"), std::string::npos) << st;
}

// What metrics report must already count a request's tokens when its client hears it finished
// (a client that scrapes /metrics after its stream ends must see them).
TEST_F(EngineTest, ObserverHasCountedEveryTokenBeforeTheRequestFinishes) {
  auto engine = CpuEngine(EngineConfig{});
  ASSERT_NE(engine, nullptr);
  std::atomic<int64_t> observed{0};  // generation tokens the observer has seen
  engine->SetObserver([&](const EngineStats& s, const StepStats*) {
    observed.store(s.counters.generation_tokens);
  });
  // Reads the observer's count at the moment the engine finishes the request.
  class CheckingSink : public CollectingSink {
   public:
    explicit CheckingSink(const std::atomic<int64_t>& observed) : observed_(observed) {}
    void OnFinish(const FinishInfo& i) override {
      observed_at_finish = observed_.load();
      CollectingSink::OnFinish(i);
    }
    int64_t observed_at_finish = -1;

   private:
    const std::atomic<int64_t>& observed_;
  };
  auto sink = std::make_shared<CheckingSink>(observed);
  Request r = MakeRequest("counted", "The capital of France is", 6);
  r.stopping.ignore_eos = true;
  ASSERT_TRUE(engine->Submit(r, sink).ok());
  ASSERT_TRUE(sink->Wait(120));
  EXPECT_EQ(sink->info.completion_tokens, 6);
  EXPECT_EQ(sink->observed_at_finish, 6);
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
    if (host_bytes / page_bytes >= 3 * (blocks + 1) * tables) {
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

// With a mass budget the engine compacts between prefill chunks and admission reserves the
// bounded V store: two long prompts that the pool cannot hold together dense run together.
TEST_F(EngineTest, MassBudgetAdmitsLongPromptsThatDenseMustRunOneAtATime) {
  const auto& c = model_->config();
  const model::ThetaTable table = ConstantPostTheta(0.02f);
  std::string text;
  for (const auto& p : Prompts()) text += p + " ";
  text = text + text + text + text + text + text;  // ~600 tokens

  auto run = [&](bool sparse, int* max_running, int64_t* preemptions) {
    auto backend = TopThetaBackend(table);
    ASSERT_TRUE(backend.ok());
    EngineConfig config;
    config.scheduler.max_num_batched_tokens = 64;  // many prefill chunks
    const int64_t page_bytes = int64_t(config.block_size) * (*backend)->kv_row_bytes();
    const int64_t tokens = int64_t(model_->tokenizer().Encode(text).size()) + 8;
    const int64_t dense_pages = 2 * ((tokens + 15) / 16) * c.num_layers * c.num_kv_heads;
    config.kv_cache_bytes = dense_pages * 7 / 5 * page_bytes;  // 1.4 dense prompts
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
  for (int64_t i = 1; i < P; ++i) {
    const float* row = rows->data() + (i - 1) * vocab;
    double m = -1e30, sum = 0;
    for (int64_t v = 0; v < vocab; ++v) m = std::max<double>(m, row[v]);
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - m);
    want[i - 1] = float(row[prompt[i]] - (m + std::log(sum)));
    want_top1[i - 1] = int32_t(std::max_element(row, row + vocab) - row);
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
  for (int64_t i = 0; i < P - 1; ++i) {
    EXPECT_NEAR(scored->prompt_logprobs[i], want[i], 1e-4) << "prompt token " << i + 1;
    ASSERT_EQ(scored->prompt_top[i].size(), 2u);
    EXPECT_EQ(scored->prompt_top[i][0].first, want_top1[i]) << "prompt token " << i + 1;
    EXPECT_GE(scored->prompt_top[i][0].second, scored->prompt_top[i][1].second);
  }

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

// A group goes into the queue whole or not at all.
TEST_F(EngineTest, SubmitAllQueuesAllOrNone) {
  EngineConfig config;
  config.kv_cache_bytes = int64_t(64) << 20;
  config.max_queue = 2;
  config.scheduler.max_num_seqs = 1;  // one runs, the rest wait
  auto engine = CpuEngine(config);
  ASSERT_NE(engine, nullptr);
  std::vector<Request> requests;
  std::vector<std::shared_ptr<TokenSink>> sinks;
  for (int i = 0; i < 3; ++i) {
    requests.push_back(MakeRequest(absl::StrCat("q/", i), "Hello", 4));
    sinks.push_back(std::make_shared<CollectingSink>());
  }
  // More than the queue holds at all: never retryable.
  absl::Status st = engine->SubmitAll(requests, sinks);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("(--max-queue 2) even when it is empty"),
            std::string::npos) << st;
  // Two fit the queue, but not behind one already waiting (a long one runs meanwhile).
  Request busy = MakeRequest("busy", "Hello", 200);
  busy.stopping.ignore_eos = true;
  Request queued = MakeRequest("queued", "Hello", 4);
  auto busy_sink = std::make_shared<CollectingSink>();
  auto queued_sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(busy, busy_sink).ok());
  while (engine->Stats().running == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(engine->Submit(queued, queued_sink).ok());
  requests.resize(2);
  sinks.resize(2);
  st = engine->SubmitAll(requests, sinks);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(std::string(st.message()).find("cannot take 2 more (1 waiting"), std::string::npos)
      << st;
  engine->Cancel("busy");
  ASSERT_TRUE(busy_sink->Wait(300));
  ASSERT_TRUE(queued_sink->Wait(300));
  ASSERT_TRUE(engine->WaitIdle(10));
  const int64_t finished_before = engine->Stats().counters.requests_finished;
  // One bad request refuses the whole group.
  requests[1].stopping.max_tokens = 100000;
  st = engine->SubmitAll(requests, sinks);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(engine->WaitIdle(1));
  EXPECT_EQ(engine->Stats().counters.requests_finished, finished_before);
  // Two fit.
  requests[1].stopping.max_tokens = 4;
  ASSERT_TRUE(engine->SubmitAll(requests, sinks).ok());
  for (auto& sk : sinks) ASSERT_TRUE(static_cast<CollectingSink&>(*sk).Wait(300));
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
