// Tokenizer::FromGguf: llama.cpp's tokenizer.ggml.* metadata to a TokenizerSpec.
// Kept apart from the rest of the tokenizer so that only users of FromGguf link GgufFile.
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/tokenizer_spec.h"

namespace thetaserve::model {
namespace {

// llama.cpp token types (tokenizer.ggml.token_type).
constexpr int64_t kTypeUnknown = 2;
constexpr int64_t kTypeControl = 3;
constexpr int64_t kTypeUserDefined = 4;

struct PreTokenizerChoice {
  std::vector<PreTokenizerStep> steps;
  bool ignore_merges = false;
  bool add_bos = false;  // llama.cpp's default before tokenizer.ggml.add_bos_token
};

// tokenizer.ggml.pre -> HF pre-tokenizer steps (the regexes llama.cpp uses for that name).
absl::StatusOr<PreTokenizerChoice> ChoosePreTokenizer(const std::string& pre) {
  PreTokenizerChoice c;
  PreTokenizerStep byte_level(PreTokenizerStep::Kind::kByteLevel);
  if (pre == "default" || pre == "gpt2" || pre == "gpt-2" || pre == "phi-2" ||
      pre == "roberta-bpe") {
    c.steps = {byte_level};
  } else if (pre == "smollm" || pre == "starcoder" || pre == "refact") {
    PreTokenizerStep digits(PreTokenizerStep::Kind::kDigits);
    digits.individual_digits = true;
    c.steps = {digits, byte_level};
  } else if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "qwen2" ||
             pre == "deepseek-r1-qwen") {
    const bool qwen = pre == "qwen2" || pre == "deepseek-r1-qwen";
    PreTokenizerStep split(PreTokenizerStep::Kind::kSplit);
    split.regex = qwen ? SplitRegex::kQwen2 : SplitRegex::kLlama3;
    byte_level.use_regex = false;
    c.steps = {split, byte_level};
    c.ignore_merges = !qwen;
    c.add_bos = !qwen;
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "tokenizer.ggml.pre '", pre,
        "' is not supported; supported: default/gpt2, smollm, starcoder, refact, llama3, "
        "llama-bpe, qwen2"));
  }
  return c;
}

template <typename T>
T ValueOr(const absl::StatusOr<T>& v, T fallback) {
  return v.ok() ? *v : fallback;
}

absl::StatusOr<TokenizerSpec> SpecFromGguf(const GgufFile& gguf) {
  TokenizerSpec spec;
  const absl::StatusOr<std::string> model = gguf.GetString("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  absl::StatusOr<std::vector<std::string>> tokens = gguf.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  spec.pieces = std::move(*tokens);
  const size_t n = spec.pieces.size();

  std::vector<int64_t> types(n, 1);
  if (gguf.Has("tokenizer.ggml.token_type")) {
    absl::StatusOr<std::vector<int64_t>> t = gguf.GetIntArray("tokenizer.ggml.token_type");
    if (!t.ok()) return t.status();
    if (t->size() != n) {
      return absl::InvalidArgumentError(absl::StrCat(gguf.path(), ": tokenizer.ggml.token_type has ",
                                                     t->size(), " entries for ", n, " tokens"));
    }
    types = std::move(*t);
  }

  const bool spm = *model == "llama";
  if (spm) {
    spec.merge_algorithm = MergeAlgorithm::kScores;
    spec.scores.assign(n, 0.0f);
    if (gguf.Has("tokenizer.ggml.scores")) {
      absl::StatusOr<std::vector<double>> s = gguf.GetFloatArray("tokenizer.ggml.scores");
      if (!s.ok()) return s.status();
      if (s->size() != n) {
        return absl::InvalidArgumentError(absl::StrCat(gguf.path(), ": tokenizer.ggml.scores has ",
                                                       s->size(), " entries for ", n, " tokens"));
      }
      for (size_t i = 0; i < n; ++i) spec.scores[i] = static_cast<float>((*s)[i]);
    }
    spec.byte_fallback = true;
    const bool add_space_prefix =
        ValueOr(gguf.GetBool("tokenizer.ggml.add_space_prefix"), true);
    const std::string marker = "\xE2\x96\x81";
    if (add_space_prefix) {
      spec.normalizer.push_back({NormalizerStep::Kind::kPrepend, "", marker});
    }
    spec.normalizer.push_back({NormalizerStep::Kind::kReplace, " ", marker});
    // HF's Llama decoder: Replace(▁, ' '), ByteFallback, Fuse, Strip(' ', 1, 0).
    const std::string space(1, ' ');
    DecoderStep replace(DecoderStep::Kind::kReplace);
    replace.pattern = marker;
    replace.content = space;
    spec.decoder = {replace, DecoderStep(DecoderStep::Kind::kByteFallback),
                    DecoderStep(DecoderStep::Kind::kFuse)};
    if (add_space_prefix) {
      DecoderStep strip(DecoderStep::Kind::kStrip);
      strip.pattern = space;
      strip.start = 1;
      spec.decoder.push_back(strip);
    }
    spec.add_bos = true;
  } else if (*model == "gpt2") {
    absl::StatusOr<std::vector<std::string>> merges =
        gguf.GetStringArray("tokenizer.ggml.merges");
    if (!merges.ok()) return merges.status();
    spec.merges.reserve(merges->size());
    for (const std::string& m : *merges) {
      const size_t space = m.find(' ', 1);
      if (space == std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(gguf.path(), ": tokenizer.ggml.merges entry '", m, "' is not 'a b'"));
      }
      spec.merges.emplace_back(m.substr(0, space), m.substr(space + 1));
    }
    const std::string pre = ValueOr(gguf.GetString("tokenizer.ggml.pre"), std::string("default"));
    absl::StatusOr<PreTokenizerChoice> choice = ChoosePreTokenizer(pre);
    if (!choice.ok()) {
      return absl::Status(choice.status().code(),
                          absl::StrCat(gguf.path(), ": ", choice.status().message()));
    }
    spec.byte_level = true;
    spec.pre_tokenizer = std::move(choice->steps);
    spec.ignore_merges = choice->ignore_merges;
    spec.add_bos = choice->add_bos;
    spec.decoder = {DecoderStep(DecoderStep::Kind::kByteLevel)};
    spec.raw_pieces.assign(n, 0);
  } else {
    return absl::UnimplementedError(absl::StrCat(
        gguf.path(), ": tokenizer.ggml.model '", *model,
        "' is not supported; supported: gpt2 (byte-level BPE), llama (SentencePiece BPE)"));
  }

  spec.unk_id = -1;
  for (size_t id = 0; id < n; ++id) {
    const int64_t type = types[id];
    if (type == kTypeUnknown && spec.unk_id < 0) spec.unk_id = static_cast<int32_t>(id);
    if (type != kTypeUnknown && type != kTypeControl && type != kTypeUserDefined) continue;
    AddedTokenSpec t;
    t.id = static_cast<int32_t>(id);
    t.content = spec.pieces[id];
    t.special = type != kTypeUserDefined;
    spec.added_tokens.push_back(std::move(t));
    if (!spec.raw_pieces.empty()) spec.raw_pieces[id] = 1;
  }
  auto read_id = [&](std::string_view key) -> int32_t {
    const absl::StatusOr<int64_t> v = gguf.GetInt(key);
    return v.ok() && *v >= 0 && static_cast<size_t>(*v) < n ? static_cast<int32_t>(*v) : -1;
  };
  if (int32_t unk = read_id("tokenizer.ggml.unknown_token_id"); unk >= 0) spec.unk_id = unk;
  spec.bos_id = read_id("tokenizer.ggml.bos_token_id");
  spec.eos_id = read_id("tokenizer.ggml.eos_token_id");
  spec.add_bos = ValueOr(gguf.GetBool("tokenizer.ggml.add_bos_token"), spec.add_bos);
  for (std::string_view key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (int32_t id = read_id(key); id >= 0) spec.extra_stop_ids.push_back(id);
  }
  spec.chat_template = ValueOr(gguf.GetString("tokenizer.chat_template"), std::string());
  return spec;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& gguf) {
  absl::StatusOr<TokenizerSpec> spec = SpecFromGguf(gguf);
  if (!spec.ok()) return spec.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = BuildTokenizer(std::move(*spec));
  if (!tok.ok()) {
    return absl::Status(tok.status().code(), absl::StrCat(gguf.path(), ": ", tok.status().message()));
  }
  return tok;
}

}  // namespace thetaserve::model
