#include "model/model.h"

#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <map>
#include <numbers>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "tests/model/gguf_writer.h"
#include "tests/model/safetensors_writer.h"
#include "tests/test_util.h"

namespace thetaserve::model {
namespace {

using thetaserve::testing::GgufWriter;
using thetaserve::testing::SafetensorsWriter;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr uint32_t kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ8_0 = 8, kGgmlBF16 = 30;

// A tiny LLaMA-style model, written as GGUF or as an HF directory.
struct TinySpec {
  std::string arch = "llama";
  int64_t vocab = 8, hidden = 64, ff = 96, layers = 2, heads = 4, kv_heads = 2;
  bool tied = false;
  bool bias = false;
  std::set<std::string> omit;                            // tensors left out
  std::map<std::string, std::vector<int64_t>> reshape;  // outermost-first shapes to use instead
  uint32_t seed = 1;
};

std::vector<float> RandomFloats(std::mt19937* rng, int64_t n) {
  std::uniform_real_distribution<float> dist(-0.5f, 0.5f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(*rng);
  return v;
}

// Q8_0 blocks with a sane scale for `n` elements.
std::string RandomQ8_0(std::mt19937* rng, int64_t n) {
  std::string out;
  for (int64_t b = 0; b < n / 32; ++b) {
    uint16_t d = FloatToHalf(0.01f);
    out.append(reinterpret_cast<const char*>(&d), 2);
    for (int j = 0; j < 32; ++j) out.push_back(char(int8_t((*rng)() % 255 - 127)));
  }
  return out;
}

std::string Encode16(const std::vector<float>& v, bool bf16) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = bf16 ? FloatToBF16(v[i]) : FloatToHalf(v[i]);
  return GgufWriter::Bytes(h);
}

// Every tensor of the spec as (name in the requested format, shape outermost first, role)
// in a fixed order. Roles: 'E' embedding, 'N' norm, 'M' matrix, 'B' bias.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  char role;
};

std::vector<TensorSpec> TensorsOf(const TinySpec& s, bool gguf) {
  const int64_t hd = s.hidden / s.heads, q = s.heads * hd, kv = s.kv_heads * hd;
  std::vector<TensorSpec> t;
  t.push_back({gguf ? "token_embd.weight" : "model.embed_tokens.weight", {s.vocab, s.hidden}, 'E'});
  t.push_back({gguf ? "output_norm.weight" : "model.norm.weight", {s.hidden}, 'N'});
  if (!s.tied) t.push_back({gguf ? "output.weight" : "lm_head.weight", {s.vocab, s.hidden}, 'M'});
  for (int64_t i = 0; i < s.layers; ++i) {
    auto n = [&](const char* g, const char* hf) {
      return gguf ? absl::StrCat("blk.", i, ".", g) : absl::StrCat("model.layers.", i, ".", hf);
    };
    t.push_back({n("attn_norm.weight", "input_layernorm.weight"), {s.hidden}, 'N'});
    t.push_back({n("attn_q.weight", "self_attn.q_proj.weight"), {q, s.hidden}, 'M'});
    t.push_back({n("attn_k.weight", "self_attn.k_proj.weight"), {kv, s.hidden}, 'M'});
    t.push_back({n("attn_v.weight", "self_attn.v_proj.weight"), {kv, s.hidden}, 'M'});
    t.push_back({n("attn_output.weight", "self_attn.o_proj.weight"), {s.hidden, q}, 'M'});
    if (s.bias) {
      t.push_back({n("attn_q.bias", "self_attn.q_proj.bias"), {q}, 'B'});
      t.push_back({n("attn_k.bias", "self_attn.k_proj.bias"), {kv}, 'B'});
      t.push_back({n("attn_v.bias", "self_attn.v_proj.bias"), {kv}, 'B'});
    }
    t.push_back({n("ffn_norm.weight", "post_attention_layernorm.weight"), {s.hidden}, 'N'});
    t.push_back({n("ffn_gate.weight", "mlp.gate_proj.weight"), {s.ff, s.hidden}, 'M'});
    t.push_back({n("ffn_up.weight", "mlp.up_proj.weight"), {s.ff, s.hidden}, 'M'});
    t.push_back({n("ffn_down.weight", "mlp.down_proj.weight"), {s.hidden, s.ff}, 'M'});
  }
  for (TensorSpec& ts : t) {
    if (auto it = s.reshape.find(ts.name); it != s.reshape.end()) ts.shape = it->second;
  }
  return t;
}

// Byte-level BPE vocabulary shared by the GGUF and tokenizer.json fixtures.
const std::vector<std::string> kTokens = {"<|endoftext|>", "a", "b", "c", "ab", "\xC4\xA0",
                                          "\xC4\xA0" "a", "bc"};
const std::vector<std::string> kMerges = {"a b", "\xC4\xA0 a", "b c"};

// Stores embeddings as Q8_0, Q as F16, norms as F16 (output) / BF16 (layers), the rest F32.
std::string BuildTinyGguf(const TinySpec& s) {
  GgufWriter w;
  std::mt19937 rng(s.seed);
  const std::string a = s.arch + ".";
  w.AddString("general.architecture", s.arch);
  w.AddString("general.name", "tiny");
  w.AddU32(a + "block_count", uint32_t(s.layers));
  w.AddU32(a + "embedding_length", uint32_t(s.hidden));
  w.AddU32(a + "feed_forward_length", uint32_t(s.ff));
  w.AddU32(a + "attention.head_count", uint32_t(s.heads));
  w.AddU32(a + "attention.head_count_kv", uint32_t(s.kv_heads));
  w.AddU32(a + "context_length", 256);
  w.AddU32(a + "rope.dimension_count", uint32_t(s.hidden / s.heads));
  w.AddF32(a + "rope.freq_base", 100000.0f);
  w.AddF32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddString("tokenizer.ggml.pre", "smollm");
  w.AddStringArray("tokenizer.ggml.tokens", kTokens);
  w.AddArray<int32_t>("tokenizer.ggml.token_type", GgufWriter::kI32, {3, 1, 1, 1, 1, 1, 1, 1});
  w.AddStringArray("tokenizer.ggml.merges", kMerges);
  w.AddU32("tokenizer.ggml.bos_token_id", 0);
  w.AddU32("tokenizer.ggml.eos_token_id", 0);
  for (const TensorSpec& t : TensorsOf(s, /*gguf=*/true)) {
    if (s.omit.count(t.name)) continue;
    std::vector<uint64_t> ne(t.shape.rbegin(), t.shape.rend());
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    if (t.role == 'E') {
      w.AddTensor(t.name, kGgmlQ8_0, ne, RandomQ8_0(&rng, n));
    } else if (t.role == 'N') {
      bool out = t.name == "output_norm.weight";
      w.AddTensor(t.name, out ? kGgmlF16 : kGgmlBF16, ne, Encode16(RandomFloats(&rng, n), !out));
    } else if (t.name.find("attn_q.weight") != std::string::npos) {
      w.AddTensor(t.name, kGgmlF16, ne, Encode16(RandomFloats(&rng, n), false));
    } else {
      w.AddTensor(t.name, kGgmlF32, ne, GgufWriter::Bytes(RandomFloats(&rng, n)));
    }
  }
  return w.Build();
}

std::string TokenizerJson() {
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t i = 0; i < kTokens.size(); ++i) vocab[kTokens[i]] = i;
  nlohmann::json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       {{{"id", 0}, {"content", "<|endoftext|>"}, {"single_word", false}, {"lstrip", false},
         {"rstrip", false}, {"normalized", false}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
        {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
        {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
        {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab}, {"merges", kMerges}}}};
  return j.dump();
}

// An HF directory: config.json, model.safetensors (norms BF16, biases F16, rest F32) and
// tokenizer.json.
void BuildTinyHf(const TinySpec& s, const std::string& dir) {
  nlohmann::json config = {
      {"model_type", s.arch},         {"hidden_size", s.hidden},
      {"intermediate_size", s.ff},    {"num_hidden_layers", s.layers},
      {"num_attention_heads", s.heads}, {"num_key_value_heads", s.kv_heads},
      {"max_position_embeddings", 256}, {"rms_norm_eps", 1e-6},
      {"rope_theta", 10000.0},        {"tie_word_embeddings", s.tied},
      {"attention_bias", s.bias},     {"vocab_size", s.vocab}};
  thetaserve::testing::WriteBytes(dir + "/config.json", config.dump());
  thetaserve::testing::WriteBytes(dir + "/tokenizer.json", TokenizerJson());
  SafetensorsWriter w;
  std::mt19937 rng(s.seed);
  for (const TensorSpec& t : TensorsOf(s, /*gguf=*/false)) {
    if (s.omit.count(t.name)) continue;
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::vector<float> v = RandomFloats(&rng, n);
    if (t.role == 'N') {
      w.Add(t.name, "BF16", t.shape, Encode16(v, true));
    } else if (t.role == 'B') {
      w.Add(t.name, "F16", t.shape, Encode16(v, false));
    } else {
      w.Add(t.name, "F32", t.shape, SafetensorsWriter::Bytes(v));
    }
  }
  thetaserve::testing::WriteBytes(dir + "/model.safetensors", w.Build());
}

class ModelLoadTest : public ::testing::Test {
 protected:
  std::string WriteGguf(const std::string& name, const TinySpec& s) {
    std::string path = dir_ + "/" + name;
    thetaserve::testing::WriteBytes(path, BuildTinyGguf(s));
    return path;
  }
  std::string WriteHf(const std::string& name, const TinySpec& s) {
    std::string path = dir_ + "/" + name;
    EXPECT_EQ(::mkdir(path.c_str(), 0755), 0);
    BuildTinyHf(s, path);
    return path;
  }
  std::string LoadError(const std::string& path) {
    auto m = Model::Load(path);
    EXPECT_FALSE(m.ok()) << path << " loaded but should not have";
    return m.ok() ? "" : std::string(m.status().message());
  }

  thetaserve::testing::ScopedTempDir tmp_{"model_load_test"};
  const std::string dir_ = tmp_.path();
};

TEST_F(ModelLoadTest, LoadsTinyLlamaGguf) {
  const std::string path = WriteGguf("tiny.gguf", TinySpec());
  auto loaded = Model::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Model& m = **loaded;
  const ModelConfig& c = m.config();
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.name, "tiny");
  EXPECT_EQ(c.vocab_size, 8);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.max_context, 256);
  EXPECT_EQ(c.rope_theta, 100000.0f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_TRUE(c.rope_interleaved);  // llama.cpp permuted Q/K
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(m.tokenizer().vocab_size(), 8);

  auto gguf = GgufFile::Open(path);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  const ModelWeights& w = m.weights();
  ASSERT_EQ(w.layers.size(), 2u);
  EXPECT_EQ(w.tok_embeddings.dtype, DType::kQ8_0);
  EXPECT_EQ(w.tok_embeddings.shape, (std::vector<int64_t>{8, 64}));
  EXPECT_EQ(w.output.name, "output.weight");
  // Matrices stay in their stored type, pointing into the file.
  const TensorView& wq = w.layers[1].wq;
  EXPECT_EQ(wq.dtype, DType::kF16);
  const TensorView* stored_q = (*gguf)->FindTensor("blk.1.attn_q.weight");
  ASSERT_NE(stored_q, nullptr);
  ASSERT_EQ(wq.nbytes, stored_q->nbytes);
  EXPECT_EQ(std::memcmp(wq.data, stored_q->data, wq.nbytes), 0);
  EXPECT_EQ(wq.shape, (std::vector<int64_t>{64, 64}));
  EXPECT_TRUE(w.layers[0].bq.empty());
  // Norms stored as F16/BF16 become F32 buffers with the same values.
  for (const auto& [view, name] : {std::pair{&w.output_norm, "output_norm.weight"},
                                   {&w.layers[1].attn_norm, "blk.1.attn_norm.weight"}}) {
    const TensorView* stored = (*gguf)->FindTensor(name);
    ASSERT_NE(stored, nullptr);
    EXPECT_NE(stored->dtype, DType::kF32);
    EXPECT_EQ(view->dtype, DType::kF32) << name;
    EXPECT_EQ(view->nbytes, 64 * sizeof(float));
    std::vector<float> want(64);
    DequantizeRow(stored->dtype, stored->data, want.data(), 64);
    EXPECT_TRUE(thetaserve::testing::AllClose(static_cast<const float*>(view->data),
                                              want.data(), 64, 0, 0))
        << name;
  }
  // Every tensor in the file is used; weight_bytes counts them as stored.
  EXPECT_EQ(m.weight_bytes(), (*gguf)->tensor_bytes());
  EXPECT_EQ(m.fingerprint().size(), 16u);
}

TEST_F(ModelLoadTest, FingerprintFollowsTheWeights) {
  TinySpec s;
  auto a = Model::Load(WriteGguf("a.gguf", s));
  auto b = Model::Load(WriteGguf("b.gguf", s));
  s.seed = 2;
  auto c = Model::Load(WriteGguf("c.gguf", s));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << a.status() << b.status() << c.status();
  EXPECT_EQ((*a)->fingerprint(), (*b)->fingerprint());
  EXPECT_NE((*a)->fingerprint(), (*c)->fingerprint());
}

TEST_F(ModelLoadTest, GgufWithoutOutputWeightIsTied) {
  TinySpec s;
  s.tied = true;
  const std::string path = WriteGguf("tied.gguf", s);
  auto m = Model::Load(path);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE((*m)->config().tied_embeddings);
  const ModelWeights& w = (*m)->weights();
  EXPECT_EQ(w.output.data, w.tok_embeddings.data);
  auto gguf = GgufFile::Open(path);
  ASSERT_TRUE(gguf.ok());
  EXPECT_EQ((*m)->weight_bytes(), (*gguf)->tensor_bytes());  // embedding counted once
}

TEST_F(ModelLoadTest, Qwen2GgufHasBiasesAndHalfRotation) {
  TinySpec s;
  s.arch = "qwen2";
  s.bias = true;
  auto m = Model::Load(WriteGguf("qwen.gguf", s));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE((*m)->config().rope_interleaved);
  EXPECT_TRUE((*m)->config().qkv_bias);
  const LayerWeights& l = (*m)->weights().layers[1];
  EXPECT_EQ(l.bk.shape, (std::vector<int64_t>{32}));
  EXPECT_EQ(l.bk.dtype, DType::kF32);

  s.bias = false;
  EXPECT_THAT(LoadError(WriteGguf("qwen_nobias.gguf", s)),
              HasSubstr("missing tensor 'blk.0.attn_q.bias'"));
}

TEST_F(ModelLoadTest, MissingGgufTensorIsNamed) {
  TinySpec s;
  s.omit = {"blk.1.ffn_down.weight"};
  const std::string path = WriteGguf("missing.gguf", s);
  EXPECT_EQ(LoadError(path),
            path + ": missing tensor 'blk.1.ffn_down.weight' (expected shape [64, 96])");
}

TEST_F(ModelLoadTest, MisShapedGgufTensorIsNamed) {
  TinySpec s;
  s.reshape = {{"blk.1.attn_q.weight", {48, 64}}};
  const std::string path = WriteGguf("shape.gguf", s);
  EXPECT_EQ(LoadError(path),
            path + ": tensor 'blk.1.attn_q.weight' has shape [48, 64], expected [64, 64]");
  s.reshape = {{"token_embd.weight", {9, 64}}};
  EXPECT_THAT(LoadError(WriteGguf("embd.gguf", s)),
              HasSubstr("tensor 'token_embd.weight' has shape [9, 64], expected [8, 64]"));
}

TEST_F(ModelLoadTest, UnsupportedGgufArchitectureIsNamed) {
  TinySpec s;
  s.arch = "gemma";
  const std::string path = WriteGguf("gemma.gguf", s);
  EXPECT_EQ(LoadError(path),
            "unsupported architecture 'gemma' in " + path + "; supported: llama, qwen2");
}

TEST_F(ModelLoadTest, MissingPathsAreNotFound) {
  auto m = Model::Load(dir_ + "/nothing.gguf");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr("nothing.gguf"));
  EXPECT_THAT(LoadError(dir_), HasSubstr("has no config.json"));
}

TEST_F(ModelLoadTest, LlamaThreeRopeFreqsBecomeScalingParameters) {
  // llama.cpp's converter writes Llama 3.x rope scaling as per-frequency divisors.
  const int64_t head_dim = 16;
  const double theta = 500000, factor = 8, low = 1, high = 4, original = 8192;
  std::vector<float> divisors;
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    double wavelen = 2 * std::numbers::pi * std::pow(theta, 2.0 * i / head_dim);
    double smooth = (original / wavelen - low) / (high - low);
    divisors.push_back(wavelen < original / high  ? 1.0f
                       : wavelen > original / low ? float(factor)
                                                  : float(1 / ((1 - smooth) / factor + smooth)));
  }
  for (bool corrupt : {false, true}) {
    if (corrupt) divisors[4] *= 1.5f;
    GgufWriter w;
    w.AddString("general.architecture", "llama");
    w.AddU32("llama.block_count", 1);
    w.AddU32("llama.embedding_length", 64);
    w.AddU32("llama.feed_forward_length", 96);
    w.AddU32("llama.attention.head_count", 4);
    w.AddU32("llama.vocab_size", 8);
    w.AddF32("llama.rope.freq_base", float(theta));
    w.AddTensor("rope_freqs.weight", kGgmlF32, {8}, GgufWriter::Bytes(divisors));
    const std::string path = dir_ + "/llama3.gguf";
    thetaserve::testing::WriteBytes(path, w.Build());
    auto gguf = GgufFile::Open(path);
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    auto c = ParseGgufConfig(**gguf);
    if (corrupt) {
      ASSERT_FALSE(c.ok());
      EXPECT_THAT(c.status().message(),
                  AllOf(HasSubstr("rope_freqs.weight[4]"), HasSubstr("not supported")));
      continue;
    }
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->rope_scaling, RopeScaling::kLlama3);
    EXPECT_EQ(c->rope_factor, 8.0f);
    EXPECT_EQ(c->rope_low_freq_factor, 1.0f);
    EXPECT_EQ(c->rope_high_freq_factor, 4.0f);
    EXPECT_EQ(c->rope_original_context, 8192);
    EXPECT_EQ(c->vocab_size, 8);  // from llama.vocab_size when there is no token list
    EXPECT_EQ(c->num_kv_heads, 4);  // head_count_kv defaults to head_count
    EXPECT_EQ(c->max_context, 2048);
  }
}

TEST_F(ModelLoadTest, GgufMissingRequiredMetadataIsNamed) {
  GgufWriter w;
  w.AddString("general.architecture", "qwen2");
  w.AddU32("qwen2.embedding_length", 64);
  const std::string path = dir_ + "/meta.gguf";
  thetaserve::testing::WriteBytes(path, w.Build());
  EXPECT_EQ(LoadError(path), path + ": missing metadata key 'qwen2.block_count'");
}

TEST_F(ModelLoadTest, LoadsTinyHfCheckpoint) {
  TinySpec s;
  s.bias = true;
  const std::string path = WriteHf("hf", s);
  auto loaded = Model::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Model& m = **loaded;
  EXPECT_EQ(m.config().architecture, "llama");
  EXPECT_EQ(m.config().name, "hf");
  EXPECT_FALSE(m.config().rope_interleaved);
  EXPECT_TRUE(m.config().qkv_bias);
  const ModelWeights& w = m.weights();
  EXPECT_EQ(w.output.name, "lm_head.weight");
  EXPECT_EQ(w.layers[0].wq.dtype, DType::kF32);
  EXPECT_EQ(w.layers[0].bq.dtype, DType::kF32);  // F16 bias converted
  EXPECT_EQ(w.layers[0].ffn_norm.dtype, DType::kF32);  // BF16 norm converted
  EXPECT_EQ(w.layers[1].bv.shape, (std::vector<int64_t>{32}));
  // As stored: 4-byte matrices and embeddings, 2-byte norms and biases.
  const int64_t matrices = 2 * 8 * 64 + 2 * (64 * 64 * 2 + 32 * 64 * 2 + 96 * 64 * 3);
  const int64_t vectors = 64 + 2 * (64 + 64 + 64 + 32 + 32);
  EXPECT_EQ(m.weight_bytes(), uint64_t(matrices * 4 + vectors * 2));
  EXPECT_EQ(m.fingerprint().size(), 16u);
}

TEST_F(ModelLoadTest, HfCheckpointErrorsNameTheTensor) {
  TinySpec s;
  s.omit = {"model.layers.1.mlp.up_proj.weight"};
  std::string path = WriteHf("hf_missing", s);
  EXPECT_EQ(LoadError(path), path + ": missing tensor 'model.layers.1.mlp.up_proj.weight' "
                                    "(expected shape [96, 64])");
  s = TinySpec();
  s.reshape = {{"model.layers.0.self_attn.k_proj.weight", {16, 64}}};
  path = WriteHf("hf_shape", s);
  EXPECT_EQ(LoadError(path), path + ": tensor 'model.layers.0.self_attn.k_proj.weight' has "
                                    "shape [16, 64], expected [32, 64]");
  s = TinySpec();
  s.omit = {"lm_head.weight"};
  EXPECT_THAT(LoadError(WriteHf("hf_nohead", s)), HasSubstr("missing tensor 'lm_head.weight'"));
  s = TinySpec();
  s.arch = "phi3";
  path = WriteHf("hf_phi", s);
  EXPECT_EQ(LoadError(path), "unsupported architecture 'phi3' in " + path +
                                 "/config.json; supported: llama, mistral, qwen2");
}

TEST(ModelLoadSmolLM2Test, LoadsDefaultModel) {
  const std::string path = thetaserve::testing::DefaultModelPath();
  auto loaded = Model::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Model& m = **loaded;
  const ModelConfig& c = m.config();
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_context, 8192);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_TRUE(c.rope_interleaved);
  EXPECT_EQ(c.rope_theta, 100000.0f);
  EXPECT_EQ(c.rope_scaling, RopeScaling::kNone);
  const ModelWeights& w = m.weights();
  EXPECT_EQ(w.tok_embeddings.dtype, DType::kQ8_0);
  EXPECT_EQ(w.output.data, w.tok_embeddings.data);
  EXPECT_EQ(w.layers[29].w_down.dtype, DType::kQ4_1);
  EXPECT_EQ(w.layers[29].w_down.shape, (std::vector<int64_t>{576, 1536}));
  EXPECT_EQ(w.layers[0].attn_norm.dtype, DType::kF32);
  EXPECT_EQ(m.weight_bytes(), 96576768u);  // every tensor in the file, embedding once
  EXPECT_EQ(m.tokenizer().vocab_size(), 49152);
  EXPECT_EQ(m.fingerprint().size(), 16u);
}
}  // namespace
}  // namespace thetaserve::model
