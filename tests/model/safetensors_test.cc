#include "model/safetensors.h"

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/quant.h"
#include "tests/model/gguf_writer.h"
#include "tests/model/safetensors_writer.h"
#include "tests/test_util.h"

namespace thetaserve::model {
namespace {

using thetaserve::testing::SafetensorsWriter;
using ::testing::AllOf;
using ::testing::HasSubstr;

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& bytes) {
    std::string path = dir_ + "/" + name;
    thetaserve::testing::WriteBytes(path, bytes);
    return path;
  }

  std::string OpenError() {
    auto ckpt = SafetensorsCheckpoint::Open(dir_);
    EXPECT_FALSE(ckpt.ok()) << "checkpoint opened but should not have";
    return ckpt.ok() ? "" : std::string(ckpt.status().message());
  }

  std::string ConfigError(const std::string& json) {
    auto c = ParseHfConfig(Write("config.json", json));
    EXPECT_FALSE(c.ok()) << "config parsed but should not have";
    return c.ok() ? "" : std::string(c.status().message());
  }

  thetaserve::testing::ScopedTempDir tmp_{"safetensors_test"};
  const std::string dir_ = tmp_.path();
};

std::string F32(const std::vector<float>& v) { return SafetensorsWriter::Bytes(v); }

TEST_F(SafetensorsTest, ReadsSingleFileOfEachFloatType) {
  SafetensorsWriter w;
  w.AddMetadata();
  w.Add("a.weight", "F32", {2, 3}, F32({1, 2, 3, 4, 5, 6}));
  std::vector<uint16_t> h = {FloatToHalf(0.5f), FloatToHalf(-1), FloatToHalf(2), 0};
  w.Add("b.weight", "F16", {4}, SafetensorsWriter::Bytes(h));
  std::vector<uint16_t> bf = {FloatToBF16(3), FloatToBF16(-4), FloatToBF16(0.25f),
                              FloatToBF16(8)};
  w.Add("c.weight", "BF16", {2, 2}, SafetensorsWriter::Bytes(bf));
  Write("model.safetensors", w.Build());

  auto ckpt = SafetensorsCheckpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->tensors().size(), 3u);
  const TensorView* a = (*ckpt)->FindTensor("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->nbytes, 24u);
  float row1[3];
  DequantizeRow(a->dtype, a->row(1), row1, 3);
  EXPECT_EQ(row1[0], 4.0f);
  EXPECT_EQ(row1[2], 6.0f);

  const TensorView* b = (*ckpt)->FindTensor("b.weight");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kF16);
  float bv[4];
  DequantizeRow(b->dtype, b->data, bv, 4);
  EXPECT_EQ(bv[1], -1.0f);

  const TensorView* c = (*ckpt)->FindTensor("c.weight");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->dtype, DType::kBF16);
  float cv[2];
  DequantizeRow(c->dtype, c->row(1), cv, 2);
  EXPECT_EQ(cv[0], 0.25f);
  EXPECT_EQ(cv[1], 8.0f);
  EXPECT_EQ((*ckpt)->FindTensor("__metadata__"), nullptr);
}

TEST_F(SafetensorsTest, ReadsShardsListedInTheIndex) {
  SafetensorsWriter s1, s2;
  s1.Add("x.weight", "F32", {2}, F32({1, 2}));
  s1.Add("y.weight", "F32", {1}, F32({3}));
  s2.Add("z.weight", "F32", {3}, F32({4, 5, 6}));
  Write("model-00001-of-00002.safetensors", s1.Build());
  Write("model-00002-of-00002.safetensors", s2.Build());
  Write("model.safetensors.index.json", R"({
    "metadata": {"total_size": 24},
    "weight_map": {"x.weight": "model-00001-of-00002.safetensors",
                   "y.weight": "model-00001-of-00002.safetensors",
                   "z.weight": "model-00002-of-00002.safetensors"}})");
  auto ckpt = SafetensorsCheckpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->tensors().size(), 3u);
  const TensorView* z = (*ckpt)->FindTensor("z.weight");
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(static_cast<const float*>(z->data)[2], 6.0f);
  EXPECT_EQ(static_cast<const float*>((*ckpt)->FindTensor("y.weight")->data)[0], 3.0f);
}

TEST_F(SafetensorsTest, MissingShardIsNamed) {
  SafetensorsWriter s1;
  s1.Add("x.weight", "F32", {1}, F32({1}));
  Write("model-00001-of-00002.safetensors", s1.Build());
  Write("model.safetensors.index.json", R"({"weight_map": {
      "x.weight": "model-00001-of-00002.safetensors",
      "z.weight": "model-00002-of-00002.safetensors"}})");
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("missing shard"),
                                 HasSubstr("model-00002-of-00002.safetensors"),
                                 HasSubstr("model.safetensors.index.json")));
}

TEST_F(SafetensorsTest, TensorMissingFromItsShardIsNamed) {
  SafetensorsWriter s1;
  s1.Add("x.weight", "F32", {1}, F32({1}));
  Write("shard.safetensors", s1.Build());
  Write("model.safetensors.index.json", R"({"weight_map": {
      "x.weight": "shard.safetensors", "w.weight": "shard.safetensors"}})");
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("'w.weight'"), HasSubstr("shard.safetensors"),
                                 HasSubstr("does not contain it")));
}

TEST_F(SafetensorsTest, UnsupportedDtypeNamesFileTensorAndDtype) {
  SafetensorsWriter w;
  w.Add("model.embed_tokens.weight", "I64", {2}, std::string(16, '\0'));
  Write("model.safetensors", w.Build());
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("model.safetensors"),
                                 HasSubstr("'model.embed_tokens.weight'"), HasSubstr("I64"),
                                 HasSubstr("supported: F32, F16, BF16")));
}

TEST_F(SafetensorsTest, TruncatedFilesAreRejected) {
  Write("model.safetensors", std::string("\x10\x00\x00", 3));
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("model.safetensors"), HasSubstr("truncated")));

  SafetensorsWriter w;
  w.Add("a.weight", "F32", {4}, F32({1, 2, 3, 4}));
  std::string full = w.Build();
  Write("model.safetensors", full.substr(0, full.size() - 4));  // data cut short
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("'a.weight'"), HasSubstr("out of range"),
                                 HasSubstr("truncated")));

  Write("model.safetensors", full.substr(0, 20));  // header cut short
  EXPECT_THAT(OpenError(), HasSubstr("runs past the end of the file"));
}

TEST_F(SafetensorsTest, HeaderLongerThanFileIsRejected) {
  uint64_t len = uint64_t(200) << 20;
  std::string bytes(reinterpret_cast<const char*>(&len), 8);
  bytes += "{}";
  Write("model.safetensors", bytes);
  EXPECT_THAT(OpenError(), AllOf(HasSubstr("header length 209715200"),
                                 HasSubstr("runs past the end")));
}

TEST_F(SafetensorsTest, HeaderThatIsNotJsonIsRejected) {
  uint64_t len = 8;
  Write("model.safetensors", std::string(reinterpret_cast<const char*>(&len), 8) + "not json");
  EXPECT_THAT(OpenError(), HasSubstr("header is not a JSON object"));
}

TEST_F(SafetensorsTest, OffsetsOutOfRangeOrMismatchedAreRejected) {
  {
    SafetensorsWriter w;
    w.AddRaw("far.weight", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 1000}}});
    w.AppendData(std::string(8, '\0'));
    Write("model.safetensors", w.Build());
    EXPECT_THAT(OpenError(), AllOf(HasSubstr("'far.weight'"), HasSubstr("out of range")));
  }
  {
    SafetensorsWriter w;
    w.AddRaw("short.weight", {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 20}}});
    w.AppendData(std::string(24, '\0'));
    Write("model.safetensors", w.Build());
    EXPECT_THAT(OpenError(), AllOf(HasSubstr("'short.weight'"), HasSubstr("20 bytes"),
                                   HasSubstr("needs 24")));
  }
  {
    SafetensorsWriter w;
    w.AddRaw("back.weight", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {8, 4}}});
    w.AppendData(std::string(8, '\0'));
    Write("model.safetensors", w.Build());
    EXPECT_THAT(OpenError(), AllOf(HasSubstr("'back.weight'"), HasSubstr("invalid data_offsets")));
  }
}

TEST_F(SafetensorsTest, DirectoryWithoutWeightsIsRejected) {
  EXPECT_THAT(OpenError(), HasSubstr("neither model.safetensors nor"));
  auto ckpt = SafetensorsCheckpoint::Open(dir_ + "/nope");
  ASSERT_FALSE(ckpt.ok());
  EXPECT_THAT(ckpt.status().message(), HasSubstr("is not a directory"));
}

constexpr char kTinyLlamaConfig[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
  "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 2048,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": null,
  "tie_word_embeddings": false, "vocab_size": 32000, "torch_dtype": "bfloat16"})";

TEST_F(SafetensorsTest, ParsesLlamaConfig) {
  auto c = ParseHfConfig(Write("config.json", kTinyLlamaConfig));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "llama");
  EXPECT_EQ(c->name, dir_.substr(dir_.find_last_of('/') + 1));
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(c->intermediate_size, 5632);
  EXPECT_EQ(c->num_layers, 22);
  EXPECT_EQ(c->num_heads, 32);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->max_context, 2048);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_EQ(c->rope_theta, 10000.0f);
  EXPECT_EQ(c->rope_scaling, RopeScaling::kNone);
  EXPECT_FALSE(c->rope_interleaved);
  EXPECT_FALSE(c->tied_embeddings);
  EXPECT_FALSE(c->qkv_bias);
}

TEST_F(SafetensorsTest, ParsesQwen2ConfigWithBiasAndTiedEmbeddings) {
  auto c = ParseHfConfig(Write("config.json", R"({
    "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "tie_word_embeddings": true, "vocab_size": 151936, "use_sliding_window": false,
    "head_dim": null})"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "qwen2");
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->kv_dim(), 128);
  EXPECT_EQ(c->rope_theta, 1e6f);
  EXPECT_TRUE(c->tied_embeddings);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->rope_interleaved);
}

TEST_F(SafetensorsTest, ParsesLlama3RopeScaling) {
  auto c = ParseHfConfig(Write("config.json", R"({
    "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "tie_word_embeddings": true, "vocab_size": 128256,
    "attention_bias": false,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}})"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling, RopeScaling::kLlama3);
  EXPECT_EQ(c->rope_factor, 32.0f);
  EXPECT_EQ(c->rope_low_freq_factor, 1.0f);
  EXPECT_EQ(c->rope_high_freq_factor, 4.0f);
  EXPECT_EQ(c->rope_original_context, 8192);
  EXPECT_EQ(c->max_context, 131072);
}

TEST_F(SafetensorsTest, ParsesLinearRopeScalingAndExplicitHeadDim) {
  auto c = ParseHfConfig(Write("config.json", R"({
    "model_type": "mistral", "hidden_size": 5120, "intermediate_size": 14336,
    "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "vocab_size": 131072, "attention_bias": true,
    "rope_scaling": {"type": "linear", "factor": 2.0}})"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);  // not hidden / heads = 160
  EXPECT_EQ(c->q_dim(), 4096);
  EXPECT_EQ(c->rope_scaling, RopeScaling::kLinear);
  EXPECT_EQ(c->rope_factor, 2.0f);
  EXPECT_FALSE(c->qkv_bias);  // only llama reads attention_bias
  EXPECT_EQ(c->max_context, 131072);  // mistral's default
}

TEST_F(SafetensorsTest, UnsupportedArchitectureMessage) {
  std::string path = dir_ + "/config.json";
  EXPECT_EQ(ConfigError(R"({"model_type": "gemma", "hidden_size": 8})"),
            "unsupported architecture 'gemma' in " + path + "; supported: llama, mistral, qwen2");
}

TEST_F(SafetensorsTest, BadConfigsNameFileAndField) {
  EXPECT_THAT(ConfigError(R"({"model_type": "llama", "intermediate_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 1, "vocab_size": 4})"),
              AllOf(HasSubstr("config.json"), HasSubstr("missing required field \"hidden_size\"")));
  EXPECT_THAT(ConfigError(R"({"hidden_size": 8})"), HasSubstr("\"model_type\""));
  EXPECT_THAT(ConfigError(R"({"model_type": "llama", "vocab_size": 4, "hidden_size": "big"})"),
              HasSubstr("\"hidden_size\" is not an integer"));
  EXPECT_THAT(ConfigError(R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 4,
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})"),
              HasSubstr("rope_scaling type 'yarn' is not supported"));
  EXPECT_THAT(ConfigError(R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 3, "num_key_value_heads": 2,
      "vocab_size": 4})"),
              HasSubstr("not a multiple of num_key_value_heads"));
  EXPECT_THAT(ConfigError("{not json"), AllOf(HasSubstr("config.json"), HasSubstr("not valid JSON")));
  auto missing = ParseHfConfig(dir_ + "/absent.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("absent.json"));
}

}  // namespace
}  // namespace thetaserve::model
