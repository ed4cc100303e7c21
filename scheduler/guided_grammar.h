// vLLM's guided_grammar (structured_outputs.grammar): the whole output is text a GBNF grammar
// (grammar_syntax.h) matches. The parse is the set of its possible stacks, as llama.cpp's
// grammar sampler keeps them: each stack the rule positions still to be read, its top a
// character class; a character moves every stack whose top takes it and drops the others. Stacks
// share their tails (one node per position and the stack under it, each node made once), and
// stacks with the same top are one, over the join of the stacks under them (a graph-structured
// stack): alternatives that part and then read the same thing (a rule that nests) keep one
// stack per top, where apart they would double at every level. A copy of the parse is a short
// list of node ids, cheap enough to take at every byte of the vocabulary walk
// (guided_choice.h's TokenBytesIndex::Walk). Bytes are read as UTF-8: a
// character split across tokens is let through only where some character the stacks take
// begins with the bytes so far.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "scheduler/grammar_syntax.h"
#include "scheduler/guide_cache.h"
#include "scheduler/guided_choice.h"

namespace thetaserve::scheduler {

// Stacks open at once, those with the same top joined. A rule that would open more as it begins
// (more alternatives than this, each beginning its own way) is refused at Compile; at run time
// a token that would open more (parses begun apart, each opening its own) is not let through.
constexpr int kMaxGrammarStacks = 1024;
// What one call (a step's Allowed, Accepts or Complete) may spend: stack nodes held at once
// (a vocabulary walk frees them between first bytes) and work (stack nodes expanded and
// copied). Past either the call stops: the tokens found so far are the step's (not
// remembered), a text not yet read through does not lead on. No grammar a person writes comes
// near them; a grammar built to be ambiguous (a thousand alternatives alike) does.
constexpr int kMaxGrammarNodes = 1 << 20;
constexpr int64_t kMaxGrammarWork = 20000000;
// Outputs whose parse a guide remembers (newest first), and their bytes in all.
constexpr int kMaxGrammarSeen = 16;
constexpr size_t kMaxGrammarSeenBytes = 256 << 10;

class GrammarGuide : public Guide {
 public:
  // Parses the grammar (errors begin "guided_grammar: ") and factors its alternatives
  // (FactorAlternatives); `max_bytes` as ParseGrammar's.
  static absl::StatusOr<std::shared_ptr<const GrammarGuide>> Compile(
      std::string_view text, size_t max_bytes = kMaxGrammarBytes);

  void Allowed(std::string_view so_far, const TokenBytesIndex& vocab,
               std::vector<int32_t>* allowed) const override;
  bool Accepts(std::string_view so_far) const override;
  bool Complete(std::string_view so_far) const override;
  // Some text of the grammar begins with `so_far` (a cut output's check).
  bool LeadsOn(std::string_view so_far) const;

  const Grammar& grammar() const { return grammar_; }  // as factored

 private:
  class Parse;
  explicit GrammarGuide(Grammar grammar) : grammar_(std::move(grammar)) {}

  struct ParseState;
  // The state after `so_far` into *state (of `parse`) and its key (Parse::Key): from the longest
  // output seen whose bytes begin so_far, reading only the bytes after it; false where so_far
  // leaves the grammar.
  bool StateAfter(std::string_view so_far, Parse* parse, ParseState* state,
                  std::string* key) const;

  Grammar grammar_;
  GuideCache<std::string> cache_;  // next tokens by the parse's stacks
  // Outputs read before and their parses' keys (Parse::Key): a step's Allowed, Accepts and
  // Complete, and the next step's, read each output's bytes once, not once each from the
  // start. Shared by a call's completions and the sampling threads, so locked.
  struct Seen {
    std::string text;
    std::string key;
  };
  mutable absl::Mutex seen_mu_;
  mutable std::vector<Seen> seen_ ABSL_GUARDED_BY(seen_mu_);
  mutable size_t seen_bytes_ ABSL_GUARDED_BY(seen_mu_) = 0;
};

}  // namespace thetaserve::scheduler
