#include "model/model.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "model/safetensors.h"

namespace thetaserve::model {
namespace {

bool StatIs(const std::string& path, mode_t type) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && (st.st_mode & S_IFMT) == type;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in) return absl::UnavailableError(absl::StrCat("cannot read ", path));
  return ss.str();
}

// The per-tensor roles of a LLaMA-style decoder and their names in each file format.
enum class Role { kAttnNorm, kWq, kWk, kWv, kWo, kBq, kBk, kBv, kFfnNorm, kGate, kUp, kDown };

std::string LayerTensorName(bool gguf, int64_t layer, Role role) {
  static const char* const kGguf[] = {
      "attn_norm.weight",   "attn_q.weight", "attn_k.weight",   "attn_v.weight",
      "attn_output.weight", "attn_q.bias",   "attn_k.bias",     "attn_v.bias",
      "ffn_norm.weight",    "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"};
  static const char* const kHf[] = {
      "input_layernorm.weight",  "self_attn.q_proj.weight",       "self_attn.k_proj.weight",
      "self_attn.v_proj.weight", "self_attn.o_proj.weight",       "self_attn.q_proj.bias",
      "self_attn.k_proj.bias",   "self_attn.v_proj.bias",         "post_attention_layernorm.weight",
      "mlp.gate_proj.weight",    "mlp.up_proj.weight",            "mlp.down_proj.weight"};
  const int i = static_cast<int>(role);
  return gguf ? absl::StrCat("blk.", layer, ".", kGguf[i])
              : absl::StrCat("model.layers.", layer, ".", kHf[i]);
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// 64-bit FNV-1a.
class Fnv1a {
 public:
  void Add(const void* data, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) hash_ = (hash_ ^ p[i]) * 0x100000001b3ull;
  }
  template <typename T>
  void AddValue(const T& v) {
    Add(&v, sizeof(v));
  }
  void AddString(std::string_view s) {
    AddValue(s.size());
    Add(s.data(), s.size());
  }
  uint64_t hash() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

// Every bound tensor once (a tied output is the embedding).
std::vector<TensorView*> AllTensors(ModelWeights& w) {
  std::vector<TensorView*> all = {&w.tok_embeddings, &w.output_norm};
  if (w.output.data != w.tok_embeddings.data) all.push_back(&w.output);
  for (LayerWeights& l : w.layers) {
    for (TensorView* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv,
                                &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down}) {
      if (!t->empty()) all.push_back(t);
    }
  }
  return all;
}

std::string Fingerprint(const ModelConfig& c, const std::vector<TensorView*>& tensors) {
  Fnv1a h;
  h.AddString(c.architecture);
  for (int64_t v : {c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads,
                    c.num_kv_heads, c.head_dim, c.rope_original_context}) {
    h.AddValue(v);
  }
  for (float v : {c.rms_norm_eps, c.rope_theta, c.rope_factor, c.rope_low_freq_factor,
                  c.rope_high_freq_factor}) {
    h.AddValue(v);
  }
  h.AddValue(static_cast<int>(c.rope_scaling));
  h.AddValue(static_cast<uint8_t>(c.rope_interleaved | c.tied_embeddings << 1 | c.qkv_bias << 2));
  // Names, shapes, types and the ends of each tensor's data: enough to tell checkpoints
  // apart without reading every weight.
  constexpr size_t kEdge = 4096;
  for (const TensorView* t : tensors) {
    h.AddString(t->name);
    for (int64_t d : t->shape) h.AddValue(d);
    h.AddValue(static_cast<int>(t->dtype));
    const uint8_t* data = static_cast<const uint8_t*>(t->data);
    const size_t head = std::min(kEdge, t->nbytes);
    h.Add(data, head);
    h.Add(data + t->nbytes - head, head);
  }
  return absl::StrFormat("%016x", h.hash());
}

}  // namespace

Model::~Model() = default;

absl::Status Model::LimitContext(int64_t tokens) {
  if (tokens < 1 || tokens > config_.max_context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a context of ", tokens, " tokens; this model's is ", config_.max_context,
        ", so it must be 1 to ", config_.max_context));
  }
  config_.max_context = tokens;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path) {
  auto model = std::unique_ptr<Model>(new Model());
  model->path_ = path;
  const bool is_dir = StatIs(path, S_IFDIR);
  if (!is_dir && !StatIs(path, S_IFREG)) {
    struct stat st;
    const bool exists = ::stat(path.c_str(), &st) == 0;  // a FIFO or a device was "not there"
    return absl::NotFoundError(absl::StrCat(
        "model path ", path, exists ? " is not a regular file or a directory" : " does not exist",
        " (expected a .gguf file or a directory with config.json, *.safetensors and "
        "tokenizer.json)"));
  }
  if (!is_dir) {
    auto gguf = GgufFile::Open(path);
    if (!gguf.ok()) return gguf.status();
    model->gguf_ = std::move(*gguf);
    auto config = ParseGgufConfig(*model->gguf_);
    if (!config.ok()) return config.status();
    model->config_ = std::move(*config);
    if (absl::Status s = model->BindWeights(path); !s.ok()) return s;
    auto tokenizer = Tokenizer::FromGguf(*model->gguf_);
    if (!tokenizer.ok()) return tokenizer.status();
    model->tokenizer_ = std::move(*tokenizer);
    return model;
  }

  const std::string config_path = path + "/config.json";
  if (!StatIs(config_path, S_IFREG)) {
    return absl::NotFoundError(absl::StrCat(path, " has no config.json"));
  }
  auto config = ParseHfConfig(config_path);
  if (!config.ok()) return config.status();
  model->config_ = std::move(*config);
  auto ckpt = SafetensorsCheckpoint::Open(path);
  if (!ckpt.ok()) return ckpt.status();
  model->safetensors_ = std::move(*ckpt);
  if (absl::Status s = model->BindWeights(path); !s.ok()) return s;
  const std::string tokenizer_path = path + "/tokenizer.json";
  const std::string tokenizer_config_path = path + "/tokenizer_config.json";
  if (!StatIs(tokenizer_path, S_IFREG)) {
    return absl::NotFoundError(absl::StrCat(path, " has no tokenizer.json"));
  }
  // FromTokenizerJson takes the JSON texts; an absent tokenizer_config.json is "".
  auto tokenizer_json = ReadWholeFile(tokenizer_path);
  if (!tokenizer_json.ok()) return tokenizer_json.status();
  std::string tokenizer_config_json;
  if (StatIs(tokenizer_config_path, S_IFREG)) {
    auto text = ReadWholeFile(tokenizer_config_path);
    if (!text.ok()) return text.status();
    tokenizer_config_json = std::move(*text);
  }
  auto tokenizer = Tokenizer::FromTokenizerJson(*tokenizer_json, tokenizer_config_json);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat(path, ": ", tokenizer.status().message()));
  }
  model->tokenizer_ = std::move(*tokenizer);
  return model;
}

absl::Status Model::BindWeights(const std::string& source) {
  const bool gguf = gguf_ != nullptr;
  const ModelConfig& c = config_;
  auto bind = [&](const std::string& name, std::vector<int64_t> shape,
                  TensorView* out) -> absl::Status {
    const TensorView* t = gguf ? gguf_->FindTensor(name) : safetensors_->FindTensor(name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": missing tensor '", name,
                                                     "' (expected shape ", ShapeString(shape),
                                                     ")"));
    }
    if (t->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": tensor '", name, "' has shape ",
                                                     ShapeString(t->shape), ", expected ",
                                                     ShapeString(shape)));
    }
    *out = *t;
    return absl::OkStatus();
  };
#define THETASERVE_RETURN_IF_ERROR(expr) \
  do {                                   \
    absl::Status _s = (expr);            \
    if (!_s.ok()) return _s;             \
  } while (0)

  ModelWeights& w = weights_;
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), ff = c.intermediate_size;
  THETASERVE_RETURN_IF_ERROR(bind(gguf ? "token_embd.weight" : "model.embed_tokens.weight",
                                  {c.vocab_size, h}, &w.tok_embeddings));
  THETASERVE_RETURN_IF_ERROR(
      bind(gguf ? "output_norm.weight" : "model.norm.weight", {h}, &w.output_norm));
  if (c.tied_embeddings) {
    w.output = w.tok_embeddings;
  } else {
    THETASERVE_RETURN_IF_ERROR(
        bind(gguf ? "output.weight" : "lm_head.weight", {c.vocab_size, h}, &w.output));
  }
  w.layers.assign(c.num_layers, LayerWeights());
  for (int64_t i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = w.layers[i];
    auto name = [&](Role r) { return LayerTensorName(gguf, i, r); };
    THETASERVE_RETURN_IF_ERROR(bind(name(Role::kAttnNorm), {h}, &l.attn_norm));
    THETASERVE_RETURN_IF_ERROR(bind(name(Role::kWq), {q, h}, &l.wq));
    THETASERVE_RETURN_IF_ERROR(bind(name(Role::kWk), {kv, h}, &l.wk));
    THETASERVE_RETURN_IF_ERROR(bind(name(Role::kWv), {kv, h}, &l.wv));
    THETASERVE_RETURN_IF_ERROR(bind(name(Role::kWo), {h, q}, &l.wo));
    if (c.qkv_bias) {
      THETASERVE_RETURN_IF_ERROR(bind(name(Role::kBq), {q}, &l.bq));
      THETASERVE_RETURN_IF_ERROR(bind(name(Role::kBk), {kv}, &l.bk));
      THETASERVE_RETURN_IF_ERROR(bind(name(Role::kBv), {kv}, &l.bv));
    }
    THETASERVE_RETURN_IF_ERROR(bind(name(Role::kFfnNorm), {h}, &l.ffn_norm));
    THETASERVE_RETURN_IF_ERROR(bind(name(Role::kGate), {ff, h}, &l.w_gate));
    THETASERVE_RETURN_IF_ERROR(bind(name(Role::kUp), {ff, h}, &l.w_up));
    THETASERVE_RETURN_IF_ERROR(bind(name(Role::kDown), {h, ff}, &l.w_down));
  }
#undef THETASERVE_RETURN_IF_ERROR

  // Size and fingerprint describe the data as stored, before 1-D tensors are converted.
  std::vector<TensorView*> all = AllTensors(w);
  weight_bytes_ = 0;
  for (const TensorView* t : all) weight_bytes_ += t->nbytes;
  fingerprint_ = Fingerprint(c, all);

  // Kernels read norms and biases as float*: convert those not stored as aligned F32.
  for (TensorView* t : all) {
    const bool aligned = reinterpret_cast<uintptr_t>(t->data) % alignof(float) == 0;
    if (t->shape.size() != 1 || (t->dtype == DType::kF32 && aligned)) continue;
    std::vector<float>& buf = owned_f32_.emplace_back(t->numel());
    DequantizeRow(t->dtype, t->data, buf.data(), t->numel());
    t->dtype = DType::kF32;
    t->data = buf.data();
    t->nbytes = buf.size() * sizeof(float);
  }
  return absl::OkStatus();
}

}  // namespace thetaserve::model
