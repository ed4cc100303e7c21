// The engine's request queue on the real model: its bound (--max-queue), a burst the free slots
// take, calls queued whole or not at all, and by priority the displacement of waiting batch
// requests by more urgent ones — never of requests that ran, of a group's completions, nor more
// than a call adds.
#include <climits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/scheduler/engine_fixture.h"

namespace thetaserve::scheduler {
namespace {

// A sink that stops the engine thread inside its k-th OnTokens until Allow(k) (at least):
// while it waits no step ends, so a test can submit against the state the last step left.
class GatedSink : public CollectingSink {
 public:
  void OnTokens(const TokenDelta& d) override {
    CollectingSink::OnTokens(d);
    std::unique_lock<std::mutex> lock(gate_mu_);
    const int call = ++calls_;
    gate_cv_.notify_all();
    gate_cv_.wait(lock, [&] { return call <= allowed_; });
  }
  void Allow(int calls) {
    std::lock_guard<std::mutex> lock(gate_mu_);
    allowed_ = calls;
    gate_cv_.notify_all();
  }
  // Whether the engine thread reached call `call` within `seconds`.
  bool WaitForCall(int call, double seconds) {
    std::unique_lock<std::mutex> lock(gate_mu_);
    return gate_cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                             [&] { return calls_ >= call; });
  }

 private:
  std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  int calls_ = 0;
  int allowed_ = 0;
};

class EngineQueueTest : public EngineTest {
 protected:
  // One request runs, the rest wait in a queue of `max_queue`, by priority.
  // With `aging`: SchedulerConfig::priority_aging.
  std::unique_ptr<Engine> OneSlotByPriority(int64_t max_queue, double aging = 0) {
    EngineConfig config;
    config.kv_cache_bytes = int64_t(128) << 20;
    config.max_queue = max_queue;
    config.scheduler.max_num_seqs = 1;
    config.scheduler.policy = SchedulingPolicy::kPriority;
    config.scheduler.priority_aging = aging;
    return CpuEngine(config);
  }
  // Submits "Hello" as request `id` of `priority` for exactly `max_tokens` tokens; its sink is
  // sinks_[id].
  absl::Status Submit(Engine& engine, const std::string& id, int64_t priority,
                      int max_tokens = 4) {
    Request r = MakeRequest(id, "Hello", max_tokens);
    r.stopping.ignore_eos = true;
    r.priority = priority;
    sinks_[id] = std::make_shared<TimedSink>();
    return engine.Submit(r, sinks_[id]);
  }
  static void WaitUntilOneRuns(const Engine& engine) {
    while (engine.Stats().running == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  // A CollectingSink that notes when its request finished.
  class TimedSink : public CollectingSink {
   public:
    void OnFinish(const FinishInfo& i) override {
      finished_at = Clock::now();
      CollectingSink::OnFinish(i);
    }
    Clock::time_point finished_at;  // read after Wait
  };

  std::map<std::string, std::shared_ptr<CollectingSink>> sinks_;
};

// A group goes into the queue whole or not at all.
TEST_F(EngineQueueTest, SubmitAllQueuesAllOrNone) {
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
  // More than the queue holds at all: never retryable, and no one request's fault.
  int refused = -1;
  absl::Status st = engine->SubmitAll(requests, sinks, &refused);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("(--max-queue 2) even when it is empty"),
            std::string::npos) << st;
  EXPECT_EQ(refused, -1);
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
  st = engine->SubmitAll(requests, sinks, &refused);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(std::string(st.message()).find("cannot take 2 more (1 waiting"), std::string::npos)
      << st;
  EXPECT_EQ(refused, -1);
  engine->Cancel("busy");
  ASSERT_TRUE(busy_sink->Wait(300));
  ASSERT_TRUE(queued_sink->Wait(300));
  ASSERT_TRUE(engine->WaitIdle(10));
  const int64_t finished_before = engine->Stats().counters.requests_finished;
  // One bad request refuses the whole group, and is named.
  requests[1].stopping.max_tokens = 100000;
  st = engine->SubmitAll(requests, sinks, &refused);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_EQ(refused, 1);
  EXPECT_TRUE(engine->WaitIdle(1));
  EXPECT_EQ(engine->Stats().counters.requests_finished, finished_before);
  // Two fit.
  requests[1].stopping.max_tokens = 4;
  ASSERT_TRUE(engine->SubmitAll(requests, sinks).ok());
  for (auto& sk : sinks) ASSERT_TRUE(static_cast<CollectingSink&>(*sk).Wait(300));
}

// A burst that the free slots take is not refused as a full queue before a step has started
// it (it was: arrivals counted as waiting until the next step ran, so with --max-queue 1 the
// second of three requests to an idle server with three slots got RESOURCE_EXHAUSTED). Past
// the slots the queue's bound holds, whether or not a step has run meanwhile.
TEST_F(EngineQueueTest, ABurstThatFitsTheFreeSlotsIsNotQueued) {
  EngineConfig config;
  config.kv_cache_bytes = int64_t(64) << 20;
  config.max_queue = 1;
  config.scheduler.max_num_seqs = 3;
  auto engine = CpuEngine(config);
  ASSERT_NE(engine, nullptr);
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  auto submit = [&](int i) {
    Request r = MakeRequest(absl::StrCat("burst/", i), "Hello", 200);
    r.stopping.ignore_eos = true;
    sinks.push_back(std::make_shared<CollectingSink>());
    return engine->Submit(r, sinks.back());
  };
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(submit(i).ok()) << "request " << i;  // 3 run, 1 waits
  const absl::Status st = submit(4);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(std::string(st.message()).find("the request queue is full (1 waiting)"),
            std::string::npos) << st;
  for (int i = 0; i < 4; ++i) engine->Cancel(absl::StrCat("burst/", i));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(sinks[i]->Wait(300));
  ASSERT_TRUE(engine->WaitIdle(10));
}

// By priority, a request that finds the queue full takes the place of the least urgent request
// waiting that has never run — the latest of that priority to arrive — if that one is strictly
// less urgent: it ends with RESOURCE_EXHAUSTED (as if refused), and the queue's bound holds.
// A request no waiting one is less urgent than is refused as before, and so is a group with
// fewer less urgent requests than it needs; one that ran and was preempted is never displaced.
TEST_F(EngineQueueTest, AMoreUrgentRequestTakesTheQueuePlaceOfTheLeastUrgent) {
  auto engine = OneSlotByPriority(/*max_queue=*/2);
  ASSERT_NE(engine, nullptr);
  auto& sinks = sinks_;
  auto submit = [&](const std::string& id, int64_t priority, int max_tokens = 4) {
    return Submit(*engine, id, priority, max_tokens);
  };
  // The running request is the most urgent: nothing preempts it.
  ASSERT_TRUE(submit("busy", 0, 2000).ok());  // runs until cancelled below
  WaitUntilOneRuns(*engine);
  ASSERT_TRUE(submit("batch-a", 5).ok());
  ASSERT_TRUE(submit("batch-b", 5).ok());
  // The queue is full; a third batch request is refused, and the message says why.
  absl::Status st = submit("batch-c", 5);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(std::string(st.message()).find(
                "full (2 waiting, none both less urgent than priority 5 and not yet started)"),
            std::string::npos) << st;
  // A more urgent one takes batch-b's place (the later of the two).
  ASSERT_TRUE(submit("urgent-1", 3).ok());
  ASSERT_TRUE(sinks["batch-b"]->Wait(60));
  EXPECT_EQ(sinks["batch-b"]->info.status.code(), absl::StatusCode::kResourceExhausted)
      << sinks["batch-b"]->info.status;
  EXPECT_NE(std::string(sinks["batch-b"]->info.status.message())
                .find("a more urgent request took this one's place (its priority 5 was"),
            std::string::npos) << sinks["batch-b"]->info.status;
  EXPECT_TRUE(sinks["batch-b"]->tokens.empty());
  // The next takes batch-a's; after that nothing waiting is less urgent than 3.
  ASSERT_TRUE(submit("urgent-2", 3).ok());
  ASSERT_TRUE(sinks["batch-a"]->Wait(60));
  EXPECT_EQ(sinks["batch-a"]->info.status.code(), absl::StatusCode::kResourceExhausted);
  st = submit("urgent-3", 3);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  // A group needing two places where one request is less urgent is refused whole.
  std::vector<Request> group;
  std::vector<std::shared_ptr<TokenSink>> group_sinks;
  for (int i = 0; i < 2; ++i) {
    group.push_back(MakeRequest(absl::StrCat("group/", i), "Hello", 4));
    group.back().priority = 1;
    group.back().stopping.ignore_eos = true;
    group_sinks.push_back(std::make_shared<CollectingSink>());
  }
  ASSERT_TRUE(submit("urgent-4", 2).ok());  // takes urgent-2's place: waiting are urgent-1, -4
  ASSERT_TRUE(sinks["urgent-2"]->Wait(60));
  EXPECT_EQ(sinks["urgent-2"]->info.status.code(), absl::StatusCode::kResourceExhausted);
  // A group of two of priority 2 finds one request less urgent (urgent-1): too few; it takes
  // nothing, and urgent-1 stays.
  std::vector<Request> pair;
  std::vector<std::shared_ptr<TokenSink>> pair_sinks;
  for (int i = 0; i < 2; ++i) {
    pair.push_back(MakeRequest(absl::StrCat("pair/", i), "Hello", 4));
    pair.back().priority = 2;
    pair_sinks.push_back(std::make_shared<CollectingSink>());
  }
  st = engine->SubmitAll(pair, pair_sinks);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(std::string(st.message()).find("fewer than 2 of them both less urgent than priority 2"),
            std::string::npos) << st;
  EXPECT_FALSE(sinks["urgent-1"]->Wait(0.5)) << "displaced for a group that was refused";
  EXPECT_TRUE(engine->SubmitAll(group, group_sinks).ok()) << "both waiting are less urgent than 1";
  ASSERT_TRUE(sinks["urgent-1"]->Wait(60));
  ASSERT_TRUE(sinks["urgent-4"]->Wait(60));
  EXPECT_EQ(sinks["urgent-1"]->info.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(sinks["urgent-4"]->info.status.code(), absl::StatusCode::kResourceExhausted);
  st = engine->SubmitAll(group, group_sinks);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(std::string(st.message()).find("fewer than 2 of them both less urgent than priority 1"),
            std::string::npos) << st;
  const EngineStats stats = engine->Stats();
  EXPECT_EQ(stats.counters.requests_displaced, 5);
  EXPECT_LE(stats.waiting, 2) << "the bound holds";
  EXPECT_FALSE(sinks["busy"]->Wait(0)) << "the running request goes on";
  engine->Cancel("busy");
  ASSERT_TRUE(sinks["busy"]->Wait(300));
  for (auto& sk : group_sinks) {
    ASSERT_TRUE(static_cast<CollectingSink&>(*sk).Wait(300));
    EXPECT_TRUE(static_cast<CollectingSink&>(*sk).info.status.ok());
    EXPECT_EQ(static_cast<CollectingSink&>(*sk).tokens.size(), 4u);
  }
  ASSERT_TRUE(engine->WaitIdle(10));
  const auto& pool = engine->pool_for_tests();
  EXPECT_EQ(pool.num_free(), pool.num_pages()) << "pages leaked";
}

// Nor is a completion of an n > 1 group (or a prompt of a call of several): ending one would
// end every one of them, those that ran too.
TEST_F(EngineQueueTest, AGroupsCompletionsAreNotDisplaced) {
  auto engine = OneSlotByPriority(/*max_queue=*/2);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(Submit(*engine, "busy", 0, 2000).ok());  // runs until cancelled below
  WaitUntilOneRuns(*engine);
  std::vector<Request> group;
  std::vector<std::shared_ptr<TokenSink>> group_sinks;
  for (int i = 0; i < 2; ++i) {
    group.push_back(MakeRequest(absl::StrCat("g/", i), "Hello", 4));
    group.back().priority = 5;
    group.back().group_id = "g";
    group.back().group_index = i;
    group_sinks.push_back(std::make_shared<CollectingSink>());
  }
  ASSERT_TRUE(engine->SubmitAll(group, group_sinks).ok());
  const absl::Status st = Submit(*engine, "urgent", 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_EQ(engine->Stats().counters.requests_displaced, 0);
  engine->Cancel("busy");
  ASSERT_TRUE(sinks_["busy"]->Wait(300));
  for (auto& sk : group_sinks) {
    ASSERT_TRUE(static_cast<CollectingSink&>(*sk).Wait(300));
    EXPECT_TRUE(static_cast<CollectingSink&>(*sk).info.status.ok());
  }
  ASSERT_TRUE(engine->WaitIdle(10));
}

// A request that ran and was preempted back into the queue is not displaced: its work is not
// thrown away for an arrival (it waits as a queued one, but was admitted once).
TEST_F(EngineQueueTest, APreemptedRequestIsNotDisplaced) {
  auto engine = OneSlotByPriority(/*max_queue=*/1);
  ASSERT_NE(engine, nullptr);
  auto& sinks = sinks_;
  ASSERT_TRUE(Submit(*engine, "batch", 5, 2000).ok());  // both run until cancelled below
  WaitUntilOneRuns(*engine);
  // An urgent request preempts the batch one, which waits, having run.
  ASSERT_TRUE(Submit(*engine, "urgent", 0, 2000).ok());
  while (engine->Stats().counters.priority_preemptions == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const absl::Status st = Submit(*engine, "medium", 3);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_FALSE(sinks["batch"]->Wait(0));
  EXPECT_EQ(engine->Stats().counters.requests_displaced, 0);
  engine->Cancel("urgent");
  engine->Cancel("batch");
  ASSERT_TRUE(sinks["urgent"]->Wait(300));
  ASSERT_TRUE(sinks["batch"]->Wait(300));
  EXPECT_TRUE(absl::IsCancelled(sinks["batch"]->info.status)) << sinks["batch"]->info.status;
  ASSERT_TRUE(engine->WaitIdle(10));
}

// A burst the free slots took may leave the queue past its bound when the token budget holds
// some of it back; an urgent arrival then displaces as many requests as it adds (one), not the
// queue's whole overflow. The engine thread is held inside the busy request's sink, so every
// submission below sees the state the last step left.
TEST_F(EngineQueueTest, AnArrivalDisplacesNoMoreThanItAdds) {
  EngineConfig config;
  config.kv_cache_bytes = int64_t(128) << 20;
  config.max_queue = 1;
  config.scheduler.max_num_seqs = 3;
  config.scheduler.max_num_batched_tokens = 32;  // a's prompt takes several steps
  config.scheduler.long_prefill_tokens = 0;       // a's chunk takes all the budget leaves
  config.scheduler.policy = SchedulingPolicy::kPriority;
  auto engine = CpuEngine(config);
  ASSERT_NE(engine, nullptr);
  auto busy = std::make_shared<GatedSink>();
  absl::Cleanup open_gate = [&] { busy->Allow(INT_MAX); };  // before the engine stops
  Request r = MakeRequest("busy", "Hello", 2000);  // runs until cancelled below
  r.stopping.ignore_eos = true;
  ASSERT_TRUE(engine->Submit(r, busy).ok());
  ASSERT_TRUE(busy->WaitForCall(1, 60)) << "the first step did not end";
  // Held in the first step: the three arrivals are a burst the two free slots and the queue's
  // one place take.
  std::string text;
  for (int i = 0; i < 12; ++i) text += "The quick brown fox jumps over the lazy dog. ";
  Request a = MakeRequest("a", text, 4);
  a.stopping.ignore_eos = true;
  a.priority = 5;
  ASSERT_GT(a.prompt.size(), 64u);
  sinks_["a"] = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(a, sinks_["a"]).ok());
  ASSERT_TRUE(Submit(*engine, "b", 5).ok());
  ASSERT_TRUE(Submit(*engine, "c", 5).ok());
  // The next step starts a with the whole token budget: b and c wait, two in a queue of one.
  busy->Allow(2);
  ASSERT_TRUE(busy->WaitForCall(3, 60)) << "the third step did not end";
  EngineStats stats = engine->Stats();
  ASSERT_EQ(stats.running, 2);
  ASSERT_EQ(stats.waiting, 2);
  absl::Status st = Submit(*engine, "d", 5);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(std::string(st.message()).find("full (2 waiting"), std::string::npos) << st;
  // An urgent arrival adds one: c (the later) goes, b stays.
  ASSERT_TRUE(Submit(*engine, "urgent", 1).ok());
  busy->Allow(INT_MAX);
  ASSERT_TRUE(sinks_["c"]->Wait(60));
  EXPECT_EQ(sinks_["c"]->info.status.code(), absl::StatusCode::kResourceExhausted)
      << sinks_["c"]->info.status;
  for (const char* id : {"a", "b", "urgent"}) {
    ASSERT_TRUE(sinks_[id]->Wait(300)) << id;
    EXPECT_TRUE(sinks_[id]->info.status.ok()) << id << ": " << sinks_[id]->info.status;
    EXPECT_EQ(sinks_[id]->tokens.size(), 4u) << id;
  }
  EXPECT_EQ(engine->Stats().counters.requests_displaced, 1);
  engine->Cancel("busy");
  ASSERT_TRUE(busy->Wait(300));
  ASSERT_TRUE(engine->WaitIdle(10));
  const auto& pool = engine->pool_for_tests();
  EXPECT_EQ(pool.num_free(), pool.num_pages()) << "pages leaked";
}

// With aging (--priority-aging, here 1,000 levels a second: five levels in 5 ms), a request
// that has waited long enough keeps its place in a full queue: an urgent arrival takes the
// place of one only if it comes before it in the order (a later priority submitted just now),
// and is refused when none does; and the request that waited starts first.
TEST_F(EngineQueueTest, AgingKeepsAWaitingRequestFromBeingDisplaced) {
  auto engine = OneSlotByPriority(/*max_queue=*/2, /*aging=*/1000);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(Submit(*engine, "busy", -1, 2000).ok());  // runs until cancelled below
  WaitUntilOneRuns(*engine);
  ASSERT_TRUE(Submit(*engine, "old", 5).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // 100 levels gained
  // A million levels later: a thousand seconds to wait before it outranks priority 0.
  ASSERT_TRUE(Submit(*engine, "fresh", 1'000'000).ok());
  // The queue is full: urgent-1 (priority 0) comes before fresh, not before old.
  ASSERT_TRUE(Submit(*engine, "urgent-1", 0).ok());
  ASSERT_TRUE(sinks_["fresh"]->Wait(60));
  EXPECT_EQ(sinks_["fresh"]->info.status.code(), absl::StatusCode::kResourceExhausted)
      << sinks_["fresh"]->info.status;
  EXPECT_NE(std::string(sinks_["fresh"]->info.status.message())
                .find("(its priority 1000000, with what waiting had gained it, came last of the "
                      "requests waiting to start)"),
            std::string::npos) << sinks_["fresh"]->info.status;
  // Waiting: old, urgent-1. urgent-2 comes after both (old gained 100 levels; urgent-1 is of
  // its priority and came first). Strict priorities would have displaced old.
  absl::Status st = Submit(*engine, "urgent-2", 0);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(std::string(st.message())
                .find("none both less urgent than priority 0 (counting the priority waiting has "
                      "gained them) and not yet started"),
            std::string::npos) << st;
  EXPECT_FALSE(sinks_["old"]->Wait(0.2)) << "old was displaced";
  EXPECT_EQ(engine->Stats().counters.requests_displaced, 1);
  engine->Cancel("busy");
  for (const char* id : {"busy", "old", "urgent-1"}) ASSERT_TRUE(sinks_[id]->Wait(300)) << id;
  for (const char* id : {"old", "urgent-1"}) {
    EXPECT_TRUE(sinks_[id]->info.status.ok()) << id << ": " << sinks_[id]->info.status;
    EXPECT_EQ(sinks_[id]->tokens.size(), 4u) << id;
    EXPECT_EQ(sinks_[id]->info.preemptions, 0) << id;
  }
  auto finished = [&](const char* id) {
    return static_cast<TimedSink&>(*sinks_[id]).finished_at;
  };
  EXPECT_LT(finished("old"), finished("urgent-1")) << "the request that waited goes first";
  ASSERT_TRUE(engine->WaitIdle(10));
  const auto& pool = engine->pool_for_tests();
  EXPECT_EQ(pool.num_free(), pool.num_pages()) << "pages leaked";
}

}  // namespace
}  // namespace thetaserve::scheduler
