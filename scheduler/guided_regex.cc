#include "scheduler/guided_regex.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/tokenizer_utf8.h"

namespace thetaserve::scheduler {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code points, inclusive

absl::Status Refused(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("guided_regex: ", model::AsAbsl(what)));
}

// Sorted, overlaps and neighbours merged, surrogates (never in UTF-8 text) left out.
Ranges Normalized(Ranges r) {
  Ranges cut;
  for (auto [lo, hi] : r) {
    if (lo <= 0xD7FF || hi >= 0xE000) {
      if (lo < 0xD800 && hi > 0xDFFF) {
        cut.push_back({lo, 0xD7FF});
        cut.push_back({0xE000, hi});
      } else if (lo >= 0xD800 && lo <= 0xDFFF) {
        if (hi >= 0xE000) cut.push_back({0xE000, hi});
      } else if (hi >= 0xD800 && hi <= 0xDFFF) {
        cut.push_back({lo, 0xD7FF});
      } else {
        cut.push_back({lo, hi});
      }
    }
  }
  std::sort(cut.begin(), cut.end());
  Ranges out;
  for (auto [lo, hi] : cut) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.push_back({lo, hi});
    }
  }
  return out;
}

Ranges Complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : Normalized(r)) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return Normalized(out);
}

// The ASCII meanings of \d \w \s (re.ASCII's).
Ranges ClassEscape(char c) {
  switch (c) {
    case 'd': return {{'0', '9'}};
    case 'w': return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    case 's': return {{'\t', '\r'}, {' ', ' '}};
    case 'D': return Complement(ClassEscape('d'));
    case 'W': return Complement(ClassEscape('w'));
    case 'S': return Complement(ClassEscape('s'));
    default: return {};
  }
}

// The pattern as a tree.
struct Node {
  enum class Kind { kEmpty, kClass, kConcat, kAlt, kRepeat } kind = Kind::kEmpty;
  Ranges ranges;          // kClass
  std::vector<int> kids;  // kConcat, kAlt; kRepeat: one
  int min = 0, max = 0;   // kRepeat; max -1: unbounded
};

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  absl::StatusOr<int> Parse(std::vector<Node>* nodes) {
    nodes_ = nodes;
    auto root = Alternation();
    if (!root.ok()) return root.status();
    if (pos_ < p_.size()) {
      // Only an unmatched ')' stops Alternation early.
      return Refused(absl::StrFormat("unbalanced parenthesis at position %d", pos_));
    }
    return *root;
  }

 private:
  bool Peek(char c) const { return pos_ < p_.size() && p_[pos_] == c; }
  int Add(Node n) {
    nodes_->push_back(std::move(n));
    return int(nodes_->size()) - 1;
  }
  int AddClass(Ranges r) {
    Node n;
    n.kind = Node::Kind::kClass;
    n.ranges = Normalized(std::move(r));
    return Add(std::move(n));
  }

  absl::StatusOr<int> Alternation() {
    Node alt;
    alt.kind = Node::Kind::kAlt;
    const bool at_start = at_start_;
    while (true) {
      at_start_ = at_start;  // each alternative begins where the group does
      auto seq = Sequence();
      if (!seq.ok()) return seq.status();
      alt.kids.push_back(*seq);
      if (!Peek('|')) break;
      ++pos_;
    }
    return alt.kids.size() == 1 ? alt.kids[0] : Add(std::move(alt));
  }

  absl::StatusOr<int> Sequence() {
    Node seq;
    seq.kind = Node::Kind::kConcat;
    while (pos_ < p_.size() && !Peek('|') && !Peek(')')) {
      // Anchors match nothing, and a whole match begins and ends where they say: taken where
      // nothing can come before (^, \A) or after ($, \Z), refused elsewhere.
      const size_t at = pos_;
      const std::string_view rest = p_.substr(pos_);
      if (rest.starts_with("^") || rest.starts_with("\\A")) {
        pos_ += rest[0] == '^' ? 1 : 2;
        if (!at_start_) {
          return Refused(absl::StrFormat("%s at position %d is not at the start",
                                         p_.substr(at, pos_ - at), at));
        }
        continue;
      }
      if (rest.starts_with("$") || rest.starts_with("\\Z")) {
        pos_ += rest[0] == '$' ? 1 : 2;
        if (pos_ != p_.size() && !(nesting_ == 0 && Peek('|'))) {
          return Refused(absl::StrFormat(
              "%s at position %d is not at the end of the pattern or of one of its "
              "alternatives", p_.substr(at, pos_ - at), at));
        }
        break;
      }
      auto atom = Atom();
      at_start_ = false;
      if (!atom.ok()) return atom.status();
      auto repeated = Quantified(*atom);
      if (!repeated.ok()) return repeated.status();
      seq.kids.push_back(*repeated);
    }
    if (seq.kids.empty()) return Add(Node{});
    return seq.kids.size() == 1 ? seq.kids[0] : Add(std::move(seq));
  }

  // A number of {m,n}, or -1 where there is none.
  int Number() {
    int v = -1;
    while (pos_ < p_.size() && p_[pos_] >= '0' && p_[pos_] <= '9') {
      v = std::min(kMaxRegexRepeat + 1, (v < 0 ? 0 : v * 10) + (p_[pos_] - '0'));
      ++pos_;
    }
    return v;
  }

  absl::StatusOr<int> Quantified(int atom) {
    bool repeated = false;
    while (pos_ < p_.size()) {
      const size_t at = pos_;
      int min = 0, max = -1;
      const char c = p_[pos_];
      if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        min = c == '+' ? 1 : 0;
        max = c == '?' ? 1 : -1;
      } else if (c == '{') {
        // Python reads a '{' that does not open {m}, {m,}, {,n} or {m,n} as itself.
        ++pos_;
        const int m = Number();
        int n = m;
        if (Peek(',')) {
          ++pos_;
          n = Number();
        }
        if (!Peek('}') || (m < 0 && n < 0 && p_[pos_ - 1] != ',')) {
          pos_ = at;
          return atom;
        }
        ++pos_;
        min = std::max(m, 0);
        max = n;
        if (min > kMaxRegexRepeat || max > kMaxRegexRepeat) {
          return Refused(absl::StrFormat("a repeat count at position %d is over %d", at,
                                         kMaxRegexRepeat));
        }
        if (max >= 0 && max < min) {
          return Refused(absl::StrFormat("{%d,%d} at position %d: the minimum is over the maximum",
                                         min, max, at));
        }
      } else {
        return atom;
      }
      if (repeated) return Refused(absl::StrFormat("multiple repeat at position %d", at));
      repeated = true;
      if (Peek('?')) {
        ++pos_;  // lazy: the same set of whole matches
      } else if (Peek('+')) {
        return Refused(absl::StrFormat("possessive repeat at position %d is not supported",
                                       pos_));
      }
      Node r;
      r.kind = Node::Kind::kRepeat;
      r.kids = {atom};
      r.min = min;
      r.max = max;
      atom = Add(std::move(r));
    }
    return atom;
  }

  // One code point of the pattern.
  uint32_t TakeChar() {
    int len = 1;
    const uint32_t cp = model::DecodeUtf8At(p_, pos_, &len);
    pos_ += len;
    return cp;
  }

  absl::StatusOr<uint32_t> Hex(int digits) {
    if (pos_ + digits > p_.size()) {
      return Refused(absl::StrFormat("incomplete escape at position %d", pos_ - 2));
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = p_[pos_ + i];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) return Refused(absl::StrFormat("incomplete escape at position %d", pos_ - 2));
      v = v * 16 + uint32_t(d);
    }
    pos_ += digits;
    if (v > kMaxCodePoint) return Refused(absl::StrFormat("bad escape at position %d", pos_));
    return v;
  }

  // After a backslash: the character it stands for, or (*ranges set) a class escape.
  absl::StatusOr<uint32_t> Escape(bool in_class, Ranges* ranges) {
    if (pos_ >= p_.size()) return Refused("the pattern ends with a backslash");
    const size_t at = pos_ - 1;
    const char c = p_[pos_];
    if (std::string_view("dwsDWS").find(c) != std::string_view::npos) {
      ++pos_;
      *ranges = ClassEscape(c);
      return 0;
    }
    switch (c) {
      case 'n': ++pos_; return '\n';
      case 't': ++pos_; return '\t';
      case 'r': ++pos_; return '\r';
      case 'f': ++pos_; return '\f';
      case 'v': ++pos_; return '\v';
      case 'a': ++pos_; return '\a';
      case 'x': ++pos_; return Hex(2);
      case 'u': ++pos_; return Hex(4);
      case 'U': ++pos_; return Hex(8);
      case 'b':
        if (in_class) {
          ++pos_;
          return '\b';
        }
        break;
      default: break;
    }
    const bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (!alnum) return TakeChar();
    // Python's octal escapes: \0 and up to two more octal digits, or three octal digits (in a
    // class, one to three); up to \377.
    auto octal = [&](size_t digits) -> absl::StatusOr<uint32_t> {
      uint32_t v = 0;
      for (size_t k = 0; k < digits && pos_ < p_.size() && p_[pos_] >= '0' && p_[pos_] <= '7';
           ++k) {
        v = v * 8 + uint32_t(p_[pos_++] - '0');
      }
      if (v > 0377) {
        return Refused(absl::StrFormat("octal escape at position %d is over \\377", at));
      }
      return v;
    };
    auto is_octal = [&](size_t i) { return i < p_.size() && p_[i] >= '0' && p_[i] <= '7'; };
    if (c == '0' || (in_class && is_octal(pos_))) return octal(3);
    if (!in_class && is_octal(pos_) && is_octal(pos_ + 1) && is_octal(pos_ + 2)) return octal(3);
    if (c >= '1' && c <= '9' && !in_class) {
      return Refused(absl::StrFormat("back-references (\\%c at position %d) are not supported",
                                     c, at));
    }
    return Refused(absl::StrFormat("\\%c at position %d is not supported", c, at));
  }

  absl::StatusOr<int> Class() {
    const size_t open = pos_ - 1;
    const bool negated = Peek('^');
    if (negated) ++pos_;
    Ranges ranges;
    bool first = true;
    while (true) {
      if (pos_ >= p_.size()) {
        return Refused(absl::StrFormat("unterminated character set at position %d", open));
      }
      if (Peek(']') && !first) {
        ++pos_;
        break;
      }
      first = false;
      // One item: a character, a class escape, or a range lo-hi.
      auto item = [&](Ranges* set) -> absl::StatusOr<uint32_t> {
        if (Peek('\\')) {
          ++pos_;
          return Escape(/*in_class=*/true, set);
        }
        return TakeChar();
      };
      Ranges set;
      auto lo = item(&set);
      if (!lo.ok()) return lo.status();
      if (!set.empty()) {
        if (Peek('-') && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
          return Refused(absl::StrFormat("bad character range at position %d", pos_ - 2));
        }
        ranges.insert(ranges.end(), set.begin(), set.end());
        continue;
      }
      if (Peek('-') && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        const size_t dash = pos_;
        ++pos_;
        auto hi = item(&set);
        if (!hi.ok()) return hi.status();
        if (!set.empty() || *hi < *lo) {
          return Refused(absl::StrFormat("bad character range at position %d", dash - 1));
        }
        ranges.push_back({*lo, *hi});
      } else {
        ranges.push_back({*lo, *lo});
      }
    }
    return AddClass(negated ? Complement(ranges) : std::move(ranges));
  }

  absl::StatusOr<int> Atom() {
    const size_t at = pos_;
    const char c = p_[pos_];
    if (c == '(') {
      if (++nesting_ > kMaxRegexNesting) {
        return Refused(absl::StrFormat("more than %d groups nested at position %d",
                                       kMaxRegexNesting, at));
      }
      ++pos_;
      if (Peek('?')) {
        if (p_.substr(pos_).starts_with("?:")) {
          pos_ += 2;
        } else if (p_.substr(pos_).starts_with("?P<")) {
          const size_t close = p_.find('>', pos_);
          if (close == std::string_view::npos) {
            return Refused(absl::StrFormat("unterminated group name at position %d", at));
          }
          pos_ = close + 1;
        } else {
          return Refused(absl::StrFormat(
              "'(?' at position %d: look-arounds, flags and other extensions are not "
              "supported ((?:…) and (?P<name>…) are)", at));
        }
      }
      auto inner = Alternation();
      --nesting_;
      if (!inner.ok()) return inner.status();
      if (!Peek(')')) {
        return Refused(absl::StrFormat("missing ), unterminated subpattern at position %d", at));
      }
      ++pos_;
      return *inner;
    }
    if (c == '*' || c == '+' || c == '?') {
      return Refused(absl::StrFormat("nothing to repeat at position %d", at));
    }
    if (c == '[') {
      ++pos_;
      return Class();
    }
    if (c == '.') {
      ++pos_;
      return AddClass(Complement({{'\n', '\n'}}));
    }
    if (c == '\\') {
      ++pos_;
      Ranges set;
      auto cp = Escape(/*in_class=*/false, &set);
      if (!cp.ok()) return cp.status();
      return AddClass(set.empty() ? Ranges{{*cp, *cp}} : std::move(set));
    }
    const uint32_t cp = TakeChar();
    return AddClass({{cp, cp}});
  }

  std::string_view p_;
  size_t pos_ = 0;
  int nesting_ = 0;  // groups open
  bool at_start_ = true;  // nothing can have come before the next atom
  std::vector<Node>* nodes_ = nullptr;
};

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
  void Build(const std::vector<Node>& nodes, int n, int32_t from, int32_t to) {
    if (too_big) return;
    const Node& node = nodes[n];
    switch (node.kind) {
      case Node::Kind::kEmpty: Empty(from, to); return;
      case Node::Kind::kClass: {
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
      case Node::Kind::kConcat: {
        int32_t at = from;
        for (size_t k = 0; k < node.kids.size(); ++k) {
          const int32_t next = k + 1 == node.kids.size() ? to : Add();
          Build(nodes, node.kids[k], at, next);
          at = next;
        }
        return;
      }
      case Node::Kind::kAlt:
        for (int kid : node.kids) Build(nodes, kid, from, to);
        return;
      case Node::Kind::kRepeat: {
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
  // sorted: a deterministic state.
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
    return Refused(absl::StrFormat("the pattern has %d bytes; at most %d are allowed",
                                   pattern.size(), max_bytes));
  }
  if (!model::IsValidUtf8(pattern)) return Refused("the pattern is not valid UTF-8");
  std::vector<Node> nodes;
  auto root = Parser(pattern).Parse(&nodes);
  if (!root.ok()) return root.status();

  Nfa nfa;
  const int32_t start = nfa.Add(), accept = nfa.Add();
  nfa.Build(nodes, *root, start, accept);
  if (nfa.too_big) {
    return Refused(absl::StrFormat(
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
    return Refused(absl::StrFormat(
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
  if (!live[kStart]) return Refused("the pattern matches nothing");
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
