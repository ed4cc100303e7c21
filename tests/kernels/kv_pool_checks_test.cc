// The KV pool checks every backend shares (Backend::SetKvLayout, CheckKvRowCopies), through
// the CPU backend: bad sizes and copies outside the pool are clear errors; valid copies pass.
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

}  // namespace
}  // namespace thetaserve::kernels
