#include "scheduler/scheduler.h"

#include <algorithm>

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

bool Scheduler::Before(const Sequence& a, const Sequence& b) {
  const int64_t pa = a.request().priority, pb = b.request().priority;
  return pa != pb ? pa < pb : a.serial < b.serial;
}

void Scheduler::Enqueue(std::unique_ptr<Sequence> seq, bool preempted) {
  seq->state = SequenceState::kWaiting;
  if (config_.policy == SchedulingPolicy::kPriority) {
    auto at = std::upper_bound(waiting_.begin(), waiting_.end(), seq,
                               [](const auto& a, const auto& b) { return Before(*a, *b); });
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

StepPlan Scheduler::Schedule() {
  StepPlan plan;
  int64_t budget = config_.max_num_batched_tokens;
  const bool by_priority = config_.policy == SchedulingPolicy::kPriority;

  // Tokens this step may still score (each needs a logits row: kMaxScoredTokensPerStep).
  int64_t score_budget = kMaxScoredTokensPerStep;
  // Chunks are held to long_prefill_tokens whenever the step may be shared: another sequence
  // runs (its decode token, or its own prompt, would otherwise wait behind an older prompt's
  // whole prefill: running sequences are served oldest first, or by priority in priority
  // order), or one waits and a slot is free
  // for it. The held chunks take back below what the others leave (all of it when the pool
  // turns a newcomer away).
  const bool held =
      config_.long_prefill_tokens > 0 &&
      (running_.size() > 1 ||
       (!waiting_.empty() && int64_t(running_.size()) < config_.max_num_seqs));
  // Tokens of `s` this step may take beyond the `planned` ones: at most `cap`, within the
  // budget, and the score budget for a prompt that is scored.
  auto take = [&](const Sequence& s, int64_t planned, int64_t cap) {
    int64_t n = std::min({s.num_uncomputed() - planned, budget, cap});
    if (s.NeedsPromptScores()) n = std::min(n, score_budget);
    return n;
  };
  const int64_t first_cap = held ? config_.long_prefill_tokens : budget;
  auto tokens_for = [&](const Sequence& s) { return take(s, 0, first_cap); };
  auto spend = [&](const Sequence& s, int64_t n) {  // n tokens of s planned
    budget -= n;
    if (s.NeedsPromptScores()) score_budget -= n;
  };
  auto planned = [&](const Sequence* s) {
    return std::any_of(plan.chunks.begin(), plan.chunks.end(),
                       [&](const ScheduledChunk& c) { return c.seq == s; });
  };
  // Plans running sequence `seq`'s next tokens. When pages run out, the last running sequence
  // (the newest; by priority, the last in priority order: running_ is kept in that order) is
  // preempted, possibly `seq` itself, until they fit.
  bool pool_short = false;  // a running sequence was preempted for pages: admit nothing
  auto plan_running = [&](Sequence* seq) {
    const int64_t n = tokens_for(*seq);
    if (n <= 0) return;
    while (!Room(seq->kv().PagesNeeded(seq->num_computed + n))) {
      Sequence* victim = running_.back().get();
      plan.preempted.push_back(victim);
      Preempt(running_.size() - 1);
      pool_short = true;
      if (victim == seq) return;
    }
    seq->kv().Grow(*pool_, seq->num_computed + n);
    plan.chunks.push_back({seq, n, seq->num_computed + n == int64_t(seq->tokens().size())});
    spend(*seq, n);
  };
  // Running sequences first, in order, each with a decode token or a chunk of its prompt. By
  // priority, those of a later priority than the first waiting sequence are deferred: each is
  // planned during admission just before the first waiting sequence that comes after it (or
  // after admission), so the budget goes in priority order, and the waiting sequences before
  // it may take its slot or pages (make_way_for).
  const Sequence* first_waiting = waiting_.empty() ? nullptr : waiting_.front().get();
  std::vector<Sequence*> deferred;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    if (by_priority && first_waiting && Before(*first_waiting, *running_[i])) {
      for (size_t j = i; j < running_.size(); ++j) deferred.push_back(running_[j].get());
      break;
    }
    plan_running(running_[i].get());
  }

  // Then admit waiting sequences while the budget, the sequence limit and the pool allow.
  // Nothing is admitted in a step that had to preempt for a running sequence's pages
  // (pool_short): the pool is already short. A sequence
  // is admitted only when the pool can also hold the rest of its prompt (and its first output
  // token) on top of what running prefills still need: admitting on the next chunk alone lets
  // long prompts push each other out before they finish (preemption thrash).
  const int64_t chunk = config_.max_num_batched_tokens;
  auto to_finish_prompt = [&](const Sequence& s) {
    const int64_t next = int64_t(s.tokens().size()) + 1;
    // Past its prompt a sequence only needs its next block (a bound would over-reserve).
    if (s.num_computed >= int64_t(s.request().prompt.size())) return s.kv().PagesNeeded(next);
    return s.kv().PagesToReach(next, config_.sparse, chunk);
  };
  int64_t reserved = 0;
  for (const auto& r : running_) reserved += to_finish_prompt(*r);
  // By priority, a waiting sequence without a slot, or short of `pages` pages above what is
  // reserved, preempts the last running sequence if that one's priority is later than its own
  // (deferred and not planned yet: it comes after the waiting one), and tries again; only when
  // preempting every running sequence of a later priority would surely give it the slot and
  // the pages, so that no work is thrown away for nothing. Surely: a page another sequence
  // shares stays held (SequenceKv::PagesFreedOnRelease). Sequences of its own priority are
  // never preempted for it.
  auto make_way_for = [&](const Sequence& seq, int64_t pages) {
    if (!by_priority) return false;
    int64_t later = 0, room = Available() - reserved;
    for (const auto& r : running_) {
      if (r->request().priority <= seq.request().priority) continue;
      ++later;
      room += r->kv().PagesFreedOnRelease(*pool_) + to_finish_prompt(*r);
    }
    if (later == 0 || room < pages ||
        int64_t(running_.size()) - later >= config_.max_num_seqs) {
      return false;
    }
    reserved -= to_finish_prompt(*running_.back());
    plan.preempted.push_back(running_.back().get());
    Preempt(running_.size() - 1);
    return true;
  };
  // Plans the deferred sequences that come before `until` (all when null). Their pages were
  // reserved; what they take now is no longer.
  size_t next_deferred = 0;
  auto plan_deferred = [&](const Sequence* until) {
    for (; next_deferred < deferred.size() && budget > 0; ++next_deferred) {
      Sequence* d = deferred[next_deferred];
      if (until && Before(*until, *d)) return;
      // Preempted by make_way_for (and, were there room for it, admitted again with a chunk).
      if (d->state != SequenceState::kRunning || planned(d)) continue;
      const int64_t before = to_finish_prompt(*d);
      plan_running(d);
      if (d->state == SequenceState::kRunning) reserved += to_finish_prompt(*d) - before;
    }
  };
  FindGroupLeaders();
  for (size_t w = 0; !pool_short && budget > 0 && w < waiting_.size();) {
    Sequence* seq = waiting_[w].get();
    if (WaitsForGroupPrompt(*seq)) {
      ++w;  // others behind it may go first
      continue;
    }
    plan_deferred(seq);
    if (pool_short || budget <= 0) break;
    if (seq->NeedsPromptScores() && score_budget <= 0) break;  // this step scores no more
    if (int64_t(running_.size()) >= config_.max_num_seqs) {
      if (make_way_for(*seq, to_finish_prompt(*seq))) continue;
      break;
    }
    // Cached blocks first: all of the tokens but the last (whose logits are needed) can come
    // from the prefix cache. Adopting pins them, so it happens only when the rest fits too.
    // A sequence whose prompt is still to be scored adopts nothing (it needs every row's
    // logits) but offers its blocks as any other.
    if (prefix_ && seq->kv().blocks() == 0) {
      const auto& tokens = seq->tokens();
      const int64_t bs = pool_->block_size();
      const std::string& salt = seq->request().cache_salt;
      seq->cache_cursor = prefix_->Start(salt);
      const cache::PrefixCache::Match match =
          seq->NeedsPromptScores()
              ? cache::PrefixCache::Match{}
              : prefix_->Find(tokens, (int64_t(tokens.size()) - 1) / bs, *pool_, salt);
      bool adopted = false;
      if (match.blocks() > 0) {
        const int64_t rest = to_finish_prompt(*seq) - 2 * match.blocks() * seq->kv().shape().tables();
        if (Available() - match.pinned_pages >= reserved + rest) {
          prefix_->Adopt(match, seq->kv(), *pool_, &seq->cache_cursor);
          seq->num_computed = match.blocks() * bs;
          seq->cached_blocks = match.blocks();
          adopted = true;
        } else if (!by_priority) {
          break;
        }
        // By priority, the whole prompt's check below fails too (adopting needs less), and may
        // make way for it: what preempting frees counts cached blocks, which adopting would pin.
      }
      if ((adopted || match.blocks() == 0) && seq->group_prompt_computed &&
          !seq->NeedsPromptScores() &&
          match.blocks() < (int64_t(seq->request().prompt.size()) - 1) / bs) {
        RegroupBehind(*seq);
      }
    }
    const int64_t n = tokens_for(*seq);
    const int64_t whole = to_finish_prompt(*seq);
    // Cached pages count as room for what is reserved, but are evicted only for what this
    // step allocates (the rest stays findable until it is needed).
    if (Available() < reserved + whole || !Room(seq->kv().PagesNeeded(seq->num_computed + n))) {
      ReleasePages(*seq);  // it waits without pages; the blocks stay cached
      if (make_way_for(*seq, whole)) continue;
      break;
    }
    if (prefix_) {
      prefix_query_tokens_ += int64_t(seq->tokens().size());
      prefix_hit_tokens_ += seq->num_computed;
      seq->restore_v_sum = seq->num_computed > 0;
    }
    reserved += std::max<int64_t>(0, whole - seq->kv().PagesNeeded(seq->num_computed + n));
    seq->kv().Grow(*pool_, seq->num_computed + n);
    seq->state = SequenceState::kRunning;
    if (!seq->first_scheduled) seq->first_scheduled = Clock::now();
    std::unique_ptr<Sequence> admitted = std::move(waiting_[w]);
    waiting_.erase(waiting_.begin() + w);
    auto at = by_priority ? std::upper_bound(running_.begin(), running_.end(), admitted,
                                             [](const auto& a, const auto& b) {
                                               return Before(*a, *b);
                                             })
                          : running_.end();
    running_.insert(at, std::move(admitted));
    plan.chunks.push_back({seq, n, seq->num_computed + n == int64_t(seq->tokens().size())});
    spend(*seq, n);
  }
  plan_deferred(nullptr);
  // Preempted sequences that were already planned must not run.
  if (!plan.preempted.empty()) {
    std::erase_if(plan.chunks, [&](const ScheduledChunk& c) {
      return c.seq->state != SequenceState::kRunning;
    });
  }
  // The budget the others left goes back to the held chunks, oldest first (by priority, in
  // priority order), as far as the pool allows without preempting (their prompts' pages are
  // reserved already).
  if (by_priority) {
    std::stable_sort(plan.chunks.begin(), plan.chunks.end(),
                     [](const ScheduledChunk& a, const ScheduledChunk& b) {
                       return Before(*a.seq, *b.seq);
                     });
  }
  for (size_t c = 0; held && budget > 0 && c < plan.chunks.size(); ++c) {
    ScheduledChunk& chunk = plan.chunks[c];
    Sequence& s = *chunk.seq;
    const int64_t more = take(s, chunk.num_tokens, budget);
    const int64_t to = s.num_computed + chunk.num_tokens + more;
    if (more <= 0 || !Room(s.kv().PagesNeeded(to))) continue;
    s.kv().Grow(*pool_, to);
    chunk.num_tokens += more;
    chunk.samples = to == int64_t(s.tokens().size());
    spend(s, more);
  }
  for (const auto& c : plan.chunks) plan.num_tokens += c.num_tokens;
  return plan;
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
