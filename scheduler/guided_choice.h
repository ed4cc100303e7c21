// vLLM's guided_choice: the output is exactly one of a few strings. It is matched on the
// tokens' bytes: a token may come next when the output's bytes followed by its own begin one
// of the choices, and the output is done once it is a choice that no other choice extends.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace thetaserve::scheduler {

class ChoiceGuide {
 public:
  // choices: non-empty.
  explicit ChoiceGuide(std::vector<std::string> choices);

  // The ids whose bytes (vocab_bytes[id]; empty for special tokens, which never match) keep
  // `so_far` on the way to a choice, ascending, into *allowed. O(vocabulary × log choices).
  void Allowed(std::string_view so_far, const std::vector<std::string>& vocab_bytes,
               std::vector<int32_t>* allowed) const;
  // `so_far` is one of the choices.
  bool IsChoice(std::string_view so_far) const;
  // `so_far` is a choice that no other choice extends: nothing more may come.
  bool Complete(std::string_view so_far) const;
  const std::vector<std::string>& choices() const { return choices_; }  // sorted, unique

 private:
  std::vector<std::string> choices_;  // sorted, unique
};

}  // namespace thetaserve::scheduler
