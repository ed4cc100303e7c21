// The engine on the real model: concurrent greedy requests equal their solo runs, seeded
// sampling, narrow pages, chunked prefill and preemption (tiny pools) change nothing, stats and
// cancellation are exact, and every page comes back. The request queue's bound and displacement
// by priority: engine_queue_test.cc.
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

// What metrics report must already count a request's tokens, and every step it took (the step
// histograms), when its client hears it finished: a client that scrapes /metrics after its
// stream ends must see them. The last step's timings once reached the observer only after the
// sink was told, and a server test that scraped right after the stream saw one decode step short.
TEST_F(EngineTest, ObserverHasCountedEveryTokenAndStepBeforeTheRequestFinishes) {
  auto engine = CpuEngine(EngineConfig{});
  ASSERT_NE(engine, nullptr);
  std::atomic<int64_t> observed{0};  // generation tokens the observer has seen
  std::atomic<int64_t> steps{0};     // steps whose timings it has seen
  engine->SetObserver([&](const EngineStats& s, const StepStats* step) {
    observed.store(s.counters.generation_tokens);
    if (step) steps.fetch_add(1);
  });
  // Reads the observer's counts at the moment the engine finishes the request.
  class CheckingSink : public CollectingSink {
   public:
    CheckingSink(const std::atomic<int64_t>& observed, const std::atomic<int64_t>& steps)
        : observed_(observed), steps_(steps) {}
    void OnFinish(const FinishInfo& i) override {
      observed_at_finish = observed_.load();
      steps_at_finish = steps_.load();
      CollectingSink::OnFinish(i);
    }
    int64_t observed_at_finish = -1;
    int64_t steps_at_finish = -1;

   private:
    const std::atomic<int64_t>& observed_;
    const std::atomic<int64_t>& steps_;
  };
  auto sink = std::make_shared<CheckingSink>(observed, steps);
  Request r = MakeRequest("counted", "The capital of France is", 6);
  r.stopping.ignore_eos = true;
  ASSERT_TRUE(engine->Submit(r, sink).ok());
  ASSERT_TRUE(sink->Wait(120));
  EXPECT_EQ(sink->info.completion_tokens, 6);
  EXPECT_EQ(sink->observed_at_finish, 6);
  EXPECT_EQ(sink->steps_at_finish, 6) << "one prefill step and five decode steps";
}

// Cancel(call_id) reaches every request of a call with several prompts, running or waiting
// (each prompt's n completions being a group of their own), and nothing else.
TEST_F(EngineTest, ACallsIdCancelsEachOfItsPrompts) {
  EngineConfig config;
  config.kv_cache_bytes = int64_t(64) << 20;
  config.scheduler.max_num_seqs = 2;  // two run, the rest wait
  auto engine = CpuEngine(config);
  ASSERT_NE(engine, nullptr);
  std::vector<Request> requests;
  std::vector<std::shared_ptr<TokenSink>> sinks;
  const char* prompts[] = {"Once upon a time", "Tell me a story", "Count to ten"};
  for (int p = 0; p < 3; ++p) {
    for (int i = 0; i < 2; ++i) {
      Request r = MakeRequest(absl::StrCat("call-", p, "/", i), prompts[p], 300);
      r.stopping.ignore_eos = true;
      r.group_id = absl::StrCat("call-", p);
      r.group_index = i;
      r.call_id = "call";
      requests.push_back(std::move(r));
      sinks.push_back(std::make_shared<CollectingSink>());
    }
  }
  Request other = MakeRequest("call-other", "Hello", 6);  // shares a prefix of the id only
  auto other_sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->SubmitAll(requests, sinks).ok());
  ASSERT_TRUE(engine->Submit(other, other_sink).ok());
  auto& first = static_cast<CollectingSink&>(*sinks[0]);
  while (first.count() < 2 && !first.finished) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(engine->Stats().running, 2);
  engine->Cancel("call");
  for (size_t k = 0; k < sinks.size(); ++k) {
    auto& sink = static_cast<CollectingSink&>(*sinks[k]);
    ASSERT_TRUE(sink.Wait(300));
    EXPECT_EQ(sink.info.reason, FinishReason::kCancelled) << k;
    EXPECT_LT(sink.info.completion_tokens, 300) << k;
  }
  ASSERT_TRUE(other_sink->Wait(300));
  EXPECT_EQ(other_sink->info.reason, FinishReason::kLength);
  ASSERT_TRUE(engine->WaitIdle(10));
  EXPECT_EQ(engine->pool_for_tests().num_free(), engine->pool_for_tests().num_pages());
}

}  // namespace
}  // namespace thetaserve::scheduler
