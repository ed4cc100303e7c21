// The one description both tokenizer loaders (GGUF metadata, tokenizer.json) fill in, and
// the factory that turns it into a Tokenizer. Tests build tiny vocabularies with it.
// Internal to model/: callers outside use Tokenizer::FromGguf / FromTokenizerJson.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/tokenizer.h"
#include "model/tokenizer_pretokenize.h"

namespace thetaserve::model {

// How symbols are merged.
enum class MergeAlgorithm {
  // HF tokenizers BPE: lowest merge rank first, leftmost on ties.
  kRanks,
  // llama.cpp llm_tokenizer_spm: the adjacent pair whose concatenation is a token with the
  // highest score first, leftmost on ties (GGUF tokenizer.ggml.model == "llama").
  kScores,
};

// An HF "added token" (GGUF: control / user-defined / unknown tokens): matched in the raw
// text before normalization and pre-tokenization.
struct AddedTokenSpec {
  int32_t id = -1;
  std::string content;
  bool special = true;       // matched only when parse_special; skipped by skip_special
  bool lstrip = false;       // swallows whitespace on its left
  bool rstrip = false;       // swallows whitespace on its right
  bool single_word = false;  // only matched when not inside a word
  bool normalized = false;   // matched against normalized text (content normalized too)
};

// HF normalizers (applied in order to each piece of text between added tokens).
struct NormalizerStep {
  enum class Kind { kPrepend, kReplace } kind = Kind::kReplace;
  std::string pattern;  // kReplace: the literal string replaced
  std::string content;  // kPrepend: prefix; kReplace: replacement
};

enum class PrependScheme { kNever, kFirst, kAlways };

// HF pre-tokenizers (applied in order; each splits every piece further).
struct PreTokenizerStep {
  enum class Kind { kDigits, kSplit, kByteLevel, kMetaspace };
  PreTokenizerStep() = default;
  explicit PreTokenizerStep(Kind k) : kind(k) {}

  Kind kind = Kind::kByteLevel;
  bool individual_digits = false;         // kDigits
  SplitRegex regex = SplitRegex::kGpt2;   // kSplit; kByteLevel when use_regex
  bool use_regex = true;                  // kByteLevel
  bool add_prefix_space = false;          // kByteLevel
  std::string replacement = "\xE2\x96\x81";  // kMetaspace ("▁")
  PrependScheme prepend_scheme = PrependScheme::kAlways;  // kMetaspace
  bool split = true;                                      // kMetaspace
};

// HF decoders, applied in order to the list of token strings.
struct DecoderStep {
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  DecoderStep() = default;
  explicit DecoderStep(Kind k) : kind(k) {}

  Kind kind = Kind::kByteLevel;
  std::string pattern;  // kReplace: literal pattern; kStrip: the character; kMetaspace: marker
  std::string content;  // kReplace: replacement
  int start = 0;        // kStrip: characters removed at the start of each string
  int stop = 0;         // kStrip: ... and at the end
  PrependScheme prepend_scheme = PrependScheme::kAlways;  // kMetaspace
};

struct TokenizerSpec {
  MergeAlgorithm merge_algorithm = MergeAlgorithm::kRanks;
  // [vocab] id -> piece as stored; "" for unused ids and for ids that only an added token
  // has (HF: not in the model's vocab), whose piece becomes the token's content (normalized
  // when the token is).
  std::vector<std::string> pieces;
  std::vector<float> scores;        // [vocab] kScores only
  std::vector<std::pair<std::string, std::string>> merges;  // kRanks: rank = index
  // [vocab] or empty: 1 where a piece is plain text even in a byte-level vocabulary (GGUF
  // stores control and user-defined tokens that way).
  std::vector<uint8_t> raw_pieces;
  bool byte_level = false;     // the model sees GPT-2 byte-mapped text (a ByteLevel step)
  bool byte_fallback = false;  // characters missing from the vocab become <0xXX> tokens
  bool fuse_unk = false;
  bool ignore_merges = false;  // a word that is itself a token skips merging (Llama 3)
  int32_t unk_id = -1;
  std::vector<AddedTokenSpec> added_tokens;
  std::vector<NormalizerStep> normalizer;
  std::vector<PreTokenizerStep> pre_tokenizer;
  std::vector<DecoderStep> decoder;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  bool add_bos = false;
  std::vector<int32_t> extra_stop_ids;  // e.g. GGUF tokenizer.ggml.eot_token_id
  std::string chat_template;
};

// Validates the spec (ids in range, byte-level vocab complete, ...) and builds the
// tokenizer. Merges naming pieces that are not in the vocabulary are skipped.
absl::StatusOr<std::unique_ptr<Tokenizer>> BuildTokenizer(TokenizerSpec spec);

}  // namespace thetaserve::model
