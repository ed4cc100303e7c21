#include "scheduler/engine.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/check.h"

namespace thetaserve::scheduler {
namespace {

// Each token's bytes in decoded text (as the output's first token if `first`), special
// tokens' left empty (a guided choice never matches them).
std::vector<std::string> VocabBytes(const model::Tokenizer& tokenizer, bool first) {
  std::vector<std::string> bytes(tokenizer.vocab_size());
  for (int32_t id = 0; id < int32_t(bytes.size()); ++id) {
    if (!tokenizer.IsSpecial(id)) bytes[id] = tokenizer.TextBytes(id, first);
  }
  return bytes;
}

// The same as the output's first token, where that differs from `rest` (an SPM model's:
// the decoder drops the first token's leading space): else null.
std::unique_ptr<TokenBytesIndex> FirstVocabBytes(const model::Tokenizer& tokenizer,
                                                 const TokenBytesIndex& rest) {
  std::vector<std::string> first = VocabBytes(tokenizer, /*first=*/true);
  for (int32_t id = 0; id < int32_t(first.size()); ++id) {
    if (first[id] != rest.bytes(id)) return std::make_unique<TokenBytesIndex>(std::move(first));
  }
  return nullptr;
}

double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

SchedulerConfig WithSparse(SchedulerConfig config, const cache::SparsePolicy& sparse) {
  config.sparse = sparse;
  return config;
}

// A page: `block_size` rows of one (layer, KV head), in the backend's KV element type.
int64_t PageBytes(const kernels::Backend& backend, int32_t block_size) {
  return int64_t(block_size) * backend.kv_row_bytes();
}

cache::KvShape KvShapeOf(const kernels::Backend& backend, int32_t block_size) {
  const auto& c = backend.model().config();
  return {static_cast<int32_t>(c.num_layers), static_cast<int32_t>(c.num_kv_heads), block_size,
          static_cast<int32_t>(c.head_dim)};
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& config,
                                                       kernels::Backend& backend) {
  const auto& c = backend.model().config();
  if (absl::Status st =
          CheckPriorityAging(config.scheduler.policy, config.scheduler.priority_aging);
      !st.ok()) {
    return st;
  }
  const int64_t page_bytes = PageBytes(backend, config.block_size);
  const int64_t num_pages = config.kv_cache_bytes / page_bytes;
  const int64_t min_pages = 2 * c.num_layers * c.num_kv_heads;  // one block of K and V
  if (num_pages < min_pages) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--kv-cache-memory %d bytes holds %d pages of %d bytes; this model needs at least %d "
        "(%d bytes) for a single block of one sequence",
        config.kv_cache_bytes, num_pages, page_bytes, min_pages, min_pages * page_bytes));
  }
  absl::Status st = backend.AllocateKvPool(num_pages, config.block_size);
  if (!st.ok()) return st;
  int64_t host_pages = 0;
  if (config.sparse.enabled && config.sparse.offload) {
    host_pages = std::max<int64_t>(0, config.offload_bytes) / page_bytes;
    if (host_pages < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--offload-memory %d bytes holds no page of %d bytes", config.offload_bytes, page_bytes));
    }
    st = backend.AllocateHostPool(host_pages);
    if (!st.ok()) return st;
  }
  std::unique_ptr<Engine> engine(new Engine(config, backend, num_pages, host_pages));
  engine->PublishStats(nullptr);
  engine->thread_ = std::thread([e = engine.get()] { e->Loop(); });
  return engine;
}

Engine::Engine(const EngineConfig& config, kernels::Backend& backend, int64_t num_pages,
               int64_t host_pages)
    : config_(config),
      backend_(&backend),
      pool_(num_pages, config.block_size),
      host_pool_(host_pages > 0 ? std::make_unique<cache::PagePool>(host_pages, config.block_size)
                                : nullptr),
      kv_shape_(KvShapeOf(backend, config.block_size)),
      prefix_cache_(config.prefix_caching && !config.sparse.enabled
                        ? std::make_unique<cache::PrefixCache>(kv_shape_)
                        : nullptr),
      scheduler_(WithSparse(config.scheduler, config.sparse), pool_, prefix_cache_.get()),
      tokenizer_(&backend.model().tokenizer()),
      vocab_bytes_(VocabBytes(*tokenizer_, /*first=*/false)),
      first_vocab_bytes_(FirstVocabBytes(*tokenizer_, vocab_bytes_)) {
  displaceable_ =
      std::set<PriorityKey, InQueueOrder>(InQueueOrder{config.scheduler.priority_aging});
  if (config.sampling_threads > 1) {
    sampling_pool_ = std::make_unique<kernels::cpu::ThreadPool>(config.sampling_threads);
  }
}

Engine::~Engine() { Stop(); }

int64_t Engine::MaxSequenceTokens() const {
  cache::SequenceKv probe(kv_shape_);
  int64_t lo = 0, hi = backend_->model().config().max_context;  // PagesNeeded grows with tokens
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (probe.PagesNeeded(mid) <= pool_.num_pages()) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

int64_t Engine::KvBytesForSequence(const kernels::Backend& backend, int32_t block_size,
                                   int64_t tokens) {
  return cache::SequenceKv(KvShapeOf(backend, block_size)).PagesNeeded(tokens) *
         PageBytes(backend, block_size);
}

void Engine::StartDrain() { draining_.store(true); }

bool Engine::WaitIdle(double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, std::chrono::duration<double>(timeout_seconds),
                           [&] { return pending_ == 0 && stats_.running == 0 && stats_.waiting == 0; });
}

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

EngineStats Engine::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Engine::PublishStats(const StepStats* step, int64_t finishing, bool scheduled) {
  EngineStats s;
  s.running = static_cast<int64_t>(scheduler_.running().size());
  s.waiting = static_cast<int64_t>(scheduler_.waiting().size());
  // Pages only the prefix cache holds are reclaimable on demand: free for these figures.
  s.pages_total = pool_.num_pages();
  s.pages_cached = pool_.num_cached_only();
  s.pages_free = pool_.num_free() + s.pages_cached;
  s.pages_used_k = pool_.num_used(cache::PageKind::kK) - pool_.num_cached_only(cache::PageKind::kK);
  s.pages_used_v = pool_.num_used(cache::PageKind::kV) - pool_.num_cached_only(cache::PageKind::kV);
  if (prefix_cache_) s.prefix_cache_blocks = prefix_cache_->num_blocks();
  if (host_pool_) {
    s.host_pages_total = host_pool_->num_pages();
    s.host_pages_used = host_pool_->num_used();
  }
  s.block_size = config_.block_size;
  s.page_bytes = PageBytes(*backend_, config_.block_size);
  s.counters = counters_;
  s.counters.prefix_query_tokens = scheduler_.prefix_query_tokens();
  s.counters.prefix_hit_tokens = scheduler_.prefix_hit_tokens();
  if (prefix_cache_) s.counters.prefix_evicted_blocks = prefix_cache_->num_evicted();
  const int64_t tables = kv_shape_.tables();
  for (const auto& seq : scheduler_.running()) {
    s.v_rows_dense_equivalent += seq->num_computed * tables;
    s.v_rows_resident += seq->kv().VRowsResident(seq->num_computed);
    s.v_rows_host_resident += seq->kv().VRowsOffloaded();
  }
  s.layer_kept_ratio = layer_kept_ratio_;
  s.v_row_bytes = backend_->kv_row_bytes();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (scheduled) scheduler_waiting_ = s.waiting;
    // Before `finishing` counts them, ended sequences can no longer be picked to make room.
    DropSettledLocked();
    s.waiting += static_cast<int64_t>(inbox_.size());
    s.last_step = step ? *step : stats_.last_step;
    stats_ = s;
    finishing_ = finishing;
    // Idle is announced from here so that WaitIdle's caller sees up-to-date stats.
    if (pending_ == 0 && s.running == 0 && s.waiting == 0) idle_cv_.notify_all();
  }
  if (observer_) observer_(s, step);
}

void Engine::CheckDeadlines() {
  const auto now = Clock::now();
  std::vector<Sequence*> expired;
  for (const auto& s : scheduler_.running()) {
    if (s->request().deadline && *s->request().deadline <= now) expired.push_back(s.get());
  }
  for (const auto& s : scheduler_.waiting()) {
    if (s->request().deadline && *s->request().deadline <= now) expired.push_back(s.get());
  }
  for (Sequence* s : expired) {
    Finish(s, FinishReason::kCancelled,
           absl::DeadlineExceededError("the request's deadline passed before it finished"));
  }
}

void Engine::Finish(Sequence* seq, FinishReason reason, absl::Status status) {
  SettleDisplaceable(*seq);
  std::unique_ptr<Sequence> owned = scheduler_.Remove(seq);
  const auto now = Clock::now();
  const auto arrival = owned->request().arrival;
  FinishInfo info;
  info.reason = reason;
  info.status = std::move(status);
  info.prompt_tokens = static_cast<int64_t>(owned->request().prompt.size());
  info.completion_tokens = owned->num_output();
  info.queue_seconds =
      owned->first_scheduled ? SecondsBetween(arrival, *owned->first_scheduled) : SecondsBetween(arrival, now);
  info.ttft_seconds = owned->first_token ? SecondsBetween(arrival, *owned->first_token) : 0.0;
  info.total_seconds = SecondsBetween(arrival, now);
  info.preemptions = owned->preemptions;
  ++counters_.requests_finished;
  finished_.emplace_back(std::move(owned), std::move(info));
}

void Engine::DeliverFinished(const StepStats* step, bool scheduled) {
  if (finished_.empty() && !step) return;
  PublishStats(step, static_cast<int64_t>(finished_.size()), scheduled);
  if (finished_.empty()) return;
  for (auto& [seq, info] : finished_) seq->sink().OnFinish(info);
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ -= finishing_;
    finishing_ = 0;
    if (pending_ == 0 && stats_.running == 0 && stats_.waiting == 0) idle_cv_.notify_all();
  }
  finished_.clear();
}

void Engine::RunStep(StepPlan& plan) {
  const auto& c = backend_->model().config();
  const auto t0 = Clock::now();
  tokens_.clear();
  chunks_.clear();
  StepStats step;
  for (const ScheduledChunk& sc : plan.chunks) {
    kernels::SeqChunk chunk;
    chunk.token_offset = static_cast<int32_t>(tokens_.size());
    chunk.num_tokens = static_cast<int32_t>(sc.num_tokens);
    chunk.start_pos = static_cast<int32_t>(sc.seq->num_computed);
    chunk.want_logits = sc.samples;
    chunk.all_logits = sc.seq->NeedsPromptScores();
    cache::SequenceKv& kv = sc.seq->kv();
    chunk.pages = PageTablesFor(kv, config_.sparse);
    chunk.tables = TableVersionOf(kv);
    if (sc.seq->restore_v_sum) {
      // Adopted from the prefix cache: VMC's running sums of the rows it did not compute
      // (only Top-θ with VMC reads them).
      const kernels::TopThetaConfig& tt = backend_->top_theta();
      if (tt.active() && tt.vmc) {
        if (absl::Status st = backend_->SumVRows(chunk.pages, sc.seq->num_computed); !st.ok()) {
          return FailStep(plan, st);
        }
      }
      sc.seq->restore_v_sum = false;
    }
    const auto& toks = sc.seq->tokens();
    tokens_.insert(tokens_.end(), toks.begin() + sc.seq->num_computed,
                   toks.begin() + sc.seq->num_computed + sc.num_tokens);
    chunks_.push_back(chunk);

    // A chunk is prefill while it computes prompt tokens (or recomputes after preemption).
    if (sc.num_tokens == 1 && sc.seq->num_computed >= int64_t(sc.seq->request().prompt.size())) {
      ++step.decode_tokens;
    } else {
      step.prefill_tokens += sc.num_tokens;
    }
  }
  attn_stats_.Reset(c.num_layers);
  kernels::ForwardBatch batch{tokens_, chunks_, false, &attn_stats_};
  // Greedy picks instead of logits where every row that samples takes its row's ArgMax and no
  // prompt is scored (EngineConfig::backend_argmax); else the rows, in the backend's own
  // logits memory where it has one (page-locked on a GPU), or ours.
  bool argmax = config_.backend_argmax && backend_->ReturnsArgmax();
  for (size_t i = 0; i < plan.chunks.size() && argmax; ++i) {
    const ScheduledChunk& sc = plan.chunks[i];
    argmax = !chunks_[i].all_logits &&
             (!sc.samples || sc.seq->request().stopping.max_tokens == 0 ||
              sc.seq->SamplesArgmax());
  }
  const int64_t logit_rows = kernels::NumLogitRows(batch);
  float* step_logits = nullptr;
  if (argmax) {
    argmax_.resize(logit_rows);
    batch.argmax = argmax_.data();
  } else {
    step_logits = backend_->LogitsMemory(logit_rows * c.vocab_size, &logits_);
  }
  absl::Status st = backend_->Forward(batch, step_logits);
  const auto t1 = Clock::now();
  if (!st.ok()) return FailStep(plan, st);
  scheduler_.Commit(plan);
  CacheCompletedBlocks(plan);
  counters_.prompt_tokens += step.prefill_tokens;
  counters_.v_rows_read += attn_stats_.v_rows_read;
  counters_.v_rows_read_dense += attn_stats_.v_rows_read_dense;
  counters_.attn_elements_kept += attn_stats_.elements_kept;
  counters_.attn_elements_dense += attn_stats_.elements_dense;
  counters_.v_rows_retained_but_evicted += attn_stats_.retained_but_evicted;
  counters_.v_rows_read_host += attn_stats_.v_rows_read_host;
  layer_kept_ratio_.resize(c.num_layers);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    layer_kept_ratio_[l] = attn_stats_.layer_dense[l]
                               ? double(attn_stats_.layer_kept[l]) / attn_stats_.layer_dense[l]
                               : 1.0;
  }

  // Score prompt tokens where asked (every row of such a chunk has logits), then sample
  // every sequence whose chunk reached its last token (in parallel when there is a pool: each
  // reads only its own request and logits row) and append the tokens in order on this
  // thread. A request for no tokens ends once its prompt is scored.
  sample_rows_.clear();
  std::vector<Sequence*> score_only;
  int64_t row = 0;  // the chunk's first logits row
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& sc = plan.chunks[i];
    const kernels::SeqChunk& chunk = chunks_[i];
    if (chunk.all_logits) {
      sc.seq->ScorePromptRows(step_logits + row * c.vocab_size, c.vocab_size, chunk.start_pos,
                              chunk.num_tokens);
    }
    row += kernels::LogitRows(batch, chunk);
    if (!sc.samples) continue;
    if (sc.seq->request().stopping.max_tokens == 0) {
      score_only.push_back(sc.seq);
    } else {
      sample_rows_.emplace_back(sc.seq, row - 1);
    }
  }
  samples_.resize(sample_rows_.size());
  auto sample = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      auto [seq, row] = sample_rows_[i];
      if (argmax) {
        samples_[i] = SampleResult();
        samples_[i].token = argmax_[row];
        continue;
      }
      std::span<float> logits(step_logits + row * c.vocab_size, c.vocab_size);
      samples_[i] = seq->sampler().Sample(logits, seq->request().prompt, seq->output(),
                                          seq->BannedTokens(),
                                          seq->GuidedTokens(vocab_bytes_,
                                                            first_vocab_bytes_.get(),
                                                            *tokenizer_));
    }
  };
  const int64_t num_samples = int64_t(sample_rows_.size());
  if (argmax) {
    counters_.argmax_tokens += num_samples;
    sample(0, num_samples);
  } else if (sampling_pool_ && num_samples > 1) {
    sampling_pool_->ParallelFor(num_samples, 1, sample);
  } else {
    sample(0, num_samples);
  }
  std::vector<std::pair<Sequence*, FinishReason>> done;
  for (Sequence* seq : score_only) {
    seq->FinishWithoutTokens();
    done.emplace_back(seq, FinishReason::kLength);
  }
  for (int64_t i = 0; i < num_samples; ++i) {
    Sequence* seq = sample_rows_[i].first;
    if (!seq->first_token) seq->first_token = Clock::now();
    ++counters_.generation_tokens;
    if (seq->AppendToken(samples_[i], *tokenizer_)) done.emplace_back(seq, seq->finish_reason());
  }
  // The observer (metrics) and the status snapshot see this step — its counters, its timings
  // and the freed pages — before any client hears that its request finished: a client that
  // scrapes or asks for the status after its stream ends finds its tokens counted, this step
  // in the step histograms and its pages free. So the sparse V store is compacted (the
  // running sequences only; the finished ones' pages are already back) before the sinks are told.
  ++counters_.steps;
  counters_.preemptions = scheduler_.num_preemptions();
  counters_.priority_preemptions = scheduler_.num_priority_preemptions();
  for (auto& [seq, reason] : done) Finish(seq, reason, absl::OkStatus());
  CompactSparseV(plan);

  step.seconds = SecondsBetween(t0, Clock::now());
  step.forward_seconds = SecondsBetween(t0, t1);
  step.num_seqs = static_cast<int64_t>(plan.chunks.size());
  step.num_tokens = plan.num_tokens;
  DeliverFinished(&step);
}

void Engine::FailStep(const StepPlan& plan, const absl::Status& st) {
  for (const ScheduledChunk& sc : plan.chunks) {
    Finish(sc.seq, FinishReason::kError,
           absl::InternalError(absl::StrCat("forward pass failed: ", st.message())));
  }
  DeliverFinished();
}

void Engine::CacheCompletedBlocks(const StepPlan& plan) {
  if (!prefix_cache_) return;
  const int64_t bs = config_.block_size;
  for (const ScheduledChunk& sc : plan.chunks) {
    Sequence& seq = *sc.seq;
    const int64_t full = seq.num_computed / bs;  // blocks whose every row is computed
    if (full <= seq.cached_blocks) continue;
    prefix_cache_->Insert(seq.tokens(), seq.cached_blocks, full, seq.kv(), pool_, &seq.cache_cursor);
    seq.cached_blocks = full;
  }
}

void Engine::CompactSparseV(const StepPlan& plan) {
  if (!config_.sparse.enabled) return;
  std::vector<cache::RowMove> moves;
  const int64_t stride = config_.scheduler.max_num_batched_tokens;
  for (const ScheduledChunk& chunk : plan.chunks) {
    Sequence* seq = chunk.seq;
    if (seq->state != SequenceState::kRunning) continue;  // finished: its pages are back
    // Also between prefill chunks (the chunk's last queries are the observation window so
    // far), so a long prompt never holds more than a chunk (a stride) and its window of dense
    // V rows; with fixed_compaction only at the prompt's compaction points (SparseChunkEnd).
    if (config_.sparse.fixed_compaction && !chunk.samples && seq->num_computed % stride != 0) {
      continue;
    }
    cache::SequenceKv::CompactResult r;
    seq->kv().CompactV(pool_, seq->num_computed, config_.sparse, &moves, &r, host_pool_.get());
    counters_.v_rows_evicted += r.rows_dropped;
    counters_.v_rows_offloaded += r.rows_offloaded;
  }
  absl::Status st = ApplyRowMoves(*backend_, moves);
  CHECK(st.ok()) << "KV row copy failed: " << st.message();
}

void Engine::Loop() {
  while (true) {
    const bool has_work = !scheduler_.running().empty() || !scheduler_.waiting().empty();
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!has_work) {
        cv_.wait(lock, [&] { return stop_ || !inbox_.empty() || !cancels_.empty(); });
      }
      if (stop_) break;
    }
    DrainInbox();
    CheckDeadlines();
    EndDisplaced();
    DeliverFinished(nullptr, /*scheduled=*/false);  // cancellations, deadlines, displaced
    StepPlan plan = scheduler_.Schedule();
    // Started (those preempted again in the same step too).
    for (const ScheduledChunk& sc : plan.chunks) SettleDisplaceable(*sc.seq);
    for (Sequence* seq : plan.preempted) SettleDisplaceable(*seq);
    if (!no_longer_displaceable_.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      DropSettledLocked();
    }
    if (plan.empty()) {
      // Submit checked that every request fits the pool alone, so an empty plan with work
      // waiting can only be a sequence that no longer fits; fail it rather than spin.
      if (scheduler_.running().empty() && !scheduler_.waiting().empty()) {
        Finish(scheduler_.waiting().front().get(), FinishReason::kError,
               absl::ResourceExhaustedError("the request does not fit in the KV cache"));
      }
      DeliverFinished();
      PublishStats(nullptr);
      continue;
    }
    RunStep(plan);
  }
  // Shutting down: whatever is left is cancelled.
  DrainInbox();
  std::vector<Sequence*> left;
  for (const auto& s : scheduler_.running()) left.push_back(s.get());
  for (const auto& s : scheduler_.waiting()) left.push_back(s.get());
  for (Sequence* s : left) {
    Finish(s, FinishReason::kCancelled, absl::UnavailableError("the server is shutting down"));
  }
  DeliverFinished();
  PublishStats(nullptr);
}

}  // namespace thetaserve::scheduler
