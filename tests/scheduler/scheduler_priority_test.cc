// The scheduler by priority (--scheduling-policy priority), on its own: waiting sequences start
// by priority, take the slots and pages of running sequences of a later priority only when
// preempting those surely makes room (shared and cached pages counted as they will be), and
// the step's budget goes in priority order.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/scheduler/scheduler_fixture.h"

namespace thetaserve::scheduler {
namespace {

TEST_F(PriorityTest, WaitingSequencesStartByPriorityThenArrival) {
  cache::PagePool pool{512, kShape.block_size};
  Scheduler by_priority{Config(SchedulingPolicy::kPriority), pool};
  const std::vector<std::pair<std::string, int64_t>> requests = {
      {"a", 5}, {"b", 0}, {"c", 5}, {"d", -1}};
  for (const auto& [id, priority] : requests) Submit(by_priority, id, 10, priority);
  EXPECT_EQ(Waiting(by_priority), (std::vector<std::string>{"d", "b", "a", "c"}));
  EXPECT_EQ(Step(by_priority), (std::vector<std::string>{"d:10+", "b:10+", "a:10+", "c:10+"}));

  cache::PagePool fcfs_pool{512, kShape.block_size};
  Scheduler fcfs{Config(SchedulingPolicy::kFcfs), fcfs_pool};
  for (const char* id : {"a", "b", "c", "d"}) Submit(fcfs, id, 10, 0);
  EXPECT_EQ(Step(fcfs), (std::vector<std::string>{"a:10+", "b:10+", "c:10+", "d:10+"}));
}

// Two slots, held by "chat" (priority 1) and "batch" (priority 5, submitted first). A request
// of batch's priority waits its turn; an urgent one (priority 0) takes the slot of the running
// sequence of the latest priority (batch, though chat is newer), which goes back to the queue
// before the waiting one of its priority (it was submitted first).
TEST_F(PriorityTest, AWaitingSequenceWithoutASlotPreemptsOneOfALaterPriority) {
  cache::PagePool pool{512, kShape.block_size};
  Scheduler s{Config(SchedulingPolicy::kPriority, /*max_num_seqs=*/2), pool};
  Sequence* batch = Submit(s, "batch", 10, 5);
  Sequence* chat = Submit(s, "chat", 10, 1);
  ASSERT_EQ(Step(s), (std::vector<std::string>{"chat:10+", "batch:10+"}));
  Sample(batch);
  Sample(chat);
  Submit(s, "peer", 10, 5);
  StepPlan plan = s.Schedule();
  EXPECT_EQ(ById(plan), (std::vector<std::string>{"chat:1+", "batch:1+"})) << "peer waits";
  EXPECT_TRUE(plan.preempted.empty());
  s.Commit(plan);
  Sample(batch);
  Sample(chat);

  Submit(s, "urgent", 10, 0);
  plan = s.Schedule();
  EXPECT_EQ(ById(plan), (std::vector<std::string>{"urgent:10+", "chat:1+"}));
  EXPECT_EQ(Ids(plan.preempted), std::vector<std::string>{"batch"});
  EXPECT_EQ(batch->num_computed, 0);
  EXPECT_EQ(batch->preemptions, 1);
  EXPECT_EQ(batch->kv().blocks(), 0) << "its pages went back to the pool";
  EXPECT_EQ(Waiting(s), (std::vector<std::string>{"batch", "peer"}));
  EXPECT_EQ(s.num_preemptions(), 1);
  EXPECT_EQ(s.num_priority_preemptions(), 1) << "a preemption for priority, counted as one";
  s.Commit(plan);
}

// The pool is short: a 20-token prompt of priority 9 runs (8 pages: two blocks), then a 15-token
// one of priority 0 takes the last 4. When the second needs its next block, first come, first
// served preempts it (the newest); by priority the first goes, though it is older.
TEST_F(PriorityTest, PagesShortPreemptTheLastByPriorityNotTheNewest) {
  for (SchedulingPolicy policy : {SchedulingPolicy::kFcfs, SchedulingPolicy::kPriority}) {
    const bool by_priority = policy == SchedulingPolicy::kPriority;
    SCOPED_TRACE(by_priority ? "priority" : "fcfs");
    cache::PagePool pool{12, kShape.block_size};
    Scheduler s{Config(policy), pool};
    Sequence* batch = Submit(s, "batch", 20, by_priority ? 9 : 0);
    ASSERT_EQ(Step(s), std::vector<std::string>{"batch:20+"});
    Sample(batch);
    Sequence* urgent = Submit(s, "urgent", 15, 0);
    const std::vector<std::string> both =
        by_priority ? std::vector<std::string>{"urgent:15+", "batch:1+"}
                    : std::vector<std::string>{"batch:1+", "urgent:15+"};
    ASSERT_EQ(Step(s), both);
    EXPECT_EQ(pool.num_free(), 0);
    Sample(batch);
    Sample(urgent);
    ASSERT_EQ(Step(s).size(), 2u);
    Sample(batch);
    Sample(urgent);
    StepPlan plan = s.Schedule();  // urgent reaches its second block
    if (by_priority) {
      EXPECT_EQ(ById(plan), std::vector<std::string>{"urgent:1+"});
      EXPECT_EQ(Ids(plan.preempted), std::vector<std::string>{"batch"});
      EXPECT_EQ(urgent->kv().blocks(), 2);
    } else {
      EXPECT_EQ(ById(plan), std::vector<std::string>{"batch:1+"});
      EXPECT_EQ(Ids(plan.preempted), std::vector<std::string>{"urgent"});
      EXPECT_EQ(batch->kv().blocks(), 2);
    }
    EXPECT_EQ(s.num_preemptions(), 1);
    EXPECT_EQ(s.num_priority_preemptions(), 0) << "a preemption for pages, by either policy";
    s.Commit(plan);
  }
}

// A waiting sequence the pool has no room for preempts a running one of a later priority and
// starts in the same step; one of the same priority does not.
TEST_F(PriorityTest, AWaitingSequenceWithoutRoomPreemptsOneOfALaterPriority) {
  cache::PagePool pool{12, kShape.block_size};
  Scheduler s{Config(SchedulingPolicy::kPriority), pool};
  Sequence* batch = Submit(s, "batch", 20, 9);
  ASSERT_EQ(Step(s), std::vector<std::string>{"batch:20+"});
  Sample(batch);
  Submit(s, "peer", 16, 9);  // needs two blocks (its prompt and first token): 4 pages are left
  ASSERT_EQ(Step(s), std::vector<std::string>{"batch:1+"});
  Sample(batch);
  Sequence* urgent = Submit(s, "urgent", 16, 0);
  StepPlan plan = s.Schedule();
  EXPECT_EQ(ById(plan), std::vector<std::string>{"urgent:16+"});
  EXPECT_EQ(Ids(plan.preempted), std::vector<std::string>{"batch"});
  EXPECT_EQ(Waiting(s), (std::vector<std::string>{"batch", "peer"}));
  EXPECT_EQ(urgent->kv().blocks(), 1);
  EXPECT_EQ(s.num_priority_preemptions(), 1);
  s.Commit(plan);
}

// Preempting is all or nothing: "mid" (priority 1) needs 8 pages; "low" (priority 5), the only
// running sequence of a later priority, would free 4, and "high" (priority 0) is not its to
// take. So low keeps running instead of losing its work for nothing, and mid waits.
TEST_F(PriorityTest, NoPreemptionThatWouldNotLetTheWaitingSequenceStart) {
  cache::PagePool pool{12, kShape.block_size};
  Scheduler s{Config(SchedulingPolicy::kPriority), pool};
  Sequence* high = Submit(s, "high", 20, 0);  // 8 pages
  Sequence* low = Submit(s, "low", 15, 5);    // 4 pages
  ASSERT_EQ(Step(s), (std::vector<std::string>{"high:20+", "low:15+"}));
  ASSERT_EQ(pool.num_free(), 0);
  Sample(high);
  Sample(low);
  Submit(s, "mid", 16, 1);
  StepPlan plan = s.Schedule();
  EXPECT_EQ(ById(plan), (std::vector<std::string>{"high:1+", "low:1+"}));
  EXPECT_TRUE(plan.preempted.empty());
  EXPECT_EQ(Waiting(s), std::vector<std::string>{"mid"});
  s.Commit(plan);
}

// "mid" (priority 5) decodes; "urgent" (priority 0) and "bulk" (priority 9) arrive. The budget
// goes in priority order across running and waiting sequences: urgent's prompt, mid's token,
// then what is left to bulk's prompt (mid got nothing while admissions took the budget first).
TEST_F(PriorityTest, ARunningSequenceTakesTheBudgetBeforeANewcomerOfALaterPriority) {
  cache::PagePool pool{512, kShape.block_size};
  Scheduler s{Config(SchedulingPolicy::kPriority), pool};
  Sequence* mid = Submit(s, "mid", 10, 5);
  ASSERT_EQ(Step(s), std::vector<std::string>{"mid:10+"});
  Sample(mid);
  Submit(s, "urgent", 40, 0);
  Submit(s, "bulk", 100, 9);
  EXPECT_EQ(Step(s), (std::vector<std::string>{"urgent:40+", "mid:1+", "bulk:23"}));
}

// The prefix cache and room: "victim" (priority 5) holds 16 pages, 12 of them its prompt's
// three blocks, which the prefix cache holds too; "early" (priority 0) holds the other 12 of
// the 28. Preempting victim makes its 16 pages available (4 freed, 12 left to the cache).
class PriorityCacheTest : public PriorityTest {
 protected:
  // victim and early running, the pool full; victim's prompt is `shared`.
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(PriorityTest::SetUp());
    shared = Prompt48();
    ASSERT_NO_FATAL_FAILURE(RunCachedPrompt(s, prefix, pool, "victim", 5, &victim));
    early = Submit(s, "early", 40, 0);
    ASSERT_EQ(Step(s), (std::vector<std::string>{"early:40+", "victim:1+"}));
    ASSERT_EQ(pool.num_free(), 0);
    Sample(victim);
    Sample(early);
  }
  cache::PagePool pool{28, kShape.block_size};
  cache::PrefixCache prefix{kShape};
  Scheduler s{Config(SchedulingPolicy::kPriority), pool, &prefix};
  std::vector<int32_t> shared;
  Sequence* victim = nullptr;
  Sequence* early = nullptr;
};

// "urgent" (priority 0, 32 tokens, nothing in common with victim) needs 12 pages: victim's 16
// are room enough, its cached blocks included (counting only the 4 pages no one else holds,
// urgent waited for victim to finish).
TEST_F(PriorityCacheTest, PagesLeftToThePrefixCacheAreRoomToPreemptFor) {
  Submit(s, "urgent", 32, 0);
  StepPlan plan = s.Schedule();
  EXPECT_EQ(ById(plan), (std::vector<std::string>{"early:1+", "urgent:32+"}));
  EXPECT_EQ(Ids(plan.preempted), std::vector<std::string>{"victim"});
  s.Commit(plan);
}

// "urgent" (priority 0) begins with victim's prompt: it needs 24 pages computing the whole
// prompt, or 12 adopting victim's three cached blocks (which adopting pins). Preempting victim
// gives 16 pages, enough for neither, so victim keeps running (counting the blocks both as
// room and as adoptable, it was preempted and urgent did not start).
TEST_F(PriorityCacheTest, PagesAWaitingSequenceWouldAdoptAreNotRoomToPreemptFor) {
  std::vector<int32_t> longer = shared;
  for (int32_t i = 0; i < 32; ++i) longer.push_back(4000 + i);
  Submit(s, "urgent", longer, 0);
  StepPlan plan = s.Schedule();
  EXPECT_EQ(ById(plan), (std::vector<std::string>{"early:1+", "victim:1+"}));
  EXPECT_TRUE(plan.preempted.empty());
  EXPECT_EQ(Waiting(s), std::vector<std::string>{"urgent"});
  s.Commit(plan);
}

// A group of two completions (priority 5) of a 48-token prompt: the second adopted the
// first's first two blocks from the prefix cache, so both hold those 8 pages (and the cache
// does), each 4 more of its own, the first also its fourth block: 20 pages of the 24, and the
// second needs 4 more for its next token. "urgent" (priority 0, 64 tokens) needs 20. Preempting
// both members gives 24 (preempting one frees too little: the shared pages stay held by the
// other): both go and urgent starts. (Counting each member's unshared pages only, 12, gave 16:
// urgent waited for the group to finish.)
TEST_F(PriorityTest, PagesAGroupSharesAreRoomWhenTheWholeGroupIsPreempted) {
  cache::PagePool pool{24, kShape.block_size};
  cache::PrefixCache prefix{kShape};
  Scheduler s{Config(SchedulingPolicy::kPriority), pool, &prefix};
  std::vector<Sequence*> members;
  for (int32_t i = 0; i < 2; ++i) {
    Request r;
    r.id = absl::StrCat(kGroup, "/", i);
    r.group_id = kGroup;
    r.group_index = i;
    r.priority = 5;
    r.prompt = Prompt48();
    r.stopping.max_tokens = 64;
    auto seq = std::make_unique<Sequence>(r, std::make_shared<CollectingSink>(),
                                          model_->tokenizer(), kShape);
    seq->serial = ++serial_;
    members.push_back(seq.get());
    s.AddWaiting(std::move(seq));
  }
  ASSERT_EQ(Step(s), std::vector<std::string>{"g/0:48+"}) << "g/1 waits for g/0's prompt";
  CacheBlocks(prefix, pool, *members[0]);
  ASSERT_EQ(members[0]->cached_blocks, 3);
  Sample(members[0]);
  ASSERT_EQ(Step(s), (std::vector<std::string>{"g/0:1+", "g/1:16+"}));
  ASSERT_EQ(members[1]->cached_blocks, 2);
  ASSERT_EQ(pool.num_free(), 4);
  Sample(members[0]);
  Sample(members[1]);
  Submit(s, "urgent", 64, 0);
  StepPlan plan = s.Schedule();
  EXPECT_EQ(ById(plan), std::vector<std::string>{"urgent:64+"});
  EXPECT_EQ(Ids(plan.preempted), (std::vector<std::string>{"g/1", "g/0"}));
  EXPECT_EQ(s.num_priority_preemptions(), 2);
  s.Commit(plan);
}

// "early" (priority 0) has computed its 48-token prompt, whose three blocks the prefix cache
// holds too, and taken its first token, in a pool of 24 pages.
class EarlyPrefixTest : public PriorityTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(PriorityTest::SetUp());
    prompt = Prompt48();
    ASSERT_NO_FATAL_FAILURE(RunCachedPrompt(s, prefix, pool, "early", 0, &early));
  }
  cache::PagePool pool{24, kShape.block_size};
  cache::PrefixCache prefix{kShape};
  Scheduler s{Config(SchedulingPolicy::kPriority), pool, &prefix};
  std::vector<int32_t> prompt;
  Sequence* early = nullptr;
};

// The other side: "victim" (priority 5) adopted the first two blocks of "early"'s prompt
// (priority 0), so those 8 pages stay held by early when victim goes: preempting it gives 8
// pages (its own block, the one it would take next, the 4 free less what it reserved), short
// of the 12 "mid" (priority 1, 40 tokens) needs. Victim keeps running; mid waits. (Counting
// the pages victim shares with early, preempting it would have seemed to give 16.)
TEST_F(EarlyPrefixTest, PagesSharedWithAnEarlierPriorityAreNoRoom) {
  Sequence* victim = Submit(s, "victim", prompt, 5);
  ASSERT_EQ(Step(s), (std::vector<std::string>{"early:1+", "victim:16+"}));
  ASSERT_EQ(victim->cached_blocks, 2);
  ASSERT_EQ(pool.num_free(), 4);
  Sample(early);
  Sample(victim);
  Submit(s, "mid", 40, 1);
  StepPlan plan = s.Schedule();
  EXPECT_EQ(ById(plan), (std::vector<std::string>{"early:1+", "victim:1+"}));
  EXPECT_TRUE(plan.preempted.empty());
  EXPECT_EQ(Waiting(s), std::vector<std::string>{"mid"});
  s.Commit(plan);
}

// And the way round: "urgent" (priority 1) begins with "early"'s prompt (priority 0, its three
// blocks cached and held by early), then 16 tokens of its own. Computing the whole prompt it
// needs 20 pages; adopting early's blocks, which stay held when "victim" (priority 5) goes, 8:
// victim's 8 pages. Victim is preempted and urgent starts on the adopted prefix. (Asking for
// the whole prompt's pages, victim kept running and urgent waited for it to finish.)
TEST_F(EarlyPrefixTest, ABlockAnEarlierPriorityHoldsIsNoPageToMakeWayFor) {
  Sequence* victim = Submit(s, "victim", 28, 5);
  ASSERT_EQ(Step(s), (std::vector<std::string>{"early:1+", "victim:28+"}));
  ASSERT_EQ(pool.num_free(), 0);
  Sample(early);
  Sample(victim);
  std::vector<int32_t> longer = prompt;
  for (int32_t t = 0; t < 16; ++t) longer.push_back(5000 + t);
  Sequence* urgent = Submit(s, "urgent", longer, 1);
  StepPlan plan = s.Schedule();
  EXPECT_EQ(ById(plan), (std::vector<std::string>{"early:1+", "urgent:16+"}));
  EXPECT_EQ(Ids(plan.preempted), std::vector<std::string>{"victim"});
  EXPECT_EQ(urgent->cached_blocks, 3);
  EXPECT_EQ(Waiting(s), std::vector<std::string>{"victim"});
  s.Commit(plan);
}

// The step's budget (64 tokens) goes by priority: a 40-token urgent prompt arriving while a
// 200-token batch prompt computes gets its chunk first and the give-back first (chunks held to
// 16), or its whole prompt before the batch prompt (no hold); first come, first served gives
// the older prompt the budget first.
TEST_F(PriorityTest, TheBudgetGoesToAnEarlierPriorityFirst) {
  for (int64_t limit : {16, 0}) {
    for (SchedulingPolicy policy : {SchedulingPolicy::kFcfs, SchedulingPolicy::kPriority}) {
      const bool by_priority = policy == SchedulingPolicy::kPriority;
      SCOPED_TRACE(absl::StrCat(by_priority ? "priority" : "fcfs", ", limit ", limit));
      cache::PagePool pool{512, kShape.block_size};
      SchedulerConfig config = Config(policy);
      config.long_prefill_tokens = limit;
      Scheduler s{config, pool};
      Submit(s, "batch", 200, by_priority ? 9 : 0);
      ASSERT_EQ(Step(s), std::vector<std::string>{"batch:64"});
      Submit(s, "urgent", 40, 0);
      std::vector<std::string> expected = {"urgent:40+", "batch:24"};
      if (!by_priority) {
        expected = limit > 0 ? std::vector<std::string>{"batch:48", "urgent:16"}
                             : std::vector<std::string>{"batch:64"};
      }
      EXPECT_EQ(Step(s), expected);
    }
  }
}

}  // namespace
}  // namespace thetaserve::scheduler
