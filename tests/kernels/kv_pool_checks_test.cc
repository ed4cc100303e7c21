// The KV pool checks every backend shares (Backend::SetKvLayout, CheckKvRowCopies), through
// the CPU backend: bad sizes and copies outside the pool are clear errors; valid copies pass.
// The KV element types CreateBackend refuses for a model. The CPU backend's refusal to pick
// tokens for the sampler, and to attend densely over a sparse V store. And the CPU backend's
// running V sums: what Forward adds up as it writes rows equals what SumVRows reads back, in
// every type.
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "tests/kernels/dense_v_check.h"
#include "tests/test_util.h"

namespace thetaserve::kernels {
namespace {

TEST(KvPoolChecksTest, BadSizesAndCopiesOutsideThePoolAreErrors) {
  auto model = model::Model::Load(testing::DefaultModelPath());
  ASSERT_TRUE(model.ok()) << model.status();
  auto backend = CreateBackend(**model, Device::kCpu, 1);
  ASSERT_TRUE(backend.ok());
  Backend& b = **backend;
  EXPECT_EQ(b.AllocateKvPool(0, 16).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.AllocateKvPool(8, 0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(b.AllocateKvPool(8, 4).ok());
  EXPECT_EQ(b.kv_layout().num_pages, 8);
  EXPECT_EQ(b.kv_layout().block_size, 4);

  for (const KvRowCopy bad : {KvRowCopy{8, 0, 0, 0}, KvRowCopy{0, 0, -1, 0}, KvRowCopy{0, 4, 1, 0},
                              KvRowCopy{0, 0, 1, -1}}) {
    const std::vector<KvRowCopy> copies = {{0, 0, 1, 0}, bad};
    absl::Status st = b.CopyKvRows(copies);
    EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
    EXPECT_NE(std::string(st.message()).find("outside the pool"), std::string::npos) << st;
  }
  EXPECT_TRUE(b.CopyKvRows(std::vector<KvRowCopy>{{0, 3, 7, 0}, {7, 0, 7, 3}}).ok());
}

// The CPU backend hands its logits to the sampler: asked for their argmax instead (a GPU
// backend's ForwardBatch::argmax), it says so rather than leave both unwritten.
TEST(KvPoolChecksTest, TheCpuBackendReturnsLogitsNotTheirArgmax) {
  auto tiny = model::Model::Load(testing::TestDataPath("tiny_llama"));
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  auto backend = CreateBackend(**tiny, Device::kCpu, 1);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_FALSE((*backend)->ReturnsArgmax());
  ASSERT_TRUE((*backend)->AllocateKvPool(64, 16).ok());
  const int64_t tables = int64_t((*tiny)->config().num_layers) * (*tiny)->config().num_kv_heads;
  std::vector<int32_t> k_table(tables), v_table(tables);
  for (int64_t i = 0; i < tables; ++i) {
    k_table[i] = static_cast<int32_t>(2 * i);
    v_table[i] = static_cast<int32_t>(2 * i + 1);
  }
  SeqChunk chunk;
  chunk.num_tokens = 1;
  chunk.pages = SeqPageTables{k_table.data(), v_table.data(), 1};
  const std::vector<SeqChunk> seqs = {chunk};
  const std::vector<int32_t> tokens = {1};
  ForwardBatch batch{tokens, seqs};
  int32_t pick = -1;
  batch.argmax = &pick;
  const absl::Status st = (*backend)->Forward(batch, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("not their argmax"), std::string::npos) << st;
  EXPECT_EQ(pick, -1);
}

TEST(KvPoolChecksTest, DenseAttentionRefusesASparseVStore) {
  ExpectDenseAttentionRefusesASparseVStore(Device::kCpu);
}

// q8_0 quantizes rows in blocks of 32 elements: a model whose head_dim is not a multiple of 32
// (the tiny test LLaMA's is 16) is refused with a clear error, other types are not.
TEST(KvPoolChecksTest, Q8_0NeedsAHeadDimThatIsAMultipleOf32) {
  auto tiny = model::Model::Load(testing::TestDataPath("tiny_llama"));
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  ASSERT_EQ((*tiny)->config().head_dim, 16);
  auto refused = CreateBackend(**tiny, Device::kCpu, 1, MatMulMode::kExact, KvDtype::kQ8_0);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(refused.status().message())
                .find("--kv-cache-dtype q8_0 quantizes rows in blocks of 32 elements, and this "
                      "model's head_dim is 16"),
            std::string::npos) << refused.status();
  EXPECT_TRUE(CreateBackend(**tiny, Device::kCpu, 1, MatMulMode::kExact, KvDtype::kFp8E4M3).ok());

  auto smollm2 = model::Model::Load(testing::DefaultModelPath());  // head_dim 64
  ASSERT_TRUE(smollm2.ok()) << smollm2.status();
  auto q8 = CreateBackend(**smollm2, Device::kCpu, 1, MatMulMode::kExact, KvDtype::kQ8_0);
  ASSERT_TRUE(q8.ok()) << q8.status();
  EXPECT_EQ((*q8)->kv_row_bytes(), 68);
}

// The prefix cache rebuilds an adopted sequence's VMC sums with SumVRows from its pages; Forward
// keeps them as it writes. Both must be the same bits (the Top-θ outputs of a cached and an
// uncached request are compared bit for bit), for rounded types and for q8_0's quantized rows.
TEST(KvPoolChecksTest, SumVRowsReadsBackTheSumsForwardKeptInEveryType) {
  auto model = model::Model::Load(testing::DefaultModelPath());
  ASSERT_TRUE(model.ok()) << model.status();
  const auto& c = (*model)->config();
  const std::vector<int32_t> prompt = (*model)->tokenizer().Encode(
      "It is a truth universally acknowledged, that a single man in possession of a good "
      "fortune, must be in want of a wife.", true);
  ASSERT_GT(prompt.size(), 20u);
  const int32_t block = 4, stride = 16;  // 64 positions per table
  const int64_t tables = int64_t(c.num_layers) * c.num_kv_heads;
  std::vector<int32_t> k_table(tables * stride), v_table(tables * stride);
  for (int64_t i = 0; i < tables * stride; ++i) {
    k_table[i] = static_cast<int32_t>(2 * i);
    v_table[i] = static_cast<int32_t>(2 * i + 1);
  }
  std::vector<float> f32_sums;
  for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kFp8E4M3, KvDtype::kQ8_0}) {
    SCOPED_TRACE(std::string(KvDtypeName(dtype)));
    auto backend = CreateBackend(**model, Device::kCpu, 1, MatMulMode::kExact, dtype);
    ASSERT_TRUE(backend.ok()) << backend.status();
    ASSERT_TRUE((*backend)->AllocateKvPool(2 * tables * stride, block).ok());
    std::vector<float> kept(tables * c.head_dim, 0.0f);
    // The prompt's first 13 tokens in one chunk, then the rest one at a time (decode steps).
    int32_t done = 0;
    while (done < static_cast<int32_t>(prompt.size())) {
      const int32_t n = done == 0 ? 13 : 1;
      SeqChunk chunk;
      chunk.num_tokens = n;
      chunk.start_pos = done;
      chunk.pages = SeqPageTables{k_table.data(), v_table.data(), stride};
      chunk.pages.v_sum = kept.data();
      const std::vector<SeqChunk> seqs = {chunk};
      const ForwardBatch batch{std::span<const int32_t>(prompt).subspan(done, n), seqs};
      std::vector<float> logits(NumLogitRows(batch) * c.vocab_size);
      ASSERT_TRUE((*backend)->Forward(batch, logits.data()).ok());
      done += n;
    }
    std::vector<float> read_back(tables * c.head_dim, -1.0f);
    SeqPageTables pages{k_table.data(), v_table.data(), stride};
    pages.v_sum = read_back.data();
    ASSERT_TRUE((*backend)->SumVRows(pages, done).ok());
    ASSERT_EQ(std::memcmp(read_back.data(), kept.data(), kept.size() * sizeof(float)), 0);
    // Not all zero, and (past f32) the rows stored are not f32's.
    EXPECT_NE(kept, std::vector<float>(kept.size(), 0.0f));
    if (dtype == KvDtype::kF32) {
      f32_sums = kept;
    } else {
      EXPECT_NE(kept, f32_sums);
    }
  }
}

}  // namespace
}  // namespace thetaserve::kernels
