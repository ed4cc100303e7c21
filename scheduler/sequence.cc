#include "scheduler/sequence.h"

#include <algorithm>

namespace thetaserve::scheduler {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kEos: return "eos";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

kernels::SeqPageTables PageTablesFor(cache::SequenceKv& kv, const cache::SparsePolicy& policy) {
  kernels::SeqPageTables p;
  p.k_pages = kv.k_table();
  p.v_pages = kv.v_table();
  p.stride = kv.stride();
  p.v_tail_start = static_cast<int32_t>(kv.v_tail_start());
  p.v_sparse_pages = kv.sparse_pages();
  p.v_sparse_pos = kv.sparse_pos();
  p.v_sparse_count = kv.sparse_count();
  p.sparse_stride = kv.sparse_stride();
  p.sparse_pos_stride = kv.pos_stride();
  if (kv.has_host_store()) {
    p.v_host_pages = kv.host_pages();
    p.v_host_pos = kv.host_pos();
    p.v_host_count = kv.host_count();
    p.host_stride = kv.host_stride();
    p.host_pos_stride = kv.host_pos_stride();
  }
  p.v_sum = kv.v_sum();
  if (policy.enabled && kv.hits_stride() > 0) {
    p.hits_stride = kv.hits_stride();
    p.hits_begin = p.v_tail_start;
    if (policy.keep_fraction > 0) {
      p.hit_mass = kv.hit_mass() + p.hits_begin;
    } else {
      p.hits = kv.hits() + p.hits_begin;
    }
  }
  return p;
}

absl::Status ApplyRowMoves(kernels::Backend& backend, std::span<const cache::RowMove> moves) {
  if (moves.empty()) return absl::OkStatus();
  std::vector<kernels::KvRowCopy> to_host, in_pool;
  for (const auto& m : moves) {
    (m.to_host ? to_host : in_pool).push_back({m.src_page, m.src_row, m.dst_page, m.dst_row});
  }
  if (!to_host.empty()) {
    if (absl::Status st = backend.OffloadKvRows(to_host); !st.ok()) return st;
  }
  if (in_pool.empty()) return absl::OkStatus();
  return backend.CopyKvRows(in_pool);
}

kernels::TableVersion TableVersionOf(const cache::SequenceKv& kv) {
  kernels::TableVersion v;
  v.id = kv.id();
  v.k_epoch = kv.k_epoch();
  v.v_epoch = kv.v_epoch();
  v.sparse_epoch = kv.sparse_epoch();
  v.host_epoch = kv.host_epoch();
  v.k_blocks = static_cast<int32_t>(kv.blocks());
  return v;
}

Sequence::Sequence(Request request, std::shared_ptr<TokenSink> sink,
                   const model::Tokenizer& tokenizer, const cache::KvShape& kv_shape)
    : request_(std::move(request)),
      sink_(std::move(sink)),
      tokens_(request_.prompt),
      kv_(kv_shape),
      sampler_(request_.sampling),
      decoder_(tokenizer, request_.skip_special_tokens) {
  guide_ = request_.guide.get();
  for (const std::string& s : request_.stopping.stop) max_stop_len_ = std::max(max_stop_len_, s.size());
  if (request_.stopping.min_tokens > 0) {
    if (!request_.stopping.ignore_eos) stop_tokens_ = tokenizer.stop_ids();
    const auto& ids = request_.stopping.stop_token_ids;
    stop_tokens_.insert(stop_tokens_.end(), ids.begin(), ids.end());
  }
}

void Sequence::ScorePromptRows(const float* logits, int64_t vocab, int64_t start_pos,
                               int64_t rows) {
  const int64_t prompt = int64_t(request_.prompt.size());
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t pos = start_pos + i + 1;  // the token row i predicts
    if (pos >= prompt) break;
    if (pos < prompt_scored_) continue;  // scored before a preemption
    std::span<const float> row(logits + i * vocab, vocab);
    PromptScores& s = prompt_scores_;
    s.top.emplace_back();
    s.ranks.push_back(0);
    s.logprobs.push_back(
        ScoreToken(row, request_.prompt[pos], request_.prompt_logprobs, &s.top.back(),
                   &s.ranks.back()));
    prompt_scored_ = pos + 1;
  }
}

void Sequence::AttachPromptScores(TokenDelta& delta) {
  if (request_.prompt_logprobs < 0 || prompt_scores_sent_) return;
  prompt_scores_.token_ids = request_.prompt;
  delta.prompt = std::make_shared<const PromptScores>(std::move(prompt_scores_));
  prompt_scores_ = {};
  prompt_scores_sent_ = true;
}

void Sequence::FinishWithoutTokens() {
  TokenDelta delta;
  AttachPromptScores(delta);
  finish_reason_ = FinishReason::kLength;
  sink_->OnTokens(delta);
}

std::span<const int32_t> Sequence::GuidedTokens(const TokenBytesIndex& vocab,
                                                const TokenBytesIndex* first_vocab,
                                                const model::Tokenizer& tokenizer) {
  if (!guide_) return {};
  guide_->Allowed(guided_bytes_, guided_first_ && first_vocab ? *first_vocab : vocab,
                  &guided_next_);
  // A choice that others extend may end here, by EOS (never offered under ignore_eos).
  if (guide_->Accepts(guided_bytes_) && !request_.stopping.ignore_eos) {
    for (int32_t id : tokenizer.stop_ids()) {
      auto at = std::lower_bound(guided_next_.begin(), guided_next_.end(), id);
      if (at == guided_next_.end() || *at != id) guided_next_.insert(at, id);
    }
  }
  // Nothing leads on (a vocabulary without the bytes needed): whatever comes next ends it.
  guided_stuck_ = guided_next_.empty();
  return guided_next_;
}

bool Sequence::AppendToken(const SampleResult& sample, const model::Tokenizer& tokenizer) {
  tokens_.push_back(sample.token);
  if (guide_ && !guided_stuck_ && !tokenizer.IsSpecial(sample.token)) {
    guided_bytes_ += tokenizer.TextBytes(sample.token, guided_first_);
    guided_first_ = false;
  }
  TokenDelta delta;
  AttachPromptScores(delta);
  delta.token_ids.push_back(sample.token);
  if (request_.sampling.logprobs > 0) {
    delta.logprobs.push_back(sample.logprob);
    delta.top.push_back(sample.top);
  }

  bool done = false;
  bool stop_string_hit = false;
  const auto& stop_ids = request_.stopping.stop_token_ids;
  // Stop strings are looked for from the min_tokens-th token on, and text is held back for
  // them from the token before (the string may begin in its text).
  static const std::vector<std::string> kNoStops;
  const auto& stops =
      num_output() >= request_.stopping.min_tokens ? request_.stopping.stop : kNoStops;
  const auto& held_for =
      num_output() + 1 >= request_.stopping.min_tokens ? request_.stopping.stop : kNoStops;
  const bool is_eos =
      !request_.stopping.ignore_eos &&
      std::find(tokenizer.stop_ids().begin(), tokenizer.stop_ids().end(), sample.token) !=
          tokenizer.stop_ids().end();
  if (is_eos) {
    finish_reason_ = FinishReason::kEos;
    done = true;
  } else if (guide_ && guided_stuck_) {
    finish_reason_ = FinishReason::kStop;  // the guide had nothing to offer: end, unsent
    done = true;
  } else if (std::find(stop_ids.begin(), stop_ids.end(), sample.token) != stop_ids.end()) {
    finish_reason_ = FinishReason::kStop;
    done = true;
  }
  if (done && request_.stopping.include_stop_str && !guide_) {
    // The stopping token's text too, as vLLM's include_stop_str_in_output (a special token's,
    // EOS's say, only with skip_special_tokens false). Not for a guided output, which is
    // then exactly the choice, or the regex's or the schema's match.
    held_text_ += decoder_.Push(sample.token);
  } else if (!done) {
    held_text_ += decoder_.Push(sample.token);
    // A stop string ends the output just before it (the string itself is not emitted), or
    // just after it with include_stop_str; the earliest match wins.
    size_t at = std::string::npos, cut = std::string::npos;
    for (const std::string& s : stops) {
      if (s.empty()) continue;
      const size_t found = held_text_.find(s);
      if (found != std::string::npos && found < at) {
        at = found;
        cut = request_.stopping.include_stop_str ? found + s.size() : found;
      }
    }
    if (cut != std::string::npos) {
      held_text_.resize(cut);
      stop_string_hit = true;
      finish_reason_ = FinishReason::kStop;
      done = true;
    } else if (guide_ && guide_->Complete(guided_bytes_)) {
      finish_reason_ = FinishReason::kStop;  // the whole of a choice, and no other is longer
      done = true;
    } else if (num_output() >= request_.stopping.max_tokens) {
      finish_reason_ = FinishReason::kLength;
      done = true;
    }
  }
  if (done) {
    if (!stop_string_hit) held_text_ += decoder_.Flush();
    delta.text = std::move(held_text_);
    held_text_.clear();
  } else {
    // Keep back the longest suffix that could still begin a stop string.
    size_t keep = 0;
    for (const std::string& s : held_for) {
      if (s.empty()) continue;
      for (size_t n = std::min(s.size() - 1, held_text_.size()); n > keep; --n) {
        if (held_text_.compare(held_text_.size() - n, n, s, 0, n) == 0) {
          keep = n;
          break;
        }
      }
    }
    delta.text = held_text_.substr(0, held_text_.size() - keep);
    held_text_.erase(0, held_text_.size() - keep);
  }
  sink_->OnTokens(delta);
  return done;
}

}  // namespace thetaserve::scheduler
