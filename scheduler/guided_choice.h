// vLLM's guided_choice: the output is exactly one of a few strings. It is matched on the
// tokens' bytes: a token may come next when the output's bytes followed by its own begin one
// of the choices, and the output is done once it is a choice that no other choice extends.
#pragma once

#include <algorithm>
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
  // Appends to *ids (in byte order, not by id) every token whose bytes an automaton takes from
  // `start` to a live state: step(state, byte, &next) says whether the byte leads on, and
  // where. Tokens that share a prefix share its steps, and a prefix that leads nowhere skips
  // every token under it at once.
  template <typename State, typename Step>
  void Walk(const State& start, const Step& step, std::vector<int32_t>* ids) const {
    Walk(start, step, ids, [](State*) {});
  }
  // The same; restart(&state) is called each time the walk goes back to `start` (a token that
  // shares no byte with the one before), where state is a copy of start the caller may replace
  // with an equal one (a guide whose states hold ids into memory of its own may free that
  // memory there and make the start's again).
  template <typename State, typename Step, typename Restart>
  void Walk(const State& start, const Step& step, std::vector<int32_t>* ids,
            const Restart& restart) const;
  // The token ids ascending: `ids` (any order, no repeats) marked, then read in order, cheaper
  // than a sort when a loose guide lets most of the vocabulary through.
  void SortIds(std::vector<int32_t>* ids) const;
  size_t size() const { return bytes_.size(); }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }

 private:
  std::vector<std::string> bytes_;                            // [id]
  std::vector<std::pair<std::string_view, int32_t>> sorted_;  // (bytes, id), non-empty, sorted
  std::vector<uint32_t> common_;  // [i]: bytes sorted_[i] shares with sorted_[i - 1] (0 for 0)
  size_t max_len_ = 0;
};

// What a guided output may be (vLLM's structured outputs), as a function of its bytes so far.
// Immutable once built: one is shared by the completions of a call.
class Guide {
 public:
  virtual ~Guide() = default;
  // The ids whose bytes keep `so_far` on the way to a whole answer, ascending, into *allowed.
  virtual void Allowed(std::string_view so_far, const TokenBytesIndex& vocab,
                       std::vector<int32_t>* allowed) const = 0;
  // `so_far` is a whole answer: the output may end here.
  virtual bool Accepts(std::string_view so_far) const = 0;
  // `so_far` is a whole answer that nothing may extend: the output ends here.
  virtual bool Complete(std::string_view so_far) const = 0;
};

class ChoiceGuide : public Guide {
 public:
  // choices: non-empty.
  explicit ChoiceGuide(std::vector<std::string> choices);

  // The ids whose bytes keep `so_far` on the way to a choice, ascending, into *allowed: the
  // tokens that are a prefix of what is left of a choice still open. O(open choices × longest
  // token × log vocabulary).
  void Allowed(std::string_view so_far, const TokenBytesIndex& vocab,
               std::vector<int32_t>* allowed) const override;
  // `so_far` is one of the choices.
  bool Accepts(std::string_view so_far) const override;
  // `so_far` is a choice that no other choice extends: nothing more may come.
  bool Complete(std::string_view so_far) const override;
  const std::vector<std::string>& choices() const { return choices_; }  // sorted, unique

 private:
  std::vector<std::string> choices_;  // sorted, unique
};

template <typename State, typename Step, typename Restart>
void TokenBytesIndex::Walk(const State& start, const Step& step, std::vector<int32_t>* ids,
                           const Restart& restart) const {
  std::vector<State> states(max_len_ + 1);  // [d]: the state after the token's first d bytes
  states[0] = start;
  // states[0 … valid] hold for the first bytes of the token walked last, and so for as many of
  // the next one's as it shares with that token: the least common_ between them (sorted order),
  // which is common_ of the next one itself when no token was skipped, and when some were
  // (all sharing more than `valid` bytes with the last) too.
  size_t valid = 0;
  size_t i = 0;
  while (i < sorted_.size()) {
    const std::string_view t = sorted_[i].first;
    size_t d = std::min<size_t>(valid, common_[i]);
    if (d == 0) restart(&states[0]);
    bool live = true;
    for (; d < t.size(); ++d) {
      if (!step(states[d], static_cast<uint8_t>(t[d]), &states[d + 1])) {
        live = false;
        break;
      }
    }
    if (live) {
      valid = t.size();
      ids->push_back(sorted_[i].second);
      ++i;
      continue;
    }
    // t's first d + 1 bytes lead nowhere: neither does any token that begins with them (they
    // follow t in byte order, each sharing more than d bytes with the one before).
    valid = d;
    for (++i; i < sorted_.size() && common_[i] > d; ++i) {
    }
  }
}

}  // namespace thetaserve::scheduler
