// The engine tests' fixture: the real model loaded once per suite, solo (engine-free) greedy
// runs to compare against, request and group builders, Top-θ backends and a sparse policy.
#pragma once

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
#include "scheduler/engine.h"
#include "tests/scheduler/collecting_sink.h"
#include "tests/test_util.h"

namespace thetaserve::scheduler {

class EngineTest : public ::testing::Test {
 protected:
  // Nothing fails here (testing::LoadSuiteModel says why): each test's SetUp does.
  static void SetUpTestSuite() {
    model_ = testing::LoadSuiteModel(&load_error_);
    if (!model_) return;
    auto b = kernels::CreateBackend(*model_, kernels::Device::kCpu, 0);
    if (!b.ok()) {
      load_error_ = b.status().ToString();
      return;
    }
    solo_backend_ = std::move(*b).release();
  }
  void SetUp() override { ASSERT_NE(solo_backend_, nullptr) << load_error_; }
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
  // Under the sparse `policy` with fixed compaction, greedy outputs of prompts of four lengths
  // alone, all at once and staggered in the engine equal the sequence runner's
  // (engine_sparse_test.cc).
  static void ExpectSparseOutputsIndependentOfTheLoad(cache::SparsePolicy policy);

  inline static model::Model* model_ = nullptr;
  inline static kernels::Backend* solo_backend_ = nullptr;
  inline static std::string load_error_;
  std::vector<std::unique_ptr<kernels::Backend>> backends_;  // CpuEngine's, outliving its engines
};

}  // namespace thetaserve::scheduler
