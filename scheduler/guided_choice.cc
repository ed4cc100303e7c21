#include "scheduler/guided_choice.h"

#include <algorithm>

namespace thetaserve::scheduler {

TokenBytesIndex::TokenBytesIndex(std::vector<std::string> bytes) : bytes_(std::move(bytes)) {
  for (size_t id = 0; id < bytes_.size(); ++id) {
    if (bytes_[id].empty()) continue;
    sorted_.push_back({bytes_[id], int32_t(id)});
    max_len_ = std::max(max_len_, bytes_[id].size());
  }
  std::sort(sorted_.begin(), sorted_.end());
  common_.assign(sorted_.size(), 0);
  for (size_t i = 1; i < sorted_.size(); ++i) {
    const std::string_view a = sorted_[i - 1].first, b = sorted_[i].first;
    uint32_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    common_[i] = n;
  }
}

void TokenBytesIndex::PrefixesOf(std::string_view s, std::vector<int32_t>* ids) const {
  for (size_t len = 1; len <= std::min(s.size(), max_len_); ++len) {
    const std::string_view prefix = s.substr(0, len);
    auto it = std::lower_bound(
        sorted_.begin(), sorted_.end(), prefix,
        [](const auto& entry, std::string_view p) { return entry.first < p; });
    // The first entry >= prefix begins with it if any does; if none does, no longer prefix of
    // s is a token either.
    if (it == sorted_.end() || !it->first.starts_with(prefix)) break;
    for (; it != sorted_.end() && it->first == prefix; ++it) ids->push_back(it->second);
  }
}

void TokenBytesIndex::SortIds(std::vector<int32_t>* ids) const {
  std::vector<uint8_t> marked(bytes_.size(), 0);
  for (int32_t id : *ids) marked[id] = 1;
  ids->clear();
  for (int32_t id = 0; id < int32_t(marked.size()); ++id) {
    if (marked[id]) ids->push_back(id);
  }
}

ChoiceGuide::ChoiceGuide(std::vector<std::string> choices) : choices_(std::move(choices)) {
  std::sort(choices_.begin(), choices_.end());
  choices_.erase(std::unique(choices_.begin(), choices_.end()), choices_.end());
}

void ChoiceGuide::Allowed(std::string_view so_far, const TokenBytesIndex& vocab,
                          std::vector<int32_t>* allowed) const {
  allowed->clear();
  // The choices that begin with so_far are contiguous in sorted order, from so_far's place.
  auto it = std::lower_bound(choices_.begin(), choices_.end(), so_far,
                             [](const std::string& c, std::string_view s) { return c < s; });
  for (; it != choices_.end() && std::string_view(*it).starts_with(so_far); ++it) {
    vocab.PrefixesOf(std::string_view(*it).substr(so_far.size()), allowed);
  }
  std::sort(allowed->begin(), allowed->end());
  allowed->erase(std::unique(allowed->begin(), allowed->end()), allowed->end());
}

bool ChoiceGuide::Accepts(std::string_view so_far) const {
  return std::binary_search(choices_.begin(), choices_.end(), so_far,
                            [](std::string_view a, std::string_view b) { return a < b; });
}

bool ChoiceGuide::Complete(std::string_view so_far) const {
  if (!Accepts(so_far)) return false;
  for (const std::string& c : choices_) {
    if (c.size() > so_far.size() && std::string_view(c).starts_with(so_far)) return false;
  }
  return true;
}

}  // namespace thetaserve::scheduler
