#include "scheduler/regex_syntax.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/tokenizer_utf8.h"
#include "scheduler/guided_regex.h"

namespace thetaserve::scheduler {
namespace {

// Sorted, overlaps and neighbours merged, surrogates (never in UTF-8 text) left out.
CodePointRanges Normalized(CodePointRanges r) {
  CodePointRanges cut;
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
  CodePointRanges out;
  for (auto [lo, hi] : cut) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.push_back({lo, hi});
    }
  }
  return out;
}

CodePointRanges Complement(const CodePointRanges& r) {
  CodePointRanges out;
  uint32_t next = 0;
  for (auto [lo, hi] : Normalized(r)) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return Normalized(out);
}

// The ASCII meanings of \d \w \s (re.ASCII's).
CodePointRanges ClassEscape(char c) {
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

class Parser {
 public:
  Parser(std::string_view p, bool calls) : p_(p), calls_(calls) {}

  absl::StatusOr<int> Parse(std::vector<RegexNode>* nodes) {
    nodes_ = nodes;
    auto root = Alternation();
    if (!root.ok()) return root.status();
    if (pos_ < p_.size()) {
      // Only an unmatched ')' stops Alternation early.
      return RegexRefused(absl::StrFormat("unbalanced parenthesis at position %d", pos_));
    }
    return *root;
  }

 private:
  bool Peek(char c) const { return pos_ < p_.size() && p_[pos_] == c; }
  int Add(RegexNode n) {
    nodes_->push_back(std::move(n));
    return int(nodes_->size()) - 1;
  }
  int AddClass(CodePointRanges r) {
    RegexNode n;
    n.kind = RegexNode::Kind::kClass;
    n.ranges = Normalized(std::move(r));
    return Add(std::move(n));
  }

  absl::StatusOr<int> Alternation() {
    RegexNode alt;
    alt.kind = RegexNode::Kind::kAlt;
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
    RegexNode seq;
    seq.kind = RegexNode::Kind::kConcat;
    while (pos_ < p_.size() && !Peek('|') && !Peek(')')) {
      // Anchors match nothing, and a whole match begins and ends where they say: taken where
      // nothing can come before (^, \A) or after ($, \Z), refused elsewhere.
      const size_t at = pos_;
      const std::string_view rest = p_.substr(pos_);
      if (rest.starts_with("^") || rest.starts_with("\\A")) {
        pos_ += rest[0] == '^' ? 1 : 2;
        if (!at_start_) {
          return RegexRefused(absl::StrFormat("%s at position %d is not at the start",
                                         p_.substr(at, pos_ - at), at));
        }
        continue;
      }
      if (rest.starts_with("$") || rest.starts_with("\\Z")) {
        pos_ += rest[0] == '$' ? 1 : 2;
        if (pos_ != p_.size() && !(nesting_ == 0 && Peek('|'))) {
          return RegexRefused(absl::StrFormat(
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
    if (seq.kids.empty()) return Add(RegexNode{});
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
          return RegexRefused(absl::StrFormat("a repeat count at position %d is over %d", at,
                                         kMaxRegexRepeat));
        }
        if (max >= 0 && max < min) {
          return RegexRefused(absl::StrFormat("{%d,%d} at position %d: the minimum is over the maximum",
                                         min, max, at));
        }
      } else {
        return atom;
      }
      if (repeated) return RegexRefused(absl::StrFormat("multiple repeat at position %d", at));
      repeated = true;
      if (Peek('?')) {
        ++pos_;  // lazy: the same set of whole matches
      } else if (Peek('+')) {
        return RegexRefused(absl::StrFormat("possessive repeat at position %d is not supported",
                                       pos_));
      }
      RegexNode r;
      r.kind = RegexNode::Kind::kRepeat;
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
      return RegexRefused(absl::StrFormat("incomplete escape at position %d", pos_ - 2));
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = p_[pos_ + i];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) return RegexRefused(absl::StrFormat("incomplete escape at position %d", pos_ - 2));
      v = v * 16 + uint32_t(d);
    }
    pos_ += digits;
    if (v > kMaxCodePoint) return RegexRefused(absl::StrFormat("bad escape at position %d", pos_));
    return v;
  }

  // After a backslash: the character it stands for, or (*ranges set) a class escape.
  absl::StatusOr<uint32_t> Escape(bool in_class, CodePointRanges* ranges) {
    if (pos_ >= p_.size()) return RegexRefused("the pattern ends with a backslash");
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
        return RegexRefused(absl::StrFormat("octal escape at position %d is over \\377", at));
      }
      return v;
    };
    auto is_octal = [&](size_t i) { return i < p_.size() && p_[i] >= '0' && p_[i] <= '7'; };
    if (c == '0' || (in_class && is_octal(pos_))) return octal(3);
    if (!in_class && is_octal(pos_) && is_octal(pos_ + 1) && is_octal(pos_ + 2)) return octal(3);
    if (c >= '1' && c <= '9' && !in_class) {
      return RegexRefused(absl::StrFormat("back-references (\\%c at position %d) are not supported",
                                     c, at));
    }
    return RegexRefused(absl::StrFormat("\\%c at position %d is not supported", c, at));
  }

  absl::StatusOr<int> Class() {
    const size_t open = pos_ - 1;
    const bool negated = Peek('^');
    if (negated) ++pos_;
    CodePointRanges ranges;
    bool first = true;
    while (true) {
      if (pos_ >= p_.size()) {
        return RegexRefused(absl::StrFormat("unterminated character set at position %d", open));
      }
      if (Peek(']') && !first) {
        ++pos_;
        break;
      }
      first = false;
      // One item: a character, a class escape, or a range lo-hi.
      auto item = [&](CodePointRanges* set) -> absl::StatusOr<uint32_t> {
        if (Peek('\\')) {
          ++pos_;
          return Escape(/*in_class=*/true, set);
        }
        return TakeChar();
      };
      CodePointRanges set;
      auto lo = item(&set);
      if (!lo.ok()) return lo.status();
      if (!set.empty()) {
        if (Peek('-') && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
          return RegexRefused(absl::StrFormat("bad character range at position %d", pos_ - 2));
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
          return RegexRefused(absl::StrFormat("bad character range at position %d", dash - 1));
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
        return RegexRefused(absl::StrFormat("more than %d groups nested at position %d",
                                       kMaxRegexNesting, at));
      }
      ++pos_;
      if (Peek('?')) {
        if (calls_ && p_.substr(pos_).starts_with("?&")) {
          pos_ += 2;
          const int n = Number();
          if (n < 0 || !Peek(')')) {
            return RegexRefused(absl::StrFormat("expected (?&N) at position %d", at));
          }
          ++pos_;
          --nesting_;
          RegexNode call;
          call.kind = RegexNode::Kind::kCall;
          call.min = n;
          return Add(std::move(call));
        }
        if (p_.substr(pos_).starts_with("?:")) {
          pos_ += 2;
        } else if (p_.substr(pos_).starts_with("?P<")) {
          const size_t close = p_.find('>', pos_);
          if (close == std::string_view::npos) {
            return RegexRefused(absl::StrFormat("unterminated group name at position %d", at));
          }
          pos_ = close + 1;
        } else {
          return RegexRefused(absl::StrFormat(
              "'(?' at position %d: look-arounds, flags and other extensions are not "
              "supported ((?:…) and (?P<name>…) are)", at));
        }
      }
      auto inner = Alternation();
      --nesting_;
      if (!inner.ok()) return inner.status();
      if (!Peek(')')) {
        return RegexRefused(absl::StrFormat("missing ), unterminated subpattern at position %d", at));
      }
      ++pos_;
      return *inner;
    }
    if (c == '*' || c == '+' || c == '?') {
      return RegexRefused(absl::StrFormat("nothing to repeat at position %d", at));
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
      CodePointRanges set;
      auto cp = Escape(/*in_class=*/false, &set);
      if (!cp.ok()) return cp.status();
      return AddClass(set.empty() ? CodePointRanges{{*cp, *cp}} : std::move(set));
    }
    const uint32_t cp = TakeChar();
    return AddClass({{cp, cp}});
  }

  std::string_view p_;
  bool calls_ = false;  // (?&N) is a call
  size_t pos_ = 0;
  int nesting_ = 0;  // groups open
  bool at_start_ = true;  // nothing can have come before the next atom
  std::vector<RegexNode>* nodes_ = nullptr;
};

}  // namespace

absl::StatusOr<int> ParseRegex(std::string_view pattern, std::vector<RegexNode>* nodes,
                               bool calls) {
  return Parser(pattern, calls).Parse(nodes);
}

absl::Status RegexRefused(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("guided_regex: ", model::AsAbsl(what)));
}

}  // namespace thetaserve::scheduler
