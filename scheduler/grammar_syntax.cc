#include "scheduler/grammar_syntax.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "model/tokenizer_utf8.h"

namespace thetaserve::scheduler {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
using Sequence = std::vector<GrammarElement>;

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '-' || c == '_';
}

// Sorts and merges ranges; with `negated`, the code points outside them instead.
std::vector<std::pair<uint32_t, uint32_t>> Normalize(
    std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  if (!negated) return merged;
  std::vector<std::pair<uint32_t, uint32_t>> outside;
  uint32_t next = 0;
  for (const auto& r : merged) {
    if (r.first > next) outside.emplace_back(next, r.first - 1);
    next = r.second + 1;
  }
  if (next <= kMaxCodePoint) outside.emplace_back(next, kMaxCodePoint);
  return outside;
}

class GbnfParser {
 public:
  GbnfParser(std::string_view text, size_t max_bytes) : text_(text), max_bytes_(max_bytes) {}

  absl::StatusOr<Grammar> Parse();

 private:
  absl::Status Error(std::string_view what) const { return ErrorAt(pos_, what); }
  absl::Status ErrorAt(size_t at, std::string_view what) const;
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }
  // Spaces, tabs and # comments; line ends too where `newlines`.
  void SkipSpace(bool newlines);
  std::string_view ParseName();
  // A rule's definition (`name ::=`) begins here.
  bool RuleBegins() const;
  int32_t RuleId(std::string_view name);
  int32_t NewRule(int32_t inside);
  absl::StatusOr<std::vector<Sequence>> ParseAlternatives(int32_t rule, bool nested, int depth);
  absl::StatusOr<Sequence> ParseSequence(int32_t rule, bool nested, int depth);
  // One character of a literal or class, escapes read and UTF-8 decoded.
  absl::StatusOr<uint32_t> ParseChar();
  absl::StatusOr<uint32_t> ParseHex(int digits);
  absl::StatusOr<int> ParseCount();
  int32_t ClassId(std::vector<std::pair<uint32_t, uint32_t>> ranges);
  // Replaces seq[from…] with the repetition of it {min, max} (max < 0: no bound).
  absl::Status Repeat(int32_t rule, Sequence* seq, size_t from, int min, int max);
  absl::Status Count(size_t elements);
  absl::Status CheckLeftRecursion(const Grammar& g) const;

  std::string_view text_;
  size_t max_bytes_;
  size_t pos_ = 0;
  absl::flat_hash_map<std::string, int32_t> ids_;
  std::vector<std::string> names_;
  std::vector<size_t> used_at_;   // [rule]: where it was first referred to (npos: not)
  std::vector<size_t> defined_at_;  // [rule]: where it was defined (npos: not yet)
  std::vector<int> generated_;      // [rule]: rules generated inside it so far
  std::vector<std::vector<Sequence>> bodies_;
  std::vector<CharClass> classes_;
  // Classes by their ranges, each made once (so alternatives alike are seen to be alike).
  std::map<std::vector<std::pair<uint32_t, uint32_t>>, int32_t> class_ids_;
  int64_t elements_ = 0;
};

absl::Status GbnfParser::ErrorAt(size_t at, std::string_view what) const {
  at = std::min(at, text_.size());
  int line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < at; ++i) {
    if (text_[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return absl::InvalidArgumentError(absl::StrFormat("guided_grammar: line %d, column %d: %s",
                                                    line, int(at - line_start) + 1, what));
}

void GbnfParser::SkipSpace(bool newlines) {
  while (!AtEnd()) {
    const char c = text_[pos_];
    if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
      ++pos_;
    } else if (c == '#') {
      while (!AtEnd() && text_[pos_] != '\n' && text_[pos_] != '\r') ++pos_;
    } else {
      break;
    }
  }
}

std::string_view GbnfParser::ParseName() {
  const size_t start = pos_;
  while (!AtEnd() && IsNameChar(text_[pos_])) ++pos_;
  return text_.substr(start, pos_ - start);
}

bool GbnfParser::RuleBegins() const {
  size_t at = pos_;
  while (at < text_.size() && IsNameChar(text_[at])) ++at;
  if (at == pos_) return false;
  while (at < text_.size() && (text_[at] == ' ' || text_[at] == '\t')) ++at;
  return text_.substr(at, 3) == "::=";
}

int32_t GbnfParser::RuleId(std::string_view name) {
  auto [it, added] = ids_.try_emplace(std::string(name), int32_t(names_.size()));
  if (added) {
    names_.emplace_back(name);
    used_at_.push_back(std::string_view::npos);
    defined_at_.push_back(std::string_view::npos);
    generated_.push_back(0);
    bodies_.emplace_back();
  }
  return it->second;
}

int32_t GbnfParser::NewRule(int32_t inside) {
  // A name no rule as written can have ('#' is no name's character), for messages.
  const int32_t id = RuleId(absl::StrCat(names_[inside], "#", ++generated_[inside]));
  defined_at_[id] = pos_;
  return id;
}

absl::Status GbnfParser::Count(size_t elements) {
  elements_ += int64_t(elements);
  if (elements_ > kMaxGrammarElements) {
    return Error(absl::StrFormat(
        "the grammar has more than %d elements with its repetitions expanded; write large "
        "repetitions with * or + and fewer {m,n} copies",
        kMaxGrammarElements));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> GbnfParser::ParseHex(int digits) {
  uint32_t value = 0;
  for (int i = 0; i < digits; ++i) {
    const char c = Peek();
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return Error(absl::StrFormat("expected %d hexadecimal digits", digits));
    }
    value = value * 16 + uint32_t(d);
    ++pos_;
  }
  return value;
}

absl::StatusOr<uint32_t> GbnfParser::ParseChar() {
  const size_t start = pos_;
  const uint8_t c = uint8_t(text_[pos_++]);
  if (c == '\\') {
    if (AtEnd()) return ErrorAt(start, "an escape at the end of the grammar");
    const char e = text_[pos_++];
    absl::StatusOr<uint32_t> cp;
    switch (e) {
      case 'x': cp = ParseHex(2); break;
      case 'u': cp = ParseHex(4); break;
      case 'U': cp = ParseHex(8); break;
      case 't': return uint32_t('\t');
      case 'r': return uint32_t('\r');
      case 'n': return uint32_t('\n');
      case 'f': return uint32_t('\f');
      case 'v': return uint32_t('\v');
      case '\\': case '"': case '[': case ']': case '-': case '^': return uint32_t(e);
      default:
        return ErrorAt(start, absl::StrFormat(
                                  "unknown escape \\%c (escapes: \\t \\r \\n \\f \\v \\\\ \\\" "
                                  "\\[ \\] \\- \\^ \\xHH \\uHHHH \\UHHHHHHHH)",
                                  e));
    }
    if (!cp.ok()) return cp.status();
    if (*cp > kMaxCodePoint || (*cp >= 0xD800 && *cp <= 0xDFFF)) {
      return ErrorAt(start, absl::StrFormat("\\%c names U+%04X, which is not a character", e, *cp));
    }
    return *cp;
  }
  if (c < 0x80) return uint32_t(c);
  // UTF-8 in the grammar's text.
  int length = 1;
  const uint32_t cp = model::DecodeUtf8At(text_, start, &length);
  if (cp == model::kInvalidCodePoint) return ErrorAt(start, "the grammar is not valid UTF-8");
  pos_ = start + size_t(length);
  return cp;
}

absl::StatusOr<int> GbnfParser::ParseCount() {
  const size_t start = pos_;
  int64_t value = 0;
  while (Peek() >= '0' && Peek() <= '9') {
    value = value * 10 + (text_[pos_++] - '0');
    if (value > kMaxGrammarRepeat) {
      return ErrorAt(start, absl::StrFormat("a repetition count above %d", kMaxGrammarRepeat));
    }
  }
  return pos_ == start ? -1 : int(value);
}

int32_t GbnfParser::ClassId(std::vector<std::pair<uint32_t, uint32_t>> ranges) {
  auto [it, added] = class_ids_.try_emplace(ranges, int32_t(classes_.size()));
  if (added) classes_.push_back(CharClass{std::move(ranges)});
  return it->second;
}

absl::Status GbnfParser::Repeat(int32_t rule, Sequence* seq, size_t from, int min, int max) {
  if (from == seq->size() || max == 0) {  // "" repeated, or x{0}: nothing
    seq->resize(from);
    return absl::OkStatus();
  }
  GrammarElement unit = (*seq)[from];
  if (seq->size() - from > 1) {  // a literal of several characters: one rule
    const int32_t id = NewRule(rule);
    bodies_[id].emplace_back(seq->begin() + from, seq->end());
    unit = {GrammarElement::kRule, id};
  }
  seq->resize(from);
  if (auto s = Count(size_t(std::max(min, 1)) + 3 * size_t(std::max(max - min, 1))); !s.ok()) {
    return s;
  }
  for (int i = 0; i < min; ++i) seq->push_back(unit);
  if (max < 0) {  // S ::= unit S | (empty)
    const int32_t star = NewRule(rule);
    bodies_[star] = {{unit, {GrammarElement::kRule, star}}, {}};
    seq->push_back({GrammarElement::kRule, star});
  } else if (max > min) {  // R_k ::= unit R_(k-1) | (empty), k = max - min … 1
    int32_t inner = -1;
    for (int k = 1; k <= max - min; ++k) {
      const int32_t opt = NewRule(rule);
      Sequence first = {unit};
      if (inner >= 0) first.push_back({GrammarElement::kRule, inner});
      bodies_[opt] = {std::move(first), {}};
      inner = opt;
    }
    seq->push_back({GrammarElement::kRule, inner});
  }
  return absl::OkStatus();
}

absl::StatusOr<Sequence> GbnfParser::ParseSequence(int32_t rule, bool nested, int depth) {
  Sequence seq;
  size_t last = std::string_view::npos;  // where the item a quantifier would repeat begins
  while (!AtEnd()) {
    const char c = Peek();
    const size_t start = pos_;
    if (c == '"') {
      ++pos_;
      last = seq.size();
      while (Peek() != '"') {
        if (AtEnd() || Peek() == '\n') return ErrorAt(start, "a literal without its closing \"");
        auto cp = ParseChar();
        if (!cp.ok()) return cp.status();
        seq.push_back({GrammarElement::kClass, ClassId({{*cp, *cp}})});
        if (auto s = Count(1); !s.ok()) return s;
      }
      ++pos_;
    } else if (c == '[') {
      ++pos_;
      const bool negated = Peek() == '^';
      if (negated) ++pos_;
      std::vector<std::pair<uint32_t, uint32_t>> ranges;
      while (Peek() != ']') {
        if (AtEnd() || Peek() == '\n') return ErrorAt(start, "a class without its closing ]");
        auto lo = ParseChar();
        if (!lo.ok()) return lo.status();
        uint32_t hi = *lo;
        if (Peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
          ++pos_;
          auto h = ParseChar();
          if (!h.ok()) return h.status();
          if (*h < *lo) return ErrorAt(start, "a class range whose end comes before its start");
          hi = *h;
        }
        ranges.emplace_back(*lo, hi);
      }
      ++pos_;
      last = seq.size();
      seq.push_back({GrammarElement::kClass, ClassId(Normalize(std::move(ranges), negated))});
      if (auto s = Count(1); !s.ok()) return s;
    } else if (c == '.') {
      ++pos_;
      last = seq.size();
      seq.push_back({GrammarElement::kClass, ClassId({{0, kMaxCodePoint}})});
      if (auto s = Count(1); !s.ok()) return s;
    } else if (IsNameChar(c)) {
      const std::string_view name = ParseName();
      const int32_t id = RuleId(name);
      if (used_at_[id] == std::string_view::npos) used_at_[id] = start;
      last = seq.size();
      seq.push_back({GrammarElement::kRule, id});
      if (auto s = Count(1); !s.ok()) return s;
    } else if (c == '(') {
      if (depth >= kMaxGrammarNesting) {
        return Error(absl::StrFormat("groups nested more than %d deep", kMaxGrammarNesting));
      }
      ++pos_;
      SkipSpace(true);
      const int32_t group = NewRule(rule);
      auto alternatives = ParseAlternatives(group, true, depth + 1);
      if (!alternatives.ok()) return alternatives.status();
      if (Peek() != ')') return ErrorAt(start, "a group without its closing )");
      ++pos_;
      bodies_[group] = std::move(*alternatives);
      last = seq.size();
      seq.push_back({GrammarElement::kRule, group});
      if (auto s = Count(1); !s.ok()) return s;
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
      if (last == std::string_view::npos) {
        return Error(absl::StrFormat("'%c' with nothing before it to repeat", c));
      }
      ++pos_;
      int min = c == '+' ? 1 : 0, max = c == '?' ? 1 : -1;
      if (c == '{') {
        SkipSpace(false);
        auto m = ParseCount();
        if (!m.ok()) return m.status();
        SkipSpace(false);
        int n = *m;
        if (Peek() == ',') {
          ++pos_;
          SkipSpace(false);
          auto upper = ParseCount();
          if (!upper.ok()) return upper.status();
          n = *upper;
          SkipSpace(false);
        } else if (*m < 0) {
          return ErrorAt(start, "expected {m}, {m,}, {,n} or {m,n}");
        }
        if (Peek() != '}') return ErrorAt(start, "expected {m}, {m,}, {,n} or {m,n}");
        ++pos_;
        min = std::max(*m, 0);
        max = n;
        if (max >= 0 && max < min) return ErrorAt(start, "{m,n} with n below m");
      }
      if (auto s = Repeat(rule, &seq, last, min, max); !s.ok()) return s;
      last = std::string_view::npos;
    } else if (!nested && (c == '\n' || c == '\r')) {
      // A line's end ends the rule where the next line begins another (`name ::=`) or the
      // grammar ends; else the rule goes on (as xgrammar reads it: `| ...` or more items on
      // the next line; llama.cpp reads only the first).
      SkipSpace(true);
      if (AtEnd() || RuleBegins()) {
        pos_ = start;
        break;
      }
      continue;
    } else {
      break;
    }
    SkipSpace(nested);
  }
  return seq;
}

absl::StatusOr<std::vector<Sequence>> GbnfParser::ParseAlternatives(int32_t rule, bool nested,
                                                                    int depth) {
  std::vector<Sequence> alternatives;
  while (true) {
    auto seq = ParseSequence(rule, nested, depth);
    if (!seq.ok()) return seq.status();
    alternatives.push_back(std::move(*seq));
    if (Peek() != '|') break;
    ++pos_;
    SkipSpace(true);
  }
  return alternatives;
}

absl::StatusOr<Grammar> GbnfParser::Parse() {
  if (text_.size() > max_bytes_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "guided_grammar has %d bytes; at most %d", text_.size(), max_bytes_));
  }
  SkipSpace(true);
  while (!AtEnd()) {
    const size_t start = pos_;
    const std::string_view name = ParseName();
    // Lark's rules (`start: ...`, `?expr: ...`), which vLLM's outlines backend reads, are
    // the likeliest other format: say which one this is.
    constexpr const char* kGbnf =
        " (the grammar is GBNF, as llama.cpp and vLLM's xgrammar backend read it: `root ::= "
        "...`; Lark's `name: ...` is not read)";
    if (name.empty()) {
      return Error(absl::StrCat("expected a rule's name (a rule is `name ::= ...`)",
                                Peek() == '?' ? kGbnf : ""));
    }
    SkipSpace(false);
    if (text_.substr(pos_, 3) != "::=") {
      return Error(absl::StrCat("expected ::= after the rule name '", std::string(name), "'",
                                Peek() == ':' ? kGbnf : ""));
    }
    pos_ += 3;
    SkipSpace(true);
    const int32_t id = RuleId(name);
    if (defined_at_[id] != std::string_view::npos) {
      return ErrorAt(start, absl::StrCat("rule '", std::string(name), "' is defined twice"));
    }
    defined_at_[id] = start;
    auto alternatives = ParseAlternatives(id, false, 0);
    if (!alternatives.ok()) return alternatives.status();
    bodies_[id] = std::move(*alternatives);
    if (!AtEnd() && Peek() != '\n' && Peek() != '\r') {
      if (Peek() == ')') return Error("a ) without its opening (");
      return Error(absl::StrFormat("unexpected '%c'", Peek()));
    }
    SkipSpace(true);
  }
  for (size_t id = 0; id < names_.size(); ++id) {
    if (defined_at_[id] == std::string_view::npos) {
      return ErrorAt(used_at_[id],
                     absl::StrCat("rule '", names_[id], "' is used but not defined"));
    }
  }
  auto root = ids_.find("root");
  if (root == ids_.end()) {
    return absl::InvalidArgumentError(
        "guided_grammar: no rule 'root'; the grammar's text is what `root ::= ...` matches");
  }

  Grammar g;
  g.root = root->second;
  g.names = names_;
  g.classes = std::move(classes_);
  g.rules.resize(bodies_.size());
  for (size_t id = 0; id < bodies_.size(); ++id) {
    // An alternative written twice is read once (twice, every text it matches would have two
    // parses, each a stack to move at every character).
    std::set<std::vector<std::pair<int, int32_t>>> written;
    for (const Sequence& alternative : bodies_[id]) {
      std::vector<std::pair<int, int32_t>> items;
      for (const GrammarElement& e : alternative) items.emplace_back(int(e.kind), e.value);
      if (!written.insert(std::move(items)).second) continue;
      g.rules[id].push_back(int32_t(g.elements.size()));
      g.elements.insert(g.elements.end(), alternative.begin(), alternative.end());
      g.elements.push_back({GrammarElement::kEnd, 0});
    }
  }

  // Rules that match some text (a class with no character in it matches none).
  std::vector<bool> productive(g.rules.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t id = 0; id < g.rules.size(); ++id) {
      if (productive[id]) continue;
      for (int32_t a : g.rules[id]) {
        bool all = true;
        for (int32_t p = a; g.elements[p].kind != GrammarElement::kEnd; ++p) {
          const GrammarElement& e = g.elements[p];
          if (e.kind == GrammarElement::kClass ? g.classes[e.value].ranges.empty()
                                               : !productive[e.value]) {
            all = false;
            break;
          }
        }
        if (all) {
          productive[id] = changed = true;
          break;
        }
      }
    }
  }
  if (!productive[g.root]) {
    return ErrorAt(defined_at_[g.root], "no text matches rule 'root' (every alternative needs "
                                        "a rule that never ends, or an empty class)");
  }
  // An alternative that matches no text (it needs such a rule or class) is dropped: a guide
  // must not let the output into it, where nothing could ever end it.
  for (std::vector<int32_t>& alternatives : g.rules) {
    std::erase_if(alternatives, [&](int32_t a) {
      for (int32_t p = a; g.elements[p].kind != GrammarElement::kEnd; ++p) {
        const GrammarElement& e = g.elements[p];
        if (e.kind == GrammarElement::kClass ? g.classes[e.value].ranges.empty()
                                             : !productive[e.value]) {
          return true;
        }
      }
      return false;
    });
  }
  if (auto s = CheckLeftRecursion(g); !s.ok()) return s;
  return g;
}

// Reading a rule starts by reading its alternatives' first elements, and those after them
// while they can match nothing: its left corners. Reaching a rule again through left corners
// grows the parse stack without reading a character (forever) unless every step on the way was
// an alternative's last element (then the stack is the same again, and the parse stops there).
// So: no cycle of left corners through a step with more to read after it.
absl::Status GbnfParser::CheckLeftRecursion(const Grammar& g) const {
  const size_t n = g.rules.size();
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t id = 0; id < n; ++id) {
      if (nullable[id]) continue;
      for (int32_t a : g.rules[id]) {
        bool all = true;
        for (int32_t p = a; g.elements[p].kind != GrammarElement::kEnd; ++p) {
          const GrammarElement& e = g.elements[p];
          if (e.kind == GrammarElement::kClass || !nullable[e.value]) {
            all = false;
            break;
          }
        }
        if (all) {
          nullable[id] = changed = true;
          break;
        }
      }
    }
  }
  struct Edge {
    int32_t to;
    bool tail;  // the alternative's last element
  };
  std::vector<std::vector<Edge>> corners(n);
  for (size_t id = 0; id < n; ++id) {
    for (int32_t a : g.rules[id]) {
      for (int32_t p = a; g.elements[p].kind != GrammarElement::kEnd; ++p) {
        const GrammarElement& e = g.elements[p];
        if (e.kind == GrammarElement::kClass) break;
        corners[id].push_back({e.value, g.elements[p + 1].kind == GrammarElement::kEnd});
        if (!nullable[e.value]) break;
      }
    }
  }
  // Strongly connected components (Tarjan's, iterative).
  std::vector<int32_t> index(n, -1), low(n, 0), component(n, -1), stack;
  std::vector<bool> on_stack(n, false);
  int32_t next_index = 0, components = 0;
  for (size_t start = 0; start < n; ++start) {
    if (index[start] >= 0) continue;
    std::vector<std::pair<int32_t, size_t>> frames = {{int32_t(start), 0}};
    index[start] = low[start] = next_index++;
    stack.push_back(int32_t(start));
    on_stack[start] = true;
    while (!frames.empty()) {
      auto& [v, edge] = frames.back();
      if (edge < corners[v].size()) {
        const int32_t w = corners[v][edge++].to;
        if (index[w] < 0) {
          index[w] = low[w] = next_index++;
          stack.push_back(w);
          on_stack[w] = true;
          frames.emplace_back(w, 0);
        } else if (on_stack[w]) {
          low[v] = std::min(low[v], index[w]);
        }
        continue;
      }
      const int32_t done = v;
      frames.pop_back();
      if (!frames.empty()) low[frames.back().first] = std::min(low[frames.back().first], low[done]);
      if (low[done] == index[done]) {
        int32_t w;
        do {
          w = stack.back();
          stack.pop_back();
          on_stack[w] = false;
          component[w] = components;
        } while (w != done);
        ++components;
      }
    }
  }
  for (size_t id = 0; id < n; ++id) {
    for (const Edge& e : corners[id]) {
      if (e.tail || component[e.to] != component[id]) continue;
      // A path back from e.to to id through the component, for the message.
      std::vector<int32_t> from(n, -1);
      std::vector<int32_t> queue = {e.to};
      from[e.to] = e.to;
      for (size_t q = 0; q < queue.size() && from[id] < 0; ++q) {
        for (const Edge& f : corners[queue[q]]) {
          if (component[f.to] == component[id] && from[f.to] < 0) {
            from[f.to] = queue[q];
            queue.push_back(f.to);
          }
        }
      }
      std::vector<std::string> path = {names_[id]};
      std::vector<std::string> back;
      for (int32_t v = int32_t(id); v != e.to; v = from[v]) back.push_back(names_[v]);
      back.push_back(names_[e.to]);
      path.insert(path.end(), back.rbegin(), back.rend());
      return ErrorAt(defined_at_[id],
                     absl::StrCat("rule '", names_[id], "' is left-recursive (",
                                  absl::StrJoin(path, " -> "),
                                  " before reading a character): write it with a repetition, "
                                  "e.g. expr ::= term (\"+\" term)* for expr ::= expr \"+\" term "
                                  "| term"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool CharClass::Contains(uint32_t cp) const { return Overlaps(cp, cp); }

bool CharClass::Overlaps(uint32_t lo, uint32_t hi) const {
  // The first range that ends at lo or after.
  auto it = std::lower_bound(ranges.begin(), ranges.end(), lo,
                             [](const std::pair<uint32_t, uint32_t>& r, uint32_t v) {
                               return r.second < v;
                             });
  return it != ranges.end() && it->first <= hi;
}

absl::StatusOr<Grammar> ParseGrammar(std::string_view text, size_t max_bytes) {
  return GbnfParser(text, max_bytes).Parse();
}

void FactorAlternatives(Grammar* g) {
  // A rule's alternatives' tails are alternatives already (each runs on to its kEnd), so a
  // group's new rule takes them where they lie; each new rule is factored in its turn.
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> by_first;
  std::vector<uint64_t> firsts;  // in the order they were met, so the result does not depend on
                                 // the map's
  for (size_t id = 0; id < g->rules.size(); ++id) {
    by_first.clear();
    firsts.clear();
    for (int32_t a : g->rules[id]) {
      const GrammarElement& e = g->elements[a];
      const uint64_t first = uint64_t(e.kind) << 32 | uint32_t(e.value);
      auto [it, added] = by_first.try_emplace(first);
      if (added) firsts.push_back(first);
      it->second.push_back(a);
    }
    if (firsts.size() == g->rules[id].size()) continue;  // every alternative begins its own way
    std::vector<int32_t> alternatives;
    int tails = 0;
    for (uint64_t first : firsts) {
      const std::vector<int32_t>& group = by_first[first];
      if (group.size() == 1 || g->elements[group[0]].kind == GrammarElement::kEnd) {
        alternatives.push_back(group[0]);
        continue;
      }
      const int32_t tail = int32_t(g->rules.size());
      std::vector<int32_t> rest;
      for (int32_t a : group) rest.push_back(a + 1);
      g->rules.push_back(std::move(rest));
      g->names.push_back(absl::StrCat(g->names[id], "#tail", ++tails));
      const GrammarElement shared = g->elements[group[0]];
      alternatives.push_back(int32_t(g->elements.size()));
      g->elements.push_back(shared);
      g->elements.push_back({GrammarElement::kRule, tail});
      g->elements.push_back({GrammarElement::kEnd, 0});
    }
    g->rules[id] = std::move(alternatives);
  }
}

}  // namespace thetaserve::scheduler
