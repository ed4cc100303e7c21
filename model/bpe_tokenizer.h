// The Tokenizer implementation behind both loaders: HF's pipeline of added-token split,
// normalizer, pre-tokenizer, BPE model and decoder, configured by a TokenizerSpec.
// Thread-safe: Encode may run concurrently (the word cache has its own lock).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "model/tokenizer.h"
#include "model/tokenizer_added_tokens.h"
#include "model/tokenizer_bpe_model.h"
#include "model/tokenizer_spec.h"

namespace thetaserve::model {

class BpeTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Create(TokenizerSpec spec);

  std::vector<int32_t> Encode(std::string_view text, bool add_bos = true,
                              bool parse_special = true) const override;
  std::string TokenBytes(int32_t id) const override;

 protected:
  std::string DecodeIds(const std::vector<int32_t>& ids) const override;
  std::string StreamBytes(int32_t id, bool first) const override;

 private:
  explicit BpeTokenizer(TokenizerSpec spec);
  // Normalizes, pre-tokenizes and encodes one stretch of text between added tokens.
  void EncodeSegment(std::string_view text, bool at_start, bool parse_special,
                     std::vector<int32_t>* out) const;
  std::string Normalize(std::string_view text) const;
  // Splits normalized text into words and encodes each; `at_start` when the text begins at
  // offset 0 of the input (HF Metaspace prepend_scheme "first").
  void PreTokenizeAndEncode(std::string_view text, bool at_start,
                            std::vector<int32_t>* out) const;
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  // The string HF's decoder chain starts from for `id` (the piece, or for byte-level
  // plain-text pieces the text re-mapped so the ByteLevel step returns it unchanged).
  std::string DecoderInput(int32_t id) const;
  // Runs the decoder steps over token strings (HF Decoder::decode_chain, then join).
  std::string RunDecoder(std::vector<std::string> tokens) const;

  // Normalizer, pre-tokenizer and decoder steps (pieces, scores and merges are released
  // once model_ and pieces_ are built).
  TokenizerSpec spec_;
  BpeModel model_;
  AddedTokenMatcher raw_added_;         // matched in the input text
  AddedTokenMatcher normalized_added_;  // matched in normalized text

  // Word -> ids for short words; cleared when it grows past kMaxCacheEntries.
  static constexpr size_t kMaxCacheEntries = 1 << 16;
  static constexpr size_t kMaxCachedWordBytes = 64;
  mutable std::mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_;  // guarded by cache_mu_
};

}  // namespace thetaserve::model
