#include "scheduler/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_format.h"
#include "base/check.h"

namespace thetaserve::scheduler {

Scheduler::Scheduler(const SchedulerConfig& config, cache::PagePool& pool,
                     cache::PrefixCache* prefix_cache)
    : config_(config), pool_(&pool), prefix_(prefix_cache) {}

bool Scheduler::Room(int64_t pages) {
  if (pool_->CanAllocate(pages)) return true;
  // Evict only when that can be enough (pages the cache alone holds bound what it can free).
  if (!prefix_ || Available() < pages) return false;
  return prefix_->MakeRoom(*pool_, pages);
}

void Scheduler::ReleasePages(Sequence& seq) {
  seq.kv().ReleaseAll(*pool_);
  if (prefix_) prefix_->Released(*pool_, &seq.cache_cursor);
  seq.num_computed = 0;
  seq.cached_blocks = 0;
  seq.restore_v_sum = false;
}

const char* SchedulingPolicyName(SchedulingPolicy policy) {
  return policy == SchedulingPolicy::kPriority ? "priority" : "fcfs";
}

std::optional<SchedulingPolicy> ParseSchedulingPolicy(std::string_view name) {
  if (name == "fcfs") return SchedulingPolicy::kFcfs;
  if (name == "priority") return SchedulingPolicy::kPriority;
  return std::nullopt;
}

PriorityKey PriorityKeyOf(const Sequence& seq) {
  return {seq.request().priority, seq.submitted, seq.serial};
}

bool InPriorityOrder(const PriorityKey& a, const PriorityKey& b, double aging) {
  if (aging > 0) {
    // Seconds on the steady clock (uptime-sized: a nanosecond's precision in a double). One
    // rounding (fma), so a key is the same bits in every comparison whether or not the
    // compiler would have fused a multiply and an add here and not there: the sorted lists
    // and the engine's set rely on it.
    auto aged = [aging](const PriorityKey& k) {
      return std::fma(aging,
                      std::chrono::duration<double>(k.submitted.time_since_epoch()).count(),
                      double(k.priority));
    };
    const double ka = aged(a), kb = aged(b);
    if (ka != kb) return ka < kb;
  } else if (a.priority != b.priority) {
    return a.priority < b.priority;  // exact, whatever the magnitudes
  }
  return a.serial < b.serial;
}

absl::Status CheckPriorityAging(SchedulingPolicy policy, double aging) {
  if (!(aging >= 0 && std::isfinite(aging))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--priority-aging is %g; it must be a finite number >= 0", aging));
  }
  if (aging > 0 && policy != SchedulingPolicy::kPriority) {
    return absl::InvalidArgumentError(
        "--priority-aging ages request priorities, which only --scheduling-policy priority "
        "has");
  }
  return absl::OkStatus();
}

bool Scheduler::Before(const Sequence& a, const Sequence& b) const {
  return InPriorityOrder(PriorityKeyOf(a), PriorityKeyOf(b), config_.priority_aging);
}

void Scheduler::Enqueue(std::unique_ptr<Sequence> seq, bool preempted) {
  seq->state = SequenceState::kWaiting;
  if (config_.policy == SchedulingPolicy::kPriority) {
    auto at = std::upper_bound(waiting_.begin(), waiting_.end(), seq, InOrder{this});
    waiting_.insert(at, std::move(seq));
  } else if (preempted) {
    waiting_.push_front(std::move(seq));
  } else {
    waiting_.push_back(std::move(seq));
  }
}

void Scheduler::AddWaiting(std::unique_ptr<Sequence> seq) { Enqueue(std::move(seq), false); }

void Scheduler::Preempt(size_t running_index) {
  std::unique_ptr<Sequence> seq = std::move(running_[running_index]);
  running_.erase(running_.begin() + running_index);
  ReleasePages(*seq);  // recompute prompt + output so far (its blocks may still be cached)
  ++seq->preemptions;
  ++preemptions_;
  Enqueue(std::move(seq), true);
}

// One Schedule() call: the step's token budgets, the pages reserved for what running prompts
// still need, the running sequences deferred behind waiting ones (by priority), and the plan.
class Scheduler::Step {
 public:
  explicit Step(Scheduler& s);
  // Running sequences first, in order, each with a decode token or a chunk of its prompt. By
  // priority, those of a later priority than the first waiting sequence are deferred: each is
  // planned during admission just before the first waiting sequence that comes after it (or
  // after admission), so the budget goes in priority order, and the waiting sequences before
  // it may take its slot or pages (MakeWayFor).
  void PlanRunning();
  // Then waiting sequences, while the budget, the sequence limit and the pool allow.
  void Admit();
  // Drops chunks of sequences preempted after they were planned, gives what is left of the
  // budget back to the held chunks, and returns the plan.
  StepPlan Finish();

 private:
  // Tokens of `s` this step may take beyond the `planned` ones: at most `cap`, within the
  // budget, and the score budget for a prompt that is scored.
  int64_t Take(const Sequence& s, int64_t planned, int64_t cap) const;
  int64_t TokensFor(const Sequence& s) const { return Take(s, 0, first_cap_); }
  void Spend(const Sequence& s, int64_t n);  // n tokens of s planned
  bool Planned(const Sequence* s) const;
  // Plans running sequence `seq`'s next tokens. When pages run out, the last running sequence
  // (the newest; by priority, the last in priority order: running_ is kept in that order) is
  // preempted, possibly `seq` itself, until they fit.
  void PlanRunningSequence(Sequence* seq);
  // Pages `s` needs to finish its prompt and take its first output token.
  int64_t ToFinishPrompt(const Sequence& s) const;
  // By priority, a waiting sequence without a slot, or short of the pages it needs above what
  // is reserved, preempts the last of the later running sequences (of a strictly later
  // priority and after it in the order, so deferred and not planned yet; with aging, one that
  // has waited long enough is not later) and tries again; only when preempting every later
  // sequence would surely give it the slot and the pages, so that no work is thrown away for
  // nothing. Surely: a page a sequence that is not later shares stays held
  // (SequenceKv::PagesFreedOnRelease; pages the later ones share among themselves, a group's
  // prompt blocks, count). Sequences of its own priority are never preempted for it. The pages
  // it needs: its prompt's, but for the cached blocks it would adopt whose pages a sequence
  // that stays holds (the cache's other blocks it would pin, so they count).
  bool MakeWayFor(const Sequence& seq);
  // Plans the deferred sequences that come before `until` (all when null). Their pages were
  // reserved; what they take now is no longer.
  void PlanDeferred(const Sequence* until);
  // The cached blocks `seq`'s tokens begin with that it may adopt: all of the tokens but the
  // last (whose logits are needed); none while its prompt is to be scored (it needs every
  // row's logits).
  cache::PrefixCache::Match AdoptableMatch(const Sequence& seq) const;
  // Adopts the cached blocks `seq`'s tokens begin with, when the rest fits too; false: the
  // admission stops here (first come, first served: it must not be passed).
  bool AdoptCachedPrefix(Sequence& seq);
  // Admits waiting sequence w with its first chunk when the pool holds the rest of its
  // prompt, `whole` pages, on top of what is reserved; else releases its pages and says no.
  bool Start(size_t w, int64_t whole);

  Scheduler& sched_;
  StepPlan plan_;
  const bool by_priority_;
  int64_t budget_;
  // Tokens this step may still score (each needs a logits row: kMaxScoredTokensPerStep).
  int64_t score_budget_ = kMaxScoredTokensPerStep;
  // Whether chunks are held to long_prefill_tokens (the step may be shared), and so the cap
  // on a sequence's first chunk.
  const bool held_;
  const int64_t first_cap_;
  int64_t reserved_ = 0;     // pages running prompts still need (Admit)
  bool pool_short_ = false;  // a running sequence was preempted for pages: admit nothing
  std::vector<Sequence*> deferred_;
  size_t next_deferred_ = 0;
};

// Chunks are held to long_prefill_tokens whenever the step may be shared: another sequence
// runs (its decode token, or its own prompt, would otherwise wait behind an older prompt's
// whole prefill: running sequences are served oldest first, or by priority in priority
// order), or one waits and a slot is free for it. The held chunks take back below what the
// others leave (all of it when the pool turns a newcomer away).
Scheduler::Step::Step(Scheduler& s)
    : sched_(s), by_priority_(s.config_.policy == SchedulingPolicy::kPriority),
      budget_(s.config_.max_num_batched_tokens),
      held_(s.config_.long_prefill_tokens > 0 &&
            (s.running_.size() > 1 ||
             (!s.waiting_.empty() && int64_t(s.running_.size()) < s.config_.max_num_seqs))),
      first_cap_(held_ ? s.config_.long_prefill_tokens : budget_) {}

int64_t Scheduler::Step::Take(const Sequence& s, int64_t planned, int64_t cap) const {
  int64_t n = std::min({s.num_uncomputed() - planned, budget_, cap});
  if (s.NeedsPromptScores()) n = std::min(n, score_budget_);
  if (sched_.config_.sparse.enabled && sched_.config_.sparse.fixed_compaction) {
    // The chunk (from num_computed) ends at the next compaction point at the latest.
    const int64_t end = SparseChunkEnd(s.num_computed, sched_.config_.max_num_batched_tokens);
    n = std::min(n, end - s.num_computed - planned);
  }
  return n;
}

void Scheduler::Step::Spend(const Sequence& s, int64_t n) {
  budget_ -= n;
  if (s.NeedsPromptScores()) score_budget_ -= n;
}

bool Scheduler::Step::Planned(const Sequence* s) const {
  return std::any_of(plan_.chunks.begin(), plan_.chunks.end(),
                     [&](const ScheduledChunk& c) { return c.seq == s; });
}

void Scheduler::Step::PlanRunningSequence(Sequence* seq) {
  const int64_t n = TokensFor(*seq);
  if (n <= 0) return;
  while (!sched_.Room(seq->kv().PagesNeeded(seq->num_computed + n))) {
    Sequence* victim = sched_.running_.back().get();
    plan_.preempted.push_back(victim);
    sched_.Preempt(sched_.running_.size() - 1);
    pool_short_ = true;
    if (victim == seq) return;
  }
  seq->kv().Grow(*sched_.pool_, seq->num_computed + n);
  plan_.chunks.push_back({seq, n, seq->num_computed + n == int64_t(seq->tokens().size())});
  Spend(*seq, n);
}

void Scheduler::Step::PlanRunning() {
  const Sequence* first_waiting = sched_.waiting_.empty() ? nullptr : sched_.waiting_.front().get();
  for (size_t i = 0; i < sched_.running_.size() && budget_ > 0; ++i) {
    if (by_priority_ && first_waiting && sched_.Before(*first_waiting, *sched_.running_[i])) {
      for (size_t j = i; j < sched_.running_.size(); ++j) {
        deferred_.push_back(sched_.running_[j].get());
      }
      break;
    }
    PlanRunningSequence(sched_.running_[i].get());
  }
}

// A sequence is admitted only when the pool can also hold the rest of its prompt (and its
// first output token) on top of what running prefills still need: admitting on the next chunk
// alone lets long prompts push each other out before they finish (preemption thrash).
int64_t Scheduler::Step::ToFinishPrompt(const Sequence& s) const {
  const int64_t next = int64_t(s.tokens().size()) + 1;
  // Past its prompt a sequence only needs its next block (a bound would over-reserve).
  if (s.num_computed >= int64_t(s.request().prompt.size())) return s.kv().PagesNeeded(next);
  return s.kv().PagesToReach(next, sched_.config_.sparse, sched_.config_.max_num_batched_tokens);
}

bool Scheduler::Step::MakeWayFor(const Sequence& seq) {
  if (!by_priority_) return false;
  // Later: of a strictly later priority and after `seq` in the order (with aging, one that
  // has waited long enough comes first: it is not preempted for `seq`).
  std::vector<const cache::SequenceKv*> later;
  size_t last = 0;  // running_'s last later one: the first preempted
  int64_t room = sched_.Available() - reserved_;
  for (size_t i = 0; i < sched_.running_.size(); ++i) {
    const Sequence& r = *sched_.running_[i];
    if (r.request().priority <= seq.request().priority || !sched_.Before(seq, r)) continue;
    later.push_back(&r.kv());
    last = i;
    room += ToFinishPrompt(r);
  }
  if (later.empty() ||
      int64_t(sched_.running_.size() - later.size()) >= sched_.config_.max_num_seqs) {
    return false;
  }
  room += cache::SequenceKv::PagesFreedOnRelease(later, *sched_.pool_);
  int64_t pages = ToFinishPrompt(seq);
  if (sched_.prefix_ && seq.kv().blocks() == 0) {
    pages -= sched_.prefix_->PagesHeldBeyond(AdoptableMatch(seq), later, *sched_.pool_);
  }
  if (room < pages) return false;
  reserved_ -= ToFinishPrompt(*sched_.running_[last]);
  plan_.preempted.push_back(sched_.running_[last].get());
  sched_.Preempt(last);
  ++sched_.priority_preemptions_;
  return true;
}

void Scheduler::Step::PlanDeferred(const Sequence* until) {
  for (; next_deferred_ < deferred_.size() && budget_ > 0; ++next_deferred_) {
    Sequence* d = deferred_[next_deferred_];
    if (until && sched_.Before(*until, *d)) return;
    // Preempted by MakeWayFor (and, were there room for it, admitted again with a chunk).
    if (d->state != SequenceState::kRunning || Planned(d)) continue;
    const int64_t before = ToFinishPrompt(*d);
    PlanRunningSequence(d);
    if (d->state == SequenceState::kRunning) reserved_ += ToFinishPrompt(*d) - before;
  }
}

cache::PrefixCache::Match Scheduler::Step::AdoptableMatch(const Sequence& seq) const {
  if (seq.NeedsPromptScores()) return {};
  const auto& tokens = seq.tokens();
  return sched_.prefix_->Find(tokens, (int64_t(tokens.size()) - 1) / sched_.pool_->block_size(),
                              *sched_.pool_, seq.request().cache_salt);
}

// Cached blocks first (AdoptableMatch). Adopting pins them, so it happens only when the rest
// fits too. A sequence whose prompt is still to be scored adopts nothing but offers its blocks
// as any other.
bool Scheduler::Step::AdoptCachedPrefix(Sequence& seq) {
  cache::PrefixCache& prefix = *sched_.prefix_;
  cache::PagePool& pool = *sched_.pool_;
  const int64_t bs = pool.block_size();
  seq.cache_cursor = prefix.Start(seq.request().cache_salt);
  const cache::PrefixCache::Match match = AdoptableMatch(seq);
  bool adopted = false;
  if (match.blocks() > 0) {
    const int64_t rest = ToFinishPrompt(seq) - 2 * match.blocks() * seq.kv().shape().tables();
    if (sched_.Available() - match.pinned_pages >= reserved_ + rest) {
      prefix.Adopt(match, seq.kv(), pool, &seq.cache_cursor);
      seq.num_computed = match.blocks() * bs;
      seq.cached_blocks = match.blocks();
      adopted = true;
    } else if (!by_priority_) {
      return false;
    }
    // By priority, the whole prompt's check (Start) fails too (adopting needs less), and may
    // make way for it (MakeWayFor asks for the prompt less the blocks that stay held).
  }
  if ((adopted || match.blocks() == 0) && seq.group_prompt_computed &&
      !seq.NeedsPromptScores() &&
      match.blocks() < (int64_t(seq.request().prompt.size()) - 1) / bs) {
    sched_.RegroupBehind(seq);
  }
  return true;
}

bool Scheduler::Step::Start(size_t w, int64_t whole) {
  Sequence* seq = sched_.waiting_[w].get();
  const int64_t n = TokensFor(*seq);
  // Cached pages count as room for what is reserved, but are evicted only for what this
  // step allocates (the rest stays findable until it is needed).
  if (sched_.Available() < reserved_ + whole ||
      !sched_.Room(seq->kv().PagesNeeded(seq->num_computed + n))) {
    sched_.ReleasePages(*seq);  // it waits without pages; the blocks stay cached
    return false;
  }
  if (sched_.prefix_) {
    sched_.prefix_query_tokens_ += int64_t(seq->tokens().size());
    sched_.prefix_hit_tokens_ += seq->num_computed;
    seq->restore_v_sum = seq->num_computed > 0;
  }
  reserved_ += std::max<int64_t>(0, whole - seq->kv().PagesNeeded(seq->num_computed + n));
  seq->kv().Grow(*sched_.pool_, seq->num_computed + n);
  seq->state = SequenceState::kRunning;
  if (!seq->first_scheduled) seq->first_scheduled = Clock::now();
  std::unique_ptr<Sequence> admitted = std::move(sched_.waiting_[w]);
  sched_.waiting_.erase(sched_.waiting_.begin() + w);
  auto& running = sched_.running_;
  auto at = by_priority_
                ? std::upper_bound(running.begin(), running.end(), admitted, InOrder{&sched_})
                : running.end();
  running.insert(at, std::move(admitted));
  plan_.chunks.push_back({seq, n, seq->num_computed + n == int64_t(seq->tokens().size())});
  Spend(*seq, n);
  return true;
}

// Nothing is admitted in a step that had to preempt for a running sequence's pages
// (pool_short_): the pool is already short.
void Scheduler::Step::Admit() {
  for (const auto& r : sched_.running_) reserved_ += ToFinishPrompt(*r);
  sched_.FindGroupLeaders();
  for (size_t w = 0; !pool_short_ && budget_ > 0 && w < sched_.waiting_.size();) {
    Sequence* seq = sched_.waiting_[w].get();
    if (sched_.WaitsForGroupPrompt(*seq)) {
      ++w;  // others behind it may go first
      continue;
    }
    PlanDeferred(seq);
    if (pool_short_ || budget_ <= 0) break;
    if (seq->NeedsPromptScores() && score_budget_ <= 0) break;  // this step scores no more
    if (int64_t(sched_.running_.size()) >= sched_.config_.max_num_seqs) {
      if (MakeWayFor(*seq)) continue;
      break;
    }
    if (sched_.prefix_ && seq->kv().blocks() == 0 && !AdoptCachedPrefix(*seq)) break;
    const int64_t whole = ToFinishPrompt(*seq);
    if (Start(w, whole)) continue;  // (waiting sequence w is the next one now)
    if (MakeWayFor(*seq)) continue;  // (Start released what it adopted)
    break;
  }
  PlanDeferred(nullptr);
}

StepPlan Scheduler::Step::Finish() {
  // Preempted sequences that were already planned must not run.
  if (!plan_.preempted.empty()) {
    std::erase_if(plan_.chunks, [&](const ScheduledChunk& c) {
      return c.seq->state != SequenceState::kRunning;
    });
  }
  // The budget the others left goes back to the held chunks, oldest first (by priority, in
  // priority order), as far as the pool allows without preempting (their prompts' pages are
  // reserved already).
  if (by_priority_) std::stable_sort(plan_.chunks.begin(), plan_.chunks.end(), InOrder{&sched_});
  for (size_t c = 0; held_ && budget_ > 0 && c < plan_.chunks.size(); ++c) {
    ScheduledChunk& chunk = plan_.chunks[c];
    Sequence& s = *chunk.seq;
    const int64_t more = Take(s, chunk.num_tokens, budget_);
    const int64_t to = s.num_computed + chunk.num_tokens + more;
    if (more <= 0 || !sched_.Room(s.kv().PagesNeeded(to))) continue;
    s.kv().Grow(*sched_.pool_, to);
    chunk.num_tokens += more;
    chunk.samples = to == int64_t(s.tokens().size());
    Spend(s, more);
  }
  for (const auto& c : plan_.chunks) plan_.num_tokens += c.num_tokens;
  return std::move(plan_);
}

StepPlan Scheduler::Schedule() {
  Step step(*this);
  step.PlanRunning();
  step.Admit();
  return step.Finish();
}

void Scheduler::Commit(const StepPlan& plan) {
  for (const ScheduledChunk& c : plan.chunks) {
    Sequence& s = *c.seq;
    const int64_t prompt = int64_t(s.request().prompt.size());
    const bool prompt_done = s.num_computed < prompt && s.num_computed + c.num_tokens >= prompt;
    s.num_computed += c.num_tokens;
    // The rest of the group may go now, together: were it to wait for whichever member leads
    // next, a first completion that ends in its prompt's step (max_tokens 1, a stop token
    // first) would pass the lead on one step at a time.
    if (prefix_ && prompt_done && !s.request().group_id.empty()) {
      for (const auto& w : waiting_) {
        if (w->request().group_id == s.request().group_id) w->group_prompt_computed = true;
      }
    }
  }
}

std::unique_ptr<Sequence> Scheduler::Remove(Sequence* seq) {
  std::unique_ptr<Sequence> out;
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const auto& p) { return p.get() == seq; });
  if (it != running_.end()) {
    out = std::move(*it);
    running_.erase(it);
  } else {
    auto wit = std::find_if(waiting_.begin(), waiting_.end(),
                            [&](const auto& p) { return p.get() == seq; });
    CHECK(wit != waiting_.end()) << "Remove of an unknown sequence";
    out = std::move(*wit);
    waiting_.erase(wit);
  }
  ReleasePages(*out);
  out->state = SequenceState::kFinished;
  return out;
}

void Scheduler::FindGroupLeaders() {
  group_leaders_.clear();
  if (!prefix_) return;
  auto consider = [&](const Sequence& s) {
    const Request& r = s.request();
    if (r.group_id.empty()) return;
    const Sequence*& leader = group_leaders_[r.group_id];
    if (leader == nullptr || r.group_index < leader->request().group_index) leader = &s;
  };
  for (const auto& s : waiting_) consider(*s);
  if (group_leaders_.empty()) return;  // no group waits: nobody to hold back
  for (const auto& s : running_) consider(*s);
}

void Scheduler::RegroupBehind(Sequence& seq) {
  const std::string& group = seq.request().group_id;
  for (const auto& w : waiting_) {
    // (A member that scores its prompt adopts nothing: it gains nothing by waiting.)
    if (w.get() != &seq && w->request().group_id == group && !w->NeedsPromptScores()) {
      w->group_prompt_computed = false;
    }
  }
  group_leaders_[group] = &seq;
}

bool Scheduler::WaitsForGroupPrompt(const Sequence& seq) const {
  const Request& r = seq.request();
  if (r.group_id.empty() || seq.group_prompt_computed) return false;
  auto it = group_leaders_.find(r.group_id);
  if (it == group_leaders_.end() || it->second == &seq) return false;
  const Sequence& leader = *it->second;
  // Waiting, or running before the end of its prompt (num_computed moves at Commit, so a
  // leader admitted earlier in this Schedule counts as not done).
  return leader.state == SequenceState::kWaiting ||
         leader.num_computed < int64_t(leader.request().prompt.size());
}

std::vector<Sequence*> Scheduler::FindAll(const std::string& id) {
  std::vector<Sequence*> found;
  auto match = [&](const Sequence& s) {
    const Request& r = s.request();
    return r.id == id || (!r.group_id.empty() && r.group_id == id) ||
           (!r.call_id.empty() && r.call_id == id);
  };
  for (auto& s : running_) if (match(*s)) found.push_back(s.get());
  for (auto& s : waiting_) if (match(*s)) found.push_back(s.get());
  return found;
}

}  // namespace thetaserve::scheduler
