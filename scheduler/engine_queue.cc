// The engine's submission side (any thread): requests checked and queued whole or not at all,
// the queue's bound, displacement by priority, cancellations; and, on the engine thread, the
// inbox drained and the displaced requests ended. The step loop is in engine.cc.
#include "scheduler/engine.h"

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/check.h"

namespace thetaserve::scheduler {

absl::StatusOr<std::unique_ptr<Sequence>> Engine::Prepare(Request request,
                                                          std::shared_ptr<TokenSink> sink) const {
  const auto& c = backend_->model().config();
  if (request.prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (request.priority != 0 && config_.scheduler.policy != SchedulingPolicy::kPriority) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "priority is %d but this server serves first come, first served; priorities need "
        "serve --scheduling-policy priority",
        request.priority));
  }
  for (int32_t t : request.prompt) {
    if (t < 0 || t >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "prompt token id %d is outside the vocabulary [0, %d)", t, c.vocab_size));
    }
  }
  const int64_t total = int64_t(request.prompt.size()) + request.stopping.max_tokens;
  if (total > c.max_context) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "prompt (%d tokens) + max_tokens (%d) = %d exceeds the model's context of %d tokens",
        request.prompt.size(), request.stopping.max_tokens, total, c.max_context));
  }
  cache::SequenceKv probe(kv_shape_);
  // A request for no tokens (prompt scores only) still reserves room for one, as admission does;
  // under a mass budget, dense K and the budget's bound on V (what admission reserves: a
  // prompt whose dense K and V outgrow the whole pool can still run).
  const int64_t pages =
      probe.PagesToReach(std::max<int64_t>(total, int64_t(request.prompt.size()) + 1),
                         config_.sparse, config_.scheduler.max_num_batched_tokens);
  if (pages > pool_.num_pages()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "prompt + max_tokens = %d tokens needs %d KV pages but the whole cache has %d; "
        "shorten the request or start the server with a larger --kv-cache-memory",
        total, pages, pool_.num_pages()));
  }
  return std::make_unique<Sequence>(std::move(request), std::move(sink), *tokenizer_, kv_shape_);
}

absl::Status Engine::Submit(Request request, std::shared_ptr<TokenSink> sink) {
  std::vector<Request> requests;
  requests.push_back(std::move(request));
  std::vector<std::shared_ptr<TokenSink>> sinks;
  sinks.push_back(std::move(sink));
  return SubmitAll(std::move(requests), std::move(sinks));
}

absl::Status Engine::SubmitAll(std::vector<Request> requests,
                               std::vector<std::shared_ptr<TokenSink>> sinks, int* refused) {
  CHECK_EQ(requests.size(), sinks.size());
  if (int64_t(requests.size()) > config_.max_queue) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d completions do not fit the request queue (--max-queue %d) even when it is empty",
        requests.size(), config_.max_queue));
  }
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto seq = Prepare(std::move(requests[i]), std::move(sinks[i]));
    if (!seq.ok()) {
      if (refused) *refused = int(i);
      return seq.status();
    }
    seqs.push_back(std::move(*seq));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || draining_.load()) {
      return absl::UnavailableError("the server is shutting down; retry on another replica");
    }
    // Finished sequences still in pending_ until their sinks have heard (DeliverFinished)
    // are neither running nor queued; nor are earlier arrivals that the free slots take while
    // none waited after the last step (a burst that fit the slots was refused until a step
    // had run). The token budget, KV room or a group's shared prompt may hold some of them
    // back: they count once a step has left them waiting (so a burst can pass the bound by
    // at most the free slots). This call's own requests count in full.
    // Requests picked to make room for earlier arrivals are leaving.
    int64_t queued = pending_ - finishing_ - stats_.running - displaced_unsettled_;
    if (scheduler_waiting_ == 0) {
      queued -= std::min<int64_t>(queued, config_.scheduler.max_num_seqs - stats_.running);
    }
    const bool by_priority = config_.scheduler.policy == SchedulingPolicy::kPriority;
    int64_t least_urgent = std::numeric_limits<int64_t>::min();
    for (const auto& seq : seqs) least_urgent = std::max(least_urgent, seq->request().priority);
    const int64_t over = queued + int64_t(seqs.size()) - config_.max_queue;
    // A call displaces at most as many as it adds: the queue may be past its bound already (a
    // burst that the free slots took, then held back), which is not this call's to undo.
    const int64_t needed = std::min<int64_t>(over, seqs.size());
    // Taken under mu_, as the serials are: submission times follow the serials.
    const Clock::time_point now = Clock::now();
    const PriorityKey arrival{least_urgent, now, std::numeric_limits<uint64_t>::max()};
    if (over > 0 && !(by_priority && PickDisplaced(arrival, needed))) {
      // By priority, fewer than `needed` requests waiting are less urgent and have never run.
      const std::string aged = config_.scheduler.priority_aging > 0
                                   ? " (counting the priority waiting has gained them)"
                                   : "";
      const std::string displace =
          by_priority ? absl::StrFormat(", fewer than %d of them both less urgent than priority "
                                        "%d%s and not yet started",
                                        needed, least_urgent, aged)
                      : "";
      if (seqs.size() > 1) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "the request queue cannot take %d more (%d waiting, at most %d%s); retry later",
            seqs.size(), queued, config_.max_queue, displace));
      }
      if (by_priority) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "the request queue is full (%d waiting, none both less urgent than priority %d%s "
            "and not yet started); retry later",
            queued, least_urgent, aged));
      }
      return absl::ResourceExhaustedError(absl::StrFormat(
          "the request queue is full (%d waiting); retry later", queued));
    }
    pending_ += int64_t(seqs.size());
    for (auto& seq : seqs) {
      seq->serial = ++submitted_;
      seq->submitted = now;
      // Not a member of a group or call: ending one would end them all (ServiceSink), those
      // that ran too.
      if (by_priority && seq->request().group_id.empty() && seq->request().call_id.empty()) {
        seq->displaceable = true;
        displaceable_.insert(PriorityKeyOf(*seq));
      }
      inbox_.push_back(std::move(seq));
    }
  }
  cv_.notify_one();
  return absl::OkStatus();
}

bool Engine::PickDisplaced(const PriorityKey& arrival, int64_t count) {
  std::vector<PriorityKey> picked;
  // Those after the arrival in the order, which are of a strictly later priority (submitted
  // before it, they gained at least as much from aging).
  for (auto it = displaceable_.rbegin(); it != displaceable_.rend() &&
                                         displaceable_.key_comp()(arrival, *it) &&
                                         int64_t(picked.size()) < count;
       ++it) {
    picked.push_back(*it);
  }
  if (int64_t(picked.size()) < count) return false;
  for (const PriorityKey& key : picked) {
    displaceable_.erase(key);
    displaced_.insert(key.serial);
  }
  displaced_unsettled_ += count;
  return true;
}

void Engine::EndDisplaced() {
  std::set<uint64_t> serials;
  serials.swap(displacing_serials_);
  if (serials.empty()) return;
  // Each picked request is still waiting and has never run: one that started or ended since
  // was taken off displaced_ when it did (DropSettledLocked).
  int64_t ended = 0;
  for (const auto& seq : scheduler_.waiting()) {
    if (serials.count(seq->serial)) displacing_.push_back(seq.get());
  }
  for (Sequence* victim : displacing_) {
    const std::string why =
        config_.scheduler.priority_aging > 0
            ? absl::StrFormat("its priority %d, with what waiting had gained it, came last of "
                              "the requests waiting to start",
                              victim->request().priority)
            : absl::StrFormat("its priority %d was the least urgent of the requests waiting to "
                              "start",
                              victim->request().priority);
    Finish(victim, FinishReason::kCancelled,
           absl::ResourceExhaustedError(absl::StrCat(
               "the request queue is full and a more urgent request took this one's place (",
               why, "); retry later")));
    ++counters_.requests_displaced;
    ++ended;
  }
  displacing_.clear();
  // pending_ counts the ended ones until their sinks are told, as finishing.
  std::lock_guard<std::mutex> lock(mu_);
  displaced_unsettled_ -= int64_t(serials.size());
  finishing_ += ended;
}

void Engine::SettleDisplaceable(Sequence& seq) {
  if (!seq.displaceable) return;
  seq.displaceable = false;
  no_longer_displaceable_.push_back(PriorityKeyOf(seq));
}

void Engine::DropSettledLocked() {
  for (const auto& key : no_longer_displaceable_) {
    // Picked but started or ended first: it leaves the queue (or has left it) by itself.
    if (!displaceable_.erase(key) && displaced_.erase(key.serial)) --displaced_unsettled_;
  }
  no_longer_displaceable_.clear();
}

void Engine::Cancel(const std::string& request_id, absl::Status why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back({request_id, std::move(why), submitted_});
  }
  cv_.notify_one();
}

void Engine::DrainInbox() {
  std::vector<std::unique_ptr<Sequence>> arrived;
  std::vector<PendingCancel> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    arrived.swap(inbox_);
    cancels.swap(cancels_);
    // Under the same lock: every request picked so far is among those drained.
    displacing_serials_.swap(displaced_);
  }
  for (auto& seq : arrived) scheduler_.AddWaiting(std::move(seq));
  for (const PendingCancel& c : cancels) {
    for (Sequence* seq : scheduler_.FindAll(c.id)) {
      if (seq->serial <= c.serial) Finish(seq, FinishReason::kCancelled, c.why);
    }
  }
}

}  // namespace thetaserve::scheduler
