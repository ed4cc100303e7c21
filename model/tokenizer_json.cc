// Tokenizer::FromTokenizerJson: a Hugging Face tokenizer.json (+ tokenizer_config.json) to a
// TokenizerSpec. Supports model BPE with the normalizers, pre-tokenizers and decoders that
// byte-level (GPT-2, SmolLM2, Llama 3, Qwen2) and SentencePiece-style BPE (Llama 2, Mistral,
// TinyLlama) tokenizers use; anything else fails with Unimplemented naming the component.
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/tokenizer.h"
#include "model/tokenizer_spec.h"
#include "model/tokenizer_utf8.h"
#include "nlohmann/json.hpp"

namespace thetaserve::model {
namespace {

using Json = nlohmann::json;

absl::Status Unsupported(std::string_view what, const Json& j) {
  return absl::UnimplementedError(absl::StrCat("tokenizer.json: unsupported ", AsAbsl(what), ": ",
                                               j.dump().substr(0, 200)));
}

std::string StrOr(const Json& j, const char* key, std::string fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

bool BoolOr(const Json& j, const char* key, bool fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

// HF Metaspace: prepend_scheme, or the older add_prefix_space flag.
PrependScheme ParsePrependScheme(const Json& j) {
  const std::string s = StrOr(j, "prepend_scheme", "");
  if (s == "first") return PrependScheme::kFirst;
  if (s == "never") return PrependScheme::kNever;
  if (s == "always") return PrependScheme::kAlways;
  return BoolOr(j, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

// {"String": "x"} -> x; regex patterns are not literal.
absl::StatusOr<std::string> LiteralPattern(const Json& j) {
  if (j.contains("String")) return j["String"].get<std::string>();
  return Unsupported("regex pattern", j);
}

absl::Status AddNormalizer(const Json& j, TokenizerSpec* spec) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = StrOr(j, "type", "");
  if (type == "Sequence") {
    for (const Json& n : j["normalizers"]) {
      if (absl::Status s = AddNormalizer(n, spec); !s.ok()) return s;
    }
  } else if (type == "Prepend") {
    spec->normalizer.push_back({NormalizerStep::Kind::kPrepend, "", j["prepend"].get<std::string>()});
  } else if (type == "Replace") {
    absl::StatusOr<std::string> pattern = LiteralPattern(j["pattern"]);
    if (!pattern.ok()) return pattern.status();
    spec->normalizer.push_back(
        {NormalizerStep::Kind::kReplace, *pattern, j["content"].get<std::string>()});
  } else if (type == "NFC") {
    // Not applied: input is taken to be NFC already (true of nearly all text).
  } else {
    return Unsupported("normalizer", j);
  }
  return absl::OkStatus();
}

absl::Status AddPreTokenizer(const Json& j, TokenizerSpec* spec) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = StrOr(j, "type", "");
  PreTokenizerStep step;
  if (type == "Sequence") {
    for (const Json& p : j["pretokenizers"]) {
      if (absl::Status s = AddPreTokenizer(p, spec); !s.ok()) return s;
    }
    return absl::OkStatus();
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    step.add_prefix_space = BoolOr(j, "add_prefix_space", true);
    step.use_regex = BoolOr(j, "use_regex", true);
    spec->byte_level = true;
  } else if (type == "Digits") {
    step.kind = PreTokenizerStep::Kind::kDigits;
    step.individual_digits = BoolOr(j, "individual_digits", false);
  } else if (type == "Split") {
    step.kind = PreTokenizerStep::Kind::kSplit;
    const Json& pattern = j["pattern"];
    const std::string regex = pattern.contains("Regex") ? pattern["Regex"].get<std::string>() : "";
    bool known = false;
    for (SplitRegex kind : {SplitRegex::kGpt2, SplitRegex::kLlama3, SplitRegex::kQwen2}) {
      if (regex == SplitRegexPattern(kind)) {
        step.regex = kind;
        known = true;
      }
    }
    if (!known || StrOr(j, "behavior", "") != "Isolated" || BoolOr(j, "invert", false)) {
      return Unsupported("Split pre-tokenizer (known: the GPT-2, Llama 3 and Qwen2 regexes, "
                         "behavior Isolated)", j);
    }
  } else if (type == "Metaspace") {
    step.kind = PreTokenizerStep::Kind::kMetaspace;
    step.replacement = StrOr(j, "replacement", step.replacement);
    step.prepend_scheme = ParsePrependScheme(j);
    step.split = BoolOr(j, "split", true);
  } else {
    return Unsupported("pre-tokenizer", j);
  }
  spec->pre_tokenizer.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status AddDecoder(const Json& j, TokenizerSpec* spec) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = StrOr(j, "type", "");
  DecoderStep step;
  if (type == "Sequence") {
    for (const Json& d : j["decoders"]) {
      if (absl::Status s = AddDecoder(d, spec); !s.ok()) return s;
    }
    return absl::OkStatus();
  } else if (type == "ByteLevel") {
    step.kind = DecoderStep::Kind::kByteLevel;
  } else if (type == "Replace") {
    step.kind = DecoderStep::Kind::kReplace;
    absl::StatusOr<std::string> pattern = LiteralPattern(j["pattern"]);
    if (!pattern.ok()) return pattern.status();
    step.pattern = *pattern;
    step.content = j["content"].get<std::string>();
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = DecoderStep::Kind::kStrip;
    step.pattern = j["content"].get<std::string>();
    step.start = j.value("start", 0);
    step.stop = j.value("stop", 0);
  } else if (type == "Metaspace") {
    step.kind = DecoderStep::Kind::kMetaspace;
    step.pattern = StrOr(j, "replacement", "\xE2\x96\x81");
    step.prepend_scheme = ParsePrependScheme(j);
  } else {
    return Unsupported("decoder", j);
  }
  spec->decoder.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status AddModel(const Json& m, TokenizerSpec* spec) {
  if (StrOr(m, "type", "BPE") != "BPE") return Unsupported("model (only BPE)", m["type"]);
  if (!StrOr(m, "continuing_subword_prefix", "").empty() ||
      !StrOr(m, "end_of_word_suffix", "").empty()) {
    return Unsupported("BPE subword prefix/suffix", m);
  }
  for (const auto& [piece, id] : m["vocab"].items()) {
    const int64_t i = id.get<int64_t>();
    if (i < 0 || i > (1 << 24)) return Unsupported("vocab id", id);
    if (static_cast<size_t>(i) >= spec->pieces.size()) spec->pieces.resize(i + 1);
    spec->pieces[i] = piece;
  }
  for (const Json& merge : m.value("merges", Json::array())) {
    if (merge.is_string()) {
      const std::string s = merge.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) return Unsupported("merge", merge);
      spec->merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2) {
      spec->merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      return Unsupported("merge", merge);
    }
  }
  spec->byte_fallback = BoolOr(m, "byte_fallback", false);
  spec->fuse_unk = BoolOr(m, "fuse_unk", false);
  spec->ignore_merges = BoolOr(m, "ignore_merges", false);
  return absl::OkStatus();
}

// tokenizer_config.json writes tokens as a string or as an AddedToken object.
std::string TokenContent(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object()) return StrOr(j, "content", "");
  return {};
}

int32_t FindId(const TokenizerSpec& spec, const std::string& content) {
  if (content.empty()) return -1;
  for (const AddedTokenSpec& t : spec.added_tokens) {
    if (t.content == content) return t.id;
  }
  for (size_t i = 0; i < spec.pieces.size(); ++i) {
    if (spec.pieces[i] == content) return static_cast<int32_t>(i);
  }
  return -1;
}

// BOS from the post-processor: TemplateProcessing whose "single" starts with a special
// token (Llama 2/3: "<s> $A" / "<|begin_of_text|> $A").
void BosFromPostProcessor(const Json& pp, TokenizerSpec* spec) {
  if (pp.is_null()) return;
  const std::string type = StrOr(pp, "type", "");
  if (type == "Sequence") {
    for (const Json& p : pp["processors"]) BosFromPostProcessor(p, spec);
  } else if (type == "TemplateProcessing" && pp.contains("single") && !pp["single"].empty()) {
    const Json& first = pp["single"][0];
    if (first.contains("SpecialToken")) {
      spec->bos_id = FindId(*spec, first["SpecialToken"]["id"].get<std::string>());
      spec->add_bos = spec->bos_id >= 0;
    }
  }
}

absl::StatusOr<TokenizerSpec> ParseSpec(const std::string& tokenizer_json,
                                        const std::string& config_json) {
  const Json j = Json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("model")) {
    return absl::InvalidArgumentError("tokenizer.json is not a JSON object with a \"model\"");
  }
  TokenizerSpec spec;
  if (absl::Status s = AddModel(j["model"], &spec); !s.ok()) return s;
  for (const Json& a : j.value("added_tokens", Json::array())) {
    AddedTokenSpec t;
    t.id = a["id"].get<int32_t>();
    t.content = a["content"].get<std::string>();
    t.special = BoolOr(a, "special", false);
    t.lstrip = BoolOr(a, "lstrip", false);
    t.rstrip = BoolOr(a, "rstrip", false);
    t.single_word = BoolOr(a, "single_word", false);
    t.normalized = BoolOr(a, "normalized", !t.special);
    if (t.id < 0 || t.id > (1 << 24)) return Unsupported("added token id", a);
    // An id only the added tokens know keeps an empty piece; BuildTokenizer fills it in.
    if (static_cast<size_t>(t.id) >= spec.pieces.size()) spec.pieces.resize(t.id + 1);
    spec.added_tokens.push_back(std::move(t));
  }
  const Json null;
  if (absl::Status s = AddNormalizer(j.value("normalizer", null), &spec); !s.ok()) return s;
  if (absl::Status s = AddPreTokenizer(j.value("pre_tokenizer", null), &spec); !s.ok()) return s;
  if (absl::Status s = AddDecoder(j.value("decoder", null), &spec); !s.ok()) return s;
  const std::string unk = StrOr(j["model"], "unk_token", "");
  spec.unk_id = unk.empty() ? -1 : FindId(spec, unk);
  BosFromPostProcessor(j.value("post_processor", null), &spec);

  if (!config_json.empty()) {
    const Json c = Json::parse(config_json, nullptr, /*allow_exceptions=*/false);
    if (c.is_discarded() || !c.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json is not a JSON object");
    }
    if (c.contains("bos_token")) {
      const int32_t bos = FindId(spec, TokenContent(c["bos_token"]));
      if (bos >= 0) spec.bos_id = bos;
    }
    if (c.contains("eos_token")) spec.eos_id = FindId(spec, TokenContent(c["eos_token"]));
    if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean()) {
      spec.add_bos = c["add_bos_token"].get<bool>() && spec.bos_id >= 0;
    }
    const Json& t = c.value("chat_template", null);
    if (t.is_string()) {
      spec.chat_template = t.get<std::string>();
    } else if (t.is_array()) {  // [{"name": "default", "template": ...}, ...]
      for (const Json& named : t) {
        if (StrOr(named, "name", "") == "default") spec.chat_template = StrOr(named, "template", "");
      }
    }
  }
  if (spec.eos_id < 0) {
    // Without a config, the usual end-of-text token when the vocabulary has it.
    for (const char* piece : {"</s>", "<|endoftext|>", "<|end_of_text|>"}) {
      if (spec.eos_id < 0) spec.eos_id = FindId(spec, piece);
    }
  }
  return spec;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromTokenizerJson(
    const std::string& tokenizer_json, const std::string& tokenizer_config_json) {
  absl::StatusOr<TokenizerSpec> spec;
  try {
    spec = ParseSpec(tokenizer_json, tokenizer_config_json);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json / tokenizer_config.json has an unexpected shape: ", e.what()));
  }
  if (!spec.ok()) return spec.status();
  return BuildTokenizer(std::move(*spec));
}

}  // namespace thetaserve::model
