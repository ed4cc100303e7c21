#include "model/gguf.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/quant.h"
#include "tests/model/gguf_writer.h"
#include "tests/test_util.h"

namespace thetaserve::model {
namespace {

using thetaserve::testing::GgufWriter;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr uint32_t kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ4_1 = 3, kGgmlQ2_K = 10;

class GgufTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& bytes) {
    std::string path = dir_ + "/" + name;
    thetaserve::testing::WriteBytes(path, bytes);
    return path;
  }

  // Metadata of every GGUF value type and three tensors of different types.
  static void AddSample(GgufWriter* w) {
    w->AddString("general.architecture", "llama");
    w->AddString("general.name", "tiny");
    w->AddU32("test.u32", 7);
    w->AddI32("test.i32", -5);
    w->AddF32("test.f32", 0.5f);
    w->AddBool("test.bool", true);
    w->AddScalar("test.u8", GgufWriter::kU8, uint8_t(200));
    w->AddScalar("test.i8", GgufWriter::kI8, int8_t(-100));
    w->AddScalar("test.u16", GgufWriter::kU16, uint16_t(60000));
    w->AddScalar("test.i16", GgufWriter::kI16, int16_t(-30000));
    w->AddScalar("test.u64", GgufWriter::kU64, uint64_t(1) << 40);
    w->AddScalar("test.i64", GgufWriter::kI64, int64_t(-1) << 40);
    w->AddScalar("test.f64", GgufWriter::kF64, 0.25);
    w->AddStringArray("tokenizer.ggml.tokens", {"a", "b", "<s>"});
    w->AddArray<int32_t>("test.i32s", GgufWriter::kI32, {1, -2, 3});
    w->AddArray<float>("test.f32s", GgufWriter::kF32, {0.5f, -1.5f});
    w->AddArray<uint8_t>("test.bools", GgufWriter::kBool, {1, 0, 1});
    w->AddArray<uint8_t>("test.u8s", GgufWriter::kU8, {255, 0});

    std::vector<float> emb(12);
    for (int i = 0; i < 12; ++i) emb[i] = i * 0.5f;
    w->AddTensor("tok.weight", kGgmlF32, {4, 3}, GgufWriter::Bytes(emb));  // shape [3, 4]
    std::vector<uint8_t> q4(40, 0x21);
    w->AddTensor("q.weight", kGgmlQ4_1, {32, 2}, GgufWriter::Bytes(q4));  // 2 rows of 1 block
    std::vector<uint16_t> h = {FloatToHalf(1), FloatToHalf(2), FloatToHalf(-3), 0, 0};
    w->AddTensor("norm.weight", kGgmlF16, {5}, GgufWriter::Bytes(h));
  }

  std::string SamplePath(GgufWriter::Layout* layout = nullptr) {
    GgufWriter w;
    AddSample(&w);
    sample_bytes_ = w.Build(layout);
    return Write("sample.gguf", sample_bytes_);
  }

  // Opens `bytes` written as `name` and returns the error message (fails if it opened).
  std::string OpenError(const std::string& name, const std::string& bytes) {
    std::string path = Write(name, bytes);
    auto f = GgufFile::Open(path);
    EXPECT_FALSE(f.ok()) << name << " opened but should not have";
    return f.ok() ? "" : std::string(f.status().message());
  }

  thetaserve::testing::ScopedTempDir tmp_{"gguf_test"};
  const std::string dir_ = tmp_.path();
  std::string sample_bytes_;
};

TEST_F(GgufTest, ReadsMetadataOfEveryType) {
  auto f = GgufFile::Open(SamplePath());
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.alignment(), 32u);
  EXPECT_EQ(*g.GetString("general.architecture"), "llama");
  EXPECT_EQ(*g.GetInt("test.u32"), 7);
  EXPECT_EQ(*g.GetInt("test.i32"), -5);
  EXPECT_EQ(*g.GetInt("test.u8"), 200);
  EXPECT_EQ(*g.GetInt("test.i8"), -100);
  EXPECT_EQ(*g.GetInt("test.u16"), 60000);
  EXPECT_EQ(*g.GetInt("test.i16"), -30000);
  EXPECT_EQ(*g.GetInt("test.u64"), int64_t(1) << 40);
  EXPECT_EQ(*g.GetInt("test.i64"), -(int64_t(1) << 40));
  EXPECT_EQ(*g.GetFloat("test.f32"), 0.5);
  EXPECT_EQ(*g.GetFloat("test.f64"), 0.25);
  EXPECT_EQ(*g.GetFloat("test.u32"), 7.0);  // integers read as floats too
  EXPECT_TRUE(*g.GetBool("test.bool"));
  EXPECT_EQ(*g.GetStringArray("tokenizer.ggml.tokens"),
            (std::vector<std::string>{"a", "b", "<s>"}));
  EXPECT_EQ(*g.GetIntArray("test.i32s"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*g.GetIntArray("test.u8s"), (std::vector<int64_t>{255, 0}));
  EXPECT_EQ(*g.GetFloatArray("test.f32s"), (std::vector<double>{0.5, -1.5}));
  EXPECT_EQ(*g.GetFloatArray("test.i32s"), (std::vector<double>{1, -2, 3}));
  EXPECT_EQ(std::get<std::vector<bool>>(g.metadata().at("test.bools")),
            (std::vector<bool>{true, false, true}));
  EXPECT_TRUE(g.Has("general.name"));
  EXPECT_FALSE(g.Has("general.nope"));
}

TEST_F(GgufTest, MetadataLookupErrorsNameKeyAndType) {
  auto f = GgufFile::Open(SamplePath());
  ASSERT_TRUE(f.ok()) << f.status();
  auto missing = (*f)->GetInt("llama.block_count");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(),
              AllOf(HasSubstr("sample.gguf"), HasSubstr("'llama.block_count'"),
                    HasSubstr("not found")));
  auto wrong = (*f)->GetString("test.u32");
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(),
              AllOf(HasSubstr("'test.u32'"), HasSubstr("uint"), HasSubstr("expected string")));
  EXPECT_FALSE((*f)->GetBool("test.i32").ok());
  EXPECT_FALSE((*f)->GetIntArray("tokenizer.ggml.tokens").ok());
}

TEST_F(GgufTest, TensorShapesAreReversedAndDataPointsIntoFile) {
  auto f = GgufFile::Open(SamplePath());
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  ASSERT_EQ(g.tensors().size(), 3u);
  const TensorView* emb = g.FindTensor("tok.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dtype, DType::kF32);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(emb->nbytes, 48u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(emb->data) % 32, 0u);  // mmap base + aligned offset
  EXPECT_EQ(static_cast<const float*>(emb->data)[5], 2.5f);
  EXPECT_EQ(reinterpret_cast<const float*>(emb->row(2))[1], 4.5f);

  const TensorView* q = g.FindTensor("q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, DType::kQ4_1);
  EXPECT_EQ(q->shape, (std::vector<int64_t>{2, 32}));
  EXPECT_EQ(q->nbytes, 40u);
  EXPECT_EQ(q->row(1) - q->row(0), 20);

  const TensorView* norm = g.FindTensor("norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->dtype, DType::kF16);
  EXPECT_EQ(norm->shape, (std::vector<int64_t>{5}));
  float vals[5];
  DequantizeRow(norm->dtype, norm->data, vals, 5);
  EXPECT_EQ(vals[2], -3.0f);

  EXPECT_EQ(g.FindTensor("nope"), nullptr);
  EXPECT_EQ(g.tensor_bytes(), 48u + 40u + 10u);
}

TEST_F(GgufTest, AcceptsVersion2AndCustomAlignment) {
  GgufWriter w;
  w.version = 2;
  w.alignment = 64;
  w.AddU32("general.alignment", 64);
  AddSample(&w);
  auto f = GgufFile::Open(Write("v2.gguf", w.Build()));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 2u);
  EXPECT_EQ((*f)->alignment(), 64u);
  for (const TensorView& t : (*f)->tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 64, 0u) << t.name;
  }
  EXPECT_EQ(static_cast<const float*>((*f)->FindTensor("tok.weight")->data)[11], 5.5f);
}

TEST_F(GgufTest, MissingFileNamesThePath) {
  auto f = GgufFile::Open(dir_ + "/absent.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(f.status().message(), HasSubstr("absent.gguf"));
}

TEST_F(GgufTest, EmptyFileIsRejected) {
  EXPECT_THAT(OpenError("empty.gguf", ""), AllOf(HasSubstr("empty.gguf"), HasSubstr("empty")));
}

TEST_F(GgufTest, WrongMagicIsRejected) {
  SamplePath();
  std::string bytes = sample_bytes_;
  std::memcpy(bytes.data(), "GGML", 4);
  EXPECT_THAT(OpenError("magic.gguf", bytes),
              AllOf(HasSubstr("magic.gguf"), HasSubstr("not a GGUF file"), HasSubstr("GGML")));
}

TEST_F(GgufTest, UnsupportedVersionsAreRejected) {
  for (uint32_t version : {1u, 4u, 0x03000000u}) {
    GgufWriter w;
    w.version = version;
    AddSample(&w);
    EXPECT_THAT(OpenError("version.gguf", w.Build()),
                AllOf(HasSubstr("version.gguf"),
                      HasSubstr("unsupported GGUF version " + std::to_string(version))));
  }
}

TEST_F(GgufTest, TruncationAnywhereIsReportedNotCrashed) {
  GgufWriter::Layout l;
  SamplePath(&l);
  const std::string& full = sample_bytes_;
  struct Cut {
    size_t size;
    std::string expect;
  };
  const std::vector<Cut> cuts = {
      {3, "truncated GGUF file: the GGUF magic"},
      {6, "truncated GGUF file: the GGUF version"},
      {20, "truncated GGUF file: the GGUF header"},
      {l.metadata_begin + 5, "truncated GGUF file: metadata key #0"},
      {l.metadata_begin + 40, "truncated GGUF file"},
      {l.tensor_info_begin - 3, "truncated GGUF file: value of metadata key 'test.u8s'"},
      {l.tensor_info_begin + 4, "truncated GGUF file: name of tensor #0"},
      {l.tensor_info_begin + 30, "truncated GGUF file: info of tensor 'tok.weight'"},
      {l.tensor_info_end, "tensor 'tok.weight' data [0, 48) is out of bounds"},
      {l.data_begin + 40, "tensor 'tok.weight' data [0, 48) is out of bounds"},
      // norm.weight is the last tensor: offset 128 (after 48 and 40 bytes, each padded to
      // 64), 10 bytes long.
      {l.data_begin + 137, "tensor 'norm.weight' data [128, 138) is out of bounds"},
  };
  for (const Cut& c : cuts) {
    ASSERT_LT(c.size, full.size());
    std::string msg = OpenError("cut.gguf", full.substr(0, c.size));
    EXPECT_THAT(msg, AllOf(HasSubstr("cut.gguf"), HasSubstr(c.expect))) << "cut at " << c.size;
  }
  // Every shorter prefix fails cleanly too; the padding after the last tensor is optional.
  EXPECT_TRUE(GgufFile::Open(Write("padless.gguf", full.substr(0, l.data_begin + 138))).ok());
  for (size_t n = 1; n < l.data_begin + 138; n += 7) {
    auto f = GgufFile::Open(Write("prefix.gguf", full.substr(0, n)));
    EXPECT_FALSE(f.ok()) << "prefix of " << n << " bytes";
  }
}

TEST_F(GgufTest, UnknownTensorTypeNamesTensorAndTypeId) {
  GgufWriter w;
  AddSample(&w);
  w.AddTensor("blk.0.attn_q.weight", kGgmlQ2_K, {256, 1}, std::string(84, '\0'));
  EXPECT_THAT(OpenError("type.gguf", w.Build()),
              AllOf(HasSubstr("type.gguf"), HasSubstr("'blk.0.attn_q.weight'"),
                    HasSubstr("ggml type 10"), HasSubstr("Q2_K")));
}

TEST_F(GgufTest, TensorDataOutOfBoundsNamesTensor) {
  GgufWriter w;
  AddSample(&w);
  w.AddTensor("far.weight", kGgmlF32, {8}, "", /*offset_override=*/1 << 20);
  EXPECT_THAT(OpenError("oob.gguf", w.Build()),
              AllOf(HasSubstr("oob.gguf"), HasSubstr("'far.weight'"), HasSubstr("out of bounds")));
}

TEST_F(GgufTest, MisalignedTensorOffsetIsRejected) {
  GgufWriter w;
  AddSample(&w);
  w.AddTensor("odd.weight", kGgmlF32, {1}, "", /*offset_override=*/4);
  EXPECT_THAT(OpenError("align.gguf", w.Build()),
              AllOf(HasSubstr("'odd.weight'"), HasSubstr("not a multiple of the alignment 32")));
}

TEST_F(GgufTest, RowNotAMultipleOfBlockSizeIsRejected) {
  GgufWriter w;
  w.AddTensor("bad.weight", kGgmlQ4_1, {48, 2}, std::string(60, '\0'));
  EXPECT_THAT(OpenError("rows.gguf", w.Build()),
              AllOf(HasSubstr("'bad.weight'"), HasSubstr("48"),
                    HasSubstr("not a multiple of the Q4_1 block size 32")));
}

TEST_F(GgufTest, MalformedMetadataIsRejected) {
  {
    GgufWriter w;
    std::string nested;
    uint32_t arr = GgufWriter::kArray;
    uint64_t one = 1;
    nested.append(reinterpret_cast<char*>(&arr), 4).append(reinterpret_cast<char*>(&one), 8);
    w.AddRaw("test.nested", GgufWriter::kArray, nested);
    EXPECT_THAT(OpenError("nested.gguf", w.Build()),
                AllOf(HasSubstr("'test.nested'"), HasSubstr("array of arrays")));
  }
  {
    GgufWriter w;
    w.AddRaw("test.weird", 99, "");
    EXPECT_THAT(OpenError("weird.gguf", w.Build()),
                AllOf(HasSubstr("'test.weird'"), HasSubstr("unknown value type 99")));
  }
  {
    GgufWriter w;
    uint64_t huge = uint64_t(1) << 62;
    w.AddRaw("test.str", GgufWriter::kString, std::string(reinterpret_cast<char*>(&huge), 8));
    EXPECT_THAT(OpenError("longstr.gguf", w.Build()),
                AllOf(HasSubstr("truncated"), HasSubstr("'test.str'")));
  }
  {
    GgufWriter w;
    std::string header;
    uint32_t type = GgufWriter::kU64;
    uint64_t huge = uint64_t(1) << 61;
    header.append(reinterpret_cast<char*>(&type), 4).append(reinterpret_cast<char*>(&huge), 8);
    w.AddRaw("test.arr", GgufWriter::kArray, header);
    EXPECT_THAT(OpenError("longarr.gguf", w.Build()),
                AllOf(HasSubstr("truncated"), HasSubstr("'test.arr'")));
  }
  {
    GgufWriter w;
    w.AddU32("general.alignment", 24);
    EXPECT_THAT(OpenError("align24.gguf", w.Build()), HasSubstr("power of two"));
  }
  {
    GgufWriter w;
    w.AddU32("test.k", 1);
    w.AddU32("test.k", 2);
    EXPECT_THAT(OpenError("dup.gguf", w.Build()), HasSubstr("duplicate metadata key 'test.k'"));
  }
}

TEST_F(GgufTest, BadTensorInfosAreRejected) {
  {
    GgufWriter w;
    w.AddTensor("five.weight", kGgmlF32, {1, 1, 1, 1, 1}, std::string(4, '\0'));
    EXPECT_THAT(OpenError("dims.gguf", w.Build()),
                AllOf(HasSubstr("'five.weight'"), HasSubstr("5 dimensions")));
  }
  {
    GgufWriter w;
    w.AddTensor("twice.weight", kGgmlF32, {1}, std::string(4, '\0'));
    w.AddTensor("twice.weight", kGgmlF32, {1}, std::string(4, '\0'));
    EXPECT_THAT(OpenError("duptensor.gguf", w.Build()),
                HasSubstr("duplicate tensor 'twice.weight'"));
  }
  {
    GgufWriter w;
    w.AddTensor("big.weight", kGgmlF32, {uint64_t(1) << 40, uint64_t(1) << 40}, "", 0);
    EXPECT_THAT(OpenError("huge.gguf", w.Build()), HasSubstr("'big.weight'"));
  }
}

// Random corruption of a valid file must never crash the reader.
TEST_F(GgufTest, CorruptedFilesNeverCrash) {
  SamplePath();
  const uint32_t seed = 2024;
  std::mt19937 rng(seed);
  int opened = 0;
  for (int i = 0; i < 1500; ++i) {
    std::string bytes = sample_bytes_;
    int flips = 1 + rng() % 4;
    for (int k = 0; k < flips; ++k) bytes[rng() % bytes.size()] = char(rng());
    if (rng() % 4 == 0) bytes.resize(1 + rng() % bytes.size());
    auto f = GgufFile::Open(Write("fuzz.gguf", bytes));
    if (f.ok()) {
      ++opened;
      // Touch every byte the views claim: out-of-bounds views would fault here.
      uint64_t sum = 0;
      for (const TensorView& t : (*f)->tensors()) {
        const uint8_t* p = static_cast<const uint8_t*>(t.data);
        for (size_t b = 0; b < t.nbytes; ++b) sum += p[b];
      }
      volatile uint64_t sink = sum;
      (void)sink;
    } else {
      EXPECT_THAT(f.status().message(), HasSubstr("fuzz.gguf")) << "seed " << seed;
    }
  }
  EXPECT_GT(opened, 0);  // some flips only touch tensor data
}

}  // namespace
}  // namespace thetaserve::model
