// The engine: one thread owns the scheduler, the page pool, every Sequence and the backend.
// Other threads talk to it only through Submit / Cancel (a locked inbox) and read Stats (a
// locked snapshot updated every step).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "cache/page_pool.h"
#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"
#include "scheduler/request.h"
#include "scheduler/scheduler.h"
#include "scheduler/stats.h"

namespace thetaserve::scheduler {

struct EngineConfig {
  SchedulerConfig scheduler;
  int64_t kv_cache_bytes = int64_t(256) << 20;  // K and V pages together
  int32_t block_size = 16;
  // Waiting requests before Submit says RESOURCE_EXHAUSTED. Under the priority policy a
  // request finding the queue full takes the place of the least urgent request waiting that
  // has never run, if that one is strictly less urgent (the latest of them to arrive); it ends
  // with RESOURCE_EXHAUSTED as if refused, and a batch of them cannot keep urgent work out.
  int64_t max_queue = 1024;
  cache::SparsePolicy sparse;  // V policy: disabled = "full"
  // The offload policy's host pool (sparse.offload): V rows moved out of the KV pool, in
  // host memory of this many bytes (pages of the KV pool's page size). When it is full, rows
  // are dropped as under the sparse policy.
  int64_t offload_bytes = int64_t(4) << 30;
  // Threads that sample a step's rows (the engine thread counts; 1: it alone). Sampling with
  // a temperature walks every row's whole vocabulary (about 0.3 ms for 49,152 logits on one
  // core), so at batch 64 it takes longer than a GPU's decode step unless rows run in
  // parallel. Rows are independent (each request owns its random generator), so the tokens
  // do not depend on this.
  int32_t sampling_threads = 1;
  // Automatic prefix caching: full blocks of computed tokens keep their K and V pages after
  // their sequence finishes (held by the cache, reclaimed least recently used first when the
  // pool is short), and a new request whose tokens begin with cached blocks adopts them
  // instead of computing them. Under the full V policy only (the sparse policy rewrites V
  // pages in place); ignored otherwise. On the CPU a request's tokens and logits are the same
  // bits with or without it.
  bool prefix_caching = false;
  // A step whose rows all sample greedily with nothing the sampler changes or reports
  // (Sequence::SamplesArgmax) and that scores no prompt takes each row's token from the
  // backend's own ArgMax where it has one (Backend::ReturnsArgmax: on a GPU the logits stay on
  // the device, 12.6 MB a step at batch 64 for SmolLM2) instead of copying the rows back; the
  // same tokens. false: always the rows (for measuring the difference).
  bool backend_argmax = true;
};

class Engine {
 public:
  // Sizes the page pool from config.kv_cache_bytes and starts the engine thread.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineConfig& config,
                                                        kernels::Backend& backend);
  ~Engine();  // Stop(0)

  // Thread-safe. Validates what the engine must (length against the pool and context) and
  // queues the request; the sink hears everything else. Errors: RESOURCE_EXHAUSTED when the
  // queue is full (and, by priority, no request waiting is less urgent: see max_queue),
  // UNAVAILABLE when draining, INVALID_ARGUMENT when it can never fit.
  absl::Status Submit(Request request, std::shared_ptr<TokenSink> sink);
  // Thread-safe. Queues all of the requests or none of them (a group's completions, a call's
  // prompts: the queue must hold them all). requests[i] reports to sinks[i]. When one request
  // is refused for itself (its prompt, its length), `refused` (if given) is set to its index;
  // for the queue or the server's state, which concern them all, it is left alone.
  absl::Status SubmitAll(std::vector<Request> requests,
                         std::vector<std::shared_ptr<TokenSink>> sinks, int* refused = nullptr);
  // Thread-safe. The longest sequence (prompt + output tokens) Submit accepts: the model's
  // context, or less when the whole KV pool holds fewer tokens.
  int64_t MaxSequenceTokens() const;
  // The pool bytes one sequence of `tokens` tokens takes on `backend` (its K and every V row),
  // with pages of `block_size` rows: what --kv-cache-memory must give for it to fit alone.
  static int64_t KvBytesForSequence(const kernels::Backend& backend, int32_t block_size,
                                    int64_t tokens);
  // Thread-safe. Cancels at the next step boundary (pages freed then); the sink gets
  // OnFinish(kCancelled, status). `request_id` is a request's id, a group's or a call's
  // (every request of the group or call still running or waiting). Unknown ids are ignored
  // (the request may have finished).
  void Cancel(const std::string& request_id, absl::Status why = absl::CancelledError("cancelled"));

  // Stop admitting new requests (Submit says UNAVAILABLE); running ones continue.
  void StartDrain();
  bool draining() const { return draining_.load(); }
  // Waits until nothing is running or waiting, or `timeout_seconds` pass; returns true if idle.
  bool WaitIdle(double timeout_seconds);
  // Cancels everything left and joins the engine thread.
  void Stop();

  EngineStats Stats() const;
  const cache::PagePool& pool_for_tests() const { return pool_; }
  bool prefix_caching() const { return prefix_cache_ != nullptr; }
  const EngineConfig& config() const { return config_; }
  // Called on the engine thread whenever the stats change: after every step (with that
  // step's figures), after cancellations, and before a step's finished requests are told so
  // (step == nullptr in both). The metrics hook; set it before traffic starts.
  using Observer = std::function<void(const EngineStats&, const StepStats* step)>;
  void SetObserver(Observer observer) { observer_ = std::move(observer); }

 private:
  // host_pages: the offload policy's host pool (0: none).
  Engine(const EngineConfig& config, kernels::Backend& backend, int64_t num_pages,
         int64_t host_pages);
  // Checks a request against the model and the pool and makes its sequence.
  absl::StatusOr<std::unique_ptr<Sequence>> Prepare(Request request,
                                                    std::shared_ptr<TokenSink> sink) const;
  void Loop();
  void DrainInbox();
  void RunStep(StepPlan& plan);
  // Finishes every sequence of the step with an error (the forward pass failed).
  void FailStep(const StepPlan& plan, const absl::Status& st);
  // Finish removes a sequence (its pages go back to the pool at once) and queues what its
  // sink will hear; DeliverFinished publishes the stats (with `step`, the step just run, if
  // any), then tells the sinks. So a client that has heard its request finish finds its pages
  // free and its tokens and steps counted (status, metrics).
  void Finish(Sequence* seq, FinishReason reason, absl::Status status);
  // `scheduled`: no arrivals were drained since the last Schedule (see PublishStats).
  void DeliverFinished(const StepStats* step = nullptr, bool scheduled = true);
  void CheckDeadlines();
  // By priority: under mu_, picks the `count` requests that an `arrival` (its least urgent
  // priority, now) displaces from a full queue (those that never ran, of a strictly later
  // priority and after it in the order, the last first: with aging, one that has waited long
  // enough is kept) and takes them off displaceable_; false (nothing taken) when there are
  // not that many.
  bool PickDisplaced(const PriorityKey& arrival, int64_t count);
  // Ends the requests SubmitAll picked (after deadlines: an expired one is told so).
  void EndDisplaced();
  // A sequence that first ran or finished is no longer displaceable: noted here, taken off
  // displaceable_ by DropSettledLocked (under mu_).
  void SettleDisplaceable(Sequence& seq);
  void DropSettledLocked();
  // `finishing`: sequences removed but whose sinks are not yet told (still in pending_).
  // `scheduled` false: between DrainInbox and Schedule, when the scheduler's waiting
  // sequences include arrivals the step is about to start (scheduler_waiting_ keeps the last
  // step's count).
  void PublishStats(const StepStats* step, int64_t finishing = 0, bool scheduled = true);
  // Applies the sparse V policy to sequences past their prompt; copies rows in the backend.
  void CompactSparseV(const StepPlan& plan);
  // Registers the blocks this step completed in the prefix cache.
  void CacheCompletedBlocks(const StepPlan& plan);

  EngineConfig config_;
  kernels::Backend* backend_;
  cache::PagePool pool_;
  std::unique_ptr<cache::PagePool> host_pool_;  // the offload policy's; null otherwise
  cache::KvShape kv_shape_;
  std::unique_ptr<cache::PrefixCache> prefix_cache_;  // null: no prefix caching
  Scheduler scheduler_;
  const model::Tokenizer* tokenizer_;
  // The tokens by their bytes in decoded text (special tokens left out): what a guided choice
  // matches; and as the output's first token where that differs (SPM), else null.
  TokenBytesIndex vocab_bytes_;
  std::unique_ptr<TokenBytesIndex> first_vocab_bytes_;
  Observer observer_;

  // Inbox: guarded by mu_.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Sequence>> inbox_;
  // A cancel applies to the requests submitted before it (serial <= its own): a request that
  // takes an id right after a cancel for its finished namesake is not hit.
  struct PendingCancel {
    std::string id;
    absl::Status why;
    uint64_t serial;
  };
  std::vector<PendingCancel> cancels_;
  uint64_t submitted_ = 0;  // serial of the last submitted sequence
  int64_t pending_ = 0;  // inbox + waiting + running, for the queue limit and WaitIdle
  int64_t finishing_ = 0;  // of pending_: finished, sinks not yet told (DeliverFinished)
  int64_t scheduler_waiting_ = 0;  // the scheduler's waiting sequences after the last Schedule
  // By priority: the queued requests that have never run (single requests: not of a group or
  // a call), in the scheduler's order; those picked to make room (serials) that the engine has
  // not ended yet, and how many picked requests pending_ still counts.
  struct InQueueOrder {
    double aging = 0;  // SchedulerConfig::priority_aging
    bool operator()(const PriorityKey& a, const PriorityKey& b) const {
      return InPriorityOrder(a, b, aging);
    }
  };
  std::set<PriorityKey, InQueueOrder> displaceable_;
  std::set<uint64_t> displaced_;
  int64_t displaced_unsettled_ = 0;
  bool stop_ = false;
  std::condition_variable idle_cv_;
  EngineStats stats_;  // snapshot, guarded by mu_

  std::atomic<bool> draining_{false};
  std::thread thread_;

  // Engine-thread state.
  std::unique_ptr<kernels::cpu::ThreadPool> sampling_pool_;  // when sampling_threads > 1
  std::vector<std::pair<Sequence*, int64_t>> sample_rows_;  // (sequence, logits row)
  std::vector<SampleResult> samples_;  // [sample_rows_] this step's tokens
  std::vector<std::pair<std::unique_ptr<Sequence>, FinishInfo>> finished_;  // not yet told
  std::vector<float> logits_;  // a step's logits where the backend has no LogitsBuffer
  std::vector<int32_t> argmax_;  // a step's greedy picks (ForwardBatch::argmax), per logits row
  std::vector<int32_t> tokens_;
  std::vector<kernels::SeqChunk> chunks_;
  // Sequences that left displaceable_ (first ran or finished), taken off it under mu_.
  std::vector<PriorityKey> no_longer_displaceable_;
  std::set<uint64_t> displacing_serials_;  // picked, taken from displaced_ by DrainInbox
  std::vector<Sequence*> displacing_;      // EndDisplaced's
  kernels::AttentionStats attn_stats_;
  std::vector<double> layer_kept_ratio_;
  EngineCounters counters_;
};

}  // namespace thetaserve::scheduler
