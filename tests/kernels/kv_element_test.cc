// The KV cache's 16- and 8-bit element types: rounding to nearest even, overflow (saturation
// for fp8), NaN, exact widening (every bit pattern round-trips), and the eight-wide vector load
// agreeing with the scalar one; q8_0 rows (int8 codes, an f16 scale per 32 elements).
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
  ASSERT_TRUE(ParseKvDtype("q8_0", &t));
  EXPECT_EQ(t, KvDtype::kQ8_0);
  EXPECT_FALSE(ParseKvDtype("q8", &t));
  EXPECT_EQ(KvDtypeName(KvDtype::kBf16), "bf16");
  EXPECT_EQ(KvRowBytes(KvDtype::kF32, 64), 256);
  EXPECT_EQ(KvRowBytes(KvDtype::kF16, 64), 128);
  EXPECT_EQ(KvRowBytes(KvDtype::kAuto, 64), 128);
  EXPECT_EQ(KvRowBytes(KvDtype::kBf16, 64), 128);
  EXPECT_EQ(KvRowBytes(KvDtype::kFp8E4M3, 64), 64);
  EXPECT_EQ(KvRowBytes(KvDtype::kFp8E5M2, 64), 64);
  EXPECT_EQ(KvRowBytes(KvDtype::kQ8_0, 64), 68);    // 64 codes, 2 f16 scales
  EXPECT_EQ(KvRowBytes(KvDtype::kQ8_0, 128), 136);  // llama.cpp's 34 bytes per 32
  EXPECT_EQ(RowUnits<Q8_0>(128), 136);
  EXPECT_EQ(RowUnits<F16>(128), 128);
  EXPECT_EQ(KvDtypeName(KvDtype::kFp8E4M3), "fp8_e4m3");
  EXPECT_EQ(KvDtypeName(KvDtype::kFp8E5M2), "fp8_e5m2");
  EXPECT_EQ(KvDtypeName(KvDtype::kQ8_0), "q8_0");
}

// A q8_0 row of x (its size a multiple of 32) and the values it reads back.
std::vector<Q8_0> Q8Row(const std::vector<float>& x) {
  std::vector<Q8_0> row(RowUnits<Q8_0>(int64_t(x.size())));
  StoreRow(x.data(), int64_t(x.size()), row.data());
  return row;
}
// (The output starts as a sentinel that no test row holds, so an element never written shows.)
std::vector<float> Widened(const std::vector<Q8_0>& row, int64_t d) {
  std::vector<float> out(d, -12345.0f);
  WidenRow(row.data(), d, out.data());
  return out;
}

TEST(KvElementTest, Q8_0QuantizesEachBlockOf32ByItsLargestMagnitude) {
  // Block 0: max |x| 127 gives scale 1: integers stay, halves round away from zero; the row's
  // 64 codes come first, then its two f16 scales. Block 1: max |x| 254 gives scale 2.
  std::vector<float> x(64, 0.0f);
  x[0] = 127.0f;
  x[1] = -127.0f;
  x[2] = 2.5f;
  x[3] = -2.5f;
  x[4] = 3.4f;
  x[5] = 0.49f;
  x[32] = -254.0f;
  x[33] = 5.0f;   // 2.5 steps: 3 steps, 6
  x[34] = 1.0f;   // half a step: away from zero, 2
  x[35] = 0.99f;  // under half a step: 0
  const std::vector<Q8_0> row = Q8Row(x);
  ASSERT_EQ(row.size(), 68u);
  EXPECT_EQ(q8::ScaleBits(row.data(), 64, 0), 0x3C00);  // f16 1.0
  EXPECT_EQ(q8::ScaleBits(row.data(), 64, 1), 0x4000);  // f16 2.0
  const int8_t want0[] = {127, -127, 3, -3, 3, 0};
  for (int e = 0; e < 6; ++e) EXPECT_EQ(q8::Code(row.data(), e), want0[e]) << e;
  const int8_t want1[] = {-127, 3, 1, 0};
  for (int e = 0; e < 4; ++e) EXPECT_EQ(q8::Code(row.data(), 32 + e), want1[e]) << 32 + e;
  const std::vector<float> y = Widened(row, 64);
  EXPECT_EQ(y[0], 127.0f);
  EXPECT_EQ(y[2], 3.0f);
  EXPECT_EQ(y[3], -3.0f);
  EXPECT_EQ(y[32], -254.0f);
  EXPECT_EQ(y[33], 6.0f);
  EXPECT_EQ(y[34], 2.0f);
  EXPECT_EQ(y[35], 0.0f);
  EXPECT_EQ(y[63], 0.0f);
}

TEST(KvElementTest, Q8_0ZeroNaNAndHugeBlocks) {
  std::vector<float> x(96, 0.0f);
  // Block 0 all zero: scale 0, reads back 0 (not NaN from 0/0).
  // Block 1 holds a NaN: every element of it reads back NaN; the other blocks are untouched.
  for (int e = 32; e < 64; ++e) x[e] = 1.0f;
  x[40] = std::nanf("");
  // Block 2: past what an f16 scale reaches (127 · 65504): held at it, like fp8's saturation.
  x[64] = 1e9f;
  x[65] = -std::numeric_limits<float>::infinity();
  x[66] = 65504.0f;
  const std::vector<float> y = Widened(Q8Row(x), 96);
  for (int e = 0; e < 32; ++e) EXPECT_EQ(y[e], 0.0f) << e;
  for (int e = 32; e < 64; ++e) EXPECT_TRUE(std::isnan(y[e])) << e;
  EXPECT_EQ(y[64], 127.0f * 65504.0f);
  EXPECT_EQ(y[65], -127.0f * 65504.0f);
  EXPECT_EQ(y[66], 65504.0f);
  EXPECT_EQ(y[67], 0.0f);
}

// Random rows at magnitudes from 0.03 to 1000 (scales in f16's normal range): every element
// reads back as code · scale, within half a step of x (a step is the f16 scale, max |x| / 127
// to 2^-11), and the largest magnitude of each block gets code ±127.
TEST(KvElementTest, Q8_0ReadsBackWithinHalfAStep) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f), exponent(-1.5f, 3.0f);
  const int64_t d = 128;
  for (int trial = 0; trial < 2000; ++trial) {
    const float magnitude = std::pow(10.0f, exponent(rng));
    std::vector<float> x(d);
    for (float& v : x) v = magnitude * uni(rng);
    const std::vector<Q8_0> row = Q8Row(x);
    const std::vector<float> y = Widened(row, d);
    for (int64_t b = 0; b < d / 32; ++b) {
      const float scale = q8::Scale(row.data(), d, b);
      int max_code = 0;
      float amax = 0.0f;
      for (int64_t e = b * 32; e < (b + 1) * 32; ++e) amax = std::max(amax, std::fabs(x[e]));
      ASSERT_NEAR(scale, amax / 127.0f, amax / 127.0f / 2048.0f) << "seed " << seed;
      for (int64_t e = b * 32; e < (b + 1) * 32; ++e) {
        const int code = q8::Code(row.data(), e);
        max_code = std::max(max_code, std::abs(code));
        ASSERT_EQ(y[e], float(code) * scale) << "element " << e << "; seed " << seed;
        ASSERT_LE(std::fabs(y[e] - x[e]), 0.5f * scale) << "element " << e << "; seed " << seed;
      }
      ASSERT_EQ(max_code, 127) << "seed " << seed;
    }
  }
}

}  // namespace
}  // namespace thetaserve::kernels::cpu
