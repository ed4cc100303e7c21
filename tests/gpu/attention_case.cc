// The GPU attention tests' harness (attention_case.h): making a case, running it on both
// sides, and comparing them.
#include "tests/gpu/attention_case.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"

#if defined(THETASERVE_CUDA_EMU)
#include "cuda_runtime.h"  // the emulator's: emu::ClusterLaunches
#endif

namespace thetaserve::kernels::cuda::attention_test {

AttentionCase::AttentionCase(const Shape& s, std::vector<SeqSpec> specs, uint64_t seed, AttnWay way)
    : s_(s), specs_(std::move(specs)), rng_(seed), k_load_(way.k_load), passes_(way.passes),
      prefill_(way.prefill), theta_prefill_(way.theta_prefill), record_mass_(way.passes != ThetaPasses::kAuto) {
  const int32_t d = s.head_dim, bs = s.block_size;
  tables_ = s.num_layers * s.num_kv_heads;
  int32_t max_end = 0;
  for (const SeqSpec& sp : specs_) max_end = std::max(max_end, sp.start_pos + sp.num_tokens);
  stride_ = (max_end + bs - 1) / bs;
  // Pages: a shuffled pool, so neighbouring table entries are far apart.
  const int64_t per_seq = int64_t(tables_) * stride_ * 3;  // K, V tail, sparse
  num_pages_ = per_seq * int64_t(specs_.size()) + 8;
  std::vector<int32_t> ids(num_pages_);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng_);
  layout_ = KvPoolLayout{bs, d, num_pages_};
  pool_.resize(num_pages_ * layout_.PageElems());
  std::normal_distribution<float> n01(0.0f, 1.0f);
  for (float& v : pool_) v = RoundBf16(n01(rng_) * 3.0f);  // junk in unused pages
  // The host pool (the offload policy's): room for every row below a tail, shuffled too.
  int64_t host_pages = 0;
  for (const SeqSpec& sp : specs_) {
    if (sp.host) host_pages += int64_t(tables_) * ((sp.v_tail_start + bs - 1) / bs);
  }
  std::vector<int32_t> host_ids(host_pages);
  std::iota(host_ids.begin(), host_ids.end(), 0);
  std::shuffle(host_ids.begin(), host_ids.end(), rng_);
  size_t host_next = 0;
  layout_.num_host_pages = host_pages;
  host_pool_.resize(host_pages * layout_.PageElems());
  for (float& v : host_pool_) v = RoundBf16(n01(rng_) * 3.0f);
  u_.resize(d);
  double norm = 0;
  for (float& v : u_) v = n01(rng_), norm += v * v;
  for (float& v : u_) v = float(v / std::sqrt(norm));

  size_t next = 0;
  seqs_.resize(specs_.size());
  int32_t offset = 0;
  for (size_t si = 0; si < specs_.size(); ++si) {
    const SeqSpec& sp = specs_[si];
    Seq& q = seqs_[si];
    const int32_t end = sp.start_pos + sp.num_tokens;
    q.k.resize(size_t(tables_) * stride_);
    q.v.resize(size_t(tables_) * stride_);
    for (auto& p : q.k) p = ids[next++];
    for (auto& p : q.v) p = ids[next++];
    for (int32_t j = 0; j < sp.v_tail_start; ++j) {
      if (j < 4 || j % 3 == 0) q.sparse_positions.push_back(j);
    }
    const int32_t n_sparse = static_cast<int32_t>(q.sparse_positions.size());
    q.sparse_stride = std::max(1, (n_sparse + bs - 1) / bs);
    q.sparse_pages.resize(size_t(tables_) * q.sparse_stride);
    for (auto& p : q.sparse_pages) p = ids[next++];
    q.sparse_pos.resize(size_t(tables_) * std::max(1, n_sparse));
    q.sparse_count.assign(tables_, n_sparse);
    for (int32_t t = 0; t < tables_; ++t) {
      std::copy(q.sparse_positions.begin(), q.sparse_positions.end(),
                q.sparse_pos.begin() + size_t(t) * std::max(1, n_sparse));
    }
    // The host store: the rows below the tail that the sparse store does not hold.
    for (int32_t j = 0; sp.host && j < sp.v_tail_start; ++j) {
      if (!(j < 4 || j % 3 == 0)) q.host_positions.push_back(j);
    }
    const int32_t n_host = static_cast<int32_t>(q.host_positions.size());
    q.host_stride = std::max(1, (n_host + bs - 1) / bs);
    q.host_pages.resize(size_t(tables_) * q.host_stride);
    for (int32_t t = 0; t < tables_; ++t) {
      for (int32_t b = 0; b < (n_host + bs - 1) / bs; ++b) {
        q.host_pages[size_t(t) * q.host_stride + b] = host_ids[host_next++];
      }
    }
    q.host_pos.resize(size_t(tables_) * std::max(1, n_host));
    q.host_count.assign(tables_, n_host);
    for (int32_t t = 0; t < tables_; ++t) {
      std::copy(q.host_positions.begin(), q.host_positions.end(),
                q.host_pos.begin() + size_t(t) * std::max(1, n_host));
    }
    q.hits_cpu.assign(size_t(tables_) * end, -1);
    q.hits_gpu = q.hits_cpu;
    q.mass_cpu.assign(size_t(tables_) * end, 0);
    q.mass_gpu = q.mass_cpu;
    q.vsum_cpu.assign(size_t(tables_) * d, 0.0f);
    q.vsum_gpu = q.vsum_cpu;

    SeqChunk c;
    c.token_offset = offset;
    c.num_tokens = sp.num_tokens;
    c.start_pos = sp.start_pos;
    c.pages.k_pages = q.k.data();
    c.pages.v_pages = q.v.data();
    c.pages.stride = stride_;
    c.pages.v_tail_start = sp.v_tail_start;
    if (sp.v_tail_start > 0) {
      c.pages.v_sparse_pages = q.sparse_pages.data();
      c.pages.v_sparse_pos = q.sparse_pos.data();
      c.pages.v_sparse_count = q.sparse_count.data();
      c.pages.sparse_stride = q.sparse_stride;
      c.pages.sparse_pos_stride = std::max(1, n_sparse);
    }
    if (sp.host) {
      c.pages.v_host_pages = q.host_pages.data();
      c.pages.v_host_pos = q.host_pos.data();
      c.pages.v_host_count = q.host_count.data();
      c.pages.host_stride = q.host_stride;
      c.pages.host_pos_stride = std::max(1, n_host);
    }
    // Marks from the tail's start on, as the engine records them (kernels/paged_kv.h).
    c.pages.hits_stride = end;
    c.pages.hits_begin = sp.v_tail_start;
    q.window = end - sp.v_tail_start;
    chunks_cpu_.push_back(c);
    chunks_cpu_.back().pages.hits = q.hits_cpu.data();
    chunks_cpu_.back().pages.hit_mass = q.mass_cpu.data();
    if (sp.v_sum) chunks_cpu_.back().pages.v_sum = q.vsum_cpu.data();
    chunks_gpu_.push_back(c);
    chunks_gpu_.back().pages.hits = q.hits_gpu.data();
    chunks_gpu_.back().pages.hit_mass = q.mass_gpu.data();
    if (sp.v_sum) chunks_gpu_.back().pages.v_sum = q.vsum_gpu.data();
    offset += sp.num_tokens;

    // K and V rows of every (layer, KV head) and position.
    for (int32_t t = 0; t < tables_; ++t) {
      for (int32_t j = 0; j < end; ++j) {
        float* kr = &pool_[layout_.RowOffset(c.pages.KPage(t, j, bs), j % bs)];
        const float lift = j == sp.sink ? 60.0f : j % 10 == 3 ? 8.0f : 0.0f;
        for (int32_t e = 0; e < d; ++e) kr[e] = RoundBf16(0.5f * n01(rng_) + lift * u_[e]);
        float* vr = nullptr;
        if (j >= sp.v_tail_start) {
          vr = &pool_[layout_.RowOffset(c.pages.VPage(t, j, bs), j % bs)];
        } else {
          auto it = std::find(q.sparse_positions.begin(), q.sparse_positions.end(), j);
          auto ih = std::find(q.host_positions.begin(), q.host_positions.end(), j);
          if (it != q.sparse_positions.end()) {
            const int32_t r = int32_t(it - q.sparse_positions.begin());
            vr = &pool_[layout_.RowOffset(q.sparse_pages[size_t(t) * q.sparse_stride + r / bs], r % bs)];
          } else if (ih != q.host_positions.end()) {
            const int32_t r = int32_t(ih - q.host_positions.begin());
            vr = &host_pool_[layout_.RowOffset(q.host_pages[size_t(t) * q.host_stride + r / bs], r % bs)];
          }
        }
        if (vr) for (int32_t e = 0; e < d; ++e) vr[e] = RoundBf16(n01(rng_));
      }
    }
  }
  num_tokens_ = offset;
  tokens_.assign(num_tokens_, 0);
  const int32_t qd = s.num_heads * d;
  q_.resize(size_t(num_tokens_) * qd);
  for (int32_t t = 0; t < num_tokens_; ++t) {
    for (int32_t h = 0; h < s.num_heads; ++h) {
      for (int32_t e = 0; e < d; ++e) q_[size_t(t) * qd + h * d + e] = 0.5f * n01(rng_) + 4.0f * u_[e];
    }
  }
  vsum_.resize(size_t(num_tokens_) * s.num_kv_heads * d);
  for (float& v : vsum_) v = n01(rng_) * 10.0f;
}

void AttentionCase::Run(const TopThetaConfig& config, bool with_vsum) {
  const int32_t d = s_.head_dim;
  for (size_t si = 0; si < seqs_.size(); ++si) {  // the retained mass where recorded
    chunks_cpu_[si].pages.hit_mass = record_mass_ ? seqs_[si].mass_cpu.data() : nullptr;
    chunks_gpu_[si].pages.hit_mass = record_mass_ ? seqs_[si].mass_gpu.data() : nullptr;
  }
  for (Seq& q : seqs_) {  // hit marks and retained mass start unset on both sides every run
    std::fill(q.hits_cpu.begin(), q.hits_cpu.end(), -1);
    std::fill(q.hits_gpu.begin(), q.hits_gpu.end(), -1);
    std::fill(q.mass_cpu.begin(), q.mass_cpu.end(), 0);
    std::fill(q.mass_gpu.begin(), q.mass_gpu.end(), 0);
  }
  with_vsum_ = with_vsum;
  RunCpu(config, chunks_cpu_, &cpu_stats_, &cpu_out_);
  // GPU.
  gpu_stats_.Reset(s_.num_layers);
  ForwardBatch gpu_batch{tokens_, chunks_gpu_, false, &gpu_stats_};
  std::vector<uint16_t> pool_bf(pool_.size());
  for (size_t i = 0; i < pool_.size(); ++i) pool_bf[i] = model::FloatToBF16(pool_[i]);
  GuardedArray<uint16_t> pool(pool_bf.size());
  GuardedArray<float> q(q_.size()), vsum(vsum_.size()), out(cpu_out_.size());
  ASSERT_TRUE(pool.ok() && q.ok() && vsum.ok() && out.ok());
  pool.Upload(pool_bf);
  q.Upload(q_);
  vsum.Upload(vsum_);
  cudaDeviceProp prop;
  CUDA_ASSERT(cudaGetDeviceProperties(&prop, 0));
  DeviceBatch db;
  ASSERT_TRUE(db.Upload(gpu_batch, s_.num_layers * s_.num_kv_heads, layout_, nullptr).ok());
  CudaAttention att(prop.multiProcessorCount);
  att.set_k_load(k_load_);
  att.set_theta_passes(passes_);
  att.set_prefill_way(prefill_);
  att.set_theta_prefill(theta_prefill_);
  att.set_kernel_limit(kernel_limit_);
  // The host pool in mapped pinned memory, as the backend allocates it.
  MappedHostBuffer host_pool;
  if (!host_pool_.empty()) {
    ASSERT_TRUE(host_pool.Allocate(host_pool_.size() * sizeof(uint16_t)).ok());
    uint16_t* h = host_pool.host<uint16_t>();
    for (size_t i = 0; i < host_pool_.size(); ++i) h[i] = model::FloatToBF16(host_pool_[i]);
    att.set_host_pool(host_pool.device<bf16>());
  }
  AttnShape shape{s_.num_heads, s_.num_kv_heads, d, scale()};
  absl::Status st = att.Prepare(gpu_batch, db, shape, s_.num_layers, config, nullptr);
  ASSERT_TRUE(st.ok()) << st;
#if defined(THETASERVE_CUDA_EMU)
  const uint64_t cluster_launches = emu::ClusterLaunches();
  const uint64_t launches = emu::KernelLaunches();
#endif
  st = att.Run(s_.layer, db, q.get(), int64_t(s_.num_heads) * d, layout_, pool.get(),
               with_vsum ? vsum.get() : nullptr, out.get(), nullptr);
  ASSERT_TRUE(st.ok()) << st;
#if defined(THETASERVE_CUDA_EMU)
  kernel_launches_ = int64_t(emu::KernelLaunches() - launches);
#endif
  st = att.Finish(&gpu_stats_, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  st = db.Download(nullptr);
  ASSERT_TRUE(st.ok()) << st;
  CUDA_ASSERT(cudaDeviceSynchronize());
  gpu_out_ = out.Download();
  EXPECT_TRUE(out.GuardsIntact());
  EXPECT_TRUE(pool.GuardsIntact());
  splits_ = att.plan().max_splits;
  chunk_ = att.plan().chunk;
  one_pass_ = att.plan().one_pass;
  if (config.active() && att.num_split_rows() > 0) {  // (Top-θ prefill tiles keep no scores)
    ExpectExactScoresArePass1s(att, db, shape, q.get(), pool.get());
  }
  // Staged or quad K where the head size allows it (64, 128), per thread otherwise.
  EXPECT_EQ(att.plan().k_load, d == 64 || d == 128 ? k_load_ : KLoad::kPerThread);
  // Fused where asked for under Top-θ; on the emulator, which counts cluster launches, the
  // fused kernel really ran (and the split kernels did not launch as clusters).
  EXPECT_EQ(att.plan().fused, config.active() && passes_ == ThetaPasses::kFused);
  // One pass where the server would take it: pre-softmax thresholds, no retained mass.
  const bool pre = config.placement() == model::ThetaPlacement::kPreSoftmax;
  EXPECT_EQ(att.plan().one_pass,
            config.active() && passes_ == ThetaPasses::kAuto && pre && !record_mass_);
#if defined(THETASERVE_CUDA_EMU)
  EXPECT_EQ(emu::ClusterLaunches() > cluster_launches, att.plan().fused);
#endif
}

void AttentionCase::ExpectExactScoresArePass1s(const CudaAttention& att, const DeviceBatch& db,
                                               const AttnShape& shape, const float* q, const uint16_t* pool) {
  const AttentionWorkspace& ws = att.workspace();
  const int32_t first = (att.num_split_rows() - 1) / att.row_batch() * att.row_batch();
  const int32_t n = att.num_split_rows() - first, H = s_.num_heads;
  std::vector<int32_t> ids(att.num_split_rows());
  CUDA_ASSERT(cudaMemcpy(ids.data(), att.row_ids(), ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  int32_t max_len = 1;
  for (const DevRow& r : db.host_rows()) max_len = std::max(max_len, r.pos + 1);
  GuardedArray<float> exact(size_t(n) * H * max_len);
  ASSERT_TRUE(exact.ok());
  const DevKv kv{db.rows(), db.seqs(), shape, s_.layer, layout_};
  const DevQueries queries{q, int64_t(H) * s_.head_dim};
  CUDA_ASSERT(LaunchExactScores(att.row_ids() + first, n, kv, pool, queries, att.plan().k_load,
                                max_len, exact.get(), nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> ex = exact.Download();
  EXPECT_TRUE(exact.GuardsIntact());
  std::vector<float> part_m(size_t(n) * H * ws.max_splits);
  // One pass keeps its scores on chip: only the split maxima to check.
  const bool coded = !att.plan().one_pass;
  EXPECT_EQ(ws.score_stride > 0, coded);
  std::vector<uint16_t> codes(size_t(n) * H * ws.score_stride);
  CUDA_ASSERT(cudaMemcpy(part_m.data(), ws.part_m, part_m.size() * sizeof(float), cudaMemcpyDeviceToHost));
  if (coded) {
    CUDA_ASSERT(cudaMemcpy(codes.data(), ws.scores, codes.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  }
  auto bits = [](float v) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    return b;
  };
  int64_t maxima = 0, scores = 0, bad_max = 0, bad_code = 0;
  for (int32_t r = 0; r < n; ++r) {
    const int32_t L = db.host_rows()[ids[first + r]].pos + 1;
    for (int32_t h = 0; h < H; ++h) {
      const float* e = &ex[(size_t(r) * H + h) * max_len];
      const uint16_t* code = coded ? &codes[(size_t(r) * H + h) * ws.score_stride] : nullptr;
      for (int32_t j0 = 0, split = 0; j0 < L; j0 += chunk_, ++split) {
        const float m = part_m[(size_t(r) * H + h) * ws.max_splits + split];
        float mx = -INFINITY;
        for (int32_t j = j0; j < std::min(L, j0 + chunk_); ++j) {
          mx = std::max(mx, e[j]);
          // EncodeScore's arithmetic (split_block.cuh), exact on the host too.
          const auto want = uint16_t(std::fmin(65535.0f, std::fmax(0.0f, std::rint((m - e[j]) * 4096.0f))));
          if (!coded) continue;
          if (code[j] != want && bad_code++ < 3) {
            ADD_FAILURE() << "row " << r << " head " << h << " position " << j << ": pass 1 stored "
                          << code[j] << ", the exact score " << e[j] << " encodes as " << want;
          }
          ++scores;
        }
        if (bits(mx) != bits(m) && bad_max++ < 3) {
          ADD_FAILURE() << "row " << r << " head " << h << " split " << split << ": pass 1's max "
                        << m << ", the exact scores' " << mx << " (K " << KLoadName(att.plan().k_load) << ")";
        }
        ++maxima;
      }
    }
  }
  EXPECT_EQ(bad_max, 0) << "of " << maxima << " split maxima";
  EXPECT_EQ(bad_code, 0) << "of " << scores << " scores";
  EXPECT_GT(maxima, 0);
}

void AttentionCase::RunCpu(const TopThetaConfig& config, const std::vector<SeqChunk>& chunks,
                           AttentionStats* stats, std::vector<float>* out) const {
  const int32_t d = s_.head_dim;
  cpu::ThreadPool threads(2);
  stats->Reset(s_.num_layers);
  ForwardBatch batch{tokens_, chunks, false, stats};
  cpu::AttentionShape cs{s_.num_layers, s_.num_heads, s_.num_kv_heads, d, scale()};
  out->assign(size_t(num_tokens_) * s_.num_heads * d, 0.0f);
  cpu::PagedAttention(
      threads, batch, cs, config,
      cpu::LayerAttention<float>{.layer = s_.layer, .q = q_.data(), .layout = layout_,
                                 .kv_pool = pool_.data(),
                                 .host_pool = host_pool_.empty() ? nullptr : host_pool_.data(),
                                 .vsum_rows = with_vsum_ ? vsum_.data() : nullptr,
                                 .o = out->data()});
}

std::vector<float> AttentionCase::CpuOutputNudged(const TopThetaConfig& config, int sign) const {
  model::ThetaTable table = *config.table;
  const bool post = table.placement == model::ThetaPlacement::kPostSoftmax;
  for (int32_t l = 0; l < table.num_layers(); ++l) {
    for (int32_t h = 0; h < table.num_heads(); ++h) {
      for (int32_t b = 0; b < int32_t(table.buckets().size()); ++b) {
        float& th = table.theta_at(l, h, b);
        if (std::isnan(th)) continue;
        const double step = kNudge * std::max(post ? 0.0 : 1.0, std::fabs(double(th)));
        th = float(th + sign * step);
      }
    }
  }
  table.Finalize();
  TopThetaConfig nudged = config;
  nudged.table = &table;
  std::vector<SeqChunk> chunks = chunks_cpu_;
  std::vector<std::vector<int32_t>> hits(seqs_.size());
  std::vector<std::vector<MassUnits>> mass(seqs_.size());
  for (size_t si = 0; si < seqs_.size(); ++si) {
    hits[si].assign(seqs_[si].hits_cpu.size(), -1);
    mass[si].assign(seqs_[si].mass_cpu.size(), 0);
    chunks[si].pages.hits = hits[si].data();
    if (chunks[si].pages.hit_mass) chunks[si].pages.hit_mass = mass[si].data();
  }
  AttentionStats stats;
  std::vector<float> out;
  RunCpu(nudged, chunks, &stats, &out);
  return out;
}

AttentionCase::Ambiguous AttentionCase::FindAmbiguous(const TopThetaConfig& config) const {
  Ambiguous a;
  for (const Seq& q : seqs_) {
    a.mass.emplace_back(q.mass_cpu.size(), 0.0f);
    a.count.emplace_back(q.mass_cpu.size(), 0);
  }
  a.rows.assign(size_t(num_tokens_) * s_.num_heads, 0);
  if (!config.table || config.top_k || config.recorder) return a;
  const model::ThetaTable& table = *config.table;
  const bool post = table.placement == model::ThetaPlacement::kPostSoftmax;
  const int32_t d = s_.head_dim, bs = s_.block_size, group = s_.num_heads / s_.num_kv_heads;
  const double scale64 = 1.0 / std::sqrt(double(d));  // scale(), in float64
  for (size_t si = 0; si < seqs_.size(); ++si) {
    const SeqChunk& c = chunks_cpu_[si];
    const int32_t end = c.start_pos + c.num_tokens;
    for (int32_t i = 0; i < c.num_tokens; ++i) {
      const int32_t L = c.start_pos + i + 1;
      if (L <= table.KAt(s_.layer, L)) continue;  // dense
      for (int32_t h = 0; h < s_.num_heads; ++h) {
        const float theta = table.Theta(s_.layer, h, L);
        if (std::isnan(theta)) continue;
        const int32_t t = s_.layer * s_.num_kv_heads + h / group;
        const float* qr = &q_[(size_t(c.token_offset) + i) * s_.num_heads * d + size_t(h) * d];
        std::vector<double> x(L);
        double m = -INFINITY, den = 0;
        for (int32_t j = 0; j < L; ++j) {
          const float* kr = &pool_[layout_.RowOffset(c.pages.KPage(t, j, bs), j % bs)];
          double dot = 0;
          for (int32_t e = 0; e < d; ++e) dot += double(qr[e]) * kr[e];
          x[j] = dot * scale64;
          m = std::max(m, x[j]);
        }
        for (int32_t j = 0; j < L; ++j) den += std::exp(x[j] - m);
        // The keep threshold and, for hit marks, the retain threshold (e > r · thr).
        const double r = config.retain_factor;
        const double thetas[2] = {theta, post ? r * theta : theta + std::log(r)};
        auto near = [&](double v, double th) {
          return std::fabs(v - th) <= kWindow * std::max(post ? 0.0 : 1.0, std::fabs(th));
        };
        for (int32_t j = 0; j < L; ++j) {
          const double p = std::exp(x[j] - m) / den;
          const double v = post ? p : x[j];
          const bool keep_near = near(v, thetas[0]);
          if (!keep_near && !(r != 1.0 && near(v, thetas[1]))) continue;
          ++a.total;
          if (keep_near) a.rows[(size_t(c.token_offset) + i) * s_.num_heads + h] = 1;
          // Marks and mass are kept from hits_begin on: entry j - hits_begin of the table.
          if (j < c.pages.hits_begin) continue;
          const size_t entry = size_t(t) * end + (j - c.pages.hits_begin);
          a.mass[si][entry] += float(p);
          a.count[si][entry] += 1;
        }
      }
    }
  }
  return a;
}

std::vector<float> AttentionCase::ExpectedOutput(const TopThetaConfig& config, const Ambiguous& amb,
                                                 int32_t* rows_either) const {
  std::vector<float> want = cpu_out_;
  *rows_either = 0;
  if (std::count(amb.rows.begin(), amb.rows.end(), 1) == 0) return want;
  const std::vector<float> alt[2] = {CpuOutputNudged(config, -1), CpuOutputNudged(config, +1)};
  const size_t d = size_t(s_.head_dim);
  auto slice = [&](const std::vector<float>& v, size_t row) {
    return std::vector<float>(v.begin() + row * d, v.begin() + (row + 1) * d);
  };
  for (size_t row = 0; row < amb.rows.size(); ++row) {
    if (!amb.rows[row]) continue;
    const std::vector<float> got = slice(gpu_out_, row);
    if (testing::Close(got, slice(cpu_out_, row), kAtol, kRtol)) continue;
    for (const std::vector<float>& a : alt) {
      if (!testing::Close(got, slice(a, row), kAtol, kRtol)) continue;
      std::copy(a.begin() + row * d, a.begin() + (row + 1) * d, want.begin() + row * d);
      ++*rows_either;
      break;
    }
  }
  return want;
}

void AttentionCase::ExpectSame(const TopThetaConfig& config) {
  // Decisions on keys within rounding of θ may differ, and only those (none, nearly always).
  const Ambiguous amb = FindAmbiguous(config);
  int32_t rows_either = 0;
  const std::vector<float> expected = ExpectedOutput(config, amb, &rows_either);
  EXPECT_TRUE(testing::Close(gpu_out_, expected, kAtol, kRtol, "attention output"))
      << "(" << splits_ << " splits of " << chunk_ << ", K " << KLoadName(k_load_)
      << (passes_ == ThetaPasses::kFused ? ", fused" : "") << (one_pass_ ? ", one pass" : "")
      << ")";
  if (rows_either > 0) {
    std::printf("(%d query rows follow the other decision on a key within rounding of θ)\n", rows_either);
  }
  auto near = [&](int64_t got, int64_t want) { return std::llabs(got - want) <= amb.total; };
  EXPECT_PRED2(near, gpu_stats_.v_rows_read, cpu_stats_.v_rows_read);
  EXPECT_PRED2(near, gpu_stats_.v_rows_read_host, cpu_stats_.v_rows_read_host);
  EXPECT_EQ(gpu_stats_.v_rows_read_dense, cpu_stats_.v_rows_read_dense);
  EXPECT_PRED2(near, gpu_stats_.elements_kept, cpu_stats_.elements_kept);
  EXPECT_EQ(gpu_stats_.elements_dense, cpu_stats_.elements_dense);
  EXPECT_PRED2(near, gpu_stats_.retained_but_evicted, cpu_stats_.retained_but_evicted);
  ASSERT_EQ(gpu_stats_.layer_kept.size(), cpu_stats_.layer_kept.size());
  for (size_t l = 0; l < cpu_stats_.layer_kept.size(); ++l) {
    EXPECT_PRED2(near, gpu_stats_.layer_kept[l], cpu_stats_.layer_kept[l]) << "layer " << l;
  }
  if (amb.total > 0) std::printf("(%lld decisions within rounding of θ)\n", (long long)amb.total);
  for (size_t si = 0; si < seqs_.size(); ++si) {
    const Seq& q = seqs_[si];
    ASSERT_EQ(q.hits_gpu.size(), q.hits_cpu.size());
    for (size_t e = 0; e < q.hits_cpu.size(); ++e) {
      if (amb.count[si][e] > 0) continue;
      ASSERT_EQ(q.hits_gpu[e], q.hits_cpu[e]) << "hit marks differ at entry " << e;
    }
    for (size_t e = 0; e < q.mass_cpu.size(); ++e) {
      const float want = float(MassValue(q.mass_cpu[e])), got = float(MassValue(q.mass_gpu[e]));
      ASSERT_LE(std::fabs(got - want), 1e-5f + 2e-3f * std::fabs(want) + 1.01f * amb.mass[si][e])
          << "retained mass at entry " << e << ": got " << got << " want " << want;
    }
    // Each table's entries past its window [hits_begin, end) stay unset on both sides.
    const size_t row = q.hits_gpu.size() / tables_;
    for (int32_t t = 0; t < tables_; ++t) {
      for (size_t e = size_t(q.window); e < row; ++e) {
        ASSERT_EQ(q.hits_gpu[t * row + e], -1) << "a mark outside the window, table " << t;
        ASSERT_EQ(q.mass_gpu[t * row + e], 0u) << "mass outside the window, table " << t;
        ASSERT_EQ(q.hits_cpu[t * row + e], -1) << "a CPU mark outside the window, table " << t;
      }
    }
  }
}

model::ThetaTable MakeTable(const Shape& s, model::ThetaPlacement placement, int32_t k) {
  model::ThetaTable t(s.num_layers, s.num_heads, model::ThetaTable::DefaultBuckets(8192));
  const auto& b = t.buckets();
  for (int32_t l = 0; l < s.num_layers; ++l) {
    for (int32_t h = 0; h < s.num_heads; ++h) {
      for (int32_t i = 0; i < int32_t(b.size()); ++i) {
        // Between the modes: pre-softmax scores 0 vs 4; post-softmax e^s/D_full with
        // D_full ≈ 6.4·L, i.e. about 0.16/L vs 8.5/L.
        t.theta_at(l, h, i) = placement == model::ThetaPlacement::kPreSoftmax ? 2.0f : 1.0f / b[i];
        t.sdc_at(l, h, i) = 0.3f;
        t.count_at(l, h, i) = 100;
      }
    }
  }
  t.k_per_layer.assign(s.num_layers, k);
  t.placement = placement;
  t.Finalize();
  return t;
}

}  // namespace thetaserve::kernels::cuda::attention_test
