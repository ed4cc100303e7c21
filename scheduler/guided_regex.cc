#include "scheduler/guided_regex.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "model/tokenizer_utf8.h"
#include "scheduler/regex_syntax.h"

namespace thetaserve::scheduler {
namespace {

// Bytes of the UTF-8 encodings of a run of code points of one length, each byte a range: the
// run is split until every byte position ranges independently (Rust regex-syntax's method).
using ByteRanges = std::vector<std::pair<uint8_t, uint8_t>>;  // one range per byte

void Utf8Sequences(uint32_t lo, uint32_t hi, std::vector<ByteRanges>* out) {
  static constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
  for (uint32_t end : kLengthEnds) {
    if (lo <= end && hi > end) {
      Utf8Sequences(lo, end, out);
      Utf8Sequences(end + 1, hi, out);
      return;
    }
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Sequences(lo, lo | m, out);
        Utf8Sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Sequences(lo, (hi & ~m) - 1, out);
        Utf8Sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  model::AppendUtf8(lo, &a);
  model::AppendUtf8(hi, &b);
  ByteRanges seq;
  for (size_t k = 0; k < a.size(); ++k) seq.push_back({uint8_t(a[k]), uint8_t(b[k])});
  out->push_back(std::move(seq));
}

// Thompson's automaton over bytes: each state has empty moves and at most one byte-range move.
struct Nfa {
  struct State {
    std::vector<int32_t> empty;
    uint8_t lo = 1, hi = 0;  // the byte move, none when lo > hi
    int32_t to = -1;
  };
  std::vector<State> states;
  int64_t empty_moves = 0;
  bool too_big = false;  // states and empty moves together over kMaxRegexNfaSize

  int32_t Add() {
    if (int64_t(states.size()) + empty_moves >= kMaxRegexNfaSize) too_big = true;
    if (too_big) return 0;
    states.emplace_back();
    return int32_t(states.size()) - 1;
  }
  void Empty(int32_t from, int32_t to) {
    if (int64_t(states.size()) + ++empty_moves > kMaxRegexNfaSize) too_big = true;
    if (!too_big) states[from].empty.push_back(to);
  }

  // Builds node `n` between `from` and `to`.
  void Build(const std::vector<RegexNode>& nodes, int n, int32_t from, int32_t to) {
    if (too_big) return;
    const RegexNode& node = nodes[n];
    switch (node.kind) {
      case RegexNode::Kind::kEmpty: Empty(from, to); return;
      case RegexNode::Kind::kClass: {
        // Each UTF-8 sequence is a chain of byte moves; chains that end alike share their
        // ends (a sequence's last bytes are mostly continuation bytes), so that states that
        // behave alike are one state, and so are the deterministic states made of them.
        std::vector<ByteRanges> seqs;
        for (auto [lo, hi] : node.ranges) Utf8Sequences(lo, hi, &seqs);
        std::map<ByteRanges, int32_t> tails;  // the last bytes -> the state that reads them
        for (const auto& seq : seqs) {
          int32_t next = to;
          for (size_t k = seq.size(); k-- > 0;) {
            // A state with a byte move has only that one.
            int32_t mover;
            if (k == 0) {
              mover = Add();
            } else {
              auto [it, fresh] = tails.try_emplace({seq.begin() + k, seq.end()}, 0);
              if (fresh) it->second = Add();
              mover = it->second;
              if (!fresh) {
                next = mover;
                continue;
              }
            }
            if (too_big) return;
            states[mover].lo = seq[k].first;
            states[mover].hi = seq[k].second;
            states[mover].to = next;
            next = mover;
          }
          Empty(from, next);
        }
        return;
      }
      case RegexNode::Kind::kConcat: {
        int32_t at = from;
        for (size_t k = 0; k < node.kids.size(); ++k) {
          const int32_t next = k + 1 == node.kids.size() ? to : Add();
          Build(nodes, node.kids[k], at, next);
          at = next;
        }
        return;
      }
      case RegexNode::Kind::kAlt:
        for (int kid : node.kids) Build(nodes, kid, from, to);
        return;
      case RegexNode::Kind::kCall:  // ParseRegex reads none here (no calls)
        too_big = true;
        return;
      case RegexNode::Kind::kRepeat: {
        const int kid = node.kids[0];
        int32_t at = from;
        for (int k = 0; k < node.min; ++k) {
          const int32_t next = Add();
          Build(nodes, kid, at, next);
          at = next;
        }
        if (node.max < 0) {
          // A loop: at -> body -> at, and out.
          const int32_t loop = Add();
          Empty(at, loop);
          Build(nodes, kid, loop, loop);
          Empty(loop, to);
          return;
        }
        for (int k = node.min; k < node.max; ++k) {
          const int32_t next = Add();
          Empty(at, to);
          Build(nodes, kid, at, next);
          at = next;
        }
        Empty(at, to);
        return;
      }
    }
  }

  // The states reachable from `set` by empty moves that have a byte move or are `accept`,
  // sorted: a deterministic state. Each state and move looked at counts in *work.
  std::vector<int32_t> Closure(const std::vector<int32_t>& set, int32_t accept,
                               std::vector<uint32_t>& seen, uint32_t mark, int64_t* work) const {
    std::vector<int32_t> stack, out;
    for (int32_t s : set) {
      if (seen[s] != mark) {
        seen[s] = mark;
        stack.push_back(s);
      }
    }
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      *work += 1 + int64_t(states[s].empty.size());
      if (states[s].lo <= states[s].hi || s == accept) out.push_back(s);
      for (int32_t t : states[s].empty) {
        if (seen[t] != mark) {
          seen[t] = mark;
          stack.push_back(t);
        }
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

}  // namespace

absl::StatusOr<std::shared_ptr<const RegexGuide>> RegexGuide::Compile(std::string_view pattern,
                                                                     size_t max_bytes) {
  if (pattern.size() > max_bytes) {
    return RegexRefused(absl::StrFormat("the pattern has %d bytes; at most %d are allowed",
                                   pattern.size(), max_bytes));
  }
  if (!model::IsValidUtf8(pattern)) return RegexRefused("the pattern is not valid UTF-8");
  std::vector<RegexNode> nodes;
  auto root = ParseRegex(pattern, &nodes);
  if (!root.ok()) return root.status();

  Nfa nfa;
  const int32_t start = nfa.Add(), accept = nfa.Add();
  nfa.Build(nodes, *root, start, accept);
  if (nfa.too_big) {
    return RegexRefused(absl::StrFormat(
        "the pattern is too large: its automaton has more than %d states and moves (repeats "
        "count once per copy)", kMaxRegexNfaSize));
  }

  auto guide = std::shared_ptr<RegexGuide>(new RegexGuide());
  guide->pattern_ = std::string(pattern);
  // Bytes that every move treats alike share a class.
  bool boundary[257] = {};
  for (const Nfa::State& s : nfa.states) {
    if (s.lo <= s.hi) {
      boundary[s.lo] = true;
      boundary[s.hi + 1] = true;
    }
  }
  int classes = 0;
  for (int b = 0; b < 256; ++b) {
    if (b > 0 && boundary[b]) ++classes;
    guide->byte_class_[b] = uint8_t(classes);
  }
  guide->num_classes_ = classes + 1;
  const int nc = guide->num_classes_;

  // Subset construction, breadth first from the start. Each state set is kept once (a map
  // key; `sets` points at it). `work` counts the states and moves looked at, `kept` the sets'
  // sizes: a pattern that would cost more than their bounds is refused as soon as it does.
  std::map<std::vector<int32_t>, int32_t> ids;
  std::vector<const std::vector<int32_t>*> sets;
  std::vector<uint32_t> seen(nfa.states.size(), 0);
  uint32_t mark = 0;
  int64_t work = 0, kept = 0;
  auto too_complex = [] {
    return RegexRefused(absl::StrFormat(
        "the pattern is too complex: its deterministic automaton has more than %d states or "
        "takes more than %d steps to build", kMaxRegexDfaStates, kMaxRegexWork));
  };
  sets.push_back(&ids.try_emplace(nfa.Closure({start}, accept, seen, ++mark, &work), 0)
                      .first->first);
  std::vector<int32_t>& next = guide->next_;
  std::vector<std::vector<int32_t>> moved(nc);  // [class]: where the set's moves lead
  for (size_t d = 0; d < sets.size(); ++d) {
    next.resize((d + 1) * nc, kDead);
    for (auto& m : moved) m.clear();
    for (int32_t s : *sets[d]) {
      const Nfa::State& st = nfa.states[s];
      if (st.lo > st.hi) continue;
      // A byte range covers whole classes, consecutive ones.
      for (int c = guide->byte_class_[st.lo]; c <= guide->byte_class_[st.hi]; ++c) {
        moved[c].push_back(st.to);
      }
      work += 1 + guide->byte_class_[st.hi] - guide->byte_class_[st.lo];
    }
    for (int c = 0; c < nc; ++c) {
      if (moved[c].empty()) continue;
      std::vector<int32_t> closure = nfa.Closure(moved[c], accept, seen, ++mark, &work);
      if (work > kMaxRegexWork) return too_complex();
      const size_t size = closure.size();
      auto [it, fresh] = ids.try_emplace(std::move(closure), int32_t(sets.size()));
      if (fresh) {
        kept += int64_t(size);
        if (sets.size() >= size_t(kMaxRegexDfaStates) || kept > kMaxRegexWork / 4) {
          return too_complex();
        }
        sets.push_back(&it->first);
      }
      next[d * nc + c] = it->second;
    }
  }
  const int n = int(sets.size());
  guide->num_states_ = n;
  guide->accepting_.assign(n, false);
  for (int d = 0; d < n; ++d) {
    guide->accepting_[d] = std::binary_search(sets[d]->begin(), sets[d]->end(), accept);
  }
  // Live states reach a match; a move to any other is a dead end, cut.
  std::vector<std::vector<int32_t>> into(n);
  for (int d = 0; d < n; ++d) {
    for (int c = 0; c < nc; ++c) {
      if (next[d * nc + c] != kDead) into[next[d * nc + c]].push_back(d);
    }
  }
  std::vector<bool> live(guide->accepting_);
  std::vector<int32_t> stack;
  for (int d = 0; d < n; ++d) {
    if (live[d]) stack.push_back(d);
  }
  while (!stack.empty()) {
    const int32_t d = stack.back();
    stack.pop_back();
    for (int32_t from : into[d]) {
      if (!live[from]) {
        live[from] = true;
        stack.push_back(from);
      }
    }
  }
  if (!live[kStart]) return RegexRefused("the pattern matches nothing");
  guide->leads_on_.assign(n, false);
  for (int d = 0; d < n; ++d) {
    for (int c = 0; c < nc; ++c) {
      int32_t& to = next[d * nc + c];
      if (to != kDead && !live[to]) to = kDead;
      if (to != kDead) guide->leads_on_[d] = true;
    }
  }
  return std::shared_ptr<const RegexGuide>(std::move(guide));
}

int32_t RegexGuide::Step(int32_t state, std::string_view bytes) const {
  for (char b : bytes) {
    if (state == kDead) break;
    state = Next(state, uint8_t(b));
  }
  return state;
}

void RegexGuide::Allowed(std::string_view so_far, const TokenBytesIndex& vocab,
                         std::vector<int32_t>* allowed) const {
  allowed->clear();
  const int32_t state = Step(kStart, so_far);
  if (state == kDead || !leads_on_[state]) return;
  auto step = [this](int32_t s, uint8_t b, int32_t* next) {
    *next = Next(s, b);
    return *next != kDead;
  };
  cache_.Allowed(vocab, state, [&](std::vector<int32_t>* ids) {
    ids->clear();
    vocab.Walk(state, step, ids);
    vocab.SortIds(ids);
  }, allowed);
}

bool RegexGuide::Emits(uint8_t byte) const {
  // Every state left is on the way to a match, so a move on `byte` from any is in one.
  for (int32_t state = 0; state < num_states_; ++state) {
    if (Next(state, byte) != kDead) return true;
  }
  return false;
}

bool RegexGuide::Accepts(std::string_view so_far) const {
  const int32_t state = Step(kStart, so_far);
  return state != kDead && accepting_[state];
}

bool RegexGuide::Complete(std::string_view so_far) const {
  const int32_t state = Step(kStart, so_far);
  return state != kDead && accepting_[state] && !leads_on_[state];
}

}  // namespace thetaserve::scheduler
