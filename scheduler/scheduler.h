// Iteration-level (continuous) batching: each step mixes the decode tokens of running
// sequences and prefill chunks of new ones under one token budget. Admission is check-then-
// commit against the page pool; when pages run out the newest running sequence (or, by
// priority, the last in priority order) is preempted (its pages freed, requeued for
// recompute). Engine-thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "cache/page_pool.h"
#include "cache/prefix_cache.h"
#include "cache/sequence_kv.h"
#include "scheduler/sequence.h"

namespace thetaserve::scheduler {

// The order in which waiting sequences start and running ones are preempted.
enum class SchedulingPolicy {
  // First come, first served: waiting sequences start in submission order (a preempted one
  // first, as it came earlier); pages short preempt the newest running sequence.
  kFcfs,
  // vLLM's --scheduling-policy priority: sequences go in order of Request::priority (lower
  // first; with priority_aging, less the levels gained since submission: InPriorityOrder),
  // then of submission. Waiting ones start in that order; each sequence's first
  // chunk of the step's budget goes in that order across running and waiting ones, and what
  // is left back to the held chunks in that order too; pages short preempt the running
  // sequence that comes last; and a waiting sequence with no slot (max_num_seqs) or no room
  // in the pool preempts running ones of a strictly later priority that come after it in the
  // order, last first, when preempting them all would surely let it start.
  kPriority,
};
// "fcfs" or "priority" (serve --scheduling-policy, ModelInfo.scheduling_policy).
const char* SchedulingPolicyName(SchedulingPolicy policy);
std::optional<SchedulingPolicy> ParseSchedulingPolicy(std::string_view name);

// Where a request stands in the priority policy's order.
struct PriorityKey {
  int64_t priority;
  Clock::time_point submitted;  // Sequence::submitted
  uint64_t serial;              // Sequence::serial
};
PriorityKey PriorityKeyOf(const Sequence& seq);
// Whether `a` goes before `b`. Strict (aging 0, vLLM's): the lower priority, then the one
// submitted first. With `aging` > 0 (priority levels per second, serve --priority-aging) every
// request's priority improves by `aging` for each second since it was submitted, so a request
// kept waiting by more urgent ones overtakes those submitted long enough after it. All gain at
// the same rate, so the order of two requests never changes: priority + aging * (submission
// time, in seconds) orders them, then the serial. A request of priority p therefore goes
// before every request of priority q < p submitted more than (p - q) / aging seconds after it.
// (Priorities past 2^53 in magnitude age coarsely: the sum is a double.)
bool InPriorityOrder(const PriorityKey& a, const PriorityKey& b, double aging);
// INVALID_ARGUMENT unless `aging` is finite and >= 0, and 0 unless `policy` is kPriority
// (serve checks it before loading the model, Engine::Create again).
absl::Status CheckPriorityAging(SchedulingPolicy policy, double aging);

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 512;  // token budget per step
  int64_t max_num_seqs = 64;             // running sequences at once
  // While the step is shared (another sequence runs, or one waits that could start), a chunk
  // computes at most this many tokens in the first pass over the budget, so that a long
  // prompt holds neither later requests' first tokens nor their later ones (nor a later
  // prompt's chunks) behind its whole prefill; what the others leave of the budget then goes
  // back to the chunks so held, oldest first (by priority, in priority order). 0: no limit
  // (nor one at or above the budget).
  int64_t long_prefill_tokens = 0;
  // The engine compacts V under this policy after every step (with fixed_compaction: every
  // decode step, and a prompt only at its compaction points, SparseChunkEnd); with a mass
  // budget admission reserves the bounded V store instead of a dense one
  // (SequenceKv::PagesToReach).
  cache::SparsePolicy sparse;
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  // Under kPriority: priority levels a request gains per second since it was submitted
  // (InPriorityOrder); 0: strict priorities. Finite and >= 0.
  double priority_aging = 0;
};

// Under a sparse policy with fixed_compaction a prompt (or a preempted sequence's recompute)
// is compacted only at multiples of `stride` (the step's token budget: the chunks it is
// computed in alone) and at its end, and its chunks never cross one: a chunk that starts at
// `at` ends here at the latest. Compacting at each chunk's end (the default) makes what the V
// store keeps, and so a greedy output, depend on the chunks the load cut (the budget others
// took, long_prefill_tokens while a step is shared). The price: beside d decoding requests a
// prompt gets budget - d tokens a step, so it reaches each point in two steps, the second of
// d tokens (up to twice the steps to its first token).
inline int64_t SparseChunkEnd(int64_t at, int64_t stride) { return (at / stride + 1) * stride; }

// Prompt tokens scored per step at most (Request::prompt_logprobs): each takes a row of logits
// (vocabulary-sized, on the host and the device), so a long prompt to score goes in chunks of
// this many, however large --max-num-batched-tokens is.
inline constexpr int64_t kMaxScoredTokensPerStep = 128;

// One sequence's share of a step.
struct ScheduledChunk {
  Sequence* seq;
  int64_t num_tokens;   // tokens [seq->num_computed, + num_tokens) are computed this step
  bool samples;         // the chunk reaches the sequence's last token: sample after the step
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;
  std::vector<Sequence*> preempted;  // preempted while planning this step
  int64_t num_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  // With a prefix cache, a sequence being admitted first adopts the cached blocks its tokens
  // begin with (all but its last token can come from there), and pages held only by the
  // cache are freed, least recently used first, whenever the pool is short.
  Scheduler(const SchedulerConfig& config, cache::PagePool& pool,
            cache::PrefixCache* prefix_cache = nullptr);

  void AddWaiting(std::unique_ptr<Sequence> seq);
  // Plans the next step; allocates the pages it needs.
  StepPlan Schedule();
  // Marks a step done: advances num_computed of every chunk.
  void Commit(const StepPlan& plan);
  // Removes a sequence (finished or cancelled) and frees its pages.
  std::unique_ptr<Sequence> Remove(Sequence* seq);

  const std::deque<std::unique_ptr<Sequence>>& waiting() const { return waiting_; }
  const std::vector<std::unique_ptr<Sequence>>& running() const { return running_; }
  int64_t num_preemptions() const { return preemptions_; }
  // Of those, the preemptions made to let a waiting sequence of an earlier priority start
  // (the rest were for a running sequence's pages).
  int64_t num_priority_preemptions() const { return priority_preemptions_; }
  // Tokens of admitted sequences looked up in the prefix cache, and those found there.
  int64_t prefix_query_tokens() const { return prefix_query_tokens_; }
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }
  // The running and waiting sequences whose request id, or group id, is `id`.
  std::vector<Sequence*> FindAll(const std::string& id);

 private:
  // Whether `a` goes before `b` under the priority policy (InPriorityOrder).
  bool Before(const Sequence& a, const Sequence& b) const;
  // Before, over what holds sequences (the waiting and running lists, the plan's chunks).
  struct InOrder {
    const Scheduler* s;
    bool operator()(const std::unique_ptr<Sequence>& a, const std::unique_ptr<Sequence>& b) const {
      return s->Before(*a, *b);
    }
    bool operator()(const ScheduledChunk& a, const ScheduledChunk& b) const {
      return s->Before(*a.seq, *b.seq);
    }
  };
  class Step;  // one Schedule() call's planning (scheduler.cc)
  // Into the waiting queue: by priority order under kPriority, else at the back, or at the
  // front for a preempted sequence (it came before every waiting one).
  void Enqueue(std::unique_ptr<Sequence> seq, bool preempted);
  void Preempt(size_t running_index);
  // A group's later completions wait (with a prefix cache) until the first has computed the
  // prompt, so that they adopt its blocks instead of computing the prompt again; once one
  // has, Commit marks the waiting rest (Sequence::group_prompt_computed) and they all may go.
  // The first is the member with the lowest index still running or waiting (if completion 0
  // was cancelled before its prompt, the next takes its place). FindGroupLeaders maps each
  // group id to it, once per Schedule.
  void FindGroupLeaders();
  bool WaitsForGroupPrompt(const Sequence& seq) const;
  // A member let go because another computed the prompt, whose cached blocks have been
  // evicted since (memory pressure), computes the prompt itself: the rest of its group waits
  // for it again (they each computed it before), and Commit lets them go once it has.
  void RegroupBehind(Sequence& seq);
  // Pages free now or held only by the prefix cache (so freed on demand).
  int64_t Available() const { return pool_->num_free() + pool_->num_cached_only(); }
  // Whether the pool has `pages` free pages, after evicting cached blocks if need be.
  bool Room(int64_t pages);
  // Returns a sequence's pages to the pool (and tells the prefix cache); nothing of it is
  // computed any more.
  void ReleasePages(Sequence& seq);

  SchedulerConfig config_;
  cache::PagePool* pool_;
  cache::PrefixCache* prefix_;  // null: no prefix caching
  std::deque<std::unique_ptr<Sequence>> waiting_;    // in the order they are to start (Enqueue)
  // In admission order; by priority, in priority order (Before): either way the last is the
  // first to be preempted.
  std::vector<std::unique_ptr<Sequence>> running_;
  int64_t preemptions_ = 0;
  int64_t priority_preemptions_ = 0;
  int64_t prefix_query_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
  std::unordered_map<std::string, const Sequence*> group_leaders_;  // FindGroupLeaders'
};

}  // namespace thetaserve::scheduler
