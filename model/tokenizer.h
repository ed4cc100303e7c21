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

// Thread-safe: every const method may run concurrently (Encode shares a locked word cache).
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
  // The bytes `id` adds to decoded text (StreamDecoder's): TokenBytes, except that an SPM
  // model's first token of a text drops the leading space its encoder added (`first`).
  std::string TextBytes(int32_t id, bool first) const { return StreamBytes(id, first); }
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
  // The text contains BOS when the template writes it: encode it with add_bos = false
  // (and parse_special = true), as HF apply_chat_template(tokenize=True) does. An empty
  // template falls back to ChatML when the vocabulary has <|im_start|>/<|im_end|>; any
  // other template fails with InvalidArgument naming the supported families.
  // continue_final_message (with add_generation_prompt false): the text ends right after the
  // last message's content (its end-of-turn cut off), so that generation continues it, as
  // transformers' apply_chat_template(continue_final_message=True).
  absl::StatusOr<std::string> ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                                                bool add_generation_prompt = true,
                                                bool continue_final_message = false) const;
  const std::string& chat_template() const { return chat_template_; }

  // The id whose piece is exactly `piece`, or -1 (linear scan; for setup, not hot paths).
  int32_t PieceToId(std::string_view piece) const;

 protected:
  friend class StreamDecoder;
  // Joins the pieces of `ids` (special tokens already filtered) through the decoder, like
  // HF Tokenizer.decode.
  virtual std::string DecodeIds(const std::vector<int32_t>& ids) const = 0;
  // The bytes `id` adds to a stream of decoded text; `first` when it is the first token
  // decoded (SPM decoders drop the space that the encoder's prefix added).
  virtual std::string StreamBytes(int32_t id, bool first) const { return TokenBytes(id); }

  std::vector<std::string> pieces_;      // id -> vocabulary string as stored
  std::vector<uint8_t> special_;         // id -> 1 for control/special tokens
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  std::vector<int32_t> stop_ids_;
  bool add_bos_ = false;
  std::string chat_template_;

 private:
  // ApplyChatTemplate's rendering, by the template's family.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt) const;
};

// Turns a stream of token ids into text deltas; bytes of a UTF-8 character split across
// tokens are held back until the character is complete. The deltas concatenate to
// Decode(ids, skip_special) (for well-formed UTF-8; ill-formed bytes become U+FFFD per
// maximal ill-formed subsequence), so an SPM model's first token loses its leading space
// like in HF decode of the generated ids, and later tokens keep theirs. Not thread-safe.
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
  bool first_ = true;    // no token has been decoded yet
  std::string pending_;  // bytes of an incomplete UTF-8 character
};

}  // namespace thetaserve::model
