// vLLM's guided_choice: the output is exactly one of a few strings. It is matched on the
// tokens' bytes: a token may come next when the output's bytes followed by its own begin one
// of the choices, and the output is done once it is a choice that no other choice extends.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace thetaserve::scheduler {

// The vocabulary by its tokens' bytes: which tokens begin a string.
class TokenBytesIndex {
 public:
  // bytes[id]: each token's bytes; empty ones (special tokens) never match.
  explicit TokenBytesIndex(std::vector<std::string> bytes);
  // sorted_ views bytes_'s strings: a move keeps them where they are, a copy would not.
  TokenBytesIndex(TokenBytesIndex&&) = default;
  TokenBytesIndex& operator=(TokenBytesIndex&&) = default;
  TokenBytesIndex(const TokenBytesIndex&) = delete;
  TokenBytesIndex& operator=(const TokenBytesIndex&) = delete;
  // Appends to *ids every token whose bytes are a prefix of `s`: one binary search per prefix
  // length, up to the longest token's, stopping where no token begins with the prefix.
  void PrefixesOf(std::string_view s, std::vector<int32_t>* ids) const;
  size_t size() const { return bytes_.size(); }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }

 private:
  std::vector<std::string> bytes_;                            // [id]
  std::vector<std::pair<std::string_view, int32_t>> sorted_;  // (bytes, id), non-empty, sorted
  size_t max_len_ = 0;
};

class ChoiceGuide {
 public:
  // choices: non-empty.
  explicit ChoiceGuide(std::vector<std::string> choices);

  // The ids whose bytes keep `so_far` on the way to a choice, ascending, into *allowed: the
  // tokens that are a prefix of what is left of a choice still open. O(open choices × longest
  // token × log vocabulary).
  void Allowed(std::string_view so_far, const TokenBytesIndex& vocab,
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
