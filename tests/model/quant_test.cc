#include "model/quant.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace thetaserve::model {
namespace {

using thetaserve::testing::AllClose;

constexpr uint16_t kHalfOne = 0x3C00;        // 1.0
constexpr uint16_t kHalfHalf = 0x3800;       // 0.5
constexpr uint16_t kHalfQuarter = 0x3400;    // 0.25
constexpr uint16_t kHalfEighth = 0x3000;     // 0.125
constexpr uint16_t kHalfMinusOne = 0xBC00;   // -1.0

void PutU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

std::vector<float> Dequantize(DType t, const std::vector<uint8_t>& blocks, int64_t n) {
  std::vector<float> out(n, std::numeric_limits<float>::quiet_NaN());
  DequantizeRow(t, blocks.data(), out.data(), n);
  return out;
}

TEST(QuantTest, BlockSizesMatchGgml) {
  EXPECT_EQ(BlockBytes(DType::kQ8_0), 34);
  EXPECT_EQ(BlockBytes(DType::kQ4_0), 18);
  EXPECT_EQ(BlockBytes(DType::kQ4_1), 20);
  EXPECT_EQ(BlockBytes(DType::kQ4_K), 144);
  EXPECT_EQ(BlockBytes(DType::kQ5_K), 176);
  EXPECT_EQ(BlockBytes(DType::kQ6_K), 210);
  EXPECT_EQ(BlockElems(DType::kQ4_1), 32);
  EXPECT_EQ(BlockElems(DType::kQ6_K), 256);
  EXPECT_EQ(RowBytes(DType::kQ4_1, 576), 18 * 20);
  EXPECT_EQ(RowBytes(DType::kBF16, 10), 20);
  EXPECT_STREQ(DTypeName(DType::kQ5_K), "Q5_K");
}

TEST(QuantTest, HalfSpecialValues) {
  EXPECT_EQ(HalfToFloat(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
  EXPECT_EQ(HalfToFloat(kHalfOne), 1.0f);
  EXPECT_EQ(HalfToFloat(0xC000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x03FF), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(HalfToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7E00)));

  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7BFF);  // below the halfway point to 65536
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);  // ties to even: overflows to inf
  EXPECT_EQ(FloatToHalf(1e10f), 0x7C00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xFC00);
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), kHalfOne);  // tie, to even (down)
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie, to even (up)
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);       // tie between 0 and 2^-24
  EXPECT_EQ(FloatToHalf(1.5f * std::ldexp(1.0f, -24)), 0x0002);  // tie, to even (up)
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
}

TEST(QuantTest, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = HalfToFloat(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << std::hex << h;
    } else {
      ASSERT_EQ(FloatToHalf(f), h) << std::hex << "half 0x" << h << " -> " << f;
    }
  }
}

#if defined(__F16C__)
TEST(QuantTest, FloatToHalfMatchesHardwareRounding) {
  const uint32_t seed = 1234;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    // Concentrate on the half range (exponents 2^-26 .. 2^17) where rounding matters.
    uint32_t u = bits(rng);
    u = (u & 0x807FFFFFu) | ((101u + (u >> 23) % 44u) << 23);
    float f;
    std::memcpy(&f, &u, 4);
    uint16_t hw = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    ASSERT_EQ(FloatToHalf(f), hw) << "seed " << seed << " float " << f << " bits 0x" << std::hex
                                  << u;
  }
}
#endif

TEST(QuantTest, BF16RoundsToNearestEven) {
  EXPECT_EQ(BF16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(BF16ToFloat(0xC040), -3.0f);
  EXPECT_EQ(BF16ToFloat(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(FloatToBF16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBF16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // tie, to even (down)
  EXPECT_EQ(FloatToBF16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie, to even (up)
  EXPECT_EQ(FloatToBF16(1.0f + std::ldexp(1.0f, -7) * 0.75f), 0x3F81);
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(FloatToBF16(3.4e38f), 0x7F80);  // rounds past the largest bf16
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(std::nanf("")))));
  // A NaN whose payload sits only in the low bits must not become infinity.
  uint32_t low_nan = 0x7F800001u;
  float f;
  std::memcpy(&f, &low_nan, 4);
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(f))));
  for (uint32_t h = 0; h < 65536; ++h) {
    float v = BF16ToFloat(uint16_t(h));
    if (!std::isnan(v)) {
      ASSERT_EQ(FloatToBF16(v), h) << std::hex << h;
    }
  }
}

// Odd lengths exercise both the 8-wide vector loop and the scalar tail.
TEST(QuantTest, F16AndBF16RowsMatchScalarConversion) {
  const uint32_t seed = 7;
  std::mt19937 rng(seed);
  const int n = 37;
  std::vector<uint16_t> halves(n), bfs(n);
  std::vector<float> want_h(n), want_b(n);
  for (int i = 0; i < n; ++i) {
    float v = std::uniform_real_distribution<float>(-100, 100)(rng);
    halves[i] = FloatToHalf(v);
    bfs[i] = FloatToBF16(v);
    want_h[i] = HalfToFloat(halves[i]);
    want_b[i] = BF16ToFloat(bfs[i]);
  }
  std::vector<float> got(n);
  DequantizeRow(DType::kF16, halves.data(), got.data(), n);
  EXPECT_TRUE(AllClose(got, want_h, 0, 0)) << "seed " << seed;
  DequantizeRow(DType::kBF16, bfs.data(), got.data(), n);
  EXPECT_TRUE(AllClose(got, want_b, 0, 0)) << "seed " << seed;
  std::vector<float> f32 = {1.5f, -2.0f, 3.25f};
  DequantizeRow(DType::kF32, f32.data(), got.data(), 3);
  EXPECT_EQ(got[2], 3.25f);
}

TEST(QuantTest, Q8_0IsScaledInt8) {
  std::vector<uint8_t> b(34);
  PutU16(&b[0], kHalfEighth);
  for (int j = 0; j < 32; ++j) b[2 + j] = uint8_t(int8_t(j * 8 - 128));  // -128, -120, ... 120
  b[2 + 31] = uint8_t(int8_t(127));
  std::vector<float> y = Dequantize(DType::kQ8_0, b, 32);
  EXPECT_EQ(y[0], -16.0f);   // -128 * 0.125
  EXPECT_EQ(y[1], -15.0f);   // -120 * 0.125
  EXPECT_EQ(y[16], 0.0f);
  EXPECT_EQ(y[17], 1.0f);
  EXPECT_EQ(y[31], 15.875f);  // 127 * 0.125
}

TEST(QuantTest, Q4_0LowNibblesFirstThenHigh) {
  std::vector<uint8_t> b(18);
  PutU16(&b[0], kHalfQuarter);
  for (int j = 0; j < 16; ++j) b[2 + j] = uint8_t(j | ((15 - j) << 4));
  std::vector<float> y = Dequantize(DType::kQ4_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 0.25f) << j;
    EXPECT_EQ(y[16 + j], (7 - j) * 0.25f) << j;
  }
  EXPECT_EQ(y[0], -2.0f);
  EXPECT_EQ(y[16], 1.75f);
}

TEST(QuantTest, Q4_1IsNibbleTimesDPlusMin) {
  // Two blocks: d=0.5, m=-1 and d=0.25, m=1 (the second checks the 20-byte stride).
  std::vector<uint8_t> b(40);
  PutU16(&b[0], kHalfHalf);
  PutU16(&b[2], kHalfMinusOne);
  PutU16(&b[20], kHalfQuarter);
  PutU16(&b[22], kHalfOne);
  for (int j = 0; j < 16; ++j) {
    b[4 + j] = uint8_t(j | ((15 - j) << 4));
    b[24 + j] = uint8_t(0xF0 | (j & 1));
  }
  std::vector<float> y = Dequantize(DType::kQ4_1, b, 64);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 0.5f - 1) << j;
    EXPECT_EQ(y[16 + j], (15 - j) * 0.5f - 1) << j;
    EXPECT_EQ(y[32 + j], (j & 1) * 0.25f + 1) << j;
    EXPECT_EQ(y[48 + j], 15 * 0.25f + 1) << j;
  }
  EXPECT_EQ(y[0], -1.0f);
  EXPECT_EQ(y[16], 6.5f);
}

TEST(QuantTest, Q4_1MatchesReferenceOnRandomBlocks) {
  const uint32_t seed = 99;
  std::mt19937 rng(seed);
  const int blocks = 9;
  std::vector<uint8_t> b(blocks * 20);
  std::vector<float> want(blocks * 32);
  for (int i = 0; i < blocks; ++i) {
    uint8_t* blk = &b[i * 20];
    PutU16(blk, FloatToHalf(std::uniform_real_distribution<float>(0.001f, 0.1f)(rng)));
    PutU16(blk + 2, FloatToHalf(std::uniform_real_distribution<float>(-1, 1)(rng)));
    for (int j = 0; j < 16; ++j) blk[4 + j] = uint8_t(rng());
    uint16_t d, m;
    std::memcpy(&d, blk, 2);
    std::memcpy(&m, blk + 2, 2);
    for (int j = 0; j < 16; ++j) {
      want[i * 32 + j] = (blk[4 + j] & 0xF) * HalfToFloat(d) + HalfToFloat(m);
      want[i * 32 + 16 + j] = (blk[4 + j] >> 4) * HalfToFloat(d) + HalfToFloat(m);
    }
  }
  std::vector<float> got = Dequantize(DType::kQ4_1, b, blocks * 32);
  EXPECT_TRUE(AllClose(got, want, 1e-6f, 1e-6f)) << "seed " << seed;
}

// Packs 6-bit scales and mins the way ggml's quantize_row_q4_K does.
void PackScalesK4(const int sc[8], const int mn[8], uint8_t* scales) {
  for (int j = 0; j < 4; ++j) {
    scales[j] = uint8_t(sc[j] | ((sc[j + 4] >> 4) << 6));
    scales[j + 4] = uint8_t(mn[j] | ((mn[j + 4] >> 4) << 6));
    scales[j + 8] = uint8_t((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
}

const int kSc[8] = {1, 2, 3, 4, 17, 33, 50, 63};
const int kMn[8] = {0, 1, 2, 3, 20, 40, 5, 63};

TEST(QuantTest, Q4_KUsesSixBitScalesAndMins) {
  std::vector<uint8_t> b(144);
  PutU16(&b[0], kHalfOne);   // d
  PutU16(&b[2], kHalfHalf);  // dmin
  PackScalesK4(kSc, kMn, &b[4]);
  for (int i = 0; i < 128; ++i) b[16 + i] = uint8_t(i * 37 + 11);
  std::vector<float> y = Dequantize(DType::kQ4_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int chunk = e / 64, within = e % 64, sub = 2 * chunk + (within >= 32);
    const uint8_t byte = b[16 + chunk * 32 + within % 32];
    const int q = within < 32 ? byte & 0xF : byte >> 4;
    ASSERT_EQ(y[e], 1.0f * kSc[sub] * q - 0.5f * kMn[sub]) << "element " << e;
  }
  // By hand: qs[0] = 11 -> element 0 = 1*1*11 - 0.5*0 = 11; element 32 = 1*2*0 - 0.5*1.
  EXPECT_EQ(y[0], 11.0f);
  EXPECT_EQ(y[32], -0.5f);
  // Sub-block 7 (scale 63, min 63): element 255 is the high nibble of qs[127] =
  // (127*37+11) & 255 = 102 = 0x66 -> 6, so 63*6 - 0.5*63.
  EXPECT_EQ(y[255], 63.0f * 6 - 31.5f);
}

TEST(QuantTest, Q5_KAddsHighBitFromQh) {
  std::vector<uint8_t> b(176);
  PutU16(&b[0], kHalfHalf);     // d
  PutU16(&b[2], kHalfQuarter);  // dmin
  PackScalesK4(kSc, kMn, &b[4]);
  for (int i = 0; i < 32; ++i) b[16 + i] = uint8_t(i * 29 + 5);   // qh
  for (int i = 0; i < 128; ++i) b[48 + i] = uint8_t(i * 53 + 3);  // qs
  std::vector<float> y = Dequantize(DType::kQ5_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int chunk = e / 64, within = e % 64, l = within % 32;
    const bool high = within >= 32;
    const int sub = 2 * chunk + high;
    const uint8_t byte = b[48 + chunk * 32 + l];
    const int bit = (b[16 + l] >> (2 * chunk + high)) & 1;
    const int q = (high ? byte >> 4 : byte & 0xF) + 16 * bit;
    ASSERT_EQ(y[e], 0.5f * kSc[sub] * q - 0.25f * kMn[sub]) << "element " << e;
  }
  // By hand: qs[0] = 3, qh[0] = 5 (bit 0 set) -> q = 19; element 0 = 0.5*1*19 - 0 = 9.5.
  EXPECT_EQ(y[0], 9.5f);
  // Element 32: high nibble of qs[0] = 0, qh[0] bit 1 = 0 -> 0.5*2*0 - 0.25*1.
  EXPECT_EQ(y[32], -0.25f);
}

TEST(QuantTest, Q6_KCombinesLowNibblesHighPairsAndInt8Scales) {
  std::vector<uint8_t> b(210);
  for (int i = 0; i < 128; ++i) b[i] = uint8_t(i * 41 + 7);        // ql
  for (int i = 0; i < 64; ++i) b[128 + i] = uint8_t(i * 23 + 1);   // qh
  const int8_t sc[16] = {1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12, 13, -14, 127, -128};
  std::memcpy(&b[192], sc, 16);
  PutU16(&b[208], kHalfQuarter);  // d
  std::vector<float> y = Dequantize(DType::kQ6_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int half = e / 128, w = e % 128, quarter = w / 32, l = w % 32;
    const uint8_t lbyte = b[half * 64 + l + (quarter & 1 ? 32 : 0)];
    const int low = quarter < 2 ? lbyte & 0xF : lbyte >> 4;
    const int high2 = (b[128 + half * 32 + l] >> (2 * quarter)) & 3;
    const int q = (low | (high2 << 4)) - 32;
    const int s = sc[half * 8 + l / 16 + 2 * quarter];
    ASSERT_EQ(y[e], 0.25f * s * q) << "element " << e;
  }
  // By hand: ql[0] = 7, qh[0] = 1 -> q = (7 | 1<<4) - 32 = -9; scale 1 -> 0.25 * -9.
  EXPECT_EQ(y[0], -2.25f);
}

}  // namespace
}  // namespace thetaserve::model
