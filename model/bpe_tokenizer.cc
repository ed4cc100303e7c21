#include "model/bpe_tokenizer.h"

#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "model/tokenizer_utf8.h"

namespace thetaserve::model {
namespace {

// Strings the chat templates end a turn with; each one that the template mentions and the
// vocabulary has becomes a stop id.
constexpr std::string_view kEndOfTurnPieces[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>",
                                                 "<|end|>", "<end_of_turn>", "</s>"};

absl::Status ValidateSpec(const TokenizerSpec& spec) {
  const auto n = static_cast<int64_t>(spec.pieces.size());
  if (n == 0) return absl::InvalidArgumentError("tokenizer vocabulary is empty");
  auto check_id = [&](int64_t id, std::string_view what) -> absl::Status {
    if (id < -1 || id >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer ", AsAbsl(what), " id ", id, " is outside the vocabulary of ", n));
    }
    return absl::OkStatus();
  };
  if (auto s = check_id(spec.bos_id, "BOS"); !s.ok()) return s;
  if (auto s = check_id(spec.eos_id, "EOS"); !s.ok()) return s;
  if (auto s = check_id(spec.unk_id, "unknown-token"); !s.ok()) return s;
  for (const AddedTokenSpec& t : spec.added_tokens) {
    if (t.id < 0 || t.id >= n) {
      return absl::InvalidArgumentError(absl::StrCat("added token '", t.content, "' has id ",
                                                     t.id, " outside the vocabulary of ", n));
    }
  }
  for (int32_t id : spec.extra_stop_ids) {
    if (auto s = check_id(id, "stop"); !s.ok()) return s;
  }
  if (spec.merge_algorithm == MergeAlgorithm::kScores && spec.scores.size() != spec.pieces.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer has ", spec.scores.size(),
                                                   " scores for ", n, " tokens"));
  }
  if (!spec.raw_pieces.empty() && spec.raw_pieces.size() != spec.pieces.size()) {
    return absl::InvalidArgumentError("tokenizer raw_pieces does not match the vocabulary");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> BuildTokenizer(TokenizerSpec spec) {
  auto tok = BpeTokenizer::Create(std::move(spec));
  if (!tok.ok()) return tok.status();
  return std::unique_ptr<Tokenizer>(std::move(*tok));
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Create(TokenizerSpec spec) {
  if (absl::Status s = ValidateSpec(spec); !s.ok()) return s;
  return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(spec)));
}

BpeTokenizer::BpeTokenizer(TokenizerSpec spec) : spec_(std::move(spec)), model_(spec_) {
  pieces_ = spec_.pieces;
  special_.assign(pieces_.size(), 0);
  for (const AddedTokenSpec& t : spec_.added_tokens) {
    if (t.special) special_[t.id] = 1;
    // HF decodes such a token from its normalized content.
    if (pieces_[t.id].empty()) pieces_[t.id] = t.normalized ? Normalize(t.content) : t.content;
    if (t.normalized) {
      normalized_added_.Add(Normalize(t.content), t);
    } else {
      raw_added_.Add(t.content, t);
    }
  }
  bos_id_ = spec_.bos_id;
  eos_id_ = spec_.eos_id;
  add_bos_ = spec_.add_bos;
  chat_template_ = spec_.chat_template;

  auto add_stop = [&](int32_t id) {
    if (id < 0) return;
    for (int32_t s : stop_ids_) {
      if (s == id) return;
    }
    stop_ids_.push_back(id);
  };
  add_stop(eos_id_);
  for (int32_t id : spec_.extra_stop_ids) add_stop(id);
  for (std::string_view piece : kEndOfTurnPieces) {
    const bool chatml_default = chat_template_.empty() && piece == "<|im_end|>";
    if (chatml_default || chat_template_.find(piece) != std::string::npos) {
      add_stop(PieceToId(piece));
    }
  }
  // model_ and pieces_ hold what is needed of these now.
  spec_.pieces = {};
  spec_.scores = {};
  spec_.merges = {};
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text, bool add_bos,
                                          bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_bos && add_bos_ && bos_id_ >= 0) ids.push_back(bos_id_);
  if (text.empty()) return ids;
  std::vector<AddedTokenMatcher::Segment> segments;
  raw_added_.Split(text, parse_special, &segments);
  for (const auto& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
    } else {
      EncodeSegment(seg.text, seg.text.data() == text.data(), parse_special, &ids);
    }
  }
  return ids;
}

void BpeTokenizer::EncodeSegment(std::string_view text, bool at_start, bool parse_special,
                                 std::vector<int32_t>* out) const {
  std::string normalized_storage;
  std::string_view normalized = text;
  if (!spec_.normalizer.empty()) {
    normalized_storage = Normalize(text);
    normalized = normalized_storage;
  }
  std::vector<AddedTokenMatcher::Segment> segments;
  if (normalized_added_.empty()) {
    segments.push_back({normalized, -1});
  } else {
    normalized_added_.Split(normalized, parse_special, &segments);
  }
  for (const auto& seg : segments) {
    if (seg.id >= 0) {
      out->push_back(seg.id);
    } else {
      PreTokenizeAndEncode(seg.text, at_start && seg.text.data() == normalized.data(), out);
    }
  }
}

std::string BpeTokenizer::Normalize(std::string_view text) const {
  std::string s(text);
  for (const NormalizerStep& step : spec_.normalizer) {
    switch (step.kind) {
      case NormalizerStep::Kind::kPrepend:
        if (!s.empty()) s.insert(0, step.content);
        break;
      case NormalizerStep::Kind::kReplace:
        if (!step.pattern.empty()) s = absl::StrReplaceAll(s, {{step.pattern, step.content}});
        break;
    }
  }
  return s;
}

void BpeTokenizer::PreTokenizeAndEncode(std::string_view text, bool at_start,
                                        std::vector<int32_t>* out) const {
  // Views into `text` or into `storage` for pieces a step rewrote; each step splits every
  // piece of the previous one.
  struct View {
    std::string_view text;
    bool at_start;
  };
  std::deque<std::string> storage;
  std::vector<View> cur{{text, at_start}};
  std::vector<View> next;
  std::vector<std::string_view> parts;
  for (const PreTokenizerStep& step : spec_.pre_tokenizer) {
    next.clear();
    for (const View& v : cur) {
      if (v.text.empty()) continue;
      std::string_view src = v.text;
      parts.clear();
      switch (step.kind) {
        case PreTokenizerStep::Kind::kDigits:
          SplitDigits(src, step.individual_digits, &parts);
          break;
        case PreTokenizerStep::Kind::kSplit:
          SplitByRegex(src, step.regex, &parts);
          break;
        case PreTokenizerStep::Kind::kByteLevel:
          if (step.add_prefix_space && src.front() != ' ') {
            src = storage.emplace_back(absl::StrCat(" ", AsAbsl(src)));
          }
          if (step.use_regex) {
            SplitByRegex(src, SplitRegex::kGpt2, &parts);
          } else {
            parts.push_back(src);
          }
          break;
        case PreTokenizerStep::Kind::kMetaspace: {
          std::string s = absl::StrReplaceAll(AsAbsl(src), {{" ", step.replacement}});
          const bool prepend =
              step.prepend_scheme == PrependScheme::kAlways ||
              (step.prepend_scheme == PrependScheme::kFirst && v.at_start);
          if (prepend && !std::string_view(s).starts_with(step.replacement)) {
            s.insert(0, step.replacement);
          }
          src = storage.emplace_back(std::move(s));
          if (step.split) {
            SplitBeforeMarker(src, step.replacement, &parts);
          } else {
            parts.push_back(src);
          }
          break;
        }
      }
      for (std::string_view p : parts) {
        if (!p.empty()) next.push_back({p, v.at_start && p.data() == src.data()});
      }
    }
    std::swap(cur, next);
  }
  for (const View& v : cur) EncodeWord(v.text, out);
}

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.size() > kMaxCachedWordBytes) {
    model_.Encode(word, out);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    const auto it = cache_.find(AsAbsl(word));
    if (it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t before = out->size();
  model_.Encode(word, out);
  std::vector<int32_t> ids(out->begin() + before, out->end());
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.emplace(std::string(word), std::move(ids));
}

}  // namespace thetaserve::model
