// Tokenizers: byte-level BPE (GPT-2 style; SmolLM2, Llama 3, Qwen2) and SentencePiece-style
// BPE with byte fallback (Llama 2, Mistral, TinyLlama), from GGUF metadata or tokenizer.json.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace thetaserve::model {

class GgufFile;

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& gguf);
  // `tokenizer_config_json` may be empty; when present it supplies BOS/EOS choices and the
  // chat template the way HF transformers reads them.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromTokenizerJson(
      const std::string& tokenizer_json, const std::string& tokenizer_config_json);

  // Text to ids. Special tokens written in the text (e.g. "<|im_start|>") become their ids
  // when `parse_special`; BOS is prepended when `add_bos` and the model asks for it.
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_bos = true,
                                      bool parse_special = true) const = 0;
  // The raw bytes of one token (byte-level and byte-fallback pieces decoded to bytes).
  virtual std::string TokenBytes(int32_t id) const = 0;
  // Ids to text; special tokens are rendered unless `skip_special`.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int64_t vocab_size() const { return static_cast<int64_t>(pieces_.size()); }
  const std::string& Piece(int32_t id) const { return pieces_[id]; }
  bool IsSpecial(int32_t id) const;
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  // Ids that end generation: EOS plus the chat template's end-of-turn token (e.g. <|im_end|>).
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  bool add_bos() const { return add_bos_; }

  // Renders the conversation with the model's chat template. Known families (ChatML,
  // Llama 2 [INST], Llama 3 headers, Mistral) are recognised from the template text.
  absl::StatusOr<std::string> ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                                                bool add_generation_prompt = true) const;

 protected:
  std::vector<std::string> pieces_;      // id -> vocabulary string as stored
  std::vector<uint8_t> special_;         // id -> 1 for control/special tokens
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  std::vector<int32_t> stop_ids_;
  bool add_bos_ = false;
  std::string chat_template_;
};

// Turns a stream of token ids into text deltas; bytes of a UTF-8 character split across
// tokens are held back until the character is complete.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = true)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  std::string Push(int32_t id);
  // Whatever is still held back (an incomplete character becomes U+FFFD).
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace thetaserve::model
