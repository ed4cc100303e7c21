#include "scheduler/guided_grammar.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "model/tokenizer_utf8.h"

namespace thetaserve::scheduler {

namespace {

constexpr int32_t kEmpty = 0;              // the node of the empty stack: the text is whole
constexpr int32_t kJoin = -2;              // pos_ of a join: parent_ is its index in joins_
constexpr size_t kMaxCachedKeyBytes = 65536;  // a larger parse is walked, not remembered
constexpr size_t kResetNodes = 1 << 18;       // a walk frees its nodes past this many
constexpr size_t kMaxRememberedStacks = 8;    // more move together (Parse::Advance)
// Stacks under one top (a join's members, their tops all different: at most one per grammar
// position); past this a call stops there.
constexpr size_t kMaxJoinMembers = 4096;
// Sets of stacks a call numbers (Parse::Step), and their stacks in all: each set held twice (a
// list and a map's key) and its moves by ASCII byte in a row of 512 bytes, at most about 6 MB.
constexpr size_t kMaxNumberedSets = 4096;
constexpr size_t kMaxNumberedStacks = 1 << 18;

}  // namespace

struct GrammarGuide::ParseState {
  std::vector<int32_t> stacks;  // node ids, each once
  uint32_t partial = 0;         // the bits of a character read so far
  uint8_t owed = 0;             // its continuation bytes still to come
  uint8_t lo = 0x80, hi = 0xBF;  // the range the next of them must be in
  int32_t set = -1;              // stacks' number in its Parse's sets_, or -1 (not numbered)
};

// The stack nodes one call makes (so the sampling threads share nothing but the grammar) and
// the steps over them. A node is a position in grammar.elements still to be read (a class or
// a rule) over the stack below it; node 0 is the empty stack. A join is several stacks at
// once, each a node: stacks with the same top become one node over the join of what lies
// under them (a graph-structured stack, as a GLR parser keeps), so alternatives that part
// and then read the same thing (two array forms of the same items, a rule that nests) keep one
// stack per top, where apart they would double at every level of nesting.
class GrammarGuide::Parse {
 public:
  using State = ParseState;

  explicit Parse(const Grammar& g) : g_(g) { AddNode(-1, -1); }

  // The stacks before any text; false when there are too many.
  bool Start(State* s) {
    OpenRule(g_.root);
    s->set = -1;
    return Expand(&s->stacks) && !s->stacks.empty();
  }

  // The state after `b`; false where no text of the grammar has it next (or past the bounds).
  bool Next(const State& s, uint8_t b, State* out) {
    if (exceeded_ || !Spend(1)) return false;
    if (s.owed == 0 && b < 0x80) return Step(s, b, out);
    uint32_t bits;
    if (s.owed == 0) {  // a character's first byte: what the next may be
      model::Utf8Lead lead;
      if (!model::Utf8LeadOf(b, &lead)) return false;
      const uint8_t owed = uint8_t(lead.length - 1), lo = lead.second_lo, hi = lead.second_hi;
      bits = b & (0x3F >> owed);
      // The characters it can begin: those bits then the next byte's range, then anything.
      const int shift = 6 * (owed - 1);
      const uint32_t first = ((bits << 6) | (lo & 0x3F)) << shift;
      const uint32_t last = (((bits << 6) | (hi & 0x3F)) << shift) | ((1u << shift) - 1);
      if (!AnyTakes(s.stacks, first, last)) return false;
      Carry(s, bits, owed, lo, hi, out);
      return true;
    }
    if (b < s.lo || b > s.hi) return false;
    bits = s.partial << 6 | (b & 0x3F);
    if (s.owed == 1) return Step(s, bits, out);
    const int shift = 6 * (s.owed - 1);
    if (!AnyTakes(s.stacks, bits << shift, (bits << shift) | ((1u << shift) - 1))) return false;
    Carry(s, bits, uint8_t(s.owed - 1), 0x80, 0xBF, out);
    return true;
  }

  // *out: s's stacks (copied into out's own buffer, not a new one) partway through a character.
  static void Carry(const State& s, uint32_t partial, uint8_t owed, uint8_t lo, uint8_t hi,
                    State* out) {
    out->stacks = s.stacks;
    out->partial = partial;
    out->owed = owed;
    out->lo = lo;
    out->hi = hi;
    out->set = s.set;
  }

  // The state after `bytes` more; false where they leave the grammar.
  bool Read(std::string_view bytes, State* s) {
    State next;
    for (char c : bytes) {
      if (!Next(*s, uint8_t(c), &next)) return false;
      std::swap(*s, next);
    }
    return true;
  }

  // The state Key wrote, its stacks made again here; false past kMaxGrammarNodes.
  bool Restore(std::string_view key, State* s) {
    constexpr size_t kTail = sizeof(uint32_t) + 3;
    s->set = -1;
    size_t at = 0;
    auto next = [&]() {
      int32_t v;
      std::memcpy(&v, key.data() + at, sizeof(v));
      at += sizeof(v);
      return v;
    };
    std::vector<int32_t> ids = {kEmpty};  // [the key's number for a node]
    std::vector<int32_t> members;
    for (int32_t entries = next(); entries > 0; --entries) {
      const int32_t pos = next();
      int32_t node;
      if (pos == kJoin) {
        members.clear();
        for (int32_t n = next(); n > 0; --n) members.push_back(ids[next()]);
        node = Join(&members);
      } else {
        node = Node(pos, ids[next()]);
      }
      if (node < 0) return false;
      ids.push_back(node);
    }
    s->stacks.clear();
    for (int32_t n = next(); n > 0; --n) s->stacks.push_back(ids[next()]);
    const char* tail = key.data() + key.size() - kTail;
    std::memcpy(&s->partial, tail, sizeof(uint32_t));
    s->owed = uint8_t(tail[4]);
    s->lo = uint8_t(tail[5]);
    s->hi = uint8_t(tail[6]);
    return true;
  }

  // A rule the grammar reaches (from the root) that would open more than kMaxGrammarStacks
  // stacks as it begins (too many alternatives each beginning its own way), or one where
  // reading a rule it refers to would (a run of rules that may match nothing, each with
  // alternatives of its own): once there nothing could follow. -1 when none, or once *budget
  // work is spent (a courtesy: the bound holds at run time whatever this finds). Stacks read
  // into from below (past the end of several rules at once) are not checked.
  int32_t TooWideRule(int64_t* budget) {
    std::vector<bool> reached(g_.rules.size(), false);
    std::vector<int32_t> rules = {g_.root};
    reached[g_.root] = true;
    for (size_t i = 0; i < rules.size() && *budget > 0; ++i) {
      for (int32_t a : g_.rules[rules[i]]) {
        for (int32_t p = a; g_.elements[p].kind != GrammarElement::kEnd; ++p) {
          const GrammarElement& e = g_.elements[p];
          if (e.kind != GrammarElement::kRule) continue;
          if (!reached[e.value]) {
            reached[e.value] = true;
            rules.push_back(e.value);
          }
          work_ = {Node(p, kEmpty)};
          if (OpensTooMany(budget)) {
            const bool wide = RuleTooWide(e.value, budget);
            const int32_t named = Widest(wide ? e.value : rules[i], budget);
            Reset();
            return named;
          }
          if (*budget <= 0) break;
        }
      }
    }
    Reset();
    return -1;
  }

  // The rule, of those `rule` (too wide) begins with, and theirs in turn, that is too wide
  // itself and begins with none that is: the one to name (a list of a thousand rules, not the
  // root that holds it). The deepest found within *budget work.
  int32_t Widest(int32_t rule, int64_t* budget) {
    std::vector<bool> seen(g_.rules.size(), false);
    seen[rule] = true;
    for (bool deeper = true; deeper && *budget > 0;) {
      deeper = false;
      for (int32_t a : g_.rules[rule]) {
        const GrammarElement& first = g_.elements[a];
        if (first.kind == GrammarElement::kRule && !seen[first.value]) {
          seen[first.value] = true;
          if (RuleTooWide(first.value, budget)) {
            rule = first.value;
            deeper = true;
            break;
          }
        }
      }
    }
    return rule;
  }

  // A bound was passed: what this parse found since is not all there is.
  bool exceeded() const { return exceeded_; }
  size_t nodes() const { return pos_.size(); }
  // A walk has kMaxGrammarWork of its own (what reading the output took aside; what the
  // parse remembered from reading it may still save some).
  void RestartWork() { work_done_ = 0; }

  // Forgets every node but the empty stack's (a walk's, between first bytes: its states hold
  // ids no longer; the start's is made again with Restore).
  void Reset() {
    // erase, not resize(1): GCC 12 warns of the growth path resize has and this never takes.
    pos_.erase(pos_.begin() + 1, pos_.end());
    parent_.erase(parent_.begin() + 1, parent_.end());
    mark_.erase(mark_.begin() + 1, mark_.end());
    flat_mark_.erase(flat_mark_.begin() + 1, flat_mark_.end());
    ascii_row_.erase(ascii_row_.begin() + 1, ascii_row_.end());
    index_.clear();
    joins_.clear();
    join_index_.clear();
    union_index_.clear();
    moves_.clear();
    moved_.clear();
    ascii_moves_.clear();
    set_index_.clear();
    sets_.clear();
    set_moves_.clear();
    set_wide_moves_.clear();
    numbered_stacks_ = 0;
  }

  static bool Whole(const State& s) {
    return s.owed == 0 && std::find(s.stacks.begin(), s.stacks.end(), kEmpty) != s.stacks.end();
  }
  static bool Ended(const State& s) {
    return s.owed == 0 && s.stacks.size() == 1 && s.stacks[0] == kEmpty;
  }

  // The state by what it holds (the same in every call, whatever the node ids): the nodes under
  // its stacks by height above the empty stack, each height's sorted by what they hold (a
  // node's position and the number the key gave its parent, a join's members' numbers) and
  // numbered in that order, then the stacks' numbers sorted, then the character being read.
  // A tail shared by many stacks is written once. Empty past `limit` bytes.
  std::string Key(const State& s, size_t limit) const {
    // Heights, children first (a depth-first walk that finishes a node once all under it are).
    absl::flat_hash_map<int32_t, int32_t> height = {{kEmpty, 0}};
    std::vector<std::vector<int32_t>> levels;
    std::vector<int32_t> dfs;
    for (int32_t top : s.stacks) dfs.push_back(top);
    while (!dfs.empty()) {
      const int32_t n = dfs.back();
      if (height.contains(n)) {
        dfs.pop_back();
        continue;
      }
      const auto [begin, end] = Under(n);
      int32_t h = 0;
      bool ready = true;
      for (const int32_t* c = begin; c != end; ++c) {
        if (auto it = height.find(*c); it != height.end()) {
          h = std::max(h, it->second);
        } else {
          dfs.push_back(*c);
          ready = false;
        }
      }
      if (!ready) continue;
      dfs.pop_back();
      height[n] = h + 1;
      if (levels.size() <= size_t(h)) levels.resize(h + 1);
      levels[h].push_back(n);
      if (height.size() * 3 * sizeof(int32_t) > limit) return "";
    }
    absl::flat_hash_map<int32_t, int32_t> number = {{kEmpty, 0}};
    std::vector<int32_t> words = {int32_t(height.size() - 1)};
    std::vector<std::vector<int32_t>> held;
    std::vector<size_t> order;
    for (const std::vector<int32_t>& level : levels) {
      held.assign(level.size(), {});
      for (size_t i = 0; i < level.size(); ++i) {
        const int32_t n = level[i];
        if (pos_[n] == kJoin) {
          const std::vector<int32_t>& members = joins_[parent_[n]];
          held[i] = {kJoin, int32_t(members.size())};
          for (int32_t m : members) held[i].push_back(number.at(m));
          std::sort(held[i].begin() + 2, held[i].end());
        } else {
          held[i] = {pos_[n], number.at(parent_[n])};
        }
      }
      order.resize(level.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return held[a] < held[b]; });
      for (size_t i : order) {
        number[level[i]] = int32_t(number.size());
        words.insert(words.end(), held[i].begin(), held[i].end());
      }
      if (words.size() * sizeof(int32_t) > limit) return "";
    }
    std::vector<int32_t> tops;
    for (int32_t top : s.stacks) tops.push_back(number.at(top));
    std::sort(tops.begin(), tops.end());
    words.push_back(int32_t(tops.size()));
    words.insert(words.end(), tops.begin(), tops.end());
    if (words.size() * sizeof(int32_t) > limit) return "";
    std::string key(reinterpret_cast<const char*>(words.data()), words.size() * sizeof(int32_t));
    key.append(reinterpret_cast<const char*>(&s.partial), sizeof(s.partial));
    key.push_back(char(s.owed));
    key.push_back(char(s.lo));
    key.push_back(char(s.hi));
    return key;
  }

 private:
  // Whether `rule`, entered over the empty stack, opens more than kMaxGrammarStacks stacks
  // (OpensTooMany).
  bool RuleTooWide(int32_t rule, int64_t* budget) {
    OpenRule(rule);
    return OpensTooMany(budget);
  }

  // work_ := `rule`'s alternatives over the empty stack (an empty alternative: the empty stack).
  void OpenRule(int32_t rule) {
    work_.clear();
    for (int32_t a : g_.rules[rule]) {
      work_.push_back(g_.elements[a].kind == GrammarElement::kEnd ? kEmpty : Node(a, kEmpty));
    }
  }

  // Whether the stacks work_ opens pass kMaxGrammarStacks, the empty stack not counted (where
  // the text may end there, the stack below goes on, and what it opens may be tops already
  // counted). Spends at most *budget (less what it spent); false once that is spent.
  bool OpensTooMany(int64_t* budget) {
    RestartWork();
    work_limit_ = std::min(kMaxGrammarWork, *budget);
    std::vector<int32_t> opened;
    const bool fits = Expand(&opened);
    const bool past = exceeded_;
    *budget -= work_done_;
    work_limit_ = kMaxGrammarWork;
    exceeded_ = false;
    RestartWork();
    if (fits || past) return false;
    return opened.size() - size_t(std::count(opened.begin(), opened.end(), kEmpty)) >
           size_t(kMaxGrammarStacks);
  }

  // The node for `pos` over `parent`, made once; -1 past kMaxGrammarNodes.
  int32_t Node(int32_t pos, int32_t parent) {
    if (parent < 0) return -1;
    const uint64_t key = uint64_t(uint32_t(pos)) << 32 | uint32_t(parent);
    auto [it, added] = index_.try_emplace(key, int32_t(pos_.size()));
    if (added && !AddNode(pos, parent)) {
      index_.erase(it);
      return -1;
    }
    return it->second;
  }

  // The node that is the stacks `members` (none of them a join) at once, made once; the stack
  // itself where there is one; -1 past kMaxJoinMembers, kMaxGrammarNodes or the work bound (a
  // join costs its members: sorted, hashed, compared). Sorts *members.
  int32_t Join(std::vector<int32_t>* members) {
    if (!Spend(int64_t(members->size()))) return -1;
    if (members->size() > kMaxJoinMembers) {
      exceeded_ = true;
      return -1;
    }
    std::sort(members->begin(), members->end());
    members->erase(std::unique(members->begin(), members->end()), members->end());
    if (members->size() == 1) return members->front();
    auto [it, added] = join_index_.try_emplace(*members, int32_t(pos_.size()));
    if (added) {
      if (!AddNode(kJoin, int32_t(joins_.size()))) {
        join_index_.erase(it);
        return -1;
      }
      joins_.push_back(*members);
    }
    return it->second;
  }

  // Appends node pos_.size(); false (and exceeded_) past kMaxGrammarNodes.
  bool AddNode(int32_t pos, int32_t parent) {
    if (pos_.size() >= size_t(kMaxGrammarNodes)) {
      exceeded_ = true;
      return false;
    }
    pos_.push_back(pos);
    parent_.push_back(parent);
    mark_.push_back(0);
    flat_mark_.push_back(0);
    ascii_row_.push_back(-1);
    return true;
  }

  // What lies directly under `n`, as [begin, end): a join's members, else its parent.
  std::pair<const int32_t*, const int32_t*> Under(int32_t n) const {
    if (pos_[n] == kJoin) {
      const std::vector<int32_t>& members = joins_[parent_[n]];
      return {members.data(), members.data() + members.size()};
    }
    return {&parent_[n], &parent_[n] + 1};
  }

  // Stacks with the same top become one over the union of what lies under them; false past the
  // bounds (kMaxGrammarStacks counts the stacks so merged).
  bool Merge(std::vector<int32_t>* stacks) {
    if (stacks->size() > 1) {
      if (!Spend(int64_t(stacks->size()))) return false;
      if (GroupByTop(*stacks, &grouped_)) {
        *stacks = grouped_.alone;
        for (const auto& [top, nodes] : grouped_.shared) {
          const int32_t node = OverUnion(top, nodes, nullptr);
          if (node < 0) return false;
          stacks->push_back(node);
        }
      }
    }
    return stacks->size() <= size_t(kMaxGrammarStacks);
  }

  // Nodes by top (GroupByTop): those alone at their top, and (top, nodes) for each top that
  // several share.
  struct Grouped {
    std::vector<int32_t> alone;
    std::vector<std::pair<int32_t, std::vector<int32_t>>> shared;
  };

  // `nodes` (none a join) by top into *out; false (*out as it was) when no two share one. A few
  // are sorted; many are counted by top in top_mark_ and top_count_, made on first use (8 bytes
  // a grammar position, where most calls never need them).
  bool GroupByTop(const std::vector<int32_t>& nodes, Grouped* out) {
    if (nodes.size() <= kMaxRememberedStacks) {
      by_top_.clear();
      for (int32_t node : nodes) by_top_.emplace_back(pos_[node], node);
      const auto end = by_top_.end();
      std::sort(by_top_.begin(), end);
      const auto alike = [](const auto& a, const auto& b) { return a.first == b.first; };
      if (std::adjacent_find(by_top_.begin(), end, alike) == end) return false;
      out->alone.clear();
      out->shared.clear();
      for (auto group = by_top_.begin(); group != end;) {
        const auto last =
            std::find_if(group, end, [&](const auto& t) { return !alike(t, *group); });
        if (last - group == 1) {
          out->alone.push_back(group->second);
        } else {
          out->shared.emplace_back(group->first, std::vector<int32_t>());
          for (auto it = group; it != last; ++it) out->shared.back().second.push_back(it->second);
        }
        group = last;
      }
      return true;
    }
    if (top_mark_.empty()) {
      top_mark_.assign(g_.elements.size() + 1, 0);
      top_count_.assign(g_.elements.size() + 1, 0);
    }
    auto slot = [&](int32_t node) { return size_t(pos_[node] + 1); };  // kEmpty's top is -1
    ++top_epoch_;
    bool alike = false;
    for (int32_t node : nodes) {
      const size_t at = slot(node);
      if (top_mark_[at] == top_epoch_) {
        ++top_count_[at];
        alike = true;
      } else {
        top_mark_[at] = top_epoch_;
        top_count_[at] = 1;
      }
    }
    if (!alike) return false;
    ++top_epoch_;  // now: marked once the top's group is made, top_count_ its index
    out->alone.clear();
    out->shared.clear();
    for (int32_t node : nodes) {
      const size_t at = slot(node);
      if (top_mark_[at] != top_epoch_) {
        if (top_count_[at] == 1) {
          out->alone.push_back(node);
          continue;
        }
        top_mark_[at] = top_epoch_;
        top_count_[at] = uint32_t(out->shared.size());
        out->shared.emplace_back(pos_[node], std::vector<int32_t>());
      }
      out->shared[top_count_[at]].second.push_back(node);
    }
    return true;
  }

  // The node for the union of the stacks `stacks` (nodes; a join among them stands for its
  // members): one node per set of stacks, whatever nodes it is made from. Alike tops become one
  // node over the union of what lies under them, and so on down, so a join's members' tops all
  // differ, and readings that multiply under one top (`r ::= "b" r r r | ""`, three ways to
  // read each "b" more) keep a node per way the stacks differ, not per reading. Iterative (the
  // graph may be thousands of levels deep): a set waits on the sets below it, each made once
  // (join_index_ remembers every set made, flattened, and union_index_ those asked for with
  // joins among them, as asked). -1 past the bounds.
  int32_t Union(std::vector<int32_t> stacks) {
    std::vector<std::vector<int32_t>> todo;
    int32_t made = Known(&stacks, &todo);
    if (made != kUnknown) return made;
    Grouped grouped;
    std::vector<int32_t> members;
    while (true) {
      const size_t at = todo.size() - 1;  // todo[at]: the set to make (pushes move it)
      made = -1;
      if (auto found = join_index_.find(todo[at]); found != join_index_.end()) {
        made = found->second;
      } else {
        if (!Spend(int64_t(todo[at].size()))) return -1;
        const bool alike = GroupByTop(todo[at], &grouped);
        members = alike ? grouped.alone : todo[at];
        if (!alike) grouped.shared.clear();
        bool ready = true;
        for (const auto& [top, nodes] : grouped.shared) {
          const int32_t node = OverUnion(top, nodes, &todo);
          if (node == kUnknown) {
            ready = false;
          } else if (node < 0) {
            return -1;
          } else if (ready) {
            members.push_back(node);
          }
        }
        if (!ready) continue;  // the sets below first
        made = Join(&members);
        if (made < 0) return -1;
        if (alike) join_index_.try_emplace(todo[at], made);
      }
      todo.pop_back();
      if (todo.empty()) {
        if (HasJoin(stacks)) union_index_.try_emplace(std::move(stacks), made);
        return made;
      }
    }
  }

  // The node `top` over the union of what lies under `nodes` (alike tops): made at once (todo
  // null: Union), or kUnknown with the set to make first pushed onto *todo. -1 past the bounds.
  int32_t OverUnion(int32_t top, const std::vector<int32_t>& nodes,
                    std::vector<std::vector<int32_t>>* todo) {
    std::vector<int32_t> under;
    under.reserve(nodes.size());
    for (int32_t node : nodes) under.push_back(parent_[node]);
    const int32_t u = todo == nullptr ? Union(std::move(under)) : Known(&under, todo);
    return u < 0 ? u : Node(top, u);
  }

  bool HasJoin(const std::vector<int32_t>& nodes) const {
    return std::any_of(nodes.begin(), nodes.end(), [&](int32_t n) { return pos_[n] == kJoin; });
  }

  // The node for the union of *stacks (sorted here, each once) where it is known: one stack, or
  // a set made before. A set with joins among it is remembered as asked for as well as
  // flattened, so a merge met again costs its stacks, not their joins' members; one without is
  // its own flattening. Else kUnknown, and the flattened set pushed onto *todo; -1 past the
  // bounds.
  static constexpr int32_t kUnknown = -3;
  int32_t Known(std::vector<int32_t>* stacks, std::vector<std::vector<int32_t>>* todo) {
    std::sort(stacks->begin(), stacks->end());
    stacks->erase(std::unique(stacks->begin(), stacks->end()), stacks->end());
    if (stacks->size() == 1) return stacks->front();
    if (!HasJoin(*stacks)) {  // its own flattening (the lookup costs what the caller paid)
      if (auto found = join_index_.find(*stacks); found != join_index_.end()) return found->second;
      todo->push_back(*stacks);
      return kUnknown;
    }
    if (auto found = union_index_.find(*stacks); found != union_index_.end()) return found->second;
    std::vector<int32_t> flat = *stacks;
    if (!Flatten(&flat)) return -1;
    int32_t u = flat.size() == 1 ? flat[0] : kUnknown;
    if (u == kUnknown) {
      if (auto found = join_index_.find(flat); found != join_index_.end()) u = found->second;
    }
    if (u == kUnknown) {
      todo->push_back(std::move(flat));
    } else {
      union_index_.try_emplace(*stacks, u);
    }
    return u;
  }

  // Each join in *nodes replaced by its members; sorted, each once. Costs what it touches;
  // false past the work bound.
  bool Flatten(std::vector<int32_t>* nodes) {
    ++flat_epoch_;
    flat_.clear();
    size_t touched = nodes->size();
    auto add = [&](int32_t node) {
      if (flat_mark_[node] == flat_epoch_) return;
      flat_mark_[node] = flat_epoch_;
      flat_.push_back(node);
    };
    for (int32_t node : *nodes) {
      if (pos_[node] != kJoin) {
        add(node);
        continue;
      }
      const auto [begin, end] = Under(node);
      touched += size_t(end - begin);
      for (const int32_t* m = begin; m != end; ++m) add(*m);
    }
    std::sort(flat_.begin(), flat_.end());
    nodes->swap(flat_);
    return Spend(int64_t(touched));
  }

  // The stack once the top of `node` has been read: the next element of its alternative over
  // the same stack, or at the alternative's end the stack below.
  int32_t After(int32_t node) {
    const int32_t next = pos_[node] + 1;
    return g_.elements[next].kind == GrammarElement::kEnd ? parent_[node]
                                                          : Node(next, parent_[node]);
  }

  // The stacks work_'s reach with a class (or nothing) on top, into *out: a rule on top
  // becomes each of its alternatives. false past the bounds.
  bool Expand(std::vector<int32_t>* out) {
    out->clear();
    ++epoch_;
    while (!work_.empty()) {
      const int32_t node = work_.back();
      work_.pop_back();
      if (node < 0 || !Spend(1)) return false;
      if (mark_[node] == epoch_) continue;
      mark_[node] = epoch_;
      if (node == kEmpty || (pos_[node] >= 0 &&
                             g_.elements[pos_[node]].kind == GrammarElement::kClass)) {
        out->push_back(node);
        continue;
      }
      if (pos_[node] == kJoin) {
        const auto [begin, end] = Under(node);
        work_.insert(work_.end(), begin, end);
        continue;
      }
      const int32_t then = After(node);
      if (then < 0) return false;
      for (int32_t a : g_.rules[g_.elements[pos_[node]].value]) {
        work_.push_back(g_.elements[a].kind == GrammarElement::kEnd ? then : Node(a, then));
      }
    }
    return Merge(out);
  }

  // The state after the character `cp` (its last byte read). A walk meets the same stacks under
  // many prefixes (a string's, after any of its characters): each set of stacks is numbered as
  // met and its moves by character remembered (ASCII in a row per set, others in a map), so a
  // step met again is a lookup and a copy, where Advance would look up every stack's move and
  // merge them.
  bool Step(const State& s, uint32_t cp, State* out) {
    const int32_t set = s.set >= 0 ? s.set : Number(s.stacks);
    if (set < 0) return Advance(s.stacks, cp, out);
    const bool ascii = cp < 128;
    int32_t to = kUnknownMove;
    if (ascii) {
      to = set_moves_[set][cp];
    } else if (auto found = set_wide_moves_.find(uint64_t(set) << 21 | cp);
               found != set_wide_moves_.end()) {
      to = found->second;
    }
    if (to == kDeadMove) return false;
    if (to == kUnknownMove) {
      const bool moved = Advance(s.stacks, cp, out);
      if (!moved && exceeded_) return false;  // past the bounds: not the grammar's answer
      to = moved ? Number(out->stacks) : kDeadMove;
      if (to == -1 && moved) return true;  // too many sets: this move is Advance's each time
      if (ascii) {
        set_moves_[set][cp] = to;
      } else if (set_wide_moves_.size() < kMaxNumberedSets * 8) {
        set_wide_moves_.emplace(uint64_t(set) << 21 | cp, to);
      }
      out->set = moved ? to : -1;
      return moved;
    }
    // A copy of a set costs a step per 64 stacks (a memcpy, where Advance touches each).
    if (!Spend(int64_t(sets_[to].size() / 64))) return false;
    out->stacks = sets_[to];
    BetweenCharacters(to, out);
    return true;
  }

  // *out's character read whole (none owed), its stacks numbered `set` (or -1).
  static void BetweenCharacters(int32_t set, State* out) {
    out->partial = 0;
    out->owed = 0;
    out->lo = 0x80;
    out->hi = 0xBF;
    out->set = set;
  }

  // The number of the set `stacks` (as ordered), made on first meeting; -1 for one stack (its
  // moves are remembered by Move already) and past kMaxNumberedSets or kMaxNumberedStacks (then
  // the steps are Advance's).
  static constexpr int32_t kUnknownMove = -2, kDeadMove = -1;
  int32_t Number(const std::vector<int32_t>& stacks) {
    if (stacks.size() < 2 || sets_.size() >= kMaxNumberedSets) return -1;  // not looked up
    if (auto found = set_index_.find(stacks); found != set_index_.end()) return found->second;
    if (numbered_stacks_ + stacks.size() > kMaxNumberedStacks) return -1;
    numbered_stacks_ += stacks.size();
    const int32_t set = int32_t(sets_.size());
    set_index_.emplace(stacks, set);
    sets_.push_back(stacks);
    set_moves_.emplace_back();
    set_moves_.back().fill(kUnknownMove);
    return set;
  }

  // The stacks after the character `cp` (merged: Merge); false when none takes it.
  // Each stack's moves are remembered (a walk meets the same stacks under many prefixes: a
  // string's, after any of its characters), so the stacks are the union of theirs. Many stacks
  // (an ambiguous grammar's) are moved together instead: their expansions share one visit of
  // each node, where apart each would walk what the others walk too.
  bool Advance(const std::vector<int32_t>& stacks, uint32_t cp, State* out) {
    BetweenCharacters(-1, out);
    if (!Spend(int64_t(stacks.size()))) return false;
    if (stacks.size() > kMaxRememberedStacks) {
      work_.clear();
      for (int32_t node : stacks) {
        if (node == kEmpty) continue;
        if (g_.classes[g_.elements[pos_[node]].value].Contains(cp)) work_.push_back(After(node));
      }
      return Expand(&out->stacks) && !out->stacks.empty();
    }
    ranges_.clear();
    for (int32_t node : stacks) {
      if (node == kEmpty) continue;
      const auto range = Move(node, cp);
      if (range.first < 0) return false;
      if (range.first < range.second) ranges_.push_back(range);
    }
    out->stacks.clear();
    if (ranges_.size() == 1) {
      out->stacks.assign(moved_.begin() + ranges_[0].first, moved_.begin() + ranges_[0].second);
      return true;
    }
    ++epoch_;
    for (const auto& [begin, end] : ranges_) {
      if (!Spend(end - begin)) return false;
      for (int32_t i = begin; i < end; ++i) {
        const int32_t node = moved_[i];
        if (mark_[node] == epoch_) continue;
        mark_[node] = epoch_;
        out->stacks.push_back(node);
      }
    }
    return !out->stacks.empty() && Merge(&out->stacks);
  }

  // The stacks `node` becomes once its top reads `cp` (none where the top does not take it),
  // as [begin, end) of moved_; begin -1 past the bounds. ASCII moves of the first nodes met sit
  // in a table by node (no hashing: most of a walk's steps), the others in a map.
  std::pair<int32_t, int32_t> Move(int32_t node, uint32_t cp) {
    const uint64_t key = uint64_t(node) << 21 | cp;  // code points < 2^21
    int32_t row = -1;
    if (cp < 128) {
      row = ascii_row_[node];
      if (row < 0 && ascii_moves_.size() < kMaxAsciiRows) {
        row = ascii_row_[node] = int32_t(ascii_moves_.size());
        ascii_moves_.emplace_back();
        ascii_moves_.back().fill({-2, -2});  // not yet known
      }
    }
    if (row >= 0) {
      if (ascii_moves_[row][cp].first != -2) return ascii_moves_[row][cp];
    } else if (auto it = moves_.find(key); it != moves_.end()) {
      return it->second;
    }
    std::pair<int32_t, int32_t> range(int32_t(moved_.size()), int32_t(moved_.size()));
    if (g_.classes[g_.elements[pos_[node]].value].Contains(cp)) {
      work_.clear();
      work_.push_back(After(node));
      if (!Expand(&expanded_) || !Spend(int64_t(expanded_.size()))) return {-1, -1};
      moved_.insert(moved_.end(), expanded_.begin(), expanded_.end());
      range.second = int32_t(moved_.size());
    }
    if (row >= 0) {
      ascii_moves_[row][cp] = range;
    } else {
      moves_.emplace(key, range);
    }
    return range;
  }

  bool Spend(int64_t work) {
    work_done_ += work;
    if (work_done_ > work_limit_) exceeded_ = true;
    return !exceeded_;
  }

  // Some stack takes a character in [lo, hi].
  bool AnyTakes(const std::vector<int32_t>& stacks, uint32_t lo, uint32_t hi) {
    if (!Spend(int64_t(stacks.size()))) return false;
    for (int32_t node : stacks) {
      if (node != kEmpty && g_.classes[g_.elements[pos_[node]].value].Overlaps(lo, hi)) {
        return true;
      }
    }
    return false;
  }

  const Grammar& g_;
  std::vector<int32_t> pos_;     // [node]: its top, or kJoin
  std::vector<int32_t> parent_;  // [node]: the stack under it, or a join's index in joins_
  std::vector<uint32_t> mark_;   // [node]: the Expand that reached it last
  uint32_t epoch_ = 0;
  std::vector<uint32_t> flat_mark_;  // [node]: the Flatten that met it last
  uint32_t flat_epoch_ = 0;
  std::vector<int32_t> flat_;        // one Flatten's
  absl::flat_hash_map<uint64_t, int32_t> index_;  // (pos, parent) -> node
  std::vector<std::vector<int32_t>> joins_;        // [join]: its members, sorted
  absl::flat_hash_map<std::vector<int32_t>, int32_t> join_index_;  // members -> node
  // The stacks a Union was asked for (joins among them) -> node, once found.
  absl::flat_hash_map<std::vector<int32_t>, int32_t> union_index_;
  Grouped grouped_;                 // one Merge's
  std::vector<std::pair<int32_t, int32_t>> by_top_;  // one GroupByTop's (top, node)
  std::vector<uint32_t> top_mark_;  // [top + 1]: the GroupByTop pass that met it last
  std::vector<uint32_t> top_count_;  // [top + 1]: its nodes, then its group's index
  uint32_t top_epoch_ = 0;
  std::vector<int32_t> work_;
  std::vector<int32_t> expanded_;
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> moves_;  // (node, cp) -> moved_
  static constexpr size_t kMaxAsciiRows = 1024;  // 1 KiB each
  std::vector<int32_t> ascii_row_;                // [node]: its row of ascii_moves_, or -1
  std::vector<std::array<std::pair<int32_t, int32_t>, 128>> ascii_moves_;  // [row][cp]
  std::vector<int32_t> moved_;
  std::vector<std::pair<int32_t, int32_t>> ranges_;  // one Advance's
  absl::flat_hash_map<std::vector<int32_t>, int32_t> set_index_;  // stacks -> their number
  std::vector<std::vector<int32_t>> sets_;                         // [number]: the stacks
  std::vector<std::array<int32_t, 128>> set_moves_;  // [number][byte]: a number, or k*Move
  absl::flat_hash_map<uint64_t, int32_t> set_wide_moves_;  // (number, cp >= 128) -> the same
  size_t numbered_stacks_ = 0;                             // in sets_, in all
  int64_t work_done_ = 0;
  int64_t work_limit_ = kMaxGrammarWork;  // less while Compile checks widths
  bool exceeded_ = false;
};

absl::StatusOr<std::shared_ptr<const GrammarGuide>> GrammarGuide::Compile(std::string_view text,
                                                                       size_t max_bytes) {
  auto grammar = ParseGrammar(text, max_bytes);
  if (!grammar.ok()) return grammar.status();
  FactorAlternatives(&*grammar);
  auto guide = std::shared_ptr<GrammarGuide>(new GrammarGuide(std::move(*grammar)));
  const Grammar& g = guide->grammar_;
  auto too_wide = [&g](int32_t rule) {
    // A rule made inside another (a group, a repetition, a factored tail) is named by it.
    const std::string& name = g.names[rule];
    return absl::InvalidArgumentError(absl::StrCat(
        "guided_grammar: rule '", name.substr(0, name.find('#')), "' can begin more than ",
        kMaxGrammarStacks, " ways at once (alternatives that begin with different characters "
        "or rules, and those of the rules they begin with): the guide follows at most ",
        kMaxGrammarStacks, " parses open at once, so once in it nothing could follow"));
  };
  Parse parse(g);
  int64_t budget = kMaxGrammarWork / 20;  // the widths' checks, in all
  if (const int32_t rule = parse.TooWideRule(&budget); rule >= 0) return too_wide(rule);
  Parse::State start;
  if (!parse.Start(&start)) {
    if (parse.exceeded()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "guided_grammar: the grammar's start is past the guide's bounds (", kMaxGrammarNodes,
          " stack nodes, ", kMaxJoinMembers, " stacks under one top, ", kMaxGrammarWork,
          " steps of work to open it)"));
    }
    return too_wide(parse.Widest(g.root, &budget));
  }
  return std::shared_ptr<const GrammarGuide>(std::move(guide));
}

bool GrammarGuide::StateAfter(std::string_view so_far, Parse* parse, ParseState* state,
                              std::string* key) const {
  bool seen = false;
  size_t from = 0;
  {
    absl::MutexLock lock(&seen_mu_);
    for (const Seen& s : seen_) {
      if ((!seen || s.text.size() > from) && so_far.starts_with(s.text)) {
        seen = true;
        from = s.text.size();
        *key = s.key;
      }
    }
  }
  if (!(seen ? parse->Restore(*key, state) : parse->Start(state)) ||
      !parse->Read(so_far.substr(from), state)) {
    return false;
  }
  if (seen && from == so_far.size()) return true;
  *key = parse->Key(*state, kMaxGrammarSeenBytes);
  if (key->empty() || so_far.size() + key->size() > kMaxGrammarSeenBytes) return true;
  absl::MutexLock lock(&seen_mu_);
  // The output this one grew from gives way to it (one entry per output being written), then
  // the oldest to the bounds.
  for (auto it = seen_.begin(); it != seen_.end();) {
    if (so_far.starts_with(it->text)) {
      seen_bytes_ -= it->text.size() + it->key.size();
      it = seen_.erase(it);
    } else {
      ++it;
    }
  }
  seen_.push_back({std::string(so_far), *key});
  seen_bytes_ += so_far.size() + key->size();
  while (seen_.size() > size_t(kMaxGrammarSeen) || seen_bytes_ > kMaxGrammarSeenBytes) {
    seen_bytes_ -= seen_.front().text.size() + seen_.front().key.size();
    seen_.erase(seen_.begin());
  }
  return true;
}

void GrammarGuide::Allowed(std::string_view so_far, const TokenBytesIndex& vocab,
                           std::vector<int32_t>* allowed) const {
  allowed->clear();
  Parse parse(grammar_);
  Parse::State state;
  std::string key;
  if (!StateAfter(so_far, &parse, &state, &key) || Parse::Ended(state)) return;
  // Between first bytes the walk frees the nodes it made past kResetNodes (a grammar that
  // makes nodes at every character would reach kMaxGrammarNodes within one walk), and makes
  // the start again from its key, whatever its size.
  const std::string restore = key.empty() ? parse.Key(state, SIZE_MAX) : key;
  auto walk = [&](std::vector<int32_t>* ids) {
    ids->clear();
    parse.RestartWork();
    vocab.Walk(
        state,
        [&parse](const Parse::State& s, uint8_t b, Parse::State* next) {
          return parse.Next(s, b, next);
        },
        ids,
        [&](Parse::State* start) {
          if (parse.nodes() < kResetNodes) return;
          parse.Reset();
          if (!parse.Restore(restore, start)) start->stacks.clear();
        });
    vocab.SortIds(ids);
    return !parse.exceeded();  // else only some of them: not remembered
  };
  if (key.empty() || key.size() > kMaxCachedKeyBytes) {
    walk(allowed);
    return;
  }
  cache_.Allowed(vocab, key, walk, allowed);
}

bool GrammarGuide::Accepts(std::string_view so_far) const {
  Parse parse(grammar_);
  Parse::State state;
  std::string key;
  return StateAfter(so_far, &parse, &state, &key) && Parse::Whole(state);
}

bool GrammarGuide::LeadsOn(std::string_view so_far) const {
  Parse parse(grammar_);
  Parse::State state;
  std::string key;
  return StateAfter(so_far, &parse, &state, &key);
}

bool GrammarGuide::Complete(std::string_view so_far) const {
  Parse parse(grammar_);
  Parse::State state;
  std::string key;
  return StateAfter(so_far, &parse, &state, &key) && Parse::Ended(state);
}

}  // namespace thetaserve::scheduler
