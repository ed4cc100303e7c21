// The scheduler on its own (page accounting and the prefix cache, no forward pass): how the
// completions of one group (the APIs' n) share the prompt's computation.
#include "scheduler/scheduler.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "tests/scheduler/collecting_sink.h"
#include "tests/test_util.h"

namespace thetaserve::scheduler {
namespace {

constexpr cache::KvShape kShape{2, 1, 16, 8};  // 2 tables, 16 rows a page
constexpr int64_t kPromptTokens = 40;           // 2 whole blocks the cache can hold, and 8
// A string, not a literal: assigning a literal to Request::group_id trips a false -Wrestrict
// warning in GCC 12.
const std::string kGroup = "g";

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = model::Model::Load(testing::DefaultModelPath());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m).release();
  }
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
  void CacheBlocks(Sequence& seq) {
    const int64_t full = seq.num_computed / kShape.block_size;
    prefix_.Insert(seq.tokens(), seq.cached_blocks, full, seq.kv(), pool_, &seq.cache_cursor);
    seq.cached_blocks = full;
  }

  // The planned chunks as "index:tokens" (member index, tokens computed this step).
  static std::vector<std::string> Chunks(const StepPlan& plan) {
    std::vector<std::string> out;
    for (const ScheduledChunk& c : plan.chunks) {
      out.push_back(absl::StrCat(c.seq->request().group_index, ":", c.num_tokens));
    }
    return out;
  }

  inline static model::Model* model_ = nullptr;
  cache::PagePool pool_{256, kShape.block_size};
  cache::PrefixCache prefix_{kShape};
  Scheduler scheduler_{SchedulerConfig{}, pool_, &prefix_};
  std::vector<Sequence*> members_;
};

TEST_F(SchedulerTest, TheRestOfAGroupAdoptsThePromptItsFirstCompletionComputed) {
  for (int32_t i = 0; i < 3; ++i) AddMember(i);
  StepPlan first = scheduler_.Schedule();
  EXPECT_EQ(Chunks(first), std::vector<std::string>{"0:40"}) << "1 and 2 wait for 0's prompt";
  scheduler_.Commit(first);
  CacheBlocks(*members_[0]);
  StepPlan second = scheduler_.Schedule();
  // 1 and 2 adopt 0's two blocks and compute the last 8 prompt tokens (0, which has sampled
  // nothing here, has nothing to compute).
  EXPECT_EQ(Chunks(second), (std::vector<std::string>{"1:8", "2:8"}));
}

// The prompt's blocks are evicted between the first completion's step and the rest's admission
// (memory pressure, here Clear): the rest each computed the whole prompt, in the same step.
// Now one computes it and the other adopts its blocks a step later.
TEST_F(SchedulerTest, AGroupWhosePromptWasEvictedComputesItOnceMoreNotPerMember) {
  for (int32_t i = 0; i < 3; ++i) AddMember(i);
  StepPlan first = scheduler_.Schedule();
  ASSERT_EQ(Chunks(first), std::vector<std::string>{"0:40"});
  scheduler_.Commit(first);
  CacheBlocks(*members_[0]);
  scheduler_.Remove(members_[0]);  // it ended with its prompt's step (max_tokens 1)
  prefix_.Clear(pool_);
  ASSERT_EQ(prefix_.num_blocks(), 0);

  StepPlan second = scheduler_.Schedule();
  EXPECT_EQ(Chunks(second), std::vector<std::string>{"1:40"}) << "2 waits for 1's prompt";
  scheduler_.Commit(second);
  CacheBlocks(*members_[1]);
  StepPlan third = scheduler_.Schedule();
  EXPECT_EQ(Chunks(third), std::vector<std::string>{"2:8"});
  EXPECT_EQ(members_[2]->cached_blocks, 2);
}

}  // namespace
}  // namespace thetaserve::scheduler
