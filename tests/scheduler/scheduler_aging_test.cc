// The priority policy with aging (serve --priority-aging): a request's priority improves with
// the time since it was submitted, so a request kept waiting by more urgent ones goes before
// those submitted long enough after it, is no longer preempted for them, and without aging the
// order is vLLM's strict one.
#include <chrono>
#include <climits>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/scheduler/scheduler_fixture.h"

namespace thetaserve::scheduler {
namespace {

Clock::time_point At(double seconds) {
  return Clock::time_point{} +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

class AgingTest : public PriorityTest {
 protected:
  static SchedulerConfig Aging(double levels_per_second, int64_t max_num_seqs = 64) {
    SchedulerConfig c = Config(SchedulingPolicy::kPriority, max_num_seqs);
    c.priority_aging = levels_per_second;
    return c;
  }
};

// priority + aging × submission time, then the serial (0.25 levels a second: exact in binary,
// so the tie is one).
TEST(PriorityOrderTest, AgingOrdersByPriorityPlusTheTimeSubmitted) {
  const PriorityKey batch{5, At(100), 1};
  const PriorityKey urgent_16{0, At(116), 2};  // 16 s later: 4 levels gained, 5 needed
  const PriorityKey urgent_20{0, At(120), 3};  // 20 s later: a tie, the serial decides
  const PriorityKey urgent_24{0, At(124), 4};
  EXPECT_TRUE(InPriorityOrder(urgent_16, batch, 0.25));
  EXPECT_FALSE(InPriorityOrder(batch, urgent_16, 0.25));
  EXPECT_TRUE(InPriorityOrder(batch, urgent_20, 0.25));
  EXPECT_FALSE(InPriorityOrder(urgent_20, batch, 0.25));
  EXPECT_TRUE(InPriorityOrder(batch, urgent_24, 0.25));
  EXPECT_FALSE(InPriorityOrder(urgent_24, batch, 0.25));
  // Without aging the priority alone, then the serial.
  EXPECT_TRUE(InPriorityOrder(urgent_24, batch, 0));
  EXPECT_FALSE(InPriorityOrder(batch, urgent_24, 0));
  const PriorityKey late_peer{5, At(50), 9};  // of batch's priority, submitted before it
  EXPECT_TRUE(InPriorityOrder(batch, late_peer, 0)) << "by the serial";
  EXPECT_TRUE(InPriorityOrder(late_peer, batch, 0.25)) << "by the time submitted";
  // Strict priorities compare exactly at the ends of the range (a double would not).
  const PriorityKey top{LLONG_MAX, At(0), 2}, below_top{LLONG_MAX - 1, At(0), 3};
  EXPECT_TRUE(InPriorityOrder(below_top, top, 0));
  EXPECT_FALSE(InPriorityOrder(top, below_top, 0));
  EXPECT_FALSE(InPriorityOrder(batch, batch, 0.25));
  EXPECT_FALSE(InPriorityOrder(batch, batch, 0));
}

// One slot, held. A batch request (priority 5) submitted at 0 s waits behind it; urgent ones
// (priority 0) come at 40 s and 60 s. At 0.1 levels a second the batch request has gained
// more than 5 levels on the second, not on the first: the queue is urgent-40, batch,
// urgent-60. Strict, it is last.
TEST_F(AgingTest, AWaitingRequestGoesBeforeThoseSubmittedLongEnoughAfterIt) {
  for (double aging : {0.1, 0.0}) {
    SCOPED_TRACE(aging);
    cache::PagePool pool{512, kShape.block_size};
    Scheduler s{Aging(aging, /*max_num_seqs=*/1), pool};
    now_ = At(0);
    Submit(s, "busy", 10, -10);
    ASSERT_EQ(Step(s), std::vector<std::string>{"busy:10+"});
    Submit(s, "batch", 10, 5);
    now_ = At(40);
    Submit(s, "urgent-40", 10, 0);
    now_ = At(60);
    Submit(s, "urgent-60", 10, 0);
    EXPECT_EQ(Waiting(s), aging > 0
                              ? (std::vector<std::string>{"urgent-40", "batch", "urgent-60"})
                              : (std::vector<std::string>{"urgent-40", "urgent-60", "batch"}));
  }
}

// One slot, held by a batch request (priority 5) submitted at 0 s. An urgent request (priority
// 0) preempts it for the slot when it comes before it in the order: at 40 s, but not at 60 s
// (at 0.1 levels a second the batch request has gained 6), when it waits for the slot instead.
TEST_F(AgingTest, ARequestThatWaitedLongEnoughIsNotPreemptedForALaterOne) {
  for (double urgent_at : {40.0, 60.0}) {
    SCOPED_TRACE(urgent_at);
    cache::PagePool pool{512, kShape.block_size};
    Scheduler s{Aging(0.1, /*max_num_seqs=*/1), pool};
    now_ = At(0);
    Sequence* batch = Submit(s, "batch", 10, 5);
    ASSERT_EQ(Step(s), std::vector<std::string>{"batch:10+"});
    Sample(batch);
    now_ = At(urgent_at);
    Submit(s, "urgent", 10, 0);
    StepPlan plan = s.Schedule();
    if (urgent_at < 50) {
      EXPECT_EQ(ById(plan), std::vector<std::string>{"urgent:10+"});
      EXPECT_EQ(Ids(plan.preempted), std::vector<std::string>{"batch"});
      EXPECT_EQ(s.num_priority_preemptions(), 1);
    } else {
      EXPECT_EQ(ById(plan), std::vector<std::string>{"batch:1+"});
      EXPECT_TRUE(plan.preempted.empty());
      EXPECT_EQ(Waiting(s), std::vector<std::string>{"urgent"});
      EXPECT_EQ(s.num_priority_preemptions(), 0);
    }
    s.Commit(plan);
  }
}

// The waiting request preempts the last of the running requests that come after it and are of
// a strictly later priority, not simply the last running one, which with aging may come after
// it without being of a later priority. In the engine: a completion of an n > 1 group waits for
// its group's prompt while later requests pass it (WaitsForGroupPrompt); one of them, more
// urgent than it but submitted long after, then runs last in the order. Here submission times
// out of serial order stand for that. Running: x (priority 5 at 0 s: 5 at 1 level a second)
// and y (priority 1 at 10 s: 11); waiting: s (priority 2 at 1 s: 3). y comes last, but only x
// is later than s; preempting y would have taken a slot from a more urgent request.
TEST_F(AgingTest, MakingWayPreemptsTheLastLaterRequestNotTheLastRunning) {
  cache::PagePool pool{512, kShape.block_size};
  Scheduler s{Aging(1.0, /*max_num_seqs=*/2), pool};
  now_ = At(0);
  Sequence* x = Submit(s, "x", 10, 5);
  now_ = At(10);
  Sequence* y = Submit(s, "y", 10, 1);
  ASSERT_EQ(Step(s), (std::vector<std::string>{"x:10+", "y:10+"}));
  Sample(x);
  Sample(y);
  now_ = At(1);
  Submit(s, "s", 10, 2);
  StepPlan plan = s.Schedule();
  EXPECT_EQ(Ids(plan.preempted), std::vector<std::string>{"x"});
  EXPECT_EQ(ById(plan), (std::vector<std::string>{"s:10+", "y:1+"}));
  EXPECT_EQ(s.num_priority_preemptions(), 1);
  s.Commit(plan);
}

// --priority-aging 0 (the default) is no aging, which either policy takes; a rate above 0 only
// the priority policy (fcfs has no priorities to age); a rate that is not a finite number >= 0
// neither.
TEST(AgingFlagTest, ZeroAgingIsTakenByEitherPolicyAndARateOnlyByPriority) {
  EXPECT_TRUE(CheckPriorityAging(SchedulingPolicy::kFcfs, 0).ok());
  EXPECT_TRUE(CheckPriorityAging(SchedulingPolicy::kPriority, 0).ok());
  EXPECT_TRUE(CheckPriorityAging(SchedulingPolicy::kPriority, 0.5).ok());
  EXPECT_EQ(CheckPriorityAging(SchedulingPolicy::kFcfs, 0.5).message(),
            "--priority-aging ages request priorities, which only --scheduling-policy priority "
            "has");
  for (double bad : {-1.0, std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_FALSE(CheckPriorityAging(SchedulingPolicy::kPriority, bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace thetaserve::scheduler
