// The scheduler on its own (page accounting and the prefix cache, no forward pass): how the
// completions of one group (the APIs' n) share the prompt's computation, and long prompts'
// chunks held so that short requests start beside them. Priorities: scheduler_priority_test.cc.
#include "scheduler/scheduler.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/scheduler/scheduler_fixture.h"

namespace thetaserve::scheduler {
namespace {

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

// Chunks while the step is shared (SchedulerConfig::long_prefill_tokens): a budget of 64 tokens
// a step, chunks held to 16 while another sequence runs or one waits, no prefix cache.
TEST_F(LongPrefillTest, APromptAloneTakesTheWholeBudget) {
  Add("long", 200);
  EXPECT_EQ(Step(held_), std::vector<std::string>{"long:64"});
  EXPECT_EQ(Step(held_), std::vector<std::string>{"long:64"});
}

// A short request arriving while a long prompt computes starts in the next step (its first
// token sampled there) instead of after the whole prefill, and then decodes a token every step
// beside the prompt's chunks (running sequences are served oldest first: without the hold its
// decode token waited for the rest of the prefill); the long prompt gives up only the short
// one's tokens.
TEST_F(LongPrefillTest, AShortRequestStartsAndDecodesBesideALongPrefill) {
  Sequence* long_seq = Add("long", 200);
  ASSERT_EQ(Step(held_), std::vector<std::string>{"long:64"});
  Sequence* short_seq = Add("short", 10);
  EXPECT_EQ(Step(held_), (std::vector<std::string>{"long:54", "short:10+"}));
  EXPECT_EQ(long_seq->num_computed, 118);
  EXPECT_EQ(long_seq->kv().capacity_tokens(), 128) << "pages for the tokens computed";
  Sample(short_seq);
  EXPECT_EQ(Step(held_), (std::vector<std::string>{"long:63", "short:1+"}));
  Sample(short_seq);
  EXPECT_EQ(Step(held_), (std::vector<std::string>{"long:19+", "short:1+"}));
}

// Under a sparse policy with fixed compaction the engine compacts a prompt only at multiples
// of the budget and at its end (SparseChunkEnd), so a chunk ends at the next multiple at the
// latest: in the first pass, and when a held chunk takes back what the others left (which
// once ran past one: the engine then computed queries a compaction should have come before).
// Without it (the default) the chunks are AShortRequestStartsAndDecodesBesideALongPrefill's.
TEST_F(LongPrefillTest, UnderFixedCompactionChunksNeverCrossACompactionPoint) {
  cache::PagePool pool{512, kShape.block_size};
  SchedulerConfig config = Config(16);
  config.sparse.enabled = true;
  config.sparse.fixed_compaction = true;
  Scheduler s{config, pool};
  Sequence* long_seq = Submit(s, "long", 200);
  ASSERT_EQ(Step(s), std::vector<std::string>{"long:64"});
  Sequence* short_seq = Submit(s, "short", 10);
  EXPECT_EQ(Step(s), (std::vector<std::string>{"long:54", "short:10+"}));
  Sample(short_seq);
  // Without the policy, long:63 (118 to 181, past 128).
  EXPECT_EQ(Step(s), (std::vector<std::string>{"long:10", "short:1+"}));
  EXPECT_EQ(long_seq->num_computed, 128);
  Sample(short_seq);
  EXPECT_EQ(Step(s), (std::vector<std::string>{"long:63", "short:1+"}));
  Sample(short_seq);
  EXPECT_EQ(Step(s), (std::vector<std::string>{"long:1", "short:1+"}));  // to 192
  Sample(short_seq);
  EXPECT_EQ(Step(s), (std::vector<std::string>{"long:8+", "short:1+"}));

  // The sparse policy's default: the third step's chunk runs past 128.
  cache::PagePool default_pool{512, kShape.block_size};
  config.sparse.fixed_compaction = false;
  Scheduler d{config, default_pool};
  Submit(d, "long", 200);
  ASSERT_EQ(Step(d), std::vector<std::string>{"long:64"});
  Sequence* other = Submit(d, "short", 10);
  ASSERT_EQ(Step(d), (std::vector<std::string>{"long:54", "short:10+"}));
  Sample(other);
  EXPECT_EQ(Step(d), (std::vector<std::string>{"long:63", "short:1+"}));
}

// A newcomer whose prompt is longer than the limit gets the limit every step until its prompt
// is done (it got one chunk, then waited for the older prompt's whole prefill).
TEST_F(LongPrefillTest, ALongerNewcomerGetsItsShareEveryStep) {
  Add("long", 200);
  ASSERT_EQ(Step(held_), std::vector<std::string>{"long:64"});
  Add("mid", 40);
  EXPECT_EQ(Step(held_), (std::vector<std::string>{"long:48", "mid:16"}));
  EXPECT_EQ(Step(held_), (std::vector<std::string>{"long:48", "mid:16"}));
  EXPECT_EQ(Step(held_), (std::vector<std::string>{"long:40+", "mid:8+"}));
}

// Two long prompts at once share every step: the second gets the limit, the first the rest.
TEST_F(LongPrefillTest, TwoLongPromptsShareEveryStep) {
  Add("a", 200);
  Add("b", 200);
  EXPECT_EQ(Step(held_), (std::vector<std::string>{"a:48", "b:16"}));
  EXPECT_EQ(Step(held_), (std::vector<std::string>{"a:48", "b:16"}));
}

// A waiting sequence the pool turns away holds nothing back: the held chunk takes the budget.
TEST_F(LongPrefillTest, ASequenceThePoolTurnsAwayHoldsNothingBack) {
  // 16 blocks (4 pages each: K and V of 2 layers): one 200-token prompt's 13, not two.
  cache::PagePool small{64, kShape.block_size};
  Scheduler s{Config(16), small};
  for (const char* id : {"long", "big"}) Submit(s, id, 200);
  EXPECT_EQ(Step(s), std::vector<std::string>{"long:64"}) << "big does not fit beside long";
  EXPECT_EQ(s.waiting().size(), 1u);
  EXPECT_EQ(Step(s), std::vector<std::string>{"long:64"});
}

TEST_F(LongPrefillTest, WithoutALimitAShortRequestWaitsForThePrefill) {
  cache::PagePool pool{512, kShape.block_size};
  Scheduler unheld{Config(0), pool};
  Submit(unheld, "long", 200);
  ASSERT_EQ(Step(unheld), std::vector<std::string>{"long:64"});
  Submit(unheld, "short", 10);
  EXPECT_EQ(Step(unheld), std::vector<std::string>{"long:64"});
  EXPECT_EQ(Step(unheld), std::vector<std::string>{"long:64"});
  EXPECT_EQ(Step(unheld), (std::vector<std::string>{"long:8+", "short:10+"}));
}

// SchedulerConfig::policy: a budget of 64 tokens a step, no hold on chunks, no prefix cache;
// blocks of 16 rows, 4 pages each (K and V of 2 layers).

}  // namespace
}  // namespace thetaserve::scheduler
