// The CUDA backend's whole forward pass against the CPU backend's, on the committed tiny
// models (f32 safetensors, bf16 sharded Qwen2 with QKV bias, mixed-quant GGUF) and on
// SmolLM2 when models/ has it: mixed prefill/decode batches over shared paged pools, dense
// and Top-θ. Both sides are fed the same (CPU-greedy) tokens so every step is compared. The
// GPU keeps the page tables between steps (SeqChunk::tables), as under the engine. And the
// refusal of attention without Top-θ over a sparse V store.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cache/page_pool.h"
#include "cache/sequence_kv.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/model.h"
#include "model/theta_table.h"
#include "scheduler/sequence.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/dense_v_check.h"
#include "tests/test_util.h"

namespace thetaserve::kernels {
namespace {

struct Report {
  double worst_rel = 0;   // max over rows of max|Δ| / max|ref|
  int worst_step = -1;    // the step (0-2: prefill, then decode) where it was seen
  int rows = 0, agree = 0;
};

// One row of logits against the reference: max|Δ| / max|ref|, both argmaxes, any NaN.
struct RowDiff {
  double rel = 0;
  int64_t want_top = 0, got_top = 0;
  bool nan = false;
};
RowDiff CompareRow(const float* want, const float* got, int64_t n) {
  RowDiff d;
  double max_ref = 0, max_diff = 0;
  for (int64_t v = 0; v < n; ++v) {
    d.nan |= std::isnan(got[v]) || std::isnan(want[v]);  // (max would drop a NaN difference)
    max_ref = std::max(max_ref, double(std::abs(want[v])));
    max_diff = std::max(max_diff, double(std::abs(want[v] - got[v])));
  }
  d.rel = max_diff / max_ref;
  d.want_top = std::max_element(want, want + n) - want;
  d.got_top = std::max_element(got, got + n) - got;
  return d;
}

// Runs three sequences through both backends: prefill (one chunked), then decode steps of
// all three together. Returns the comparison.
Report Compare(const model::Model& m, const TopThetaConfig& theta, int decode_steps) {
  const auto& c = m.config();
  auto cpu = CreateBackend(m, Device::kCpu, 0, MatMulMode::kExact, KvDtype::kF32);  // f32 reference
  auto gpu = CreateBackend(m, Device::kCuda, 0);
  EXPECT_TRUE(cpu.ok() && gpu.ok()) << (gpu.ok() ? cpu.status() : gpu.status());
  Report rep;
  if (!cpu.ok() || !gpu.ok()) return rep;
  (*cpu)->SetTopTheta(theta);
  (*gpu)->SetTopTheta(theta);
  const int32_t bs = 16, stride = 32;  // 512 positions per sequence
  const int64_t tables = c.num_layers * c.num_kv_heads;
  for (auto* b : {&*cpu, &*gpu}) EXPECT_TRUE((*b)->AllocateKvPool(2 * tables * stride * 3, bs).ok());
  std::vector<std::vector<int32_t>> ktab(3), vtab(3);
  for (int s = 0; s < 3; ++s) {
    ktab[s].resize(tables * stride);
    vtab[s].resize(tables * stride);
    for (int64_t i = 0; i < tables * stride; ++i) {
      ktab[s][i] = static_cast<int32_t>((2 * i) * 3 + s);
      vtab[s][i] = static_cast<int32_t>((2 * i + 1) * 3 + s);
    }
  }
  // V sums for VMC, one set per backend.
  std::vector<std::vector<float>> vsum_cpu(3, std::vector<float>(tables * c.head_dim, 0.0f));
  std::vector<std::vector<float>> vsum_gpu = vsum_cpu;
  const auto& tok = m.tokenizer();
  std::vector<std::vector<int32_t>> seq_tokens = {
      tok.Encode("It is a truth universally acknowledged, that a single man in possession of a "
                 "good fortune, must be in want of a wife. However little known the feelings",
                 false),
      tok.Encode("In the beginning God created the heaven and the earth.", false),
      tok.Encode("The capital of France is", false),
  };
  std::vector<int32_t> done(3, 0);
  int step_index = 0;
  auto step = [&](std::vector<std::pair<int, int>> parts) {
    const int this_step = step_index++;
    std::vector<int32_t> tokens;
    std::vector<SeqChunk> cpu_seqs, gpu_seqs;
    for (auto [s, n] : parts) {
      SeqChunk ch;
      ch.token_offset = static_cast<int32_t>(tokens.size());
      ch.num_tokens = n;
      ch.start_pos = done[s];
      ch.pages = SeqPageTables{ktab[s].data(), vtab[s].data(), stride};
      // An identity, as the engine gives: the GPU keeps the tables and is sent only the
      // blocks each step adds (its tables are set for all 512 positions from the start).
      ch.tables.id = uint64_t(s) + 1;
      ch.tables.k_blocks = (done[s] + n + bs - 1) / bs;
      for (int i = 0; i < n; ++i) tokens.push_back(seq_tokens[s][done[s] + i]);
      cpu_seqs.push_back(ch);
      gpu_seqs.push_back(ch);
      if (theta.active()) {
        cpu_seqs.back().pages.v_sum = vsum_cpu[s].data();
        gpu_seqs.back().pages.v_sum = vsum_gpu[s].data();
      }
    }
    ForwardBatch cb{tokens, cpu_seqs, false}, gb{tokens, gpu_seqs, false};
    const int64_t rows = NumLogitRows(cb);
    std::vector<float> want(rows * c.vocab_size), got(rows * c.vocab_size, std::nanf(""));
    absl::Status st = (*cpu)->Forward(cb, want.data());
    ASSERT_TRUE(st.ok()) << "cpu: " << st;
    st = (*gpu)->Forward(gb, got.data());
    ASSERT_TRUE(st.ok()) << "cuda: " << st;
    for (int64_t r = 0; r < rows; ++r) {
      const RowDiff d = CompareRow(want.data() + r * c.vocab_size, got.data() + r * c.vocab_size,
                                   c.vocab_size);
      ASSERT_FALSE(d.nan) << "NaN logit";
      if (d.rel > rep.worst_rel) {
        rep.worst_rel = d.rel;
        rep.worst_step = this_step;
      }
      const int64_t a = d.want_top;
      ++rep.rows;
      rep.agree += d.want_top == d.got_top;
      // Teacher forcing: both continue with the CPU's greedy token.
      const int s = parts[r].first;
      done[s] += parts[r].second;
      if (done[s] == static_cast<int32_t>(seq_tokens[s].size())) seq_tokens[s].push_back(int32_t(a));
    }
  };
  // A failed step stops the run (its ASSERTs only leave the lambda).
  const int n0 = static_cast<int>(seq_tokens[0].size());
  step({{0, 7}});
  if (::testing::Test::HasFatalFailure()) return rep;
  step({{0, n0 - 7}, {1, static_cast<int>(seq_tokens[1].size())}, {2, 3}});
  if (::testing::Test::HasFatalFailure()) return rep;
  step({{0, 1}, {1, 1}, {2, static_cast<int>(seq_tokens[2].size()) - 3}});
  for (int i = 0; i < decode_steps && !::testing::Test::HasFatalFailure(); ++i) step({{0, 1}, {1, 1}, {2, 1}});
  return rep;
}

// Post-softmax θ = 1/L (keep above-average probabilities) in every layer (the tiny models
// have two).
model::ThetaTable AboveAverageTable(const model::ModelConfig& c) {
  model::ThetaTable t(c.num_layers, c.num_heads, model::ThetaTable::DefaultBuckets(4096));
  for (int32_t l = 0; l < c.num_layers; ++l)
    for (int32_t h = 0; h < c.num_heads; ++h)
      for (int32_t i = 0; i < int32_t(t.buckets().size()); ++i) {
        t.theta_at(l, h, i) = 1.0f / t.buckets()[i];
        t.sdc_at(l, h, i) = 0.5f;
        t.count_at(l, h, i) = 1;
      }
  t.k_per_layer.assign(c.num_layers, 8);
  t.placement = model::ThetaPlacement::kPostSoftmax;
  t.Finalize();
  return t;
}

// Pre-softmax θ = 0 (keep the keys a head scores above zero) in every layer: the GPU runs it in
// one pass (no step here records the retained mass).
model::ThetaTable PositiveScoreTable(const model::ModelConfig& c) {
  model::ThetaTable t = AboveAverageTable(c);
  for (int32_t l = 0; l < c.num_layers; ++l)
    for (int32_t h = 0; h < c.num_heads; ++h)
      for (int32_t i = 0; i < int32_t(t.buckets().size()); ++i) t.theta_at(l, h, i) = 0.0f;
  t.placement = model::ThetaPlacement::kPreSoftmax;
  t.Finalize();
  return t;
}

// theta_tol < 0: no bound on the Top-θ logits difference. The tiny models' random weights give
// nearly uniform attention, so θ = 1/L sits among the probabilities and bf16 K/V (GPU) vs f32
// (CPU) flip keep decisions; their Top-θ kernels are checked exactly in gpu_attention_test on
// data with a clear gap instead, and here only for finite logits and greedy agreement.
void CheckModel(const std::string& path, int decode_steps, double tol, double theta_tol) {
  auto m = model::Model::Load(path);
  ASSERT_TRUE(m.ok()) << m.status();
  {
    SCOPED_TRACE("dense");
    const Report r = Compare(**m, TopThetaConfig{}, decode_steps);
    std::printf("[ %s dense ] worst max|Δ|/max|ref| %.2e (step %d), greedy agreement %d/%d\n",
                path.c_str(), r.worst_rel, r.worst_step, r.agree, r.rows);
    EXPECT_LE(r.worst_rel, tol);
    EXPECT_GE(r.agree, r.rows * 9 / 10);
  }
  for (bool pre : {false, true}) {
    SCOPED_TRACE(pre ? "top-theta pre-softmax" : "top-theta");
    const model::ThetaTable table =
        pre ? PositiveScoreTable((*m)->config()) : AboveAverageTable((*m)->config());
    TopThetaConfig cfg;
    cfg.table = &table;
    const Report r = Compare(**m, cfg, decode_steps);
    std::printf("[ %s top-theta %s ] worst max|Δ|/max|ref| %.2e (step %d), greedy agreement %d/%d\n",
                path.c_str(), pre ? "pre" : "post", r.worst_rel, r.worst_step, r.agree, r.rows);
    if (theta_tol >= 0) {
      EXPECT_LE(r.worst_rel, theta_tol);
    }
    EXPECT_GE(r.agree, r.rows * 8 / 10);
  }
}

// bf16 weights and activations against an f32 reference: a few percent of the largest
// logit at most; a broken kernel is off by O(1).
constexpr double kTol = 5e-2;

TEST(GpuForwardTest, TinyLlamaSafetensors) {
  SKIP_WITHOUT_CUDA_DEVICE();
  CheckModel(testing::TestDataPath("tiny_llama"), 24, kTol, -1);
}

TEST(GpuForwardTest, TinyQwen2Bf16ShardedWithBias) {
  SKIP_WITHOUT_CUDA_DEVICE();
  CheckModel(testing::TestDataPath("tiny_qwen2"), 24, kTol, -1);
}

TEST(GpuForwardTest, TinyLlamaGgufMixedQuant) {
  SKIP_WITHOUT_CUDA_DEVICE();
  CheckModel(testing::TestDataPath("tiny_llama_gguf/tiny_llama.gguf"), 24, kTol, -1);
}

TEST(GpuForwardTest, SmolLM2) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const std::string path = testing::SourceDir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is missing (scripts/fetch-model.sh)";
  // Trained attention is peaked: θ separates kept from pruned rows, so Top-θ stays close.
  CheckModel(path, 32, kTol, 2 * kTol);
}

// One sequence under Top-θ and the sparse V policy, as the engine runs it: SequenceKv page
// tables (so the GPU keeps them between steps and is sent only what changed), chunked
// prefill, then decoding, with compaction after every step. Both backends get the same
// tables, and the compaction the CPU's hit marks decide is applied to both pools, so they
// store the same V rows; the GPU records its marks into a scratch copy, which must stay
// untouched outside each step's window [v_tail_start, end). Logits are compared at every step.
// With `offload`, the rows compaction does not keep go to both backends' host pools instead,
// and the GPU must read some of them back from there. Returns false when the model is missing.
bool CheckSparseVThroughCompaction(const std::string& path, double theta_tol, bool offload = false) {
  if (!std::filesystem::exists(path)) return false;
  auto m = model::Model::Load(path);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return true;
  const auto& c = (*m)->config();
  auto cpu = CreateBackend(**m, Device::kCpu, 0, MatMulMode::kExact, KvDtype::kF32);
  auto gpu = CreateBackend(**m, Device::kCuda, 0);
  EXPECT_TRUE(cpu.ok() && gpu.ok()) << (gpu.ok() ? cpu.status() : gpu.status());
  if (!cpu.ok() || !gpu.ok()) return true;
  const model::ThetaTable table = AboveAverageTable(c);
  TopThetaConfig theta;
  theta.table = &table;
  (*cpu)->SetTopTheta(theta);
  (*gpu)->SetTopTheta(theta);
  const int32_t bs = 16;
  const cache::KvShape shape{static_cast<int32_t>(c.num_layers), static_cast<int32_t>(c.num_kv_heads),
                             bs, static_cast<int32_t>(c.head_dim)};
  const int64_t num_pages = 2 * shape.tables() * (512 / bs);
  cache::PagePool pool(num_pages, bs);
  for (auto* b : {&*cpu, &*gpu}) EXPECT_TRUE((*b)->AllocateKvPool(num_pages, bs).ok());
  cache::SequenceKv kv(shape);
  cache::SparsePolicy policy;
  policy.enabled = true;
  policy.offload = offload;
  policy.local_window = 32;
  policy.sink_tokens = 4;
  policy.obs_window = 8;
  const int64_t host_pages = offload ? shape.tables() * (512 / bs) : 0;
  cache::PagePool host(std::max<int64_t>(host_pages, 1), bs);
  if (offload) {
    for (auto* b : {&*cpu, &*gpu}) EXPECT_TRUE((*b)->AllocateHostPool(host_pages).ok());
  }
  AttentionStats gpu_stats;
  gpu_stats.Reset(c.num_layers);

  std::vector<int32_t> tokens = (*m)->tokenizer().Encode(
      "It is a truth universally acknowledged, that a single man in possession of a good "
      "fortune, must be in want of a wife. However little known the feelings or views of such a "
      "man may be on his first entering a neighbourhood, this truth is so well fixed in the "
      "minds of the surrounding families, that he is considered the rightful property of some "
      "one or other of their daughters.",
      false);
  const int32_t prompt = static_cast<int32_t>(tokens.size());
  std::vector<float> gpu_vsum;       // the GPU's own VMC sums
  std::vector<int32_t> gpu_marks;    // the GPU's marks, kept apart from the CPU's
  constexpr int32_t kUnset = -5;
  double worst = 0;
  int rows = 0, agree = 0;
  int64_t gpu_marked = 0, compactions = 0;
  int32_t done = 0;
  for (int step = 0; done < prompt + 96; ++step) {
    const int32_t n = done < prompt ? std::min(40, prompt - done) : 1;
    EXPECT_TRUE(pool.CanAllocate(kv.PagesNeeded(done + n)));
    if (::testing::Test::HasFailure()) return true;
    kv.Grow(pool, done + n);
    if (gpu_vsum.empty()) gpu_vsum.assign(kv.v_sum(), kv.v_sum() + shape.tables() * c.head_dim);
    SeqChunk ch;
    ch.num_tokens = n;
    ch.start_pos = done;
    ch.pages = scheduler::PageTablesFor(kv, policy);
    ch.tables = scheduler::TableVersionOf(kv);
    SeqChunk gch = ch;
    const int64_t stride = kv.hits_stride();
    gpu_marks.assign(size_t(shape.tables()) * stride, kUnset);
    const int32_t begin = ch.pages.hits_begin;
    gch.pages.hits = gpu_marks.data() + begin;
    gch.pages.v_sum = gpu_vsum.data();
    const std::vector<int32_t> step_tokens(tokens.begin() + done, tokens.begin() + done + n);
    const std::vector<SeqChunk> cseqs = {ch}, gseqs = {gch};
    std::vector<float> want(c.vocab_size), got(c.vocab_size, std::nanf(""));
    absl::Status st = (*cpu)->Forward(ForwardBatch{step_tokens, cseqs, false}, want.data());
    EXPECT_TRUE(st.ok()) << "cpu: " << st;
    st = (*gpu)->Forward(ForwardBatch{step_tokens, gseqs, false, &gpu_stats}, got.data());
    EXPECT_TRUE(st.ok()) << "cuda, step " << step << ": " << st;
    if (::testing::Test::HasFailure()) return true;
    const RowDiff d = CompareRow(want.data(), got.data(), c.vocab_size);
    EXPECT_FALSE(d.nan) << "NaN logit at step " << step;
    if (d.nan) return true;
    worst = std::max(worst, d.rel);
    const int32_t a = static_cast<int32_t>(d.want_top);
    ++rows;
    agree += d.want_top == d.got_top;
    // The GPU's marks: position p of table t sits at t * stride + p (the pointer starts at
    // `begin`); entries of positions outside [begin, end) must stay unset, and a mark is the
    // position of one of this step's queries.
    const int32_t end = done + n;
    for (int64_t t = 0; t < shape.tables(); ++t) {
      for (int64_t p = 0; p < stride; ++p) {
        const int32_t mark = gpu_marks[t * stride + p];
        if (p < begin || p >= end) {
          EXPECT_EQ(mark, kUnset) << "a GPU mark outside the window [" << begin << ", " << end
                                  << "): table " << t << ", position " << p << ", step " << step;
        } else if (mark != kUnset) {
          EXPECT_TRUE(mark >= done && mark < end) << "mark " << mark << " at step " << step;
          ++gpu_marked;
        }
        if (::testing::Test::HasFailure()) return true;
      }
    }
    done = end;
    if (done == int32_t(tokens.size())) tokens.push_back(a);  // teacher forcing: the CPU's token
    // The CPU's marks decide what both pools keep.
    std::vector<cache::RowMove> moves;
    cache::SequenceKv::CompactResult r;
    kv.CompactV(pool, done, policy, &moves, &r, offload ? &host : nullptr);
    compactions += r.rows_kept + r.rows_offloaded + r.rows_dropped > 0;
    EXPECT_TRUE(scheduler::ApplyRowMoves(**cpu, moves).ok());
    EXPECT_TRUE(scheduler::ApplyRowMoves(**gpu, moves).ok());
  }
  std::printf("[ %s sparse V ] worst max|Δ|/max|ref| %.2e, greedy agreement %d/%d, %lld "
              "compactions, %lld GPU marks, %lld of %lld V rows stored\n",
              path.c_str(), worst, agree, rows, (long long)compactions, (long long)gpu_marked,
              (long long)kv.VRowsResident(done), (long long)(done * shape.tables()));
  EXPECT_GT(compactions, 5);
  EXPECT_GT(gpu_marked, 0) << "the GPU recorded no hit marks";
  EXPECT_LT(kv.VRowsResident(done), done * shape.tables()) << "the policy dropped nothing";
  if (offload) {
    std::printf("[ %s offload ] %lld V rows in the host pool, %lld read back by the GPU\n",
                path.c_str(), (long long)kv.VRowsOffloaded(), (long long)gpu_stats.v_rows_read_host);
    EXPECT_EQ(kv.VRowsResident(done) + kv.VRowsOffloaded(), done * shape.tables());
    EXPECT_GT(gpu_stats.v_rows_read_host, 0) << "the GPU read no row from the host pool";
    EXPECT_EQ(gpu_stats.retained_but_evicted, 0) << "nothing is dropped under offload";
  }
  if (theta_tol >= 0) {
    EXPECT_LE(worst, theta_tol);
  }
  EXPECT_GE(agree, rows * 8 / 10);
  kv.ReleaseAll(pool);
  return true;
}

TEST(GpuForwardTest, DenseAttentionRefusesASparseVStore) {
  SKIP_WITHOUT_CUDA_DEVICE();
  ExpectDenseAttentionRefusesASparseVStore(Device::kCuda);
}

TEST(GpuForwardTest, SparseVThroughCompactionTinyLlama) {
  SKIP_WITHOUT_CUDA_DEVICE();
  // Random weights: keep decisions flip between bf16 and f32, so only agreement is bounded.
  ASSERT_TRUE(CheckSparseVThroughCompaction(testing::TestDataPath("tiny_llama_gguf/tiny_llama.gguf"), -1));
}

TEST(GpuForwardTest, OffloadVThroughCompactionTinyLlama) {
  SKIP_WITHOUT_CUDA_DEVICE();
  ASSERT_TRUE(CheckSparseVThroughCompaction(testing::TestDataPath("tiny_llama_gguf/tiny_llama.gguf"),
                                            -1, /*offload=*/true));
}

TEST(GpuForwardTest, OffloadVThroughCompactionSmolLM2) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const std::string path = testing::SourceDir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!CheckSparseVThroughCompaction(path, 2 * kTol, /*offload=*/true)) {
    GTEST_SKIP() << path << " is missing (scripts/fetch-model.sh)";
  }
}

TEST(GpuForwardTest, SparseVThroughCompactionSmolLM2) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const std::string path = testing::SourceDir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!CheckSparseVThroughCompaction(path, 2 * kTol)) {
    GTEST_SKIP() << path << " is missing (scripts/fetch-model.sh)";
  }
}

// Two CUDA backends of one model: `direct` launches every step's kernels
// (THETASERVE_CUDA_GRAPHS=0), `graphed` replays decode steps as CUDA graphs.
struct DirectAndGraphed {
  absl::StatusOr<std::unique_ptr<Backend>> direct, graphed;
  explicit DirectAndGraphed(const model::Model& m) {
    setenv("THETASERVE_CUDA_GRAPHS", "0", 1);
    direct = CreateBackend(m, Device::kCuda, 0);
    unsetenv("THETASERVE_CUDA_GRAPHS");
    graphed = CreateBackend(m, Device::kCuda, 0);
  }
};

// One sequence's page tables over a pool of 2 · tables · stride pages: position block i of
// table lh in K page 2(lh · stride + i), in V page 2(lh · stride + i) + 1.
struct InterleavedTables {
  std::vector<int32_t> k, v;
  int32_t stride;
  InterleavedTables(int64_t tables, int32_t stride)
      : k(tables * stride), v(tables * stride), stride(stride) {
    for (int64_t i = 0; i < tables * stride; ++i) {
      k[i] = int32_t(2 * i);
      v[i] = int32_t(2 * i + 1);
    }
  }
  int64_t pages() const { return 2 * int64_t(k.size()); }
  SeqPageTables page_tables() const { return SeqPageTables{k.data(), v.data(), stride}; }
};

// Decode steps replay captured CUDA graphs; the same steps launched directly give the same
// logits, bit for bit (dense attention is deterministic).
TEST(GpuForwardTest, CudaGraphReplayEqualsDirectLaunch) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::string path = testing::SourceDir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) path = testing::TestDataPath("tiny_llama_gguf/tiny_llama.gguf");
  auto m = model::Model::Load(path);
  ASSERT_TRUE(m.ok()) << m.status();
  const auto& c = (*m)->config();
  auto [direct, graphed] = DirectAndGraphed(**m);
  ASSERT_TRUE(direct.ok() && graphed.ok());
  const int32_t bs = 16;
  const InterleavedTables tab(c.num_layers * c.num_kv_heads, 16);
  for (auto* b : {&*direct, &*graphed}) ASSERT_TRUE((*b)->AllocateKvPool(tab.pages(), bs).ok());
  std::vector<int32_t> tokens = (*m)->tokenizer().Encode("The capital of France is", false);
  int32_t done = 0;
  for (int step = 0; step < 24; ++step) {
    const int32_t n = step == 0 ? static_cast<int32_t>(tokens.size()) : 1;
    SeqChunk ch;
    ch.num_tokens = n;
    ch.start_pos = done;
    ch.pages = tab.page_tables();
    std::vector<int32_t> step_tokens(tokens.begin() + done, tokens.begin() + done + n);
    std::vector<SeqChunk> seqs = {ch};
    ForwardBatch batch{step_tokens, seqs, false};
    std::vector<float> a(c.vocab_size), b(c.vocab_size);
    ASSERT_TRUE((*direct)->Forward(batch, a.data()).ok());
    ASSERT_TRUE((*graphed)->Forward(batch, b.data()).ok());
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "step " << step;
    done += n;
    tokens.push_back(int32_t(std::max_element(a.begin(), a.end()) - a.begin()));
  }
}

// Decode steps replay a graph captured once per planned length (cuda::PlannedLength: steps of
// 256 keys at these lengths), not one per step, under dense attention and Top-θ alike: from a
// 200-token prompt to 530 keys, three captures (planned 256, 512, 768). Sized from the exact
// length, Top-θ's score stride changed the graph's key every 4 tokens. A graph replayed at up to
// 256 lengths gives the logits direct launches give, bit for bit (the plan is the same).
TEST(GpuForwardTest, DecodeGraphsAreCapturedOncePerPlannedLengthAndEqualDirectLaunches) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto m = model::Model::Load(testing::TestDataPath("tiny_llama"));
  ASSERT_TRUE(m.ok()) << m.status();
  const auto& c = (*m)->config();
  const model::ThetaTable table = AboveAverageTable(c);
  constexpr int32_t kBlock = 16, kPrompt = 200, kEnd = 530;
  const int64_t tables = c.num_layers * c.num_kv_heads;
  const InterleavedTables tab(tables, 34);  // 544 positions
  for (const bool theta : {false, true}) {
    SCOPED_TRACE(theta ? "Top-θ" : "dense");
    auto [direct, graphed] = DirectAndGraphed(**m);
    ASSERT_TRUE(direct.ok() && graphed.ok());
    TopThetaConfig cfg;
    if (theta) cfg.table = &table;
    std::vector<std::vector<float>> v_sums;  // each backend's VMC sums
    for (auto* b : {&*direct, &*graphed}) {
      (*b)->SetTopTheta(cfg);
      ASSERT_TRUE((*b)->AllocateKvPool(tab.pages(), kBlock).ok());
      v_sums.emplace_back(size_t(tables) * c.head_dim, 0.0f);
    }
    const int64_t before = cuda::GraphsCaptured();
    std::vector<float> a(c.vocab_size), g(c.vocab_size);
    for (int32_t done = 0; done < kEnd;) {
      const int32_t n = done == 0 ? kPrompt : 1;
      std::vector<int32_t> tokens(n);
      for (int32_t i = 0; i < n; ++i) tokens[i] = (7 * (done + i) + 3) % c.vocab_size;
      SeqChunk ch;
      ch.num_tokens = n;
      ch.start_pos = done;
      ch.pages = tab.page_tables();
      SeqChunk gch = ch;
      ch.pages.v_sum = v_sums[0].data();
      gch.pages.v_sum = v_sums[1].data();
      const std::vector<SeqChunk> seqs = {ch}, gseqs = {gch};
      absl::Status st = (*direct)->Forward(ForwardBatch{tokens, seqs, false}, a.data());
      ASSERT_TRUE(st.ok()) << "at " << done << ": " << st;
      st = (*graphed)->Forward(ForwardBatch{tokens, gseqs, false}, g.data());
      ASSERT_TRUE(st.ok()) << "at " << done << ": " << st;
      ASSERT_EQ(0, std::memcmp(a.data(), g.data(), a.size() * sizeof(float))) << "at " << done;
      done += n;
    }
    EXPECT_EQ(cuda::GraphsCaptured() - before, 3);
  }
}

// A new pool drops the cached graphs: they hold the pool's address and layout, and the block
// size is not in their keys. After AllocateKvPool with twice the block size (the same bytes,
// which a device allocator tends to hand back at the same address; the emulator does), decode
// steps capture again and give the logits direct launches give.
TEST(GpuForwardTest, ANewPoolDropsCachedGraphs) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto m = model::Model::Load(testing::TestDataPath("tiny_llama"));
  ASSERT_TRUE(m.ok()) << m.status();
  const auto& c = (*m)->config();
  auto [direct, graphed] = DirectAndGraphed(**m);
  ASSERT_TRUE(direct.ok() && graphed.ok());
  for (const int32_t block : {16, 32}) {
    SCOPED_TRACE(::testing::Message() << "block " << block);
    // 1,024 positions, the same bytes either way
    const InterleavedTables tab(c.num_layers * c.num_kv_heads, 1024 / block);
    for (auto* b : {&*direct, &*graphed}) {
      ASSERT_TRUE((*b)->AllocateKvPool(tab.pages(), block).ok());
    }
    const int64_t before = cuda::GraphsCaptured();
    std::vector<float> a(c.vocab_size), g(c.vocab_size);
    for (int32_t done = 0; done < 40;) {
      const int32_t n = done == 0 ? 30 : 1;
      std::vector<int32_t> tokens(n);
      for (int32_t i = 0; i < n; ++i) tokens[i] = (5 * (done + i) + 1) % c.vocab_size;
      SeqChunk ch;
      ch.num_tokens = n;
      ch.start_pos = done;
      ch.pages = tab.page_tables();
      const std::vector<SeqChunk> seqs = {ch};
      ASSERT_TRUE((*direct)->Forward(ForwardBatch{tokens, seqs, false}, a.data()).ok());
      ASSERT_TRUE((*graphed)->Forward(ForwardBatch{tokens, seqs, false}, g.data()).ok());
      ASSERT_EQ(0, std::memcmp(a.data(), g.data(), a.size() * sizeof(float))) << "at " << done;
      done += n;
    }
    EXPECT_EQ(cuda::GraphsCaptured() - before, 1);
  }
}

}  // namespace
}  // namespace thetaserve::kernels
