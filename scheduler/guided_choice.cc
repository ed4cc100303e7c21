#include "scheduler/guided_choice.h"

#include <algorithm>

namespace thetaserve::scheduler {

ChoiceGuide::ChoiceGuide(std::vector<std::string> choices) : choices_(std::move(choices)) {
  std::sort(choices_.begin(), choices_.end());
  choices_.erase(std::unique(choices_.begin(), choices_.end()), choices_.end());
}

void ChoiceGuide::Allowed(std::string_view so_far, const std::vector<std::string>& vocab_bytes,
                          std::vector<int32_t>* allowed) const {
  allowed->clear();
  // What is left of each choice that begins with so_far (sorted, as the choices are). A
  // token's bytes b may come next when some rest begins with b: then the first rest >= b does
  // (every string beginning with b sorts after b and before any other string >= b).
  std::vector<std::string_view> rests;
  for (const std::string& c : choices_) {
    if (c.size() > so_far.size() && std::string_view(c).starts_with(so_far)) {
      rests.push_back(std::string_view(c).substr(so_far.size()));
    }
  }
  if (rests.empty()) return;
  for (size_t id = 0; id < vocab_bytes.size(); ++id) {
    const std::string& b = vocab_bytes[id];
    if (b.empty()) continue;
    auto it = std::lower_bound(rests.begin(), rests.end(), std::string_view(b));
    if (it != rests.end() && it->starts_with(b)) allowed->push_back(int32_t(id));
  }
}

bool ChoiceGuide::IsChoice(std::string_view so_far) const {
  return std::binary_search(choices_.begin(), choices_.end(), so_far,
                            [](std::string_view a, std::string_view b) { return a < b; });
}

bool ChoiceGuide::Complete(std::string_view so_far) const {
  if (!IsChoice(so_far)) return false;
  for (const std::string& c : choices_) {
    if (c.size() > so_far.size() && std::string_view(c).starts_with(so_far)) return false;
  }
  return true;
}

}  // namespace thetaserve::scheduler
