// The KV cache's 16-bit element types: rounding to nearest even, overflow, NaN, exact widening
// (every bit pattern round-trips), and the eight-wide vector load agreeing with the scalar one.
#include "kernels/cpu/kv_element.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/vec.h"
#include "kernels/kv_dtype.h"

namespace thetaserve::kernels::cpu {
namespace {

uint16_t F16Bits(float x) { return FromFloat<F16>(x).bits; }
uint16_t Bf16Bits(float x) { return FromFloat<Bf16>(x).bits; }

TEST(KvElementTest, F16RoundsToNearestEvenAndOverflowsToInfinity) {
  EXPECT_EQ(F16Bits(1.0f), 0x3C00);
  EXPECT_EQ(F16Bits(-2.0f), 0xC000);
  EXPECT_EQ(F16Bits(-0.0f), 0x8000);
  EXPECT_EQ(F16Bits(65504.0f), 0x7BFF);  // the largest f16
  EXPECT_EQ(F16Bits(65519.0f), 0x7BFF);  // below the midpoint to the next power: stays finite
  EXPECT_EQ(F16Bits(65520.0f), 0x7C00);  // the midpoint rounds to even: infinity
  EXPECT_EQ(F16Bits(1e6f), 0x7C00);
  EXPECT_EQ(F16Bits(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(F16Bits(std::ldexp(1.0f, -26)), 0x0000);  // under half of it: zero
  // Ties (half an ulp, 2^-11 at 1.0) go to the even neighbour; anything past goes up.
  EXPECT_EQ(F16Bits(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(F16Bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(F16Bits(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);
  EXPECT_TRUE(std::isnan(ToFloat(FromFloat<F16>(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(ToFloat(FromFloat<F16>(-std::numeric_limits<float>::infinity())),
            -std::numeric_limits<float>::infinity());
}

TEST(KvElementTest, Bf16RoundsToNearestEvenAndKeepsNaNsNaN) {
  EXPECT_EQ(Bf16Bits(1.0f), 0x3F80);
  EXPECT_EQ(Bf16Bits(-0.0f), 0x8000);
  EXPECT_EQ(Bf16Bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // a tie: to even
  EXPECT_EQ(Bf16Bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(Bf16Bits(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(Bf16Bits(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to infinity
  EXPECT_EQ(Bf16Bits(std::numeric_limits<float>::infinity()), 0x7F80);
  // A NaN whose payload sits in the low 16 bits must not round into infinity.
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFF80FFFFu, 0x7FFFFFFFu}) {
    EXPECT_TRUE(std::isnan(ToFloat(FromFloat<Bf16>(std::bit_cast<float>(nan))))) << std::hex << nan;
  }
  EXPECT_EQ(ToFloat(Bf16{0x4049}), 3.140625f);
}

TEST(KvElementTest, EveryBitPatternWidensExactlyAndRoundsBackToItself) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const float h = ToFloat(F16{uint16_t(b)});
    const float bf = ToFloat(Bf16{uint16_t(b)});
    if (std::isnan(h)) {
      EXPECT_TRUE(std::isnan(ToFloat(FromFloat<F16>(h))));
    } else {
      ASSERT_EQ(F16Bits(h), b) << std::hex << b;
    }
    if (std::isnan(bf)) {
      EXPECT_TRUE(std::isnan(ToFloat(FromFloat<Bf16>(bf))));
    } else {
      ASSERT_EQ(Bf16Bits(bf), b) << std::hex << b;
    }
  }
}

#if TS_AVX2
template <typename T>
void ExpectLoad8MatchesToFloat() {
  std::vector<T> x;
  for (uint32_t b = 0; b <= 0xFFFF; ++b) x.push_back(T{uint16_t(b)});
  for (size_t i = 0; i < x.size(); i += 8) {
    float got[8];
    _mm256_storeu_ps(got, Load8(x.data() + i));
    for (int u = 0; u < 8; ++u) {
      const float want = ToFloat(x[i + u]);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got[u])) << std::hex << i + u;
      } else {
        ASSERT_EQ(std::bit_cast<uint32_t>(got[u]), std::bit_cast<uint32_t>(want))
            << std::hex << i + u;
      }
    }
  }
}

TEST(KvElementTest, VectorLoadWidensLikeTheScalarConversion) {
  ExpectLoad8MatchesToFloat<F16>();
  ExpectLoad8MatchesToFloat<Bf16>();
}
#endif

TEST(KvDtypeTest, NamesParseAndSizes) {
  KvDtype t = KvDtype::kAuto;
  for (auto [name, want] : {std::pair{"f32", KvDtype::kF32}, std::pair{"fp16", KvDtype::kF16},
                            std::pair{"bfloat16", KvDtype::kBf16}, std::pair{"auto", KvDtype::kAuto}}) {
    ASSERT_TRUE(ParseKvDtype(name, &t)) << name;
    EXPECT_EQ(t, want) << name;
  }
  EXPECT_FALSE(ParseKvDtype("f8", &t));
  EXPECT_FALSE(ParseKvDtype("", &t));
  EXPECT_EQ(KvDtypeName(KvDtype::kBf16), "bf16");
  EXPECT_EQ(KvDtypeBytes(KvDtype::kF32), 4);
  EXPECT_EQ(KvDtypeBytes(KvDtype::kF16), 2);
  EXPECT_EQ(KvDtypeBytes(KvDtype::kBf16), 2);
}

}  // namespace
}  // namespace thetaserve::kernels::cpu
