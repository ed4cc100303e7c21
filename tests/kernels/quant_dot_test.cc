// Integer dot products of quantized weight blocks with Q8 activation blocks (quant_dot.h), on
// hand-built blocks, and MatMul's quantized mode against its exact f32 mode.
#include "kernels/cpu/quant_dot.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "model/quant.h"
#include "tests/test_util.h"

namespace thetaserve::kernels::cpu {
namespace {

using model::DType;

void PutHalf(uint8_t* p, float f) {
  const uint16_t h = model::FloatToHalf(f);
  std::memcpy(p, &h, 2);
}

// One weight row of `nb` random blocks of type `t` (random scales, offsets and quants).
std::vector<uint8_t> RandomRow(DType t, int64_t nb, std::mt19937& rng) {
  std::vector<uint8_t> row(nb * model::BlockBytes(t));
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = row.data() + b * model::BlockBytes(t);
    PutHalf(p, scale(rng));
    int first = 2;
    if (t == DType::kQ4_1) {
      PutHalf(p + 2, -8.0f * scale(rng));  // a min, as Q4_1 blocks of centred weights have
      first = 4;
    }
    for (int64_t i = first; i < model::BlockBytes(t); ++i) p[i] = uint8_t(byte(rng));
  }
  return row;
}

std::vector<float> RandomFloats(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

// Σ w[k] · d_b · q[k] in double: what the integer path must give up to f32 rounding.
double ReferenceDot(DType t, const std::vector<uint8_t>& w, const BlockQ8x2* x, int64_t nb,
                    double* abs_sum) {
  std::vector<float> wf(nb * kQ8Block);
  model::DequantizeRow(t, w.data(), wf.data(), nb * kQ8Block);
  double sum = 0;
  *abs_sum = 0;
  for (int64_t k = 0; k < nb * kQ8Block; ++k) {
    const BlockQ8x2& p = x[k / (2 * kQ8Block)];
    const int j = static_cast<int>(k % (2 * kQ8Block));
    const double xv = double(p.d(j / kQ8Block)) * p.quant(j);
    sum += double(wf[k]) * xv;
    *abs_sum += std::fabs(double(wf[k]) * xv);
  }
  return sum;
}

TEST(QuantizeRowQ8Test, ScaleIsMaxOver127AndQuantsRoundToNearest) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = 0.37f * float(i - 20);
  x[40] = -25.4f;  // the largest magnitude of block 1
  BlockQ8x2 q;
  QuantizeRowQ8(x.data(), 64, &q);
  EXPECT_FLOAT_EQ(q.d(0), 0.37f * 20 / 127.0f);
  EXPECT_EQ(q.quant(0), -127);
  EXPECT_FLOAT_EQ(q.d(1), 25.4f / 127.0f);
  EXPECT_EQ(q.quant(40), -127);
  // The layout the kernels load: elements 0..15 of each block in lo, 16..31 in hi.
  EXPECT_EQ(q.lo[16 + 8], q.quant(40));
  EXPECT_EQ(q.hi[3], q.quant(19));
  for (int b = 0; b < 2; ++b) {
    const float max_abs = b == 0 ? std::fabs(x[0]) : std::fabs(x[40]);
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) {
      const float want = x[b * 32 + i] / q.d(b);
      const int got = q.quant(b * 32 + i);
      EXPECT_LE(std::fabs(got - want), 0.5f + 1e-4f) << "block " << b << " elem " << i;
      EXPECT_EQ(got, int(std::nearbyint(x[b * 32 + i] * (127.0f / max_abs))))
          << "block " << b << " elem " << i;
      sum += got;
    }
    EXPECT_FLOAT_EQ(q.s(b), q.d(b) * float(sum));
  }
}

// A zero block, and the absent second block of a row with an odd block count, are all zeros.
TEST(QuantizeRowQ8Test, ZeroBlockAndAbsentBlockAreZero) {
  std::vector<float> x(32, 0.0f);
  BlockQ8x2 q;
  std::memset(&q, 0x5A, sizeof(q));
  QuantizeRowQ8(x.data(), 32, &q);
  for (int u = 0; u < 2; ++u) {
    EXPECT_EQ(q.d(u), 0.0f);
    EXPECT_EQ(q.s(u), 0.0f);
  }
  for (int j = 0; j < 64; ++j) EXPECT_EQ(q.quant(j), 0) << j;
}

// A Q4_1 block with d = 0.5, m = -2 and quants 0..15, 15..0 against integer activations:
// every term is exact in f32, so is the result.
TEST(QuantizedDotTest, HandBuiltQ4_1BlockIsExact) {
  uint8_t w[20];
  PutHalf(w, 0.5f);
  PutHalf(w + 2, -2.0f);
  for (int i = 0; i < 16; ++i) w[4 + i] = uint8_t(i | ((15 - i) << 4));  // elems i and 16+i
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = float((i * 7) % 23 - 11);  // max |x| = 11
  BlockQ8x2 xq;
  QuantizeRowQ8(x.data(), 32, &xq);
  double want = 0;
  for (int i = 0; i < 32; ++i) {
    const int q = i < 16 ? i : 15 - (i - 16);
    want += (0.5 * q - 2.0) * double(xq.d(0)) * xq.quant(i);
  }
  float got;
  QuantizedDotRows(DType::kQ4_1, w, 20, 1, &xq, 1, 1, 1, &got);
  EXPECT_NEAR(got, want, 1e-5 * std::fabs(want) + 1e-6);
}

TEST(QuantizedDotTest, HandBuiltQ8_0AndQ4_0BlocksMatchTheirDequantizedValues) {
  // Q8_0 with the extreme quants -128 and 127 (maddubs' pair sum stays inside int16).
  uint8_t w8[34];
  PutHalf(w8, 0.25f);
  for (int i = 0; i < 32; ++i) w8[2 + i] = uint8_t(int8_t(i % 2 ? 127 : -128));
  uint8_t w4[18];
  PutHalf(w4, 0.125f);
  for (int i = 0; i < 16; ++i) w4[2 + i] = uint8_t((i % 16) | (((i * 3) % 16) << 4));
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = i % 3 == 0 ? 127.0f : -127.0f + i;
  BlockQ8x2 xq;
  QuantizeRowQ8(x.data(), 32, &xq);
  ASSERT_EQ(xq.d(0), 1.0f);  // x are the quants themselves
  double want8 = 0, want4 = 0;
  for (int i = 0; i < 32; ++i) {
    want8 += 0.25 * (i % 2 ? 127 : -128) * xq.quant(i);
    const int q4 = i < 16 ? i : (((i - 16) * 3) % 16);
    want4 += 0.125 * (q4 - 8) * xq.quant(i);
  }
  float got8, got4;
  QuantizedDotRows(DType::kQ8_0, w8, 34, 1, &xq, 1, 1, 1, &got8);
  QuantizedDotRows(DType::kQ4_0, w4, 18, 1, &xq, 1, 1, 1, &got4);
  EXPECT_EQ(got8, want8);  // small integers times powers of two: exact
  EXPECT_EQ(got4, want4);
}

class QuantizedDotTypeTest : public ::testing::TestWithParam<DType> {};

// Random rows of 1..9 blocks (odd counts exercise the unpaired last block) against 1..4
// activation rows: the result equals the double-precision dot of the dequantized values up to
// f32 rounding, each activation row's result does not depend on how many rows ran with it, and
// the AVX2 and AVX-VNNI builds agree bit for bit.
TEST_P(QuantizedDotTypeTest, MatchesDequantizedDotAndIsIndependentOfRowCount) {
  const DType t = GetParam();
  std::printf("quantized dot product: %s\n", QuantizedDotIsa());
  const unsigned seed = 1234 + static_cast<unsigned>(t);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int64_t nb = 1; nb <= 9; ++nb) {
    const std::vector<uint8_t> w = RandomRow(t, nb, rng);
    const int64_t np = Q8PairsPerRow(nb * kQ8Block);
    std::vector<BlockQ8x2> x(4 * np);
    for (int r = 0; r < 4; ++r) {
      std::vector<float> xf = RandomFloats(nb * kQ8Block, rng);
      QuantizeRowQ8(xf.data(), nb * kQ8Block, x.data() + r * np);
    }
    float all[4];
    QuantizedDotRows(t, w.data(), 0, 1, x.data(), np, 4, nb, all);
    // The AVX-VNNI build (where the CPU has it) computes the same int32 sums as the AVX2 one.
    float avx2[4];
    QuantizedDotRowsAvx2(t, w.data(), 0, 1, x.data(), np, 4, nb, avx2);
    for (int r = 0; r < 4; ++r) EXPECT_EQ(avx2[r], all[r]) << "nb " << nb << " row " << r;
    for (int tt = 1; tt <= 4; ++tt) {
      float some[4];
      QuantizedDotRows(t, w.data(), 0, 1, x.data(), np, tt, nb, some);
      for (int r = 0; r < tt; ++r) EXPECT_EQ(some[r], all[r]) << "nb " << nb << " tt " << tt;
    }
    for (int r = 0; r < 4; ++r) {
      double abs_sum;
      const double want = ReferenceDot(t, w, x.data() + r * np, nb, &abs_sum);
      EXPECT_NEAR(all[r], want, 1e-5 * abs_sum) << "nb " << nb << " row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, QuantizedDotTypeTest,
                         ::testing::Values(DType::kQ8_0, DType::kQ4_0, DType::kQ4_1),
                         [](const auto& info) { return std::string(model::DTypeName(info.param)); });

// MatMul's quantized mode against its exact mode on a weight of 37 rows (crossing the 16-row
// tile) and 1..9 activation rows, with bias and accumulation. The only difference is the
// activations' rounding to 8 bits: |Δ| <= Σ_k |w[n,k]| · d_x / 2 per element, bounded here
// by 1% of Σ_k |w[n,k] x[t,k]| plus a small absolute term.
TEST(QuantizedMatMulTest, QuantizedModeMatchesExactModeWithinActivationRounding) {
  ThreadPool pool(2);
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    const unsigned seed = 99 + static_cast<unsigned>(t);
    SCOPED_TRACE(std::string(model::DTypeName(t)) + " seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const int64_t N = 37, nb = 6, K = nb * kQ8Block;
    std::vector<uint8_t> wdata;
    for (int64_t n = 0; n < N; ++n) {
      std::vector<uint8_t> row = RandomRow(t, nb, rng);
      wdata.insert(wdata.end(), row.begin(), row.end());
    }
    model::TensorView w;
    w.dtype = t;
    w.shape = {N, K};
    w.data = wdata.data();
    w.nbytes = wdata.size();
    std::vector<float> wf(N * K);
    model::DequantizeRow(t, wdata.data(), wf.data(), N * K);
    const std::vector<float> bias = RandomFloats(N, rng);
    for (int64_t T : {1, 2, 3, 4, 5, 9}) {
      const std::vector<float> x = RandomFloats(T * K, rng);
      const std::vector<float> y0 = RandomFloats(T * N, rng);
      std::vector<float> exact = y0, quant = y0;
      MatMul(pool, x.data(), T, w, bias.data(), exact.data(), /*accumulate=*/true,
             MatMulMode::kExact);
      MatMul(pool, x.data(), T, w, bias.data(), quant.data(), /*accumulate=*/true,
             MatMulMode::kQuantized);
      for (int64_t r = 0; r < T; ++r) {
        for (int64_t n = 0; n < N; ++n) {
          double mag = 0;
          for (int64_t k = 0; k < K; ++k) mag += std::fabs(wf[n * K + k] * x[r * K + k]);
          const double diff = std::fabs(double(quant[r * N + n]) - exact[r * N + n]);
          EXPECT_LE(diff, 0.01 * mag + 1e-5) << "T " << T << " row " << r << " col " << n;
        }
      }
      // The quantized rows do not depend on the batch: row 0 alone gives the same numbers.
      std::vector<float> alone(y0.begin(), y0.begin() + N);
      MatMul(pool, x.data(), 1, w, bias.data(), alone.data(), true, MatMulMode::kQuantized);
      for (int64_t n = 0; n < N; ++n) EXPECT_EQ(alone[n], quant[n]) << "T " << T << " col " << n;
    }
  }
}

// MatMuls (one parallel region over several weights of one x) gives what MatMul gives for each,
// in both modes.
TEST(QuantizedMatMulTest, MatMulsEqualsOneMatMulPerWeight) {
  ThreadPool pool(2);
  const unsigned seed = 4242;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int64_t nb = 3, K = nb * kQ8Block, T = 5;
  const DType types[] = {DType::kQ4_1, DType::kQ8_0, DType::kQ4_0};
  const int64_t rows[] = {40, 7, 16};
  std::vector<std::vector<uint8_t>> data(3);
  std::vector<model::TensorView> ws(3);
  for (int i = 0; i < 3; ++i) {
    for (int64_t n = 0; n < rows[i]; ++n) {
      std::vector<uint8_t> row = RandomRow(types[i], nb, rng);
      data[i].insert(data[i].end(), row.begin(), row.end());
    }
    ws[i].dtype = types[i];
    ws[i].shape = {rows[i], K};
    ws[i].data = data[i].data();
    ws[i].nbytes = data[i].size();
  }
  const std::vector<float> x = RandomFloats(T * K, rng);
  const std::vector<float> bias = RandomFloats(40, rng);
  for (MatMulMode mode : {MatMulMode::kQuantized, MatMulMode::kExact}) {
    std::vector<std::vector<float>> fused(3), alone(3);
    for (int i = 0; i < 3; ++i) {
      fused[i] = alone[i] = RandomFloats(T * rows[i], rng);
      MatMul(pool, x.data(), T, ws[i], i == 0 ? bias.data() : nullptr, alone[i].data(),
             /*accumulate=*/i == 1, mode);
    }
    const MatMulOut outs[] = {{&ws[0], bias.data(), fused[0].data(), false},
                              {&ws[1], nullptr, fused[1].data(), true},
                              {&ws[2], nullptr, fused[2].data(), false}};
    MatMuls(pool, x.data(), T, outs, mode);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(fused[i], alone[i]) << "weight " << i;
  }
}

}  // namespace
}  // namespace thetaserve::kernels::cpu
