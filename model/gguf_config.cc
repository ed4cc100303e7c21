// ModelConfig from GGUF metadata (llama.cpp's `<arch>.*` keys).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/gguf.h"

namespace thetaserve::model {
namespace {

class MetadataReader {
 public:
  MetadataReader(const GgufFile& gguf, std::string prefix) : gguf_(gguf), prefix_(prefix) {}

  // `<arch>.<key>`; missing keys fall back to `fallback` or fail naming the key.
  absl::StatusOr<int64_t> Int(const std::string& key, std::optional<int64_t> fallback) const {
    std::string full = prefix_ + key;
    if (!gguf_.Has(full)) {
      if (fallback) return *fallback;
      return Missing(full);
    }
    auto v = gguf_.GetInt(full);
    if (v.ok() && *v <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(gguf_.path(), ": metadata key '", full, "' must be positive, got ", *v));
    }
    return v;
  }
  absl::StatusOr<double> Float(const std::string& key, double fallback) const {
    std::string full = prefix_ + key;
    if (!gguf_.Has(full)) return fallback;
    return gguf_.GetFloat(full);
  }
  bool Has(const std::string& key) const { return gguf_.Has(prefix_ + key); }
  absl::Status Missing(const std::string& full_key) const {
    return absl::InvalidArgumentError(
        absl::StrCat(gguf_.path(), ": missing metadata key '", full_key, "'"));
  }

 private:
  const GgufFile& gguf_;
  std::string prefix_;
};

// llama.cpp stores Llama 3.x rope scaling as a per-frequency divisor tensor rope_freqs.weight
// [head_dim/2] instead of metadata. Recover the kLlama3 parameters: the largest divisor is
// the factor; the other three are the values every Llama 3.x release uses, checked against
// the tensor element by element.
absl::Status RopeFromFreqsTensor(const GgufFile& gguf, const TensorView& t, ModelConfig* c) {
  const int64_t half = c->head_dim / 2;
  if (t.dtype != DType::kF32 || t.numel() != half) {
    return absl::InvalidArgumentError(absl::StrCat(
        gguf.path(), ": tensor 'rope_freqs.weight' should be F32 [", half, "], got ",
        DTypeName(t.dtype), " with ", t.numel(), " elements"));
  }
  std::vector<float> divisors(half);
  std::memcpy(divisors.data(), t.data, half * sizeof(float));
  double factor = 1;
  for (float v : divisors) factor = std::max(factor, double(v));
  const double low = 1, high = 4, original = 8192;
  const double low_wavelen = original / low, high_wavelen = original / high;
  for (int64_t i = 0; i < half; ++i) {
    double freq = std::pow(double(c->rope_theta), -2.0 * i / c->head_dim);
    double wavelen = 2 * std::numbers::pi / freq;
    double expected;
    if (wavelen < high_wavelen) {
      expected = 1;
    } else if (wavelen > low_wavelen) {
      expected = factor;
    } else {
      double smooth = (original / wavelen - low) / (high - low);
      expected = 1 / ((1 - smooth) / factor + smooth);
    }
    if (std::fabs(divisors[i] - expected) > 1e-3 * expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          gguf.path(), ": rope_freqs.weight[", i, "] = ", divisors[i],
          " does not match Llama 3 rope scaling (factor ", factor,
          ", low/high freq factors 1/4, original context 8192; expected ", expected,
          "); this rope scaling is not supported"));
    }
  }
  c->rope_scaling = RopeScaling::kLlama3;
  c->rope_factor = static_cast<float>(factor);
  c->rope_low_freq_factor = static_cast<float>(low);
  c->rope_high_freq_factor = static_cast<float>(high);
  c->rope_original_context = static_cast<int64_t>(original);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseGgufConfig(const GgufFile& gguf) {
  const std::string& path = gguf.path();
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  ModelConfig c;
  if (!gguf.Has("general.architecture")) return error("missing metadata key 'general.architecture'");
  auto arch = gguf.GetString("general.architecture");
  if (!arch.ok()) return arch.status();
  c.architecture = *arch;
  if (c.architecture != "llama" && c.architecture != "qwen2") {
    return absl::InvalidArgumentError(absl::StrCat("unsupported architecture '", c.architecture,
                                                   "' in ", path, "; supported: llama, qwen2"));
  }
  if (auto name = gguf.GetString("general.name"); name.ok()) {
    c.name = *name;
  } else {
    size_t slash = path.find_last_of('/');
    c.name = path.substr(slash == std::string::npos ? 0 : slash + 1);
    if (c.name.size() > 5 && c.name.ends_with(".gguf")) c.name.resize(c.name.size() - 5);
  }

  MetadataReader md(gguf, c.architecture + ".");
#define THETASERVE_ASSIGN(lhs, expr)  \
  do {                                \
    auto _v = (expr);                 \
    if (!_v.ok()) return _v.status(); \
    lhs = *_v;                        \
  } while (0)
  THETASERVE_ASSIGN(c.num_layers, md.Int("block_count", std::nullopt));
  THETASERVE_ASSIGN(c.hidden_size, md.Int("embedding_length", std::nullopt));
  THETASERVE_ASSIGN(c.intermediate_size, md.Int("feed_forward_length", std::nullopt));
  THETASERVE_ASSIGN(c.num_heads, md.Int("attention.head_count", std::nullopt));
  THETASERVE_ASSIGN(c.num_kv_heads, md.Int("attention.head_count_kv", c.num_heads));
  THETASERVE_ASSIGN(c.max_context, md.Int("context_length", 2048));
  if (c.num_heads % c.num_kv_heads != 0) {
    return error(absl::StrCat("attention.head_count ", c.num_heads,
                              " is not a multiple of attention.head_count_kv ", c.num_kv_heads));
  }
  int64_t default_head_dim = c.hidden_size / c.num_heads;
  int64_t rope_dim = 0;
  THETASERVE_ASSIGN(rope_dim, md.Int("rope.dimension_count", default_head_dim));
  THETASERVE_ASSIGN(c.head_dim, md.Int("attention.key_length", rope_dim));
  if (rope_dim != c.head_dim) {
    return error(absl::StrCat("rope.dimension_count ", rope_dim, " differs from the head size ",
                              c.head_dim, "; partial rotary embeddings are not supported"));
  }
  if (md.Has("attention.value_length")) {
    int64_t v_dim;
    THETASERVE_ASSIGN(v_dim, md.Int("attention.value_length", std::nullopt));
    if (v_dim != c.head_dim) {
      return error(absl::StrCat("attention.value_length ", v_dim, " differs from key_length ",
                                c.head_dim, ", which is not supported"));
    }
  }
  if (c.head_dim % 2 != 0) return error(absl::StrCat("head size ", c.head_dim, " is odd"));
  double eps, theta;
  THETASERVE_ASSIGN(eps, md.Float("attention.layer_norm_rms_epsilon", 1e-5));
  THETASERVE_ASSIGN(theta, md.Float("rope.freq_base", 10000.0));
  c.rms_norm_eps = static_cast<float>(eps);
  c.rope_theta = static_cast<float>(theta);
  // llama.cpp's converter permutes LLaMA's Q/K rows so RoPE rotates adjacent pairs; it
  // leaves Qwen2's in HF order.
  c.rope_interleaved = c.architecture == "llama";

  const std::string scaling_key = c.architecture + ".rope.scaling.type";
  std::string scaling = "none";
  if (gguf.Has(scaling_key)) THETASERVE_ASSIGN(scaling, gguf.GetString(scaling_key));
  if (scaling == "linear") {
    double factor;
    THETASERVE_ASSIGN(factor, md.Float("rope.scaling.factor", 1.0));
    c.rope_scaling = RopeScaling::kLinear;
    c.rope_factor = static_cast<float>(factor);
  } else if (scaling != "none") {
    return error(absl::StrCat("rope scaling type '", scaling,
                              "' is not supported (supported: none, linear, Llama 3)"));
  }
  if (const TensorView* freqs = gguf.FindTensor("rope_freqs.weight")) {
    if (c.rope_scaling != RopeScaling::kNone) {
      return error("has both rope.scaling.type and rope_freqs.weight");
    }
    if (absl::Status s = RopeFromFreqsTensor(gguf, *freqs, &c); !s.ok()) return s;
  }

  auto tokens = gguf.metadata().find("tokenizer.ggml.tokens");
  if (tokens != gguf.metadata().end() &&
      std::holds_alternative<std::vector<std::string>>(tokens->second)) {
    c.vocab_size = static_cast<int64_t>(std::get<std::vector<std::string>>(tokens->second).size());
  } else if (md.Has("vocab_size")) {
    THETASERVE_ASSIGN(c.vocab_size, md.Int("vocab_size", std::nullopt));
  } else {
    return error("no vocabulary: neither 'tokenizer.ggml.tokens' nor '" + c.architecture +
                 ".vocab_size' is present");
  }
#undef THETASERVE_ASSIGN

  c.tied_embeddings = gguf.FindTensor("output.weight") == nullptr;
  c.qkv_bias = c.architecture == "qwen2" || gguf.FindTensor("blk.0.attn_q.bias") != nullptr;
  return c;
}

}  // namespace thetaserve::model
