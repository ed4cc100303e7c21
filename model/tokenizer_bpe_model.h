// The BPE model: one pre-tokenized word in, token ids out. Two merge orders: HF tokenizers'
// rank-based merges (byte-level and byte-fallback vocabularies from tokenizer.json or GGUF
// "gpt2") and llama.cpp's score-based SentencePiece merges (GGUF "llama").
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "model/tokenizer_spec.h"

namespace thetaserve::model {

class BpeModel {
 public:
  // `spec.pieces` etc. as documented in tokenizer_spec.h. Thread-safe after construction.
  explicit BpeModel(const TokenizerSpec& spec);

  // Appends the ids of `word`: raw bytes when byte-level (mapped through GPT-2's table
  // implicitly), the normalized text otherwise.
  void Encode(std::string_view word, std::vector<int32_t>* out) const;

  // Number of merges that were usable (both sides and the result in the vocabulary).
  size_t num_merges() const { return merges_.size(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  struct Symbol {
    int32_t id;     // kRanks: token id
    int32_t prev;   // index of the previous live symbol, -1 at the start
    int32_t next;   // index of the next live symbol, -1 at the end
    uint32_t start; // byte offset in the word
    uint32_t len;   // bytes; 0 once merged into its left neighbour
  };

  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  int32_t Lookup(std::string_view s) const;
  void InitSymbols(std::string_view word, std::vector<Symbol>* symbols) const;
  void MergeByRank(std::vector<Symbol>* symbols) const;
  void EncodeByScore(std::string_view word, std::vector<int32_t>* out) const;
  void AppendBytes(std::string_view bytes, std::vector<int32_t>* out) const;

  MergeAlgorithm algorithm_;
  bool byte_level_;
  bool byte_fallback_;
  bool fuse_unk_;
  bool ignore_merges_;
  int32_t unk_id_;
  // Model-input form -> id: the raw bytes of each piece when byte-level, else the piece.
  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<uint64_t, Merge> merges_;  // (left id, right id) -> merge
  std::vector<float> scores_;                    // [vocab] kScores
  std::array<int32_t, 256> byte_char_ids_;       // byte-level: id of the byte's character
  std::array<int32_t, 256> byte_fallback_ids_;   // id of "<0xXX>", -1 if absent
};

}  // namespace thetaserve::model
