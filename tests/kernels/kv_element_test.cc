// The KV cache's 16- and 8-bit element types: rounding to nearest even, overflow (saturation
// for fp8), NaN, exact widening (every bit pattern round-trips), and the eight-wide vector load
// agreeing with the scalar one.
#include "kernels/cpu/kv_element.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
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

uint8_t E4M3Bits(float x) { return FromFloat<Fp8E4M3>(x).bits; }
uint8_t E5M2Bits(float x) { return FromFloat<Fp8E5M2>(x).bits; }

TEST(KvElementTest, Fp8E4M3RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(E4M3Bits(1.0f), 0x38);  // 0.0111.000
  EXPECT_EQ(E4M3Bits(-2.0f), 0xC0);
  EXPECT_EQ(E4M3Bits(-0.0f), 0x80);
  EXPECT_EQ(E4M3Bits(448.0f), 0x7E);  // the largest finite value
  EXPECT_EQ(E4M3Bits(464.0f), 0x7E);  // past it: held there, never NaN
  EXPECT_EQ(E4M3Bits(-1e6f), 0xFE);
  EXPECT_EQ(E4M3Bits(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(E4M3Bits(416.0f + 15.9f), 0x7D);  // under the midpoint to 448
  EXPECT_EQ(E4M3Bits(432.0f), 0x7E);           // the midpoint: to even (448's mantissa is 110)
  EXPECT_EQ(E4M3Bits(std::ldexp(1.0f, -6)), 0x08);   // the smallest normal
  EXPECT_EQ(E4M3Bits(std::ldexp(1.0f, -9)), 0x01);   // the smallest subnormal
  EXPECT_EQ(E4M3Bits(std::ldexp(1.0f, -10)), 0x00);  // half of it: a tie, to even (zero)
  EXPECT_EQ(E4M3Bits(3 * std::ldexp(1.0f, -10)), 0x02);  // 1.5 steps: to even (2)
  EXPECT_EQ(E4M3Bits(std::ldexp(1.0f, -6) - std::ldexp(1.0f, -11)), 0x08);  // rounds up to normal
  EXPECT_EQ(E4M3Bits(1.0f + std::ldexp(1.0f, -4)), 0x38);      // a tie: to even
  EXPECT_EQ(E4M3Bits(1.0f + 3 * std::ldexp(1.0f, -4)), 0x3A);  // a tie: to even (up)
  EXPECT_EQ(E4M3Bits(1.0f + std::ldexp(1.0f, -4) + std::ldexp(1.0f, -12)), 0x39);
  EXPECT_EQ(E4M3Bits(1.9999f), 0x40);  // the carry moves into the exponent
  EXPECT_TRUE(std::isnan(ToFloat(FromFloat<Fp8E4M3>(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(ToFloat(Fp8E4M3{0xFF})));
  EXPECT_EQ(ToFloat(Fp8E4M3{0x7E}), 448.0f);
  EXPECT_EQ(ToFloat(Fp8E4M3{0x0B}), 1.375f * std::ldexp(1.0f, -6));  // 0.0001.011
  EXPECT_EQ(ToFloat(Fp8E4M3{0x85}), -5 * std::ldexp(1.0f, -9));       // a subnormal
}

TEST(KvElementTest, Fp8E5M2RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(E5M2Bits(1.0f), 0x3C);  // f16's top byte
  EXPECT_EQ(E5M2Bits(-0.0f), 0x80);
  EXPECT_EQ(E5M2Bits(57344.0f), 0x7B);  // the largest finite value
  EXPECT_EQ(E5M2Bits(1e6f), 0x7B);      // past it: held there, not infinity
  EXPECT_EQ(E5M2Bits(-std::numeric_limits<float>::infinity()), 0xFB);
  EXPECT_EQ(E5M2Bits(std::ldexp(1.0f, -16)), 0x01);  // the smallest subnormal
  EXPECT_EQ(E5M2Bits(std::ldexp(1.0f, -17)), 0x00);  // a tie: to even (zero)
  EXPECT_EQ(E5M2Bits(1.0f + std::ldexp(1.0f, -3)), 0x3C);      // a tie: to even
  EXPECT_EQ(E5M2Bits(1.0f + 3 * std::ldexp(1.0f, -3)), 0x3E);  // a tie: to even (up)
  EXPECT_EQ(E5M2Bits(1.0f + std::ldexp(1.0f, -3) + std::ldexp(1.0f, -12)), 0x3D);
  EXPECT_TRUE(std::isnan(ToFloat(FromFloat<Fp8E5M2>(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(ToFloat(Fp8E5M2{0x7C}), std::numeric_limits<float>::infinity());
  EXPECT_EQ(ToFloat(Fp8E5M2{0x7B}), 57344.0f);
}

// The nearest finite value by search over all codes, ties to the even code (the one whose
// mantissa ends in 0), magnitudes past the largest held at it: an oracle that shares only the
// decode table with FromFloat, none of its bit arithmetic.
template <typename T>
uint8_t NearestCode(float x, uint8_t max_code) {
  if (std::isnan(x)) return 0;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a >= ToFloat(T{max_code})) return sign | max_code;
  uint8_t lo = 0;
  while (ToFloat(T{uint8_t(lo + 1)}) <= a) ++lo;
  const float below = a - ToFloat(T{lo}), above = ToFloat(T{uint8_t(lo + 1)}) - a;
  if (below < above || (below == above && lo % 2 == 0)) return sign | lo;
  return sign | uint8_t(lo + 1);
}

template <typename T>
void ExpectRoundingMatchesTheNearestCode(uint8_t max_code, uint32_t seed) {
  std::vector<float> xs;
  // Every finite code, the midpoints between neighbours (the ties), and points a little either
  // side of each midpoint.
  for (int c = 0; c < max_code; ++c) {
    const float v = ToFloat(T{uint8_t(c)}), next = ToFloat(T{uint8_t(c + 1)});
    const float mid = v + (next - v) / 2;
    for (float x : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  // Random magnitudes across the whole range, and past it.
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> exponent(-24.0f, 20.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::exp2(exponent(rng));
    xs.push_back(i % 2 ? -x : x);
  }
  for (float x : xs) {
    ASSERT_EQ(FromFloat<T>(x).bits, NearestCode<T>(x, max_code)) << x << "; seed " << seed;
  }
}

TEST(KvElementTest, Fp8RoundingIsTheNearestCodeTiesToEven) {
  const uint32_t seed = std::random_device{}();
  {
    SCOPED_TRACE("e4m3");
    ExpectRoundingMatchesTheNearestCode<Fp8E4M3>(0x7E, seed);
  }
  {
    SCOPED_TRACE("e5m2");
    ExpectRoundingMatchesTheNearestCode<Fp8E5M2>(0x7B, seed);
  }
}

TEST(KvElementTest, EveryFp8CodeRoundsBackToItself) {
  for (uint32_t b = 0; b <= 0xFF; ++b) {
    const float e4 = ToFloat(Fp8E4M3{uint8_t(b)}), e5 = ToFloat(Fp8E5M2{uint8_t(b)});
    if (std::isnan(e4)) {
      EXPECT_TRUE((b & 0x7F) == 0x7F) << std::hex << b;
      EXPECT_TRUE(std::isnan(ToFloat(FromFloat<Fp8E4M3>(e4))));
    } else {
      ASSERT_EQ(E4M3Bits(e4), b) << std::hex << b;
    }
    if (std::isnan(e5)) {
      EXPECT_TRUE(std::isnan(ToFloat(FromFloat<Fp8E5M2>(e5))));
    } else if (!std::isinf(e5)) {  // infinities saturate to the largest finite value
      ASSERT_EQ(E5M2Bits(e5), b) << std::hex << b;
    }
    // E5M2 is f16's top byte.
    const float h = ToFloat(F16{uint16_t(b << 8)});
    if (!std::isnan(h)) {
      EXPECT_EQ(e5, h) << std::hex << b;
    }
  }
}

#if TS_AVX2
template <typename T>
void ExpectLoad8MatchesToFloat() {
  using Bits = decltype(T{}.bits);
  std::vector<T> x;
  for (uint32_t b = 0; b <= std::numeric_limits<Bits>::max(); ++b) x.push_back(T{Bits(b)});
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
  ExpectLoad8MatchesToFloat<Fp8E4M3>();
  ExpectLoad8MatchesToFloat<Fp8E5M2>();
}
#endif

TEST(KvDtypeTest, NamesParseAndSizes) {
  KvDtype t = KvDtype::kAuto;
  for (auto [name, want] : {std::pair{"f32", KvDtype::kF32}, std::pair{"fp16", KvDtype::kF16},
                            std::pair{"bfloat16", KvDtype::kBf16}, std::pair{"auto", KvDtype::kAuto}}) {
    ASSERT_TRUE(ParseKvDtype(name, &t)) << name;
    EXPECT_EQ(t, want) << name;
  }
  for (auto [name, want] : {std::pair{"fp8", KvDtype::kFp8E4M3}, std::pair{"fp8_e4m3", KvDtype::kFp8E4M3},
                            std::pair{"fp8_e5m2", KvDtype::kFp8E5M2}}) {
    ASSERT_TRUE(ParseKvDtype(name, &t)) << name;
    EXPECT_EQ(t, want) << name;
  }
  EXPECT_FALSE(ParseKvDtype("f8", &t));
  EXPECT_FALSE(ParseKvDtype("fp8_e4m3fnuz", &t));
  EXPECT_FALSE(ParseKvDtype("", &t));
  EXPECT_EQ(KvDtypeName(KvDtype::kBf16), "bf16");
  EXPECT_EQ(KvDtypeBytes(KvDtype::kF32), 4);
  EXPECT_EQ(KvDtypeBytes(KvDtype::kF16), 2);
  EXPECT_EQ(KvDtypeBytes(KvDtype::kBf16), 2);
  EXPECT_EQ(KvDtypeBytes(KvDtype::kFp8E4M3), 1);
  EXPECT_EQ(KvDtypeBytes(KvDtype::kFp8E5M2), 1);
  EXPECT_EQ(KvDtypeName(KvDtype::kFp8E4M3), "fp8_e4m3");
  EXPECT_EQ(KvDtypeName(KvDtype::kFp8E5M2), "fp8_e5m2");
}

}  // namespace
}  // namespace thetaserve::kernels::cpu
