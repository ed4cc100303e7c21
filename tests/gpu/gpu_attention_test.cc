// GPU paged attention against the CPU reference (kernels/cpu/attention.cc): dense decode
// (flash-decoding splits) and tiled prefill, and Top-θ with every placement, SDC mode and VMC,
// over a sparse V store with dropped rows; outputs, hit marks and counters.
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/attention_case.h"

namespace thetaserve::kernels::cuda::attention_test {
namespace {

// kAuto reads K per thread below kStagedFromKeys keys per KV head a launch (rows × longest
// length), staged from there, and per thread where the head size has no staged kernel; an
// explicit way stays as asked. (Host code: runs without a device.)
TEST(SplitPlanTest, AutoKLoadStagesLargeLaunches) {
  const AttnShape d64{9, 3, 64, 0.125f}, d32{4, 1, 32, 0.17f};
  EXPECT_EQ(PlanSplits(1, d64, 32768, 132, KLoad::kAuto).k_load, KLoad::kPerThread);
  EXPECT_EQ(PlanSplits(8, d64, 4096, 132, KLoad::kAuto).k_load, KLoad::kPerThread);
  EXPECT_EQ(PlanSplits(1, d64, 65535, 132, KLoad::kAuto).k_load, KLoad::kPerThread);
  EXPECT_EQ(PlanSplits(2, d64, 32768, 132, KLoad::kAuto).k_load, KLoad::kStaged);
  EXPECT_EQ(PlanSplits(64, d64, 1024, 132, KLoad::kAuto).k_load, KLoad::kStaged);
  EXPECT_EQ(PlanSplits(1, d64, 131072, 132, KLoad::kAuto).k_load, KLoad::kStaged);
  EXPECT_EQ(PlanSplits(64, d32, 32768, 132, KLoad::kAuto).k_load, KLoad::kPerThread);
  EXPECT_EQ(PlanSplits(64, d64, 32768, 132, KLoad::kQuad).k_load, KLoad::kQuad);
  EXPECT_EQ(PlanSplits(1, d64, 64, 132, KLoad::kStaged).k_load, KLoad::kStaged);
  EXPECT_EQ(PlanSplits(64, d64, 32768, 132, KLoad::kPerThread).k_load, KLoad::kPerThread);
  // A fixed chunk (batch-invariant attention): per thread whatever the batch.
  const char* chunk = std::getenv("THETASERVE_ATTN_CHUNK");
  const std::string saved = chunk ? chunk : "";
  setenv("THETASERVE_ATTN_CHUNK", "512", 1);
  EXPECT_EQ(PlanSplits(64, d64, 32768, 132, KLoad::kAuto).k_load, KLoad::kPerThread);
  EXPECT_EQ(PlanSplits(64, d64, 32768, 132, KLoad::kAuto).chunk, 512);
  if (chunk) {
    setenv("THETASERVE_ATTN_CHUNK", saved.c_str(), 1);
  } else {
    unsetenv("THETASERVE_ATTN_CHUNK");
  }
}

// The measuring knobs: each name picks its way and (where a name function exists) is its
// way's name; the default's name, unset, empty, or anything not exactly a name (case, a
// prefix, a trailing space, a typo) picks the default, a typo said on stderr once per value.
// (Host code: runs without a device.)
TEST(SplitPlanTest, KnobsNameTheirWaysAndSayWhenTheyNameNothing) {
  const char* vars[] = {"THETASERVE_ATTN_K_LOAD", "THETASERVE_ATTN_THETA",
                        "THETASERVE_ATTN_PREFILL", "THETASERVE_ATTN_THETA_PREFILL"};
  std::vector<std::optional<std::string>> saved;
  for (const char* var : vars) {
    const char* v = std::getenv(var);
    saved.push_back(v ? std::optional<std::string>(v) : std::nullopt);
  }
  auto k_load = [](const std::string& v) {
    setenv("THETASERVE_ATTN_K_LOAD", v.c_str(), 1);
    return DefaultKLoad();
  };
  auto passes = [](const std::string& v) {
    setenv("THETASERVE_ATTN_THETA", v.c_str(), 1);
    return DefaultThetaPasses();
  };
  auto prefill = [](const std::string& v) {
    setenv("THETASERVE_ATTN_PREFILL", v.c_str(), 1);
    return DefaultPrefillWay();
  };
  auto theta_prefill = [](const std::string& v) {
    setenv("THETASERVE_ATTN_THETA_PREFILL", v.c_str(), 1);
    return DefaultThetaPrefill();
  };
  EXPECT_EQ(k_load("thread"), KLoad::kPerThread);
  EXPECT_EQ(k_load("staged"), KLoad::kStaged);
  EXPECT_EQ(k_load("quad"), KLoad::kQuad);
  EXPECT_EQ(passes("split"), ThetaPasses::kSplit);
  EXPECT_EQ(passes("fused"), ThetaPasses::kFused);
  EXPECT_EQ(prefill("fma"), PrefillWay::kFma);
  EXPECT_EQ(prefill("wmma"), PrefillWay::kWmma);
  EXPECT_EQ(theta_prefill("split"), ThetaPrefill::kSplit);
  for (KLoad k : {KLoad::kPerThread, KLoad::kStaged, KLoad::kQuad, KLoad::kAuto}) {
    EXPECT_EQ(k_load(KLoadName(k)), k) << KLoadName(k);
  }
  for (PrefillWay w : {PrefillWay::kMma, PrefillWay::kWmma, PrefillWay::kFma}) {
    EXPECT_EQ(prefill(PrefillWayName(w)), w) << PrefillWayName(w);
  }
  for (ThetaPrefill w : {ThetaPrefill::kTiled, ThetaPrefill::kSplit}) {
    EXPECT_EQ(theta_prefill(ThetaPrefillName(w)), w) << ThetaPrefillName(w);
  }
  ::testing::internal::CaptureStderr();
  for (const char* var : vars) unsetenv(var);
  EXPECT_EQ(DefaultKLoad(), KLoad::kAuto);
  EXPECT_EQ(DefaultThetaPasses(), ThetaPasses::kAuto);
  EXPECT_EQ(DefaultPrefillWay(), PrefillWay::kMma);
  EXPECT_EQ(DefaultThetaPrefill(), ThetaPrefill::kTiled);
  EXPECT_EQ(k_load(""), KLoad::kAuto);
  EXPECT_EQ(passes(""), ThetaPasses::kAuto);
  EXPECT_EQ(prefill(""), PrefillWay::kMma);
  EXPECT_EQ(theta_prefill(""), ThetaPrefill::kTiled);
  EXPECT_EQ(k_load("auto"), KLoad::kAuto);
  EXPECT_EQ(passes("auto"), ThetaPasses::kAuto);
  EXPECT_EQ(prefill("mma"), PrefillWay::kMma);
  EXPECT_EQ(theta_prefill("tiled"), ThetaPrefill::kTiled);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  // Values not met before in this process (the test may run again in it: --gtest_repeat).
  static int run = 0;
  const std::string typo = "staget" + std::to_string(run++);
  ::testing::internal::CaptureStderr();
  for (int twice = 0; twice < 2; ++twice) {
    EXPECT_EQ(k_load(typo), KLoad::kAuto);
    EXPECT_EQ(passes(typo), ThetaPasses::kAuto);
    EXPECT_EQ(prefill(typo), PrefillWay::kMma);
    EXPECT_EQ(theta_prefill(typo), ThetaPrefill::kTiled);
  }
  for (const char* near : {"Staged", "stage", "staged ", "Fused", "fuse", "fused ", "Wmma", "wmm",
                           "wmma ", "Split", "spli", "split "}) {
    EXPECT_EQ(k_load(near), KLoad::kAuto) << "'" << near << "'";
    EXPECT_EQ(passes(near), ThetaPasses::kAuto) << "'" << near << "'";
    EXPECT_EQ(prefill(near), PrefillWay::kMma) << "'" << near << "'";
    EXPECT_EQ(theta_prefill(near), ThetaPrefill::kTiled) << "'" << near << "'";
  }
  const std::string said = ::testing::internal::GetCapturedStderr();
  for (const std::string& line :
       {"THETASERVE_ATTN_K_LOAD=" + typo + " is none of thread|staged|quad|auto",
        "THETASERVE_ATTN_THETA=" + typo + " is none of split|fused|auto",
        "THETASERVE_ATTN_PREFILL=" + typo + " is none of mma|wmma|fma",
        "THETASERVE_ATTN_THETA_PREFILL=" + typo + " is none of tiled|split"}) {
    const size_t at = said.find(line);
    EXPECT_NE(at, std::string::npos) << said;
    if (at != std::string::npos) {
      EXPECT_EQ(said.find(line, at + 1), std::string::npos) << said;
    }
  }
  for (size_t i = 0; i < saved.size(); ++i) {
    if (saved[i]) {
      setenv(vars[i], saved[i]->c_str(), 1);
    } else {
      unsetenv(vars[i]);
    }
  }
}

// Every case runs with pass 1 reading K per thread, staged through shared memory, and per quad
// (dense cases also with prefill tiles through warp matrix functions, "_wmma_prefill", and on
// f32 FMAs, "_fma_prefill", besides the register-resident tensor-core kernel);
// the Top-θ cases (GpuTopThetaTest) each way three times: with the passes the server picks (one
// pass for pre-softmax thresholds; these runs do not record the retained mass, which would
// take two), as two kernels, and fused (these two record the mass); their prefill chunks go to
// the tiled Top-θ kernel, and in two more ways ("_split_theta_prefill") to the split kernels
// a row at a time.
class GpuAttentionTest : public ::testing::TestWithParam<AttnWay> {};
INSTANTIATE_TEST_SUITE_P(KLoad, GpuAttentionTest,
                         ::testing::Values(AttnWay{KLoad::kPerThread}, AttnWay{KLoad::kStaged},
                                           AttnWay{KLoad::kQuad},
                                           AttnWay{KLoad::kPerThread, ThetaPasses::kAuto,
                                                   PrefillWay::kWmma},
                                           AttnWay{KLoad::kPerThread, ThetaPasses::kAuto,
                                                   PrefillWay::kFma}),
                         [](const ::testing::TestParamInfo<AttnWay>& p) {
                           return WayName(p.param);
                         });
class GpuTopThetaTest : public GpuAttentionTest {};
INSTANTIATE_TEST_SUITE_P(
    Way, GpuTopThetaTest,
    ::testing::Values(AttnWay{KLoad::kPerThread}, AttnWay{KLoad::kStaged}, AttnWay{KLoad::kQuad},
                      AttnWay{KLoad::kPerThread, ThetaPasses::kSplit},
                      AttnWay{KLoad::kStaged, ThetaPasses::kSplit},
                      AttnWay{KLoad::kQuad, ThetaPasses::kSplit},
                      AttnWay{KLoad::kPerThread, ThetaPasses::kFused},
                      AttnWay{KLoad::kStaged, ThetaPasses::kFused},
                      AttnWay{KLoad::kQuad, ThetaPasses::kFused},
                      AttnWay{KLoad::kPerThread, ThetaPasses::kAuto, PrefillWay::kMma,
                              ThetaPrefill::kSplit},
                      AttnWay{KLoad::kStaged, ThetaPasses::kSplit, PrefillWay::kMma,
                              ThetaPrefill::kSplit}),
    [](const ::testing::TestParamInfo<AttnWay>& p) { return WayName(p.param); });

TEST_P(GpuAttentionTest, DenseDecodeAndPrefillMatchCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  for (Shape s : {Shape{}, Shape{2, 1, 8, 2, 128, 16}, Shape{2, 0, 4, 4, 64, 32},
                  Shape{2, 1, 8, 1, 64, 16}, Shape{2, 1, 4, 2, 16, 16}, Shape{2, 1, 4, 1, 32, 16},
                  Shape{2, 1, 9, 3, 64, 12}}) {
    SCOPED_TRACE(::testing::Message() << "heads " << s.num_heads << "/" << s.num_kv_heads << " d "
                                      << s.head_dim << " block " << s.block_size);
    // Decode rows of many lengths (one crossing several 1024-key splits), whole prefills (one
    // over several of the tiled kernel's key tiles), chunked prefills after cached tokens (one
    // whose warps of 16 query rows, at group 1, end at position 64: the first key of a tile),
    // and a first token; pages of 12 rows too (a block size that is not a power of two).
    AttentionCase c(s,
                    {{37, 1}, {0, 70}, {130, 45}, {2100, 1}, {0, 1}, {511, 1}, {0, 200}, {1, 64}},
                    seed, GetParam());
    c.RunAndExpectSame(TopThetaConfig{}, false);
  }
}

TEST_P(GpuAttentionTest, ManyDecodeRowsAtLongContext) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  // 64 rows: few splits per row, so chunks reach their 1024-key maximum.
  std::vector<SeqSpec> specs;
  for (int i = 0; i < 64; ++i) specs.push_back({1000 + 37 * i, 1});
  AttentionCase c(Shape{}, specs, seed, GetParam());
  c.RunAndExpectSame(TopThetaConfig{}, false);
}

TEST_P(GpuAttentionTest, DenseDecodeOfLongRows) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  // Rows of many splits (17,001 keys, the last split partial) beside shorter ones, for
  // group sizes 3 and 4.
  for (const Shape s : {Shape{}, Shape{2, 1, 8, 2, 128, 16}}) {
    AttentionCase c(s, {{17000, 1}, {9000, 1}, {3000, 1}}, seed, GetParam());
    c.RunAndExpectSame(TopThetaConfig{}, false);
  }
}

// The largest chunks the plan allows for big heads and groups (d 128 at groups 4 and 8, d 64 at
// group 8): with staged K, pass 1's shared memory then comes near the 48 KB a launch may take
// without the opt-in, its static arrays included; on a GPU a plan past it fails to launch.
TEST_P(GpuAttentionTest, LargestChunksForBigHeadsAndGroups) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  const ChunkEnv env("1024");  // asks for 1024-key chunks; the plan caps them
  for (const Shape s : {Shape{2, 1, 8, 2, 128, 16}, Shape{2, 1, 8, 1, 128, 16}, Shape{2, 1, 8, 1, 64, 16}}) {
    SCOPED_TRACE(::testing::Message() << "d " << s.head_dim << " group " << s.num_heads / s.num_kv_heads);
    const model::ThetaTable table = MakeTable(s, model::ThetaPlacement::kPostSoftmax, 16);
    const model::ThetaTable pre = MakeTable(s, model::ThetaPlacement::kPreSoftmax, 16);
    TopThetaConfig theta, theta_pre;
    theta.table = &table;
    theta_pre.table = &pre;
    for (const TopThetaConfig& cfg : {TopThetaConfig{}, theta, theta_pre}) {
      AttentionCase c(s, {{2500, 1}, {1100, 1}}, seed, GetParam());
      c.RunAndExpectSame(cfg, cfg.table != nullptr);
      // One pass (pre-softmax) holds flags and a kept list beside the scores: its chunk is
      // whatever fits (d 128, group 8: under 1024 keys), and the launch above is the check.
      if (c.one_pass()) continue;
      // Per thread or quad every shape here fits 1024-key chunks; staged, none does.
      if (GetParam().k_load != KLoad::kStaged) {
        EXPECT_EQ(c.chunk(), 1024);
      } else {
        EXPECT_LT(c.chunk(), 1024);
      }
    }
  }
}

// The benchmark's time per kernel cuts the split path short (set_kernel_limit): the first n
// kernels launch (dense: pass 1, combine; Top-θ: pass 1, pass 2, combine; fused or one pass:
// that kernel, combine), the output stays as poisoned until the last, and the whole path still
// matches the CPU. The emulator counts the launches; Top-θ's counters tell on a GPU too.
TEST_P(GpuTopThetaTest, KernelLimitLaunchesTheFirstKernelsOnly) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  const Shape s;
  const model::ThetaTable post = MakeTable(s, model::ThetaPlacement::kPostSoftmax, 16);
  const model::ThetaTable pre = MakeTable(s, model::ThetaPlacement::kPreSoftmax, 16);
  TopThetaConfig theta_post, theta_pre;
  theta_post.table = &post;
  theta_pre.table = &pre;
  for (const TopThetaConfig& cfg : {TopThetaConfig{}, theta_post, theta_pre}) {
    const ThetaPasses passes = GetParam().passes;
    const bool one_launch =
        passes == ThetaPasses::kFused ||
        (passes == ThetaPasses::kAuto && cfg.placement() == model::ThetaPlacement::kPreSoftmax);
    const bool two_passes = cfg.active() && !one_launch;
    const int32_t kernels = two_passes ? 3 : 2;
    for (int32_t limit = 1; limit <= kernels; ++limit) {
      SCOPED_TRACE(::testing::Message()
                   << (cfg.active() ? model::PlacementName(cfg.placement()) : "dense")
                   << ", limit " << limit);
      AttentionCase c(s, {{3000, 1}, {700, 1}}, seed, GetParam());
      c.set_kernel_limit(limit);
      c.Run(cfg, cfg.active());
#if defined(THETASERVE_CUDA_EMU)
      EXPECT_EQ(c.kernel_launches(), limit);
#endif
      // On any device, Top-θ's counters say which kernels ran: pass 2 (or the fused or one-pass
      // kernel) counts the V rows it reads, the combine the elements kept.
      if (cfg.active()) {
        const bool pass2_ran = !two_passes || limit >= 2;
        EXPECT_EQ(c.gpu_stats().v_rows_read > 0, pass2_ran);
        EXPECT_EQ(c.gpu_stats().elements_kept > 0, limit == kernels);
      }
      if (limit < kernels) {
        const std::vector<float>& out = c.gpu_out();
        EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) {
          uint32_t b;
          std::memcpy(&b, &v, 4);
          return b == 0xFFFFFFFFu;  // GuardedArray's poison
        }));
      } else {
        c.ExpectSame(cfg);
      }
    }
  }
}

// Pre-softmax thresholds run in one pass (nothing row-wide decides a key) unless a sequence
// records the retained mass, which needs the row's D_full (the engine's mass budget,
// --keep-fraction): then in two. Either way the GPU matches the CPU, over a sparse store and a
// host store below the tail, for decode and prefill rows.
TEST(GpuOnePassTest, OnePassUnlessTheRetainedMassIsRecorded) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  const Shape s;
  const model::ThetaTable table = MakeTable(s, model::ThetaPlacement::kPreSoftmax, 16);
  TopThetaConfig theta;
  theta.table = &table;
  // Chunks as planned, and of 64 keys: then a split's last host row, position 383 of the split
  // [320, 384), is one the thresholds keep (every tenth key from 3 is lifted).
  for (const char* chunk : {static_cast<const char*>(nullptr), "64"})
  for (KLoad k : {KLoad::kPerThread, KLoad::kStaged, KLoad::kQuad}) {
    for (bool mass : {false, true}) {
      SCOPED_TRACE(::testing::Message() << KLoadName(k) << (mass ? ", mass" : ", no mass")
                                        << ", chunk " << (chunk ? chunk : "planned"));
      const ChunkEnv env(chunk);
      AttentionCase c(s, {{1500, 1, 600, true, -1, true}, {900, 2, 320}, {40, 24}}, seed,
                      AttnWay{k});
      c.set_record_mass(mass);
      c.RunAndExpectSame(theta, true);
      if (chunk) {
        EXPECT_EQ(c.chunk(), 64);
      }
      EXPECT_EQ(c.one_pass(), !mass);
      EXPECT_GT(c.cpu_marks(), 0);
      if (mass) {
        EXPECT_GT(c.total_mass(), 0.0);
      }
    }
  }
}

// Top-θ prefill tiles (PrefillThetaKernel, the default for prompt chunks under Top-θ) against
// the CPU: both placements, the retain factor (marks only where e > 8·thr: 8 splits the kept
// mode, MakeTable) or none, over the dense tail, a sparse store and a host store below it; d 64
// with a group of 3 (a token's heads in different warps) and of 1 (64 tokens a tile, one row
// each), d 128 with 8; chunks that start inside a key tile and span several row tiles, one
// whose store ends inside a tile, and an attention sink among a store's positions; the
// retained mass recorded. The split kernels'
// way of taking prefill rows is every GpuTopThetaTest's "_split_theta_prefill" runs.
TEST(GpuThetaPrefillTest, TiledTopThetaPrefillMatchesCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  for (const Shape s : {Shape{}, Shape{2, 1, 4, 4, 64, 16}, Shape{2, 1, 8, 1, 128, 16}})
  for (auto placement : {model::ThetaPlacement::kPreSoftmax, model::ThetaPlacement::kPostSoftmax})
  for (bool host : {false, true}) {
    const float retain = host ? 8.0f : 1.0f;
    SCOPED_TRACE(::testing::Message()
                 << "d " << s.head_dim << " group " << s.num_heads / s.num_kv_heads << " "
                 << model::PlacementName(placement)
                 << (host ? ", host store, retain 8" : ", sparse store"));
    const model::ThetaTable table = MakeTable(s, placement, 16);
    TopThetaConfig cfg;
    cfg.table = &table;
    cfg.retain_factor = retain;
    SeqSpec stored{300, 70, 240};  // the store ends inside the key tile [192, 256)
    SeqSpec sink{70, 3, 64};
    sink.sink = 6;
    stored.host = sink.host = host;
    AttentionCase c(s, {{100, 130}, stored, sink, {0, 9}}, seed,
                    AttnWay{KLoad::kPerThread, ThetaPasses::kSplit});
    c.RunAndExpectSame(cfg, true);
    EXPECT_GT(c.cpu_stats().elements_kept, 0);
    EXPECT_LT(c.cpu_stats().elements_kept, c.cpu_stats().elements_dense / 4);
    EXPECT_GT(c.cpu_marks(), 0);
    EXPECT_GT(c.total_mass(), 1.0);
    if (host) {
      EXPECT_GT(c.cpu_stats().v_rows_read_host, 0) << "no row was read from the host store";
      EXPECT_EQ(c.cpu_stats().retained_but_evicted, 0) << "a host row was missed";
    } else {
      EXPECT_GT(c.cpu_stats().retained_but_evicted, 0);
    }
  }
}

TEST_P(GpuTopThetaTest, TopThetaEveryPlacementSdcAndVmcMatchesCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  for (const Shape s : {Shape{}, Shape{2, 1, 8, 1, 128, 16}})
  for (auto placement : {model::ThetaPlacement::kPreSoftmax, model::ThetaPlacement::kPostSoftmax}) {
    const model::ThetaTable table = MakeTable(s, placement, 16);
    for (SdcMode sdc : {SdcMode::kNone, SdcMode::kExact, SdcMode::kExpThreshold, SdcMode::kOffline}) {
      for (bool vmc : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "d " << s.head_dim << " group " << s.num_heads / s.num_kv_heads
                                          << " " << model::PlacementName(placement) << " sdc "
                                          << SdcModeName(sdc) << " vmc " << vmc);
        // Rows longer and shorter than k, a prefill chunk, a long decode row, and a
        // sequence without V sums (no VMC for it).
        AttentionCase c(s, {{200, 1}, {50, 40}, {1500, 1}, {5, 1}, {0, 12, 0, false}}, seed, GetParam());
        TopThetaConfig cfg;
        cfg.table = &table;
        cfg.sdc = sdc;
        cfg.vmc = vmc;
        c.RunAndExpectSame(cfg, true);
        // The threshold really prunes: about a tenth of the elements survive.
        EXPECT_LT(c.cpu_stats().elements_kept, c.cpu_stats().elements_dense / 4);
      }
    }
  }
}

TEST_P(GpuTopThetaTest, TopThetaOverSparseVStoreMatchesCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  const Shape s;
  const model::ThetaTable table = MakeTable(s, model::ThetaPlacement::kPostSoftmax, 16);
  TopThetaConfig cfg;
  cfg.table = &table;
  // Decode and a prefill chunk over a V store whose rows below 256 are two thirds dropped.
  AttentionCase c(s, {{300, 1, 256}, {320, 20, 256}, {1200, 1, 1024}}, seed, GetParam());
  c.RunAndExpectSame(cfg, true);
  EXPECT_GT(c.cpu_stats().retained_but_evicted, 0);
  EXPECT_EQ(c.total_mass() > 1.0, c.records_mass()) << "retained mass recorded, or not, as asked";
}

// Hit marks with a retain factor (--retain-factor): a row is marked where some head keeps it
// with e > r · threshold, a second threshold pass 2 tests beside the keep threshold, in the
// positions loop (over a sparse store) and in the stored rows' loop (without one).
TEST_P(GpuTopThetaTest, TopThetaRetainFactorMarksMatchCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  const Shape s;
  for (auto placement : {model::ThetaPlacement::kPreSoftmax, model::ThetaPlacement::kPostSoftmax}) {
    SCOPED_TRACE(model::PlacementName(placement));
    const model::ThetaTable table = MakeTable(s, placement, 16);
    int64_t marks[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      TopThetaConfig cfg;
      cfg.table = &table;
      // 8: the kept mode's scores (about 4 pre-softmax, 8.5/L post) straddle 8 θ (2 + ln 8,
      // 8/L), so the factor splits the kept rows (MakeTable).
      cfg.retain_factor = i == 0 ? 1.0f : 8.0f;
      AttentionCase c(s, {{300, 1, 256}, {1200, 1}, {40, 30}}, seed, GetParam());
      c.RunAndExpectSame(cfg, true);
      marks[i] = c.cpu_marks();
    }
    // The factor takes marks away (some kept rows pass θ but not 8θ), not all of them.
    EXPECT_GT(marks[1], 0);
    EXPECT_LT(marks[1], marks[0]);
  }
}

// The offload policy's host store: the rows the sparse store above drops are in the host pool
// (mapped pinned memory on the GPU) instead, and both sides read the retained ones from there;
// nothing is missed. Pre- and post-softmax, decode rows, a prefill chunk, a long row over
// several splits, and a short one whose host rows end inside the first block.
TEST_P(GpuTopThetaTest, TopThetaOverAHostStoreMatchesCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  const Shape s;
  for (auto placement : {model::ThetaPlacement::kPreSoftmax, model::ThetaPlacement::kPostSoftmax}) {
    SCOPED_TRACE(model::PlacementName(placement));
    const model::ThetaTable table = MakeTable(s, placement, 16);
    TopThetaConfig cfg;
    cfg.table = &table;
    std::vector<SeqSpec> specs = {{300, 1, 256}, {320, 20, 256}, {2500, 1, 2048}, {77, 1, 32}};
    for (SeqSpec& sp : specs) sp.host = true;
    AttentionCase c(s, specs, seed, GetParam());
    c.RunAndExpectSame(cfg, true);
    EXPECT_GT(c.cpu_stats().v_rows_read_host, 0) << "no row was read from the host store";
    EXPECT_EQ(c.cpu_stats().retained_but_evicted, 0) << "a host row was missed";
  }
}

// Pages of 12 rows (--block-size takes any size): every page lookup divides by a block size
// that is not a power of two (Divisor's division, not its shift), in pass 1's K reads (each
// way), the staged copies, dense V, prefill, and pass 2's tail, sparse and host stores.
TEST_P(GpuTopThetaTest, BlockSizeNotAPowerOfTwoMatchesCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  const Shape s{2, 1, 9, 3, 64, 12};
  {
    AttentionCase c(s, {{37, 1}, {0, 70}, {130, 45}, {2100, 1}}, seed, GetParam());
    c.RunAndExpectSame(TopThetaConfig{}, false);
  }
  for (auto placement : {model::ThetaPlacement::kPreSoftmax, model::ThetaPlacement::kPostSoftmax})
  for (bool host : {false, true}) {
    SCOPED_TRACE(::testing::Message() << model::PlacementName(placement)
                                      << (host ? ", host store" : ", sparse store"));
    const model::ThetaTable table = MakeTable(s, placement, 16);
    TopThetaConfig cfg;
    cfg.table = &table;
    // V tails start at multiples of 12; the first sequence keeps all of V.
    std::vector<SeqSpec> specs = {{1500, 1}, {300, 1, 252}, {320, 20, 252}, {1200, 1, 1020}};
    for (SeqSpec& sp : specs) sp.host = host && sp.v_tail_start > 0;
    AttentionCase c(s, specs, seed, GetParam());
    c.RunAndExpectSame(cfg, true);
    if (host) {
      EXPECT_GT(c.cpu_stats().v_rows_read_host, 0) << "no row was read from the host store";
    }
    EXPECT_EQ(c.total_mass() > 1.0, c.records_mass()) << "retained mass recorded, or not, as asked";
  }
}

// An attention sink scores ~30 where the rest score ~0 and ~4: its split's other rows lie 26-30
// nats below that split's max, past what the 16-bit scores between the passes hold. Pre-softmax
// θ = 2 keeps the ~4 rows everywhere, those of the sink's split included; their saturated
// scores must not decide (or weigh) them. Post-softmax the sink takes nearly all the mass.
TEST_P(GpuTopThetaTest, TopThetaWithAnAttentionSinkMatchesCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  const Shape s;
  for (auto placement : {model::ThetaPlacement::kPreSoftmax, model::ThetaPlacement::kPostSoftmax}) {
    SCOPED_TRACE(model::PlacementName(placement));
    const model::ThetaTable table = MakeTable(s, placement, 16);
    TopThetaConfig cfg;
    cfg.table = &table;
    SeqSpec with_sink{3000, 1};
    with_sink.sink = 1;
    SeqSpec sparse_with_sink{2500, 1, 1200};
    sparse_with_sink.sink = 0;  // the first sparse-store row
    AttentionCase c(s, {with_sink, sparse_with_sink}, seed, GetParam());
    c.RunAndExpectSame(cfg, true);
  }
}

// A row of 30,000 keys beside short ones: over 50 splits, which a fused cluster's 8 blocks
// take in turn (block b: splits b, b + 8, ...), the short rows' blocks mostly past their ends.
TEST_P(GpuTopThetaTest, TopThetaRowOf30kKeysMatchesCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  const Shape s;
  const model::ThetaTable table = MakeTable(s, model::ThetaPlacement::kPostSoftmax, 16);
  TopThetaConfig cfg;
  cfg.table = &table;
  AttentionCase c(s, {{30000, 1}, {700, 1, 512}, {3, 1}}, seed, GetParam());
  c.RunAndExpectSame(cfg, true);
  EXPECT_GT(c.splits(), 6 * 8);
  EXPECT_EQ(c.total_mass() > 1.0, c.records_mass()) << "retained mass recorded, or not, as asked";
}

TEST_P(GpuTopThetaTest, TopThetaLongRowsMatchCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const Shape s;
  // A fresh seed, and one whose post-softmax case puts rows within 1e-4 of a threshold: the
  // 16-bit scores between the passes would flip their decisions, the exact-score fallback
  // (split_keep.cuh, RowKeep near a band) must not.
  for (uint64_t seed : {testing::TestSeed(), uint64_t{2740948863}}) {
    SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
    // Long decode rows over many splits, with and without a sparse store (whose stored rows
    // map to positions in other splits).
    for (auto placement : {model::ThetaPlacement::kPreSoftmax, model::ThetaPlacement::kPostSoftmax}) {
      SCOPED_TRACE(model::PlacementName(placement));
      const model::ThetaTable table = MakeTable(s, placement, 16);
      TopThetaConfig cfg;
      cfg.table = &table;
      AttentionCase c(s, {{12000, 1}, {10000, 1, 6000}, {9000, 1, 100}}, seed, GetParam());
      c.RunAndExpectSame(cfg, true);
      EXPECT_GT(c.cpu_stats().retained_but_evicted, 0);
      EXPECT_EQ(c.total_mass() > 1.0, c.records_mass()) << "retained mass recorded, or not, as asked";
    }
  }
}

}  // namespace
}  // namespace thetaserve::kernels::cuda::attention_test
