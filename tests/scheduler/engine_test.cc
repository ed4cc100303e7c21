// The engine on the real model: concurrent greedy requests equal their solo runs, chunked
// prefill and preemption (tiny pools) change nothing, and every page comes back.
#include "scheduler/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/sequence_runner.h"
#include "model/model.h"
#include "tests/test_util.h"

namespace thetaserve::scheduler {
namespace {

// Collects one request's output; thread-safe to wait on.
class CollectingSink : public TokenSink {
 public:
  void OnTokens(const TokenDelta& d) override {
    std::lock_guard<std::mutex> lock(mu_);
    tokens.insert(tokens.end(), d.token_ids.begin(), d.token_ids.end());
    text += d.text;
    count_.store(static_cast<int>(tokens.size()));
  }
  void OnFinish(const FinishInfo& i) override {
    std::lock_guard<std::mutex> lock(mu_);
    info = i;
    finished = true;
    cv_.notify_all();
  }
  bool Wait(double seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return finished; });
  }
  int count() const { return count_.load(); }

  std::vector<int32_t> tokens;
  std::string text;
  FinishInfo info;
  bool finished = false;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> count_{0};
};

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

  static model::Model* model_;
  static kernels::Backend* solo_backend_;
};

model::Model* EngineTest::model_ = nullptr;
kernels::Backend* EngineTest::solo_backend_ = nullptr;

TEST_F(EngineTest, SixtyFourConcurrentGreedyRequestsMatchTheirSoloRuns) {
  auto backend = kernels::CreateBackend(*model_, kernels::Device::kCpu, 0);
  ASSERT_TRUE(backend.ok());
  EngineConfig config;
  config.kv_cache_bytes = int64_t(512) << 20;
  config.scheduler.max_num_seqs = 64;
  config.scheduler.max_num_batched_tokens = 256;
  auto engine = Engine::Create(config, **backend);
  ASSERT_TRUE(engine.ok()) << engine.status();

  const auto prompts = Prompts();
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  std::vector<Request> requests;
  for (int i = 0; i < 64; ++i) {
    // Mixed prompt lengths (repeat a prompt up to 3 times) and output lengths 4..19.
    std::string text = prompts[i % prompts.size()];
    for (int r = 0; r < i % 3; ++r) text += " " + prompts[(i + r + 1) % prompts.size()];
    requests.push_back(MakeRequest("r" + std::to_string(i), text, 4 + (i * 7) % 16));
  }
  for (auto& r : requests) {
    sinks.push_back(std::make_shared<CollectingSink>());
    ASSERT_TRUE((*engine)->Submit(r, sinks.back()).ok());
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
  const auto& pool = (*engine)->pool_for_tests();
  ASSERT_TRUE((*engine)->WaitIdle(10));
  EXPECT_EQ(pool.num_free(), pool.num_pages()) << "pages leaked";
}

TEST_F(EngineTest, TinyPoolForcesChunkedPrefillAndPreemptionWithIdenticalOutput) {
  auto backend = kernels::CreateBackend(*model_, kernels::Device::kCpu, 0);
  ASSERT_TRUE(backend.ok());
  const auto& c = model_->config();
  EngineConfig config;
  config.block_size = 4;
  // Room for 8 blocks of 4 tokens per (layer, KV head), K and V: 32 tokens in all, while
  // each request needs up to ~30: they must take turns.
  const int64_t page_bytes = config.block_size * c.head_dim * 4;
  config.kv_cache_bytes = 2 * 8 * c.num_layers * c.num_kv_heads * page_bytes;
  config.scheduler.max_num_batched_tokens = 6;  // prompts take several chunks
  config.scheduler.max_num_seqs = 4;
  auto engine = Engine::Create(config, **backend);
  ASSERT_TRUE(engine.ok()) << engine.status();

  const auto prompts = Prompts();
  std::vector<Request> requests;
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (int i = 0; i < 4; ++i) {
    requests.push_back(MakeRequest("p" + std::to_string(i), prompts[i % 2 ? 0 : 4], 14));
    requests.back().stopping.ignore_eos = true;
    sinks.push_back(std::make_shared<CollectingSink>());
    ASSERT_TRUE((*engine)->Submit(requests.back(), sinks.back()).ok());
  }
  for (auto& s : sinks) ASSERT_TRUE(s->Wait(300));
  EXPECT_GT((*engine)->Stats().counters.preemptions, 0) << "the pool was meant to force preemption";
  for (size_t i = 0; i < requests.size(); ++i) {
    auto runner = scheduler::SequenceRunner::Create(*solo_backend_, 64);
    ASSERT_TRUE(runner.ok());
    auto logits = runner->Append(requests[i].prompt);
    std::vector<int32_t> want;
    for (int k = 0; k < 14; ++k) {
      int32_t t = static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
      want.push_back(t);
      logits = runner->Append(std::span<const int32_t>(&t, 1));
    }
    EXPECT_EQ(sinks[i]->tokens, want) << "request " << i;
    EXPECT_EQ(sinks[i]->info.reason, FinishReason::kLength);
  }
  ASSERT_TRUE((*engine)->WaitIdle(10));
  EXPECT_EQ((*engine)->pool_for_tests().num_free(), (*engine)->pool_for_tests().num_pages());
}

TEST_F(EngineTest, CancellingHalfMidwayReturnsEveryPage) {
  auto backend = kernels::CreateBackend(*model_, kernels::Device::kCpu, 0);
  ASSERT_TRUE(backend.ok());
  EngineConfig config;
  config.kv_cache_bytes = int64_t(128) << 20;
  auto engine = Engine::Create(config, **backend);
  ASSERT_TRUE(engine.ok());
  const auto prompts = Prompts();
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (int i = 0; i < 16; ++i) {
    Request r = MakeRequest("c" + std::to_string(i), prompts[i % prompts.size()], 40);
    r.stopping.ignore_eos = true;
    sinks.push_back(std::make_shared<CollectingSink>());
    ASSERT_TRUE((*engine)->Submit(r, sinks.back()).ok());
  }
  // Cancel the even ones once they have produced a few tokens.
  for (int i = 0; i < 16; i += 2) {
    while (sinks[i]->count() < 3 && !sinks[i]->finished) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    (*engine)->Cancel("c" + std::to_string(i));
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
  ASSERT_TRUE((*engine)->WaitIdle(10));
  const auto& pool = (*engine)->pool_for_tests();
  EXPECT_EQ(pool.num_free(), pool.num_pages()) << "pages leaked";
  EXPECT_EQ((*engine)->Stats().running, 0);
}

TEST_F(EngineTest, RejectsARequestThatCanNeverFitThePool) {
  auto backend = kernels::CreateBackend(*model_, kernels::Device::kCpu, 0);
  ASSERT_TRUE(backend.ok());
  const auto& c = model_->config();
  EngineConfig config;
  config.kv_cache_bytes = 2 * 4 * c.num_layers * c.num_kv_heads * 16 * c.head_dim * 4;  // 64 tokens
  auto engine = Engine::Create(config, **backend);
  ASSERT_TRUE(engine.ok());
  Request big = MakeRequest("big", "hello", 100);
  absl::Status st = (*engine)->Submit(big, std::make_shared<CollectingSink>());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("--kv-cache-memory"), std::string::npos) << st;
}

}  // namespace
}  // namespace thetaserve::scheduler
