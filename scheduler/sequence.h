// Engine-owned, mutable state of one request: its tokens, how many have K/V in the cache, its
// pages, sampler and text decoder. Engine-thread only, but for sampling: the engine hands each
// sequence's sampler(), BannedTokens() and GuidedTokens() to one worker of its sampling pool
// while it waits for them all (Engine::Step), so no sequence is touched by two threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cache/prefix_cache.h"
#include "cache/sequence_kv.h"
#include "kernels/backend.h"
#include "kernels/paged_kv.h"
#include "model/tokenizer.h"
#include "scheduler/guided_choice.h"
#include "scheduler/request.h"
#include "scheduler/sampler.h"

namespace thetaserve::scheduler {

enum class SequenceState { kWaiting, kRunning, kFinished };

class Sequence {
 public:
  Sequence(Request request, std::shared_ptr<TokenSink> sink, const model::Tokenizer& tokenizer,
           const cache::KvShape& kv_shape);

  const Request& request() const { return request_; }
  TokenSink& sink() { return *sink_; }
  SequenceState state = SequenceState::kWaiting;

  // All tokens: the prompt, then the output so far.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  std::span<const int32_t> output() const {
    return std::span<const int32_t>(tokens_).subspan(request_.prompt.size());
  }
  int64_t num_output() const { return int64_t(tokens_.size()) - int64_t(request_.prompt.size()); }
  // Tokens whose K/V are in the cache.
  int64_t num_computed = 0;
  int64_t num_uncomputed() const { return int64_t(tokens_.size()) - num_computed; }

  cache::SequenceKv& kv() { return kv_; }
  const cache::SequenceKv& kv() const { return kv_; }
  Sampler& sampler() { return sampler_; }
  // Tokens the sampler must not pick now: EOS (unless ignored) and the stop token ids while
  // fewer than min_tokens are out; empty after.
  std::span<const int32_t> BannedTokens() const {
    return num_output() < request_.stopping.min_tokens ? std::span<const int32_t>(stop_tokens_)
                                                        : std::span<const int32_t>();
  }

  // Whether this step's token is the ArgMax of its logits row as the model left it (greedy,
  // nothing banned, no guide, nothing else the sampler changes or reports): Sampler::PicksArgmax.
  bool SamplesArgmax() const {
    return !guide_ && BannedTokens().empty() && sampler_.PicksArgmax();
  }

  // A guided choice's next tokens (ascending; `vocab`: the tokens by their bytes in decoded
  // text, `first_vocab` as the output's first token where that differs, else null), with the
  // end-of-sequence ids where the output is a choice another one extends; empty when
  // unguided. When nothing can continue the output toward a choice, the next token ends the
  // sequence (kStop) whatever it is, its text unsent. Computed into the sequence's buffer.
  std::span<const int32_t> GuidedTokens(const TokenBytesIndex& vocab,
                                        const TokenBytesIndex* first_vocab,
                                        const model::Tokenizer& tokenizer);

  // Appends a sampled token and decides whether the sequence is done; emits the delta to the
  // sink (text held back while it could still be the start of a stop string).
  // Returns true when finished (reason in finish_reason()).
  bool AppendToken(const SampleResult& sample, const model::Tokenizer& tokenizer);

  // Prompt log-probabilities (Request::prompt_logprobs): whether prompt tokens are still to be
  // scored (the next chunk needs the logits of all its rows, and no cached blocks may stand in
  // for computing them).
  bool NeedsPromptScores() const {
    return request_.prompt_logprobs >= 0 && prompt_scored_ < int64_t(request_.prompt.size());
  }
  // Scores the prompt tokens that `rows` rows of logits, computed at positions start_pos …,
  // predict (row i predicts the token at start_pos + i + 1), skipping those already scored.
  void ScorePromptRows(const float* logits, int64_t vocab, int64_t start_pos, int64_t rows);
  // A request for max_tokens = 0: emits the prompt's scores and ends (kLength, no tokens).
  void FinishWithoutTokens();
  FinishReason finish_reason() const { return finish_reason_; }

  // Prefix cache: how many blocks of tokens() were adopted from or offered to the cache, where
  // the sequence stands there, and whether it adopted blocks at admission whose V sums the
  // backend must rebuild before its next forward pass.
  int64_t cached_blocks = 0;
  cache::PrefixCache::Cursor cache_cursor;
  bool restore_v_sum = false;
  // A member of its group (the APIs' n) has computed the prompt and offered its blocks to the
  // prefix cache: this one no longer waits for the group's first completion.
  bool group_prompt_computed = false;

  // Order of submission (Engine::SubmitAll): a cancel reaches only requests submitted before it.
  uint64_t serial = 0;
  // When it was submitted (with its serial; later serials, never earlier times): the priority
  // policy's aging counts from here (SchedulerConfig::priority_aging).
  Clock::time_point submitted{};
  // Under the priority policy, listed among the queued requests that have never run (those a
  // more urgent arrival may displace from a full queue) until it first runs or finishes.
  bool displaceable = false;

  // Timing, for FinishInfo.
  std::optional<Clock::time_point> first_scheduled;
  std::optional<Clock::time_point> first_token;
  int64_t preemptions = 0;

 private:
  Request request_;
  std::shared_ptr<TokenSink> sink_;
  std::vector<int32_t> tokens_;
  cache::SequenceKv kv_;
  Sampler sampler_;
  model::StreamDecoder decoder_;
  std::string held_text_;  // decoded but not yet emitted (possible stop-string prefix)
  size_t max_stop_len_ = 0;
  std::vector<int32_t> stop_tokens_;  // EOS ids (unless ignore_eos) and stop_token_ids
  // Request::guide: the output's bytes so far, the next tokens' buffer.
  const Guide* guide_ = nullptr;  // request_.guide's
  std::string guided_bytes_;
  bool guided_first_ = true;   // no text token out yet (the decoder's first)
  bool guided_stuck_ = false;  // nothing continues toward a choice: the next token ends it
  std::vector<int32_t> guided_next_;
  FinishReason finish_reason_ = FinishReason::kLength;
  // Prompt log-probabilities: tokens [1, prompt_scored_) are scored; what is kept until the
  // first delta carries it.
  int64_t prompt_scored_ = 1;
  bool prompt_scores_sent_ = false;
  PromptScores prompt_scores_;
  // Moves the prompt's scores into `delta` the first time (when asked for).
  void AttachPromptScores(TokenDelta& delta);
};

// The page tables the kernels read for `kv`. Hit marks (recency rule) or retained mass (mass
// budget) are recorded only when the sparse policy will read them, and only from the tail's
// first position on: compaction never looks at older rows, and a device copies the marks
// both ways every step.
kernels::SeqPageTables PageTablesFor(cache::SequenceKv& kv, const cache::SparsePolicy& policy);
// Their identity and versions (a device backend keeps a copy and sends only what changed).
kernels::TableVersion TableVersionOf(const cache::SequenceKv& kv);
// Runs a compaction's row moves in the backend: the copies to the host pool first (they read
// tail rows that the in-place moves may overwrite), then the in-pool copies in order.
absl::Status ApplyRowMoves(kernels::Backend& backend, std::span<const cache::RowMove> moves);

}  // namespace thetaserve::scheduler
