// The scheduler tests' fixtures: the real tokenizer (loaded once per suite), a small pool and
// prefix cache, request builders, steps planned and committed as the engine would.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "scheduler/scheduler.h"
#include "tests/scheduler/collecting_sink.h"
#include "tests/test_util.h"

namespace thetaserve::scheduler {

constexpr cache::KvShape kShape{2, 1, 16, 8};  // 2 tables, 16 rows a page
constexpr int64_t kPromptTokens = 40;           // 2 whole blocks the cache can hold, and 8
// A string, not a literal: assigning a literal to Request::group_id trips a false -Wrestrict
// warning in GCC 12.
const std::string kGroup = "g";

class SchedulerTest : public ::testing::Test {
 protected:
  // Nothing fails here (testing::LoadSuiteModel says why): each test's SetUp does.
  static void SetUpTestSuite() { model_ = testing::LoadSuiteModel(&load_error_); }
  void SetUp() override { ASSERT_NE(model_, nullptr) << load_error_; }
  static void TearDownTestSuite() { delete model_; }

  // Completion `index` of group "g": the same 40-token prompt for each.
  void AddMember(int32_t index) {
    Request r;
    r.group_id = kGroup;
    r.id = absl::StrCat(kGroup, "/", index);
    for (int64_t i = 0; i < kPromptTokens; ++i) r.prompt.push_back(int32_t(1000 + i));
    r.stopping.max_tokens = 4;
    r.group_index = index;
    auto seq = std::make_unique<Sequence>(r, std::make_shared<CollectingSink>(),
                                          model_->tokenizer(), kShape);
    members_.push_back(seq.get());
    scheduler_.AddWaiting(std::move(seq));
  }

  // What the engine does after a step: computed blocks go to the prefix cache.
  static void CacheBlocks(cache::PrefixCache& prefix, cache::PagePool& pool, Sequence& seq) {
    const int64_t full = seq.num_computed / kShape.block_size;
    prefix.Insert(seq.tokens(), seq.cached_blocks, full, seq.kv(), pool, &seq.cache_cursor);
    seq.cached_blocks = full;
  }
  void CacheBlocks(Sequence& seq) { CacheBlocks(prefix_, pool_, seq); }

  // The planned chunks as "index:tokens" (member index, tokens computed this step).
  static std::vector<std::string> Chunks(const StepPlan& plan) {
    std::vector<std::string> out;
    for (const ScheduledChunk& c : plan.chunks) {
      out.push_back(absl::StrCat(c.seq->request().group_index, ":", c.num_tokens));
    }
    return out;
  }

  inline static model::Model* model_ = nullptr;
  inline static std::string load_error_;
  cache::PagePool pool_{256, kShape.block_size};
  cache::PrefixCache prefix_{kShape};
  Scheduler scheduler_{SchedulerConfig{}, pool_, &prefix_};
  std::vector<Sequence*> members_;
};

class LongPrefillTest : public SchedulerTest {
 protected:
  // A request of `tokens` prompt tokens, none shared with another's, at `priority`, submitted
  // to `s` now (serials as the engine's).
  Sequence* Submit(Scheduler& s, const std::string& id, int64_t tokens, int64_t priority = 0) {
    std::vector<int32_t> prompt;
    for (int64_t i = 0; i < tokens; ++i) prompt.push_back(int32_t(100 * (next_ + 1) + i));
    ++next_;
    return Submit(s, id, std::move(prompt), priority);
  }
  Sequence* Submit(Scheduler& s, const std::string& id, std::vector<int32_t> prompt,
                   int64_t priority) {
    Request r;
    r.id = id;
    r.priority = priority;
    r.prompt = std::move(prompt);
    r.stopping.max_tokens = 64;
    auto seq = std::make_unique<Sequence>(r, std::make_shared<CollectingSink>(),
                                          model_->tokenizer(), kShape);
    seq->serial = ++serial_;
    seq->submitted = now_;
    Sequence* out = seq.get();
    s.AddWaiting(std::move(seq));
    return out;
  }
  // Into the scheduler whose chunks are held to 16.
  Sequence* Add(const std::string& id, int64_t tokens) { return Submit(held_, id, tokens); }
  static std::vector<std::string> ById(const StepPlan& plan) {
    std::vector<std::string> out;
    for (const ScheduledChunk& c : plan.chunks) {
      out.push_back(absl::StrCat(c.seq->request().id, ":", c.num_tokens, c.samples ? "+" : ""));
    }
    return out;
  }
  // What the engine does after a step whose chunk samples: a token (not EOS) joins the output.
  void Sample(Sequence* seq) {
    SampleResult r;
    r.token = 1000;
    ASSERT_FALSE(seq->AppendToken(r, model_->tokenizer()));
  }
  // Plans a step and commits it.
  std::vector<std::string> Step(Scheduler& s) {
    StepPlan plan = s.Schedule();
    s.Commit(plan);
    return ById(plan);
  }

  static SchedulerConfig Config(int64_t limit) {
    SchedulerConfig c;
    c.max_num_batched_tokens = 64;
    c.long_prefill_tokens = limit;
    return c;
  }
  int next_ = 0;
  uint64_t serial_ = 0;
  Clock::time_point now_{};  // Sequence::submitted of what Submit adds
  cache::PagePool held_pool_{512, kShape.block_size};
  Scheduler held_{Config(16), held_pool_};
};

class PriorityTest : public LongPrefillTest {
 protected:
  static SchedulerConfig Config(SchedulingPolicy policy, int64_t max_num_seqs = 64) {
    SchedulerConfig c = LongPrefillTest::Config(0);
    c.policy = policy;
    c.max_num_seqs = max_num_seqs;
    return c;
  }
  static std::vector<std::string> Ids(const std::vector<Sequence*>& seqs) {
    std::vector<std::string> out;
    for (const Sequence* s : seqs) out.push_back(s->request().id);
    return out;
  }
  // The 48 tokens 3000…3047: three whole blocks.
  static std::vector<int32_t> Prompt48() {
    std::vector<int32_t> prompt;
    for (int32_t t = 0; t < 48; ++t) prompt.push_back(3000 + t);
    return prompt;
  }
  // Prompt48() as `id` of `priority`, computed alone in one step of `s`, its three blocks
  // offered to `prefix`, its first token taken.
  void RunCachedPrompt(Scheduler& s, cache::PrefixCache& prefix, cache::PagePool& pool,
                       const std::string& id, int64_t priority, Sequence** out) {
    Sequence* seq = *out = Submit(s, id, Prompt48(), priority);
    ASSERT_EQ(Step(s), std::vector<std::string>{absl::StrCat(id, ":48+")});
    CacheBlocks(prefix, pool, *seq);
    ASSERT_EQ(seq->cached_blocks, 3);
    Sample(seq);
  }
  static std::vector<std::string> Waiting(const Scheduler& s) {
    std::vector<std::string> out;
    for (const auto& w : s.waiting()) out.push_back(w->request().id);
    return out;
  }
};

}  // namespace thetaserve::scheduler
