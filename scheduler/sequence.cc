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

Sequence::Sequence(Request request, std::shared_ptr<TokenSink> sink,
                   const model::Tokenizer& tokenizer, const cache::KvShape& kv_shape)
    : request_(std::move(request)),
      sink_(std::move(sink)),
      tokens_(request_.prompt),
      kv_(kv_shape),
      sampler_(request_.sampling),
      decoder_(tokenizer) {
  for (const std::string& s : request_.stopping.stop) max_stop_len_ = std::max(max_stop_len_, s.size());
}

bool Sequence::AppendToken(const SampleResult& sample, const model::Tokenizer& tokenizer) {
  tokens_.push_back(sample.token);
  TokenDelta delta;
  delta.token_ids.push_back(sample.token);
  if (request_.sampling.logprobs > 0) {
    delta.logprobs.push_back(sample.logprob);
    delta.top.push_back(sample.top);
  }

  bool done = false;
  bool stop_string_hit = false;
  const auto& stop_ids = request_.stopping.stop_token_ids;
  const bool is_eos =
      !request_.stopping.ignore_eos &&
      std::find(tokenizer.stop_ids().begin(), tokenizer.stop_ids().end(), sample.token) !=
          tokenizer.stop_ids().end();
  if (is_eos) {
    finish_reason_ = FinishReason::kEos;
    done = true;
  } else if (std::find(stop_ids.begin(), stop_ids.end(), sample.token) != stop_ids.end()) {
    finish_reason_ = FinishReason::kStop;
    done = true;
  } else {
    held_text_ += decoder_.Push(sample.token);
    // A stop string ends the output just before it; the string itself is not emitted.
    size_t cut = std::string::npos;
    for (const std::string& s : request_.stopping.stop) {
      if (s.empty()) continue;
      size_t at = held_text_.find(s);
      if (at != std::string::npos) cut = std::min(cut, at);
    }
    if (cut != std::string::npos) {
      held_text_.resize(cut);
      stop_string_hit = true;
      finish_reason_ = FinishReason::kStop;
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
    for (const std::string& s : request_.stopping.stop) {
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
