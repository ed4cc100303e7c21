// The GPU forward pass's row kernels against the CPU backend's: embedding gather, RMSNorm,
// SwiGLU, bias + RoPE + paged K/V write (positions up to 1e5, pages shuffled, every other
// page left poisoned), VMC running sums, ordered KV row copies, V sums rebuilt from the pool
// (prefix caching), the greedy pick of a row of logits, and the warp-wide matrix instructions
// of the prefill kernel.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "model/config.h"
#include "model/quant.h"
#include "tests/gpu/gpu_test_util.h"

namespace thetaserve::kernels::cuda {
namespace {

using testing::GuardedArray;
using testing::RoundBf16;

std::vector<float> Random(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> Bf16ToFloats(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = model::BF16ToFloat(v[i]);
  return f;
}

TEST(GpuOpsTest, EmbedRmsNormSiluMulMatchCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t T = 37, n = 576, vocab = 1000, inter = 1536;

  // Embedding: bf16 rows gathered exactly.
  std::vector<uint16_t> table(vocab * n);
  for (auto& b : table) b = model::FloatToBF16(std::normal_distribution<float>(0, 1)(rng));
  std::vector<int32_t> tokens(T);
  for (auto& t : tokens) t = std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng);
  GuardedArray<uint16_t> dtable(table.size());
  GuardedArray<int32_t> dtokens(T);
  GuardedArray<float> emb(T * n);
  dtable.Upload(table);
  dtokens.Upload(tokens);
  CUDA_ASSERT(LaunchEmbed(dtable.get(), dtokens.get(), T, n, emb.get(), nullptr));
  std::vector<float> want(T * n);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < n; ++i) want[t * n + i] = model::BF16ToFloat(table[tokens[t] * n + i]);
  EXPECT_TRUE(testing::Close(emb.Download(), want, 0.0f, 0.0f, "embedding"));
  EXPECT_TRUE(emb.GuardsIntact());

  // RMSNorm, f32 and bf16 outputs, all rows and a row subset.
  const std::vector<float> x = Random(T * n, rng, 3.0f), w = Random(n, rng);
  GuardedArray<float> dx(T * n), dw(n), y(T * n);
  GuardedArray<uint16_t> yb(T * n);
  dx.Upload(x);
  dw.Upload(w);
  CUDA_ASSERT(LaunchRmsNormF32(dx.get(), nullptr, dw.get(), T, n, 1e-5f, y.get(), nullptr));
  CUDA_ASSERT(LaunchRmsNormBf16(dx.get(), nullptr, dw.get(), T, n, 1e-5f, yb.get(), nullptr));
  std::vector<float> ref(T * n);
  cpu::RmsNorm(x.data(), w.data(), T, n, 1e-5f, ref.data());
  EXPECT_TRUE(testing::Close(y.Download(), ref, 1e-5f, 1e-5f, "rmsnorm f32"));
  EXPECT_TRUE(testing::Close(Bf16ToFloats(yb.Download()), ref, 1e-5f, 8e-3f, "rmsnorm bf16"));
  const std::vector<int32_t> pick = {5, 0, 36};
  GuardedArray<int32_t> dpick(pick.size());
  GuardedArray<float> ysub(pick.size() * n);
  dpick.Upload(pick);
  CUDA_ASSERT(LaunchRmsNormF32(dx.get(), dpick.get(), dw.get(), pick.size(), n, 1e-5f, ysub.get(), nullptr));
  std::vector<float> ref_sub;
  for (int32_t p : pick) ref_sub.insert(ref_sub.end(), ref.begin() + p * n, ref.begin() + (p + 1) * n);
  EXPECT_TRUE(testing::Close(ysub.Download(), ref_sub, 1e-5f, 1e-5f, "rmsnorm rows"));
  EXPECT_TRUE(y.GuardsIntact() && yb.GuardsIntact() && ysub.GuardsIntact());

  // SwiGLU on [gate | up] rows.
  const std::vector<float> gu = Random(T * 2 * inter, rng, 2.0f);
  GuardedArray<float> dgu(gu.size());
  GuardedArray<uint16_t> act(T * inter);
  dgu.Upload(gu);
  CUDA_ASSERT(LaunchSiluMul(dgu.get(), T, inter, act.get(), nullptr));
  std::vector<float> ref_act(T * inter);
  for (int64_t t = 0; t < T; ++t) {
    cpu::SiluMul(gu.data() + t * 2 * inter, gu.data() + t * 2 * inter + inter, inter,
                 ref_act.data() + t * inter);
  }
  EXPECT_TRUE(testing::Close(Bf16ToFloats(act.Download()), ref_act, 1e-6f, 8e-3f, "silu*up"));
  EXPECT_TRUE(act.GuardsIntact());
  CUDA_ASSERT(cudaDeviceSynchronize());
}

TEST(GpuOpsTest, RopeAndKvWriteMatchCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (bool interleaved : {false, true}) {
    SCOPED_TRACE(interleaved ? "interleaved" : "halves");
    model::ModelConfig c;
    c.num_heads = 9;
    c.num_kv_heads = 3;
    c.head_dim = 64;
    c.num_layers = 2;
    c.rope_theta = 100000.0f;
    c.rope_interleaved = interleaved;
    c.rope_scaling = model::RopeScaling::kLlama3;
    c.rope_factor = 8.0f;
    const cpu::Rope rope(c);
    const int32_t layer = 1, d = 64, bs = 16, width = (9 + 6) * d;
    // Three sequences: a prefill chunk crossing pages, a decode at 1e5, a decode at 17.
    struct S { int32_t start, n; };
    const std::vector<S> seqs = {{5, 30}, {100000, 1}, {17, 1}};
    const int32_t T = 32, tables = 2 * 3;
    const int32_t stride = 100001 / bs + 1;
    // Every sequence's pages are distinct and odd; even pages stay poisoned.
    std::vector<std::vector<int32_t>> ktab(3), vtab(3);
    int32_t next = 1;
    for (int s = 0; s < 3; ++s) {
      ktab[s].assign(size_t(tables) * stride, 0);
      vtab[s].assign(size_t(tables) * stride, 0);
      const int32_t end = seqs[s].start + seqs[s].n;
      for (int32_t t = 0; t < tables; ++t) {
        for (int32_t p = seqs[s].start / bs; p <= (end - 1) / bs; ++p) {
          ktab[s][t * stride + p] = next, next += 2;
          vtab[s][t * stride + p] = next, next += 2;
        }
      }
    }
    const int64_t num_pages = next + 1;
    const KvPoolLayout layout{bs, d, num_pages};
    std::vector<float> bias = Random(width, rng);
    std::vector<float> qkv = Random(size_t(T) * width, rng, 2.0f);
    std::vector<DevRow> rows;
    for (int s = 0; s < 3; ++s)
      for (int32_t i = 0; i < seqs[s].n; ++i) rows.push_back({s, seqs[s].start + i});

    // Device side.
    GuardedArray<int32_t> dk0(ktab[0].size()), dk1(ktab[1].size()), dk2(ktab[2].size());
    GuardedArray<int32_t> dv0(vtab[0].size()), dv1(vtab[1].size()), dv2(vtab[2].size());
    GuardedArray<int32_t>* dk[] = {&dk0, &dk1, &dk2};
    GuardedArray<int32_t>* dv[] = {&dv0, &dv1, &dv2};
    std::vector<DevSeq> dseqs(3);
    int32_t off = 0;
    for (int s = 0; s < 3; ++s) {
      dk[s]->Upload(ktab[s]);
      dv[s]->Upload(vtab[s]);
      dseqs[s].token_offset = off;
      dseqs[s].num_tokens = seqs[s].n;
      dseqs[s].start_pos = seqs[s].start;
      dseqs[s].pages.k_pages = dk[s]->get();
      dseqs[s].pages.v_pages = dv[s]->get();
      dseqs[s].pages.stride = stride;
      off += seqs[s].n;
    }
    GuardedArray<DevSeq> dseq_arr(3);
    dseq_arr.Upload(dseqs);
    GuardedArray<DevRow> drows(T);
    drows.Upload(rows);
    GuardedArray<float> dqkv(qkv.size()), dbias(bias.size()), dfreq(d / 2);
    dqkv.Upload(qkv);
    dbias.Upload(bias);
    dfreq.Upload(rope.inv_freq());
    GuardedArray<uint16_t> pool(num_pages * layout.PageElems());
    AttnShape shape{9, 3, d, 0.125f};
    const DevKv kv{drows.get(), dseq_arr.get(), shape, layer, layout};
    CUDA_ASSERT(LaunchRopeWriteKv(dqkv.get(), dbias.get(), T, kv, dfreq.get(), interleaved,
                                  pool.get(), nullptr));
    CUDA_ASSERT(cudaDeviceSynchronize());

    // CPU side.
    std::vector<float> ref = qkv;
    std::vector<float> ref_pool(num_pages * layout.PageElems(), std::nanf(""));
    for (int32_t t = 0; t < T; ++t) {
      float* row = ref.data() + size_t(t) * width;
      for (int32_t i = 0; i < width; ++i) row[i] += bias[i];
      rope.Apply(row, 9, rows[t].pos);
      rope.Apply(row + 9 * d, 3, rows[t].pos);
      for (int32_t g = 0; g < 3; ++g) {
        const int64_t lh = layer * 3 + g;
        const int32_t pos = rows[t].pos, s = rows[t].seq;
        const int32_t kp = ktab[s][lh * stride + pos / bs], vp = vtab[s][lh * stride + pos / bs];
        for (int32_t e = 0; e < d; ++e) {
          ref_pool[layout.RowOffset(kp, pos % bs) + e] = RoundBf16(row[(9 + g) * d + e]);
          ref_pool[layout.RowOffset(vp, pos % bs) + e] = RoundBf16(row[(12 + g) * d + e]);
        }
      }
    }
    EXPECT_TRUE(testing::Close(dqkv.Download(), ref, 2e-5f, 2e-5f, "rotated qkv"));
    const std::vector<float> got_pool = Bf16ToFloats(pool.Download());
    size_t written = 0;
    for (size_t i = 0; i < got_pool.size(); ++i) {
      if (std::isnan(ref_pool[i])) {
        ASSERT_TRUE(std::isnan(got_pool[i])) << "pool element " << i << " written but not a K/V row of the step";
      } else {
        ++written;
        ASSERT_NEAR(got_pool[i], ref_pool[i], 1e-4f + 8e-3f * std::abs(ref_pool[i])) << "pool element " << i;
      }
    }
    EXPECT_EQ(written, size_t(T) * 2 * 3 * d);
    EXPECT_TRUE(pool.GuardsIntact() && dqkv.GuardsIntact());
  }
}

TEST(GpuOpsTest, VSumAndKvRowCopiesMatchCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int32_t d = 64, H = 9, KVH = 3, layers = 2, layer = 1, width = (H + 2 * KVH) * d;
  // Running V sums: two sequences with sums, one without.
  const std::vector<int32_t> ntok = {300, 1, 7};
  const int32_t T = 308;
  const std::vector<float> qkv = Random(size_t(T) * width, rng);
  std::vector<std::vector<float>> sums(3);
  std::vector<DevSeq> seqs(3);
  std::vector<std::unique_ptr<GuardedArray<float>>> dsums;
  int32_t off = 0;
  for (int s = 0; s < 3; ++s) {
    seqs[s].token_offset = off;
    seqs[s].num_tokens = ntok[s];
    off += ntok[s];
    if (s == 1) continue;
    sums[s] = Random(size_t(layers) * KVH * d, rng);
    dsums.push_back(std::make_unique<GuardedArray<float>>(sums[s].size()));
    dsums.back()->Upload(sums[s]);
    seqs[s].pages.v_sum = dsums.back()->get();
  }
  GuardedArray<DevSeq> dseqs(3);
  dseqs.Upload(seqs);
  GuardedArray<float> dqkv(qkv.size()), rows(size_t(T) * KVH * d);
  dqkv.Upload(qkv);
  const DevKv kv{nullptr, dseqs.get(), AttnShape{H, KVH, d, 1.0f}, layer, {}};  // no rows read
  CUDA_ASSERT(LaunchVSum(dqkv.get(), kv, 3, rows.get(), nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> got_rows = rows.Download();
  int k = 0;
  for (int s = 0; s < 3; ++s) {
    if (s == 1) continue;
    std::vector<float> ref = sums[s];
    for (int32_t i = 0; i < ntok[s]; ++i) {
      const int32_t row = seqs[s].token_offset + i;
      for (int32_t e = 0; e < KVH * d; ++e) {
        ref[layer * KVH * d + e] += qkv[size_t(row) * width + (H + KVH) * d + e];
        ASSERT_NEAR(got_rows[size_t(row) * KVH * d + e], ref[layer * KVH * d + e],
                    1e-4f * (1 + std::abs(ref[layer * KVH * d + e])));
      }
    }
    EXPECT_TRUE(testing::Close(dsums[k]->Download(), ref, 1e-4f, 1e-5f, "v_sum"));
    ++k;
  }
  // The sequence without sums leaves its rows untouched (still poisoned).
  EXPECT_TRUE(std::isnan(got_rows[size_t(seqs[1].token_offset) * KVH * d]));

  // Ordered row copies: a compaction that moves rows onto earlier slots of the same pages.
  const KvPoolLayout layout{16, d, 8};
  std::vector<float> pool(layout.num_pages * layout.PageElems());
  for (float& v : pool) v = RoundBf16(std::normal_distribution<float>(0, 1)(rng));
  std::vector<KvRowCopy> copies;
  int32_t dst = 0;
  for (int32_t src = 0; src < 64; ++src) {
    if (src % 3 == 1) continue;
    copies.push_back({2 + src / 16, src % 16, 2 + dst / 16, dst % 16});
    ++dst;
  }
  std::vector<float> ref = pool;
  for (const KvRowCopy& c : copies) {
    std::memmove(&ref[layout.RowOffset(c.dst_page, c.dst_row)], &ref[layout.RowOffset(c.src_page, c.src_row)],
                 d * sizeof(float));
  }
  std::vector<uint16_t> pool_bf(pool.size());
  for (size_t i = 0; i < pool.size(); ++i) pool_bf[i] = model::FloatToBF16(pool[i]);
  GuardedArray<uint16_t> dpool(pool_bf.size());
  GuardedArray<KvRowCopy> dcopies(copies.size());
  dpool.Upload(pool_bf);
  dcopies.Upload(copies);
  CUDA_ASSERT(LaunchCopyKvRows(dcopies.get(), copies.size(), layout, dpool.get(), nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_TRUE(testing::Close(Bf16ToFloats(dpool.Download()), ref, 0.0f, 0.0f, "pool after copies"));
  EXPECT_TRUE(dpool.GuardsIntact());
}

// A sequence that adopts cached blocks gets its V sums from the pool: each table's rows in
// position order, through shuffled pages, over a length that ends inside a page. The pool's
// values are bf16, so the f32 sums in the same order are exact.
TEST(GpuOpsTest, SumVRowsRebuildsTheRunningSums) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int32_t d = 64, tables = 5, length = 37, bs = 16, blocks = 3;
  const KvPoolLayout layout{bs, d, 24};
  std::vector<float> pool(layout.num_pages * layout.PageElems());
  for (float& v : pool) v = RoundBf16(std::normal_distribution<float>(0, 1)(rng));
  std::vector<int32_t> ids(layout.num_pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(size_t(tables) * blocks);
  std::vector<float> ref(size_t(tables) * d, 0.0f);
  for (int32_t t = 0; t < tables; ++t) {
    for (int32_t pos = 0; pos < length; ++pos) {
      const float* row = &pool[layout.RowOffset(ids[t * blocks + pos / bs], pos % bs)];
      for (int32_t e = 0; e < d; ++e) ref[t * d + e] += row[e];
    }
  }
  std::vector<uint16_t> pool_bf(pool.size());
  for (size_t i = 0; i < pool.size(); ++i) pool_bf[i] = model::FloatToBF16(pool[i]);
  GuardedArray<uint16_t> dpool(pool_bf.size());
  GuardedArray<int32_t> dids(ids.size());
  GuardedArray<float> dsum(ref.size());  // poisoned until written
  dpool.Upload(pool_bf);
  dids.Upload(ids);
  CUDA_ASSERT(LaunchSumVRows(dids.get(), tables, length, layout, dpool.get(), dsum.get(), nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_TRUE(testing::Close(dsum.Download(), ref, 0.0f, 0.0f, "v_sum"));
  EXPECT_TRUE(dsum.GuardsIntact());
  EXPECT_TRUE(dpool.GuardsIntact());
}

// The greedy pick on the device (ForwardBatch::argmax) against the sampler's: rows of random
// logits and rows made to trip it: ties (the first wins), NaNs before and at the largest value
// (never picked), nothing above -inf or only NaN (0), +inf twice, one finite value at the very
// end, a whole row equal, the largest value twice where the later index is met first. Vocabularies below one block's threads, not a multiple of them, and
// SmolLM2's.
TEST(GpuOpsTest, ArgmaxRowsPickAsTheSampler) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto sampler_pick = [&](const float* x, int64_t n) {  // scheduler/sampler.cc's ArgMax
    int32_t best = 0;
    float m = -inf;
    for (int64_t i = 0; i < n; ++i) {
      if (x[i] > m) m = x[i], best = int32_t(i);
    }
    return best;
  };
  for (const int64_t vocab : {1, 7, 513, 1000, 49152}) {
    SCOPED_TRACE("vocab " + std::to_string(vocab));
    std::uniform_int_distribution<int64_t> at(0, vocab - 1);
    std::vector<std::vector<float>> rows;
    for (int k = 0; k < 4; ++k) rows.push_back(Random(vocab, rng, 3.0f));
    {  // the largest value three times
      std::vector<float> r = Random(vocab, rng);
      for (int k = 0; k < 3; ++k) r[at(rng)] = 9.5f;
      rows.push_back(r);
    }
    {  // NaNs everywhere a tenth, one right before the largest value, one at index 0
      std::vector<float> r = Random(vocab, rng);
      for (float& v : r) v = std::uniform_real_distribution<float>(0, 1)(rng) < 0.1f ? nan : v;
      const int64_t top = at(rng);
      r[top] = 7.0f;
      if (top > 0) r[top - 1] = nan;
      r[0] = nan;
      rows.push_back(r);
    }
    rows.push_back(std::vector<float>(vocab, -inf));
    rows.push_back(std::vector<float>(vocab, nan));
    {
      std::vector<float> r(vocab, -inf);
      r[vocab - 1] = -1e30f;
      rows.push_back(r);
    }
    {
      std::vector<float> r = Random(vocab, rng);
      r[at(rng)] = inf;
      r[at(rng)] = inf;
      rows.push_back(r);
    }
    rows.push_back(std::vector<float>(vocab, 0.25f));
    if (vocab > 512) {  // the largest value at 512 and 511: the second thread's beats the first's
      std::vector<float> r = Random(vocab, rng);
      r[512] = r[511] = 11.0f;
      rows.push_back(r);
    }
    std::vector<float> all;
    std::vector<int32_t> want;
    for (const auto& r : rows) {
      all.insert(all.end(), r.begin(), r.end());
      want.push_back(sampler_pick(r.data(), vocab));
    }
    GuardedArray<float> dlogits(all.size());
    GuardedArray<int32_t> dout(rows.size());  // -1 until written
    dlogits.Upload(all);
    CUDA_ASSERT(LaunchArgmaxRows(dlogits.get(), int64_t(rows.size()), vocab, dout.get(), nullptr));
    CUDA_ASSERT(cudaDeviceSynchronize());
    const std::vector<int32_t> got = dout.Download();
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_EQ(got[i], want[i]) << "row " << i;
    }
    EXPECT_TRUE(dout.GuardsIntact());
  }
}

// The warp-wide instructions of the mma prefill kernel alone (kernels/cuda/warp_mma.cuh): an
// element read from the wrong lane or register half of A, B or C (on a GPU: a layout written
// down wrong) shows as a wrong product. A and B are bf16 with products exact in f32; every C
// element differs, so C's layout shows too.
TEST(GpuOpsTest, WarpMmaAndLdmatrixFollowTheirLayouts) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<float> a = Random(16 * 16, rng), b = Random(16 * 16, rng), c = Random(16 * 16, rng);
  std::vector<uint16_t> a16(a.size()), b16(b.size()), bt16(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a16[i] = model::FloatToBF16(a[i]);
    a[i] = model::BF16ToFloat(a16[i]);
  }
  for (int k = 0; k < 16; ++k) {
    for (int n = 0; n < 16; ++n) {
      b16[k * 16 + n] = bt16[n * 16 + k] = model::FloatToBF16(b[k * 16 + n]);
      b[k * 16 + n] = model::BF16ToFloat(b16[k * 16 + n]);
    }
  }
  GuardedArray<uint16_t> da(a16.size()), dbt(bt16.size()), db(b16.size());
  GuardedArray<float> dc(c.size()), dd(2 * c.size());
  da.Upload(a16);
  dbt.Upload(bt16);
  db.Upload(b16);
  dc.Upload(c);
  CUDA_ASSERT(LaunchWarpMmaProbe(da.get(), dbt.get(), db.get(), dc.get(), dd.get(), nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> got = dd.Download();
  for (int way = 0; way < 2; ++way) {
    for (int m = 0; m < 16; ++m) {
      for (int n = 0; n < 16; ++n) {
        double want = c[m * 16 + n];
        for (int k = 0; k < 16; ++k) want += double(a[m * 16 + k]) * b[k * 16 + n];
        EXPECT_NEAR(got[way * 256 + m * 16 + n], want, 1e-5 * (1 + std::abs(want)))
            << (way ? "B through ldmatrix .trans" : "B from its transpose's rows") << ", row "
            << m << ", column " << n;
      }
    }
  }
  EXPECT_TRUE(dd.GuardsIntact());
}

}  // namespace
}  // namespace thetaserve::kernels::cuda
