// Tokenizer methods shared by every implementation, and StreamDecoder.
#include "model/tokenizer.h"

#include "model/tokenizer_utf8.h"

namespace thetaserve::model {

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::vector<int32_t> kept;
  kept.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;  // HF drops ids it does not know
    if (skip_special && IsSpecial(id)) continue;
    kept.push_back(id);
  }
  return DecodeIds(kept);
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < special_.size() && special_[id] != 0;
}

int32_t Tokenizer::PieceToId(std::string_view piece) const {
  for (size_t id = 0; id < pieces_.size(); ++id) {
    if (pieces_[id] == piece) return static_cast<int32_t>(id);
  }
  return -1;
}

std::string StreamDecoder::Push(int32_t id) {
  if (id < 0 || id >= tokenizer_.vocab_size()) return {};
  if (skip_special_ && tokenizer_.IsSpecial(id)) return {};
  pending_ += tokenizer_.StreamBytes(id, first_);
  first_ = false;
  const size_t complete = Utf8CompletePrefix(pending_);
  std::string out = Utf8Lossy(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out = Utf8Lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace thetaserve::model
