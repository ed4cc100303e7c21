// The KV pool checks every backend shares (Backend::SetKvLayout, CheckKvRowCopies), through
// the CPU backend: bad sizes and copies outside the pool are clear errors; valid copies pass.
// And the KV element types CreateBackend refuses for a model.
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "model/model.h"
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

}  // namespace
}  // namespace thetaserve::kernels
