// Top-θ attention: equals dense when nothing is pruned; on a hand-built case the survivors,
// SDC and VMC equal hand-computed values; hit bits and counters; calibration recovers known
// thresholds.
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/theta_calibrator.h"
#include "model/model.h"
#include "model/theta_table.h"
#include "scheduler/sequence_runner.h"
#include "tests/test_util.h"

namespace thetaserve::kernels {
namespace {

model::ThetaTable ConstantTable(int32_t layers, int32_t heads, float theta, int32_t k,
                                model::ThetaPlacement placement) {
  model::ThetaTable t(layers, heads, model::ThetaTable::DefaultBuckets(4096));
  for (int32_t l = 0; l < layers; ++l) {
    t.k_per_layer[l] = k;
    for (int32_t h = 0; h < heads; ++h) {
      for (size_t b = 0; b < t.buckets().size(); ++b) t.theta_at(l, h, b) = theta;
    }
  }
  t.placement = placement;
  t.Finalize();
  return t;
}

TEST(TopThetaTest, NothingPrunedEqualsDense) {
  auto model = model::Model::Load(testing::SourceDir() + "/tests/data/tiny_llama");
  ASSERT_TRUE(model.ok()) << model.status();
  const auto& c = (*model)->config();
  // f32 pages: 16-bit pages would round the two paths' last-bit differences in one layer's
  // output into whole f16 steps of the next layer's K and V.
  auto dense = CreateBackend(**model, Device::kCpu, 1, MatMulMode::kQuantized, KvDtype::kF32);
  auto theta = CreateBackend(**model, Device::kCpu, 1, MatMulMode::kQuantized, KvDtype::kF32);
  ASSERT_TRUE(dense.ok() && theta.ok());
  std::mt19937 rng(7);
  std::vector<int32_t> tokens(150);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % c.vocab_size);
  auto dr = scheduler::SequenceRunner::Create(**dense, 256);
  auto ref = dr->Append(tokens, true, 37);
  ASSERT_TRUE(ref.ok());

  // θ = -inf pre-softmax keeps every row; so does k >= L. Either way: dense.
  for (int variant = 0; variant < 2; ++variant) {
    model::ThetaTable table =
        variant == 0 ? ConstantTable(c.num_layers, c.num_heads,
                                     -std::numeric_limits<float>::infinity(), 1,
                                     model::ThetaPlacement::kPreSoftmax)
                     : ConstantTable(c.num_layers, c.num_heads, 1.0f, 1000,
                                     model::ThetaPlacement::kPostSoftmax);
    TopThetaConfig cfg;
    cfg.table = &table;
    cfg.sdc = SdcMode::kExact;
    cfg.vmc = true;
    (*theta)->SetTopTheta(cfg);
    auto tr = scheduler::SequenceRunner::Create(**theta, 256);
    AttentionStats stats;
    stats.Reset(c.num_layers);
    auto got = tr->Append(tokens, true, 37, &stats);
    ASSERT_TRUE(got.ok());
    EXPECT_TRUE(testing::AllClose(*got, *ref, 1e-5f, 1e-5f)) << "variant " << variant;
    EXPECT_EQ(stats.v_rows_read, stats.v_rows_read_dense);
    EXPECT_EQ(stats.elements_kept, stats.elements_dense);
  }
}

// One layer, one KV head, two query heads, head_dim 4, five keys: everything by hand.
class HandBuiltTest : public ::testing::Test {
 protected:
  static constexpr int kD = 4, kL = 5, kGroup = 2;

  void SetUp() override {
    layout_ = KvPoolLayout{4, kD, 8};  // 8 pages of 4 rows
    pool_.assign(layout_.num_pages * layout_.PageElems(), 0.0f);
    // K rows chosen so that q·k/2 (scale 1/sqrt(4)) gives easy scores.
    const float k_rows[kL][kD] = {{2, 0, 0, 0}, {0, 2, 0, 0}, {1, 1, 0, 0}, {-2, 0, 0, 0}, {0, 0, 2, 0}};
    const float v_rows[kL][kD] = {{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}, {1, 1, 1, 1}};
    for (int j = 0; j < kL; ++j) {
      const int32_t kp = k_pages_[j / 4], vp = v_pages_[j / 4];
      std::copy(k_rows[j], k_rows[j] + kD, pool_.begin() + layout_.RowOffset(kp, j % 4));
      std::copy(v_rows[j], v_rows[j] + kD, pool_.begin() + layout_.RowOffset(vp, j % 4));
      for (int e = 0; e < kD; ++e) vsum_[e] += v_rows[j][e];
    }
    // Head 0: q = (1,0,0,0) -> scores (1, 0, 0.5, -1, 0). Head 1: q = (0,0,1,0) -> (0,0,0,0,1).
    q_ = {1, 0, 0, 0, 0, 0, 1, 0};
    scores_[0] = {1, 0, 0.5, -1, 0};
    scores_[1] = {0, 0, 0, 0, 1};
    hits_.assign(8, -1);
  }

  // Runs the CPU kernel for the last position (decode of token 4, L = 5).
  std::vector<float> Run(const TopThetaConfig& cfg, AttentionStats* stats, int32_t tail_start = 0,
                         std::vector<int32_t> sparse_pos = {}, std::vector<int32_t> sparse_pages = {}) {
    SeqChunk seq;
    seq.token_offset = 0;
    seq.num_tokens = 1;
    seq.start_pos = kL - 1;
    seq.pages.k_pages = k_pages_;
    seq.pages.v_pages = v_pages_ + tail_start / 4;
    seq.pages.stride = 2;
    seq.pages.v_tail_start = tail_start;
    sparse_count_ = static_cast<int32_t>(sparse_pos.size());
    seq.pages.v_sparse_pages = sparse_pages.data();
    seq.pages.v_sparse_pos = sparse_pos.data();
    seq.pages.v_sparse_count = &sparse_count_;
    seq.pages.sparse_stride = 2;
    seq.pages.sparse_pos_stride = 8;
    seq.pages.hits = hits_.data();
    seq.pages.hits_stride = 8;
    seq.pages.hit_mass = mass_.empty() ? nullptr : mass_.data();
    seq.pages.v_sum = vsum_;
    std::vector<int32_t> token = {0};
    ForwardBatch batch{token, std::span<const SeqChunk>(&seq, 1), false, stats};
    cpu::AttentionShape shape{1, kGroup, 1, kD, 0.5f};
    cpu::ThreadPool pool(1);
    std::vector<float> out(kGroup * kD, -7.0f);
    cpu::PagedAttention(pool, batch, shape, cfg,
                        cpu::LayerAttention<float>{.layer = 0, .q = q_.data(), .layout = layout_,
                                                   .kv_pool = pool_.data(), .vsum_rows = vsum_,
                                                   .o = out.data()});
    return out;
  }

  // Expected output of one head by the formulas of DESIGN.md §4, from the scores alone.
  std::vector<float> Expected(int head, const std::vector<bool>& keep, const std::vector<bool>& stored,
                              SdcMode sdc, bool vmc, float e_thr) {
    const float v_rows[kL][kD] = {{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}, {1, 1, 1, 1}};
    const auto& s = scores_[head];
    const float m = *std::max_element(s.begin(), s.end());
    double d_full = 0, d_kept = 0;
    int kept = 0;
    for (int j = 0; j < kL; ++j) {
      d_full += std::exp(s[j] - m);
      if (keep[j] && stored[j]) d_kept += std::exp(s[j] - m), ++kept;
    }
    double denom = sdc == SdcMode::kExact ? d_full
                   : sdc == SdcMode::kExpThreshold ? d_kept + (kL - kept) * e_thr
                                                   : d_kept;
    std::vector<float> o(kD, 0.0f);
    for (int j = 0; j < kL; ++j) {
      if (!(keep[j] && stored[j])) continue;
      for (int e = 0; e < kD; ++e) o[e] += std::exp(s[j] - m) / denom * v_rows[j][e];
    }
    if (vmc) {
      const double missing = 1.0 - d_kept / denom;
      for (int e = 0; e < kD; ++e) o[e] += missing * vsum_[e] / kL;
    }
    return o;
  }

  KvPoolLayout layout_;
  std::vector<float> pool_;
  int32_t k_pages_[2] = {0, 1};
  int32_t v_pages_[2] = {2, 3};
  std::vector<float> q_;
  std::vector<float> scores_[kGroup];
  float vsum_[kD] = {0, 0, 0, 0};
  std::vector<int32_t> hits_;
  std::vector<MassUnits> mass_;  // retained mass per position; empty: not recorded
  int32_t sparse_count_ = 0;
};

TEST_F(HandBuiltTest, PreSoftmaxSurvivorsSdcAndVmcEqualHandComputedValues) {
  // θ = 0.25 pre-softmax: head 0 keeps scores 1 and 0.5 (positions 0, 2); head 1 keeps only
  // position 4 (score 1). Strict '>': a score of exactly θ would be pruned.
  model::ThetaTable table = ConstantTable(1, kGroup, 0.25f, 2, model::ThetaPlacement::kPreSoftmax);
  for (SdcMode sdc : {SdcMode::kNone, SdcMode::kExact, SdcMode::kExpThreshold}) {
    for (bool vmc : {false, true}) {
      TopThetaConfig cfg;
      cfg.table = &table;
      cfg.sdc = sdc;
      cfg.vmc = vmc;
      AttentionStats stats;
      stats.Reset(1);
      hits_.assign(8, -1);
      std::vector<float> out = Run(cfg, &stats);
      const std::vector<bool> all(kL, true);
      auto e0 = Expected(0, {true, false, true, false, false}, all, sdc, vmc, std::exp(0.25f - 1.0f));
      auto e1 = Expected(1, {false, false, false, false, true}, all, sdc, vmc, std::exp(0.25f - 1.0f));
      std::vector<float> want = e0;
      want.insert(want.end(), e1.begin(), e1.end());
      EXPECT_TRUE(testing::AllClose(out, want, 1e-6f, 1e-5f))
          << "sdc " << SdcModeName(sdc) << " vmc " << vmc;
      // Rows read = |{0, 2} ∪ {4}| = 3 of 5; elements kept 2 + 1 of 10.
      EXPECT_EQ(stats.v_rows_read, 3);
      EXPECT_EQ(stats.v_rows_read_dense, 5);
      EXPECT_EQ(stats.elements_kept, 3);
      EXPECT_EQ(stats.elements_dense, 10);
      // The retaining query is at position 4.
      EXPECT_EQ(hits_, (std::vector<int32_t>{4, -1, 4, -1, 4, -1, -1, -1}));
    }
  }
}

TEST_F(HandBuiltTest, RetainFactorMarksOnlyRowsKeptWithMarginAndLeavesTheOutputAlone) {
  // Pre-softmax θ = 0.25: the e-threshold is e^(0.25 - 1) ≈ 0.472 for both heads. Head 0 keeps
  // positions 0 (e = 1) and 2 (e = e^-0.5 ≈ 0.607); head 1 keeps 4 (e = 1). With a retain
  // factor of 1.5 (1.5 · 0.472 ≈ 0.708) position 2 is still attended but no longer marked.
  model::ThetaTable table = ConstantTable(1, kGroup, 0.25f, 2, model::ThetaPlacement::kPreSoftmax);
  TopThetaConfig cfg;
  cfg.table = &table;
  AttentionStats base_stats;
  base_stats.Reset(1);
  const std::vector<float> base = Run(cfg, &base_stats);
  EXPECT_EQ(hits_, (std::vector<int32_t>{4, -1, 4, -1, 4, -1, -1, -1}));

  cfg.retain_factor = 1.5f;
  hits_.assign(8, -1);
  AttentionStats stats;
  stats.Reset(1);
  const std::vector<float> out = Run(cfg, &stats);
  EXPECT_EQ(hits_, (std::vector<int32_t>{4, -1, -1, -1, 4, -1, -1, -1}));
  EXPECT_EQ(out, base);
  EXPECT_EQ(stats.v_rows_read, base_stats.v_rows_read);
  EXPECT_EQ(stats.elements_kept, base_stats.elements_kept);

  // A factor above every margin marks nothing.
  cfg.retain_factor = 4.0f;
  hits_.assign(8, -1);
  Run(cfg, nullptr);
  EXPECT_EQ(hits_, std::vector<int32_t>(8, -1));
}

TEST_F(HandBuiltTest, RetainedMassIsTheSumOfTheRetainingHeadsProbabilities) {
  // Pre-softmax θ = 0.25 as above: head 0 retains 0 (p = 1/D0) and 2 (e^-.5/D0), head 1
  // retains 4 (1/D1); D0 = 1 + 2e^-1 + e^-.5 + e^-2, D1 = 4e^-1 + 1. Twice: the mass adds up.
  model::ThetaTable table = ConstantTable(1, kGroup, 0.25f, 2, model::ThetaPlacement::kPreSoftmax);
  TopThetaConfig cfg;
  cfg.table = &table;
  mass_.assign(8, 0);
  Run(cfg, nullptr);
  Run(cfg, nullptr);
  const double d0 = 1 + 2 * std::exp(-1.0) + std::exp(-0.5) + std::exp(-2.0);
  const double d1 = 4 * std::exp(-1.0) + 1;
  const std::vector<float> want = {float(2 / d0), 0, float(2 * std::exp(-0.5) / d0), 0,
                                   float(2 / d1), 0, 0, 0};
  std::vector<float> got(mass_.size());
  for (size_t j = 0; j < got.size(); ++j) got[j] = float(MassValue(mass_[j]));
  EXPECT_TRUE(testing::AllClose(got, want, 1e-6f, 1e-5f));
}

TEST_F(HandBuiltTest, PostSoftmaxThresholdIsOnProbabilities) {
  // Head 0 probabilities: e^(s-1)/D with D = 1 + e^-1 + e^-.5 + e^-2 + e^-1.
  const double d0 = 1 + std::exp(-1.0) * 2 + std::exp(-0.5) + std::exp(-2.0);
  // θ between p(2) = e^-.5/D ≈ 0.26 and p(1) = e^-1/D ≈ 0.16 keeps positions 0 and 2.
  const float theta = static_cast<float>(0.5 * (std::exp(-0.5) + std::exp(-1.0)) / d0);
  model::ThetaTable table = ConstantTable(1, kGroup, theta, 2, model::ThetaPlacement::kPostSoftmax);
  TopThetaConfig cfg;
  cfg.table = &table;
  cfg.sdc = SdcMode::kExact;
  cfg.vmc = true;
  std::vector<float> out = Run(cfg, nullptr);
  const std::vector<bool> all(kL, true);
  auto e0 = Expected(0, {true, false, true, false, false}, all, SdcMode::kExact, true, 0);
  // Head 1: p(4) = e^0/(4e^-1 + 1) ≈ 0.405 > θ ≈ 0.21; the others ≈ 0.149 < θ.
  auto e1 = Expected(1, {false, false, false, false, true}, all, SdcMode::kExact, true, 0);
  e0.insert(e0.end(), e1.begin(), e1.end());
  EXPECT_TRUE(testing::AllClose(out, e0, 1e-6f, 1e-5f));
}

TEST_F(HandBuiltTest, DroppedRowsAreRetainedButEvictedAndTheirMassGoesToVmc) {
  // Positions 0..3 left the tail (tail starts at 4); the sparse store kept only position 2
  // (in page 4, row 0). Head 0 retains 0 and 2, but 0 was dropped.
  pool_.resize(layout_.num_pages * layout_.PageElems());
  const float v2[kD] = {0, 0, 1, 0};
  std::copy(v2, v2 + kD, pool_.begin() + layout_.RowOffset(4, 0));
  // The tail page for positions 4..7 is v_pages_[1] = 3.
  model::ThetaTable table = ConstantTable(1, kGroup, 0.25f, 2, model::ThetaPlacement::kPreSoftmax);
  TopThetaConfig cfg;
  cfg.table = &table;
  cfg.sdc = SdcMode::kExact;
  cfg.vmc = true;
  AttentionStats stats;
  stats.Reset(1);
  std::vector<float> out = Run(cfg, &stats, /*tail_start=*/4, /*sparse_pos=*/{2}, /*sparse_pages=*/{4});
  const std::vector<bool> stored = {false, false, true, false, true};
  auto e0 = Expected(0, {true, false, true, false, false}, stored, SdcMode::kExact, true, 0);
  auto e1 = Expected(1, {false, false, false, false, true}, stored, SdcMode::kExact, true, 0);
  e0.insert(e0.end(), e1.begin(), e1.end());
  EXPECT_TRUE(testing::AllClose(out, e0, 1e-6f, 1e-5f));
  EXPECT_EQ(stats.retained_but_evicted, 1);
  EXPECT_EQ(stats.v_rows_read, 2);
}

TEST(ThetaCalibratorTest, RecoversMeanPlusTenthOfStdPerBucket) {
  model::ThetaTable shape(2, 3, model::ThetaTable::DefaultBuckets(1024));
  ThetaCalibrator cal(shape);
  std::mt19937 rng(3);
  // θ_row ~ N(mu, sigma) with mu depending on (layer, head) and ln L.
  auto mu = [](int l, int h, int64_t L) { return 0.1f * l + 0.05f * h + 0.2f * std::log(float(L)); };
  const float sigma = 0.3f;
  std::normal_distribution<float> noise(0.0f, sigma);
  for (int i = 0; i < 200000; ++i) {
    const int l = i % 2, h = (i / 2) % 3;
    const int64_t L = shape.buckets()[40 + (i / 6) % 20];  // exact bucket lengths
    cal.Record(l, h, L, mu(l, h, L) + noise(rng), 0.5f);
  }
  model::ThetaTable t = cal.Build(0.1);
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 3; ++h) {
      for (int b = 40; b < 60; ++b) {
        const int64_t L = shape.buckets()[b];
        EXPECT_NEAR(t.Theta(l, h, L), mu(l, h, L) + 0.1f * sigma, 0.02f) << l << " " << h << " " << L;
        EXPECT_NEAR(t.SdcRatio(l, h, L), 0.5f, 1e-6f);
      }
      // Beyond the last calibrated bucket: the fitted slope in ln L carries on (0.2 per ln L).
      const int64_t last = shape.buckets()[59];
      EXPECT_NEAR(t.Theta(l, h, last * 4) - t.Theta(l, h, last), 0.2f * std::log(4.0f), 0.02f);
    }
  }
}

// Prefills `n` deterministic tokens through the real CPU kernel in calibration mode (exact
// top-k with `shape`'s k, every long row's value to `recorder`), one 512-token chunk.
void RunCalibration(const model::Model& model, const model::ThetaTable& shape,
                    CalibrationRecorder* recorder, int n, AttentionStats* stats) {
  const auto& c = model.config();
  TopThetaConfig cfg;
  cfg.table = &shape;
  cfg.recorder = recorder;
  auto backend = CreateBackend(model, Device::kCpu, 1);
  ASSERT_TRUE(backend.ok());
  (*backend)->SetTopTheta(cfg);
  auto runner = scheduler::SequenceRunner::Create(**backend, 64);
  ASSERT_TRUE(runner.ok());
  std::vector<int32_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(i * 7 % c.vocab_size);
  stats->Reset(c.num_layers);
  ASSERT_TRUE(runner->Append(tokens, false, 512, stats).ok());
}

TEST(ThetaCalibratorTest, TopKCalibrationRecordsTheKPlusFirstLargest) {
  // Through the real kernel: with a recorder, each row's value is its (k+1)-th largest.
  auto model = model::Model::Load(testing::SourceDir() + "/tests/data/tiny_llama");
  ASSERT_TRUE(model.ok());
  const auto& c = (*model)->config();
  struct Check : CalibrationRecorder {
    void Record(int32_t layer, int32_t head, int64_t L, float theta_row, float miss) override {
      std::lock_guard<std::mutex> lock(mu);
      ++rows;
      ok = ok && std::isfinite(theta_row) && theta_row > 0 && theta_row < 1 && L > 8 && miss >= 0;
    }
    std::mutex mu;
    int64_t rows = 0;
    bool ok = true;
  } check;
  model::ThetaTable shape(c.num_layers, c.num_heads, model::ThetaTable::DefaultBuckets(256));
  for (auto& k : shape.k_per_layer) k = 8;
  shape.placement = model::ThetaPlacement::kPostSoftmax;
  AttentionStats stats;
  ASSERT_NO_FATAL_FAILURE(RunCalibration(**model, shape, &check, 40, &stats));
  // Rows with L > 8: positions 8..39, every layer and head.
  EXPECT_EQ(check.rows, (40 - 8) * c.num_layers * c.num_heads);
  EXPECT_TRUE(check.ok);
  // Exact top-k keeps exactly k elements per long row (no ties in random data).
  int64_t expected = 0;
  for (int64_t L = 1; L <= 40; ++L) expected += std::min<int64_t>(L, 8);
  EXPECT_EQ(stats.elements_kept, expected * c.num_layers * c.num_heads);
}

TEST(ThetaCalibratorTest, KScheduleSetsSurvivorsPerRowLength) {
  // The same kernel run with k growing with L (8 up to L = 16, log-log to 16 at L = 32, then
  // held): exact top-k keeps k(L) elements in each long row, and calibration records a row
  // only where L > k(L).
  auto model = model::Model::Load(testing::SourceDir() + "/tests/data/tiny_llama");
  ASSERT_TRUE(model.ok());
  const auto& c = (*model)->config();
  model::ThetaTable shape(c.num_layers, c.num_heads, model::ThetaTable::DefaultBuckets(256));
  for (auto& k : shape.k_per_layer) k = 8;
  shape.k_schedule = {{16, 8}, {32, 16}};
  ASSERT_TRUE(model::ThetaTable::ValidateKSchedule(shape.k_schedule).ok());
  struct Count : CalibrationRecorder {
    void Record(int32_t, int32_t, int64_t, float, float) override {
      std::lock_guard<std::mutex> lock(mu);
      ++rows;
    }
    std::mutex mu;
    int64_t rows = 0;
  } count;
  AttentionStats stats;
  ASSERT_NO_FATAL_FAILURE(RunCalibration(**model, shape, &count, 48, &stats));
  int64_t kept = 0, recorded = 0;
  for (int64_t L = 1; L <= 48; ++L) {
    const int32_t k = shape.KAt(0, L);
    kept += std::min<int64_t>(L, k);
    recorded += L > k;
  }
  EXPECT_EQ(stats.elements_kept, kept * c.num_layers * c.num_heads);
  EXPECT_EQ(count.rows, recorded * c.num_layers * c.num_heads);
  EXPECT_GT(kept, 36 + 8 * 40) << "the schedule must keep more than a fixed k = 8 would";
}

TEST(ThetaTableTest, KScheduleInterpolatesInLogLogAndRoundTrips) {
  model::ThetaTable t(2, 1, model::ThetaTable::DefaultBuckets(64));
  t.k_per_layer = {512, 64};
  EXPECT_EQ(t.KAt(1, 8192), 64) << "no schedule: the layer's k";
  t.k_schedule = {{2048, 64}, {8192, 128}};
  EXPECT_EQ(t.KAt(1, 100), 64);
  EXPECT_EQ(t.KAt(1, 2048), 64);
  EXPECT_EQ(t.KAt(1, 4096), 91);  // 64 · 2^0.5 = 90.5: halfway in ln L is halfway in ln k
  EXPECT_EQ(t.KAt(1, 8192), 128);
  EXPECT_EQ(t.KAt(1, 100000), 128) << "held beyond the last point";
  EXPECT_EQ(t.KAt(0, 8192), 512) << "a dense layer's larger k stays";
  for (int32_t b = 0; b < int32_t(t.buckets().size()); ++b) t.theta_at(1, 0, b) = 0.01f;
  t.Finalize();
  const std::string with = t.fingerprint;
  const thetaserve::testing::ScopedTempDir tmp("top_theta_test");
  const std::string path = tmp.File("k_schedule_theta.json");
  ASSERT_TRUE(t.Save(path).ok());
  auto loaded = model::ThetaTable::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->k_schedule, t.k_schedule);
  EXPECT_EQ(loaded->fingerprint, with);
  t.k_schedule.clear();
  t.Finalize();
  EXPECT_NE(t.fingerprint, with) << "the schedule is part of the file's identity";
}

TEST(ThetaTableTest, ThetaIsLinearInLnLAcrossEmptyBucketsHeldBelowAndExtrapolatedAbove) {
  model::ThetaTable t(1, 1, {10, 20, 40, 80, 160, 320});
  // Buckets 10, 40 and 320 had no calibration rows (NaN).
  const float theta[] = {NAN, 1.0f, NAN, 3.0f, 4.0f, NAN};
  const float sdc[] = {NAN, 0.1f, NAN, 0.3f, 0.4f, NAN};
  for (int32_t b = 0; b < 6; ++b) {
    t.theta_at(0, 0, b) = theta[b];
    t.sdc_at(0, 0, b) = sdc[b];
    t.count_at(0, 0, b) = std::isnan(theta[b]) ? 0 : 10;
  }
  t.Finalize();
  EXPECT_EQ(t.Theta(0, 0, 1), 1.0f) << "held at the first calibrated bucket below it";
  EXPECT_EQ(t.Theta(0, 0, 20), 1.0f);
  EXPECT_NEAR(t.Theta(0, 0, 40), 2.0f, 1e-6f) << "halfway in ln L between 20 and 80";
  EXPECT_NEAR(t.Theta(0, 0, 30), 1.0f + 2.0f * float(std::log(1.5) / std::log(4.0)), 1e-6f);
  EXPECT_EQ(t.Theta(0, 0, 80), 3.0f);
  EXPECT_NEAR(t.Theta(0, 0, 113), 3.0f + float(std::log(113.0 / 80.0) / std::log(2.0)), 1e-6f);
  EXPECT_NEAR(t.SdcRatio(0, 0, 40), 0.2f, 1e-6f);
  // Past the last calibrated bucket θ goes on linearly in ln L with the least-squares slope of
  // the calibrated buckets ((20, 1), (80, 3), (160, 4): exactly 1 per doubling); the SDC
  // ratio is held.
  EXPECT_NEAR(t.Theta(0, 0, 320) - t.Theta(0, 0, 160), 1.0f, 1e-5f);
  EXPECT_NEAR(t.Theta(0, 0, 640) - t.Theta(0, 0, 320), 1.0f, 1e-5f);
  EXPECT_EQ(t.SdcRatio(0, 0, 640), 0.4f);
}

TEST(ThetaTableTest, KScheduleValidation) {
  using S = model::ThetaTable::KSchedule;
  EXPECT_TRUE(model::ThetaTable::ValidateKSchedule(S{{2048, 64}, {8192, 128}}).ok());
  // Each refused for its reason (any error passed before).
  auto refusal = [](const S& schedule) {
    const absl::Status st = model::ThetaTable::ValidateKSchedule(schedule);
    return st.ok() ? std::string("accepted") : std::string(st.message());
  };
  const std::string order = "k schedule: lengths must increase and k must not decrease";
  EXPECT_EQ(refusal(S{{2048, 128}, {8192, 64}}), order) << "k must not shrink";
  EXPECT_EQ(refusal(S{{8192, 64}, {2048, 128}}), order) << "lengths must increase";
  EXPECT_EQ(refusal(S{{64, 64}}), "k schedule point 64:64: need 1 <= k < L");
  EXPECT_EQ(refusal(S{{64, 0}}), "k schedule point 64:0: need 1 <= k < L");
}

// A θ file edited by hand (or cut short) is refused by name: an unknown placement was read as
// post-softmax, a k below 1 was taken, and buckets out of order broke the bisection over them.
TEST(ThetaTableTest, LoadRefusesAFileWithValuesNoCalibrationWrites) {
  model::ThetaTable t(2, 1, {16, 32, 64});
  t.k_per_layer = {64, 8};
  for (int32_t b = 0; b < 3; ++b) t.theta_at(1, 0, b) = 0.01f;
  t.Finalize();
  const thetaserve::testing::ScopedTempDir tmp("top_theta_test");
  const std::string good = tmp.File("good_theta.json");
  ASSERT_TRUE(t.Save(good).ok());
  ASSERT_TRUE(model::ThetaTable::Load(good).ok());
  nlohmann::json j;
  std::ifstream(good) >> j;
  const std::pair<std::string, std::function<void(nlohmann::json&)>> edits[] = {
      {"placement is 'middle'; it must be pre or post", [](auto& x) { x["placement"] = "middle"; }},
      {"k_per_layer[1] = -5; k must be >= 1", [](auto& x) { x["k_per_layer"][1] = -5; }},
      {"k_per_layer[0] = 0; k must be >= 1", [](auto& x) { x["k_per_layer"][0] = 0; }},
      {"buckets must be lengths >= 1 in increasing order",
       [](auto& x) { x["buckets"] = {16, 64, 32}; }},
      {"num_layers and num_heads must be >= 1", [](auto& x) { x["num_heads"] = 0; }},
      // Values no calibration writes: they were used as they stood (post θ = 5 kept nothing).
      {"theta[3] (layer 1, head 0, bucket 0) = 5; a post-softmax θ is a probability in [0, 1]",
       [](auto& x) { x["theta"][3] = 5.0; }},
      {"theta[5] (layer 1, head 0, bucket 2) = -0.5; a post-softmax θ is a probability in "
       "[0, 1]",
       [](auto& x) { x["theta"][5] = -0.5; }},
      {"theta[4] (layer 1, head 0, bucket 1) = inf; a post-softmax θ is a probability in [0, 1]",
       [](auto& x) { x["theta"][4] = 1e300; }},
      {"sdc_offline[3] (layer 1, head 0, bucket 0) = -1; it must be finite and >= 0",
       [](auto& x) { x["sdc_offline"][3] = -1.0; }},
      {"counts[0] (layer 0, head 0, bucket 0) = -1; it must be >= 0",
       [](auto& x) { x["counts"][0] = -1; }},
      // A shape the arrays do not have is said before anything is sized by it (it threw
      // bad_alloc).
      {"theta has 6 entries; num_layers × num_heads × buckets = 100000 × 100000 × 3 = "
       "30000000000",
       [](auto& x) { x["num_layers"] = 100000; x["num_heads"] = 100000; }},
  };
  for (const auto& [message, edit] : edits) {
    nlohmann::json bad = j;
    edit(bad);
    const std::string path = tmp.File("bad_theta.json");
    std::ofstream(path) << bad.dump();
    auto loaded = model::ThetaTable::Load(path);
    ASSERT_FALSE(loaded.ok()) << message;
    EXPECT_EQ(loaded.status().message(), path + ": " + message);
  }
  // A pre-softmax θ is a scaled score: any finite value.
  nlohmann::json pre = j;
  pre["placement"] = "pre";
  pre["theta"][3] = 5.0;
  pre["theta"][4] = -3.0;
  const std::string path = tmp.File("pre_theta.json");
  std::ofstream(path) << pre.dump();
  auto loaded = model::ThetaTable::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->theta_at(1, 0, 0), 5.0f);
}

}  // namespace
}  // namespace thetaserve::kernels
