// --kv-cache-memory: sizes, shares of the free memory, and the errors a user can cause.
#include "server/kv_cache_size.h"

#include <string>

#include "gtest/gtest.h"

namespace thetaserve::server {
namespace {

constexpr int64_t kGiB = int64_t(1) << 30;

TEST(KvCacheSizeTest, SizesAreBytes) {
  for (const auto& [text, bytes] : {std::pair<std::string, int64_t>{"512M", int64_t(512) << 20},
                                    {"2G", 2 * kGiB}, {"1.5g", 3 * kGiB / 2}, {"64k", 64 << 10},
                                    {"1048576", 1 << 20}}) {
    auto spec = ParseKvCacheSpec(text);
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status();
    auto size = ResolveKvCacheSize(*spec, std::nullopt);  // a size needs no free memory
    ASSERT_TRUE(size.ok()) << size.status();
    EXPECT_EQ(size->bytes, bytes) << text;
  }
}

// Small sizes in MiB: --offload-memory 1M was logged as "0.00 GiB of host memory".
TEST(KvCacheSizeTest, BytesTextSaysSmallSizesInMiB) {
  EXPECT_EQ(BytesText(1 << 20), "1.0 MiB");
  EXPECT_EQ(BytesText(64 << 20), "64.0 MiB");
  EXPECT_EQ(BytesText(kGiB / 4), "0.25 GiB");
  EXPECT_EQ(BytesText(113 * kGiB + kGiB * 2 / 5), "113.40 GiB");
}

TEST(KvCacheSizeTest, ASharePartsTheFreeMemoryLessTheReserve) {
  auto spec = ParseKvCacheSpec("90%");
  ASSERT_TRUE(spec.ok());
  auto size = ResolveKvCacheSize(*spec, 101 * kGiB);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(size->bytes, 90 * kGiB);  // 90% of (101 GiB − 1 GiB)
  EXPECT_NE(size->description.find("90% of the 101.00 GiB free"), std::string::npos) << size->description;
  size = ResolveKvCacheSize(*ParseKvCacheSpec("100%"), 3 * kGiB);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(size->bytes, 2 * kGiB);
}

// A small model on a large GPU: 90% of 139 GiB free is more than the CUDA kernels can address
// at head size 16 (2^31 rows of 32 bytes = 64 GiB). The share stops there and says so; a share
// under the limit and a size are left as they are.
TEST(KvCacheSizeTest, AShareStopsAtTheLargestPoolTheBackendAddresses) {
  const int64_t max_bytes = (int64_t(1) << 31) * 32;
  auto capped = ResolveKvCacheSize(*ParseKvCacheSpec("90%"), 139 * kGiB, max_bytes);
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ(capped->bytes, max_bytes);
  EXPECT_NE(capped->description.find("64.00 GiB (the largest pool the backend can address; "
                                     "90% of the 139.00 GiB free"),
            std::string::npos)
      << capped->description;
  auto under = ResolveKvCacheSize(*ParseKvCacheSpec("50%"), 101 * kGiB, max_bytes);
  ASSERT_TRUE(under.ok());
  EXPECT_EQ(under->bytes, 50 * kGiB);
  EXPECT_EQ(under->description.find("largest pool"), std::string::npos) << under->description;
  auto size = ResolveKvCacheSize(*ParseKvCacheSpec("100G"), 139 * kGiB, max_bytes);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(size->bytes, 100 * kGiB) << "a size is the backend's to refuse";
}

TEST(KvCacheSizeTest, BadValuesSayWhatIsAccepted) {
  for (const std::string text : {"", "0", "-1G", "abc", "12X", "0%", "150%", "-5%", "%", "nan%"}) {
    auto spec = ParseKvCacheSpec(text);
    ASSERT_FALSE(spec.ok()) << "'" << text << "' was accepted";
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(spec.status().message()).find("such as 90%"), std::string::npos) << spec.status();
  }
}

TEST(KvCacheSizeTest, AShareNeedsKnownAndSufficientFreeMemory) {
  auto spec = ParseKvCacheSpec("50%");
  ASSERT_TRUE(spec.ok());
  auto unknown = ResolveKvCacheSize(*spec, std::nullopt);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(unknown.status().message()).find("give a size"), std::string::npos);
  auto little = ResolveKvCacheSize(*spec, kGiB / 2);
  ASSERT_FALSE(little.ok());
  EXPECT_EQ(little.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(little.status().message()).find("0.50 GiB is free"), std::string::npos) << little.status();
}

TEST(KvCacheSizeTest, TheCpuDefaultHoldsOneFullContextWithinAQuarterOfFreeMemory) {
  constexpr int64_t kMiB = int64_t(1) << 20;
  // A small model's full context under the floor: the floor.
  KvCacheSize small = DefaultCpuKvCacheSize(100 * kMiB, 16 * kGiB);
  EXPECT_EQ(small.bytes, kCpuKvFloorBytes);
  // SmolLM2's 8,192 tokens in fp32 (360 MiB): all of it, and the log says why.
  KvCacheSize full = DefaultCpuKvCacheSize(360 * kMiB, 16 * kGiB);
  EXPECT_EQ(full.bytes, 360 * kMiB);
  EXPECT_NE(full.description.find("full context"), std::string::npos) << full.description;
  full = DefaultCpuKvCacheSize(360 * kMiB, std::nullopt);  // free memory unknown: no cap
  EXPECT_EQ(full.bytes, 360 * kMiB);
  // A long-context model on a small machine: a quarter of the free memory, said in the log.
  KvCacheSize capped = DefaultCpuKvCacheSize(34 * kGiB, 8 * kGiB);
  EXPECT_EQ(capped.bytes, 2 * kGiB);
  EXPECT_NE(capped.description.find("a quarter of the 8.00 GiB free"), std::string::npos)
      << capped.description;
  EXPECT_NE(capped.description.find("needs 34.00 GiB"), std::string::npos) << capped.description;
  // The cap never goes under the floor.
  EXPECT_EQ(DefaultCpuKvCacheSize(34 * kGiB, 512 * kMiB).bytes, kCpuKvFloorBytes);
}

}  // namespace
}  // namespace thetaserve::server
