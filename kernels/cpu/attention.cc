#include "kernels/cpu/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/vec.h"

namespace thetaserve::kernels::cpu {

void WriteKv(const ForwardBatch& batch, const AttentionShape& shape, int64_t layer,
             const float* k, const float* v, const KvPoolLayout& layout, float* pool,
             float* vsum_rows) {
  const int64_t d = shape.head_dim;
  const int64_t kv_dim = shape.num_kv_heads * d;
  for (const SeqChunk& seq : batch.seqs) {
    for (int32_t i = 0; i < seq.num_tokens; ++i) {
      const int64_t row = seq.token_offset + i;
      const int64_t pos = seq.start_pos + i;
      for (int64_t g = 0; g < shape.num_kv_heads; ++g) {
        const int64_t lh = layer * shape.num_kv_heads + g;
        const int32_t slot = static_cast<int32_t>(pos % layout.block_size);
        float* kd = pool + layout.RowOffset(seq.pages.KPage(lh, pos, layout.block_size), slot);
        float* vd = pool + layout.RowOffset(seq.pages.VPage(lh, pos, layout.block_size), slot);
        const float* vr = v + row * kv_dim + g * d;
        std::memcpy(kd, k + row * kv_dim + g * d, d * sizeof(float));
        std::memcpy(vd, vr, d * sizeof(float));
        if (seq.pages.v_sum) {
          float* sum = seq.pages.v_sum + lh * d;
          for (int64_t e = 0; e < d; ++e) sum[e] += vr[e];
          if (vsum_rows) std::memcpy(vsum_rows + row * kv_dim + g * d, sum, d * sizeof(float));
        }
      }
    }
  }
}

namespace {

constexpr int64_t kMaxGroup = 64;  // query heads per KV head

// One unit of work: the query heads of one KV group for one token.
struct Unit {
  int32_t seq;
  int32_t token;  // index within the sequence's chunk
  int32_t kv_head;
};

// Per-thread scratch, reused across units.
struct Scratch {
  std::vector<float> e;      // [group, L] exp(s - m)
  std::vector<float> sorted; // [L] for the (k+1)-th largest
  AttentionStats stats;
};

// Dense softmax attention for one unit (no config).
void DenseUnit(const SeqChunk& seq, int64_t lh, int64_t L, int64_t group, int64_t d, float scale,
               const KvPoolLayout& layout, const float* kv_pool, const float* qg, float* og,
               std::vector<float>& e) {
  const int32_t bs = layout.block_size;
  e.resize(group * L);
  float row_max[kMaxGroup];
  std::fill(row_max, row_max + group, -std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < L; ++j) {
    const float* kr = kv_pool + layout.RowOffset(seq.pages.KPage(lh, j, bs), int32_t(j % bs));
    for (int64_t h = 0; h < group; ++h) {
      const float s = Dot(qg + h * d, kr, d) * scale;
      e[h * L + j] = s;
      row_max[h] = std::max(row_max[h], s);
    }
  }
  float denom[kMaxGroup];
  for (int64_t h = 0; h < group; ++h) {
    float sum = 0.0f;
    float* eh = e.data() + h * L;
    for (int64_t j = 0; j < L; ++j) {
      eh[j] = std::exp(eh[j] - row_max[h]);
      sum += eh[j];
    }
    denom[h] = sum;
  }
  std::fill(og, og + group * d, 0.0f);
  for (int64_t j = 0; j < L; ++j) {
    const float* vr = kv_pool + layout.RowOffset(seq.pages.VPage(lh, j, bs), int32_t(j % bs));
    for (int64_t h = 0; h < group; ++h) Axpy(e[h * L + j], vr, og + h * d, d);
  }
  for (int64_t h = 0; h < group; ++h) Scale(1.0f / denom[h], og + h * d, d);
}

// Top-θ attention for one unit: pass 1 over all K (scores, max, D_full), the keep test per
// head, pass 2 over the stored V rows (sparse store, then tail) gathering only kept rows and
// setting hit bits, then SDC and VMC.
void TopThetaUnit(const SeqChunk& seq, int64_t layer, int64_t lh, int64_t pos, int64_t group,
                  int64_t first_head, const AttentionShape& shape, const KvPoolLayout& layout,
                  const float* kv_pool, const float* qg, const float* vsum, float* og,
                  const TopThetaConfig& cfg, Scratch& scratch) {
  const int64_t d = shape.head_dim;
  const int64_t L = pos + 1;
  const int32_t bs = layout.block_size;
  const model::ThetaTable& table = *cfg.table;
  const int32_t k = table.KAt(static_cast<int32_t>(layer), L);
  const bool post = table.placement == model::ThetaPlacement::kPostSoftmax;
  std::vector<float>& e = scratch.e;
  e.resize(group * L);

  // Pass 1: scores for every key, row maxima, full denominators.
  float row_max[kMaxGroup], d_full[kMaxGroup];
  std::fill(row_max, row_max + group, -std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < L; ++j) {
    const float* kr = kv_pool + layout.RowOffset(seq.pages.KPage(lh, j, bs), int32_t(j % bs));
    for (int64_t h = 0; h < group; ++h) {
      const float s = Dot(qg + h * d, kr, d) * shape.scale;
      e[h * L + j] = s;
      row_max[h] = std::max(row_max[h], s);
    }
  }
  for (int64_t h = 0; h < group; ++h) {
    float* eh = e.data() + h * L;
    double sum = 0;
    for (int64_t j = 0; j < L; ++j) sum += eh[j] = std::exp(eh[j] - row_max[h]);
    d_full[h] = static_cast<float>(sum);
  }

  // The keep test in exp space: keep_j ⇔ e_j > thr (exp is monotonic, so pre-softmax s_j > θ
  // is e_j > e^(θ-m), and post-softmax p_j > θ is e_j > θ·D_full). thr < 0 keeps everything.
  float thr[kMaxGroup];
  for (int64_t h = 0; h < group; ++h) {
    const int32_t head = static_cast<int32_t>(first_head + h);
    float* eh = e.data() + h * L;
    if (L <= k) {
      thr[h] = -1.0f;  // short rows are dense
    } else if (cfg.top_k || cfg.recorder) {
      // Exact top-k: the threshold is the (k+1)-th largest value.
      scratch.sorted.assign(eh, eh + L);
      std::nth_element(scratch.sorted.begin(), scratch.sorted.begin() + k, scratch.sorted.end(),
                       std::greater<float>());
      thr[h] = scratch.sorted[k];
      if (cfg.recorder) {
        double kept = 0;
        for (int64_t j = 0; j < L; ++j) kept += eh[j] > thr[h] ? eh[j] : 0.0f;
        const float theta_row = post ? thr[h] / d_full[h] : row_max[h] + std::log(thr[h]);
        const float miss = kept > 0 ? static_cast<float>((d_full[h] - kept) / kept) : 0.0f;
        cfg.recorder->Record(static_cast<int32_t>(layer), head, L, theta_row, miss);
      }
    } else {
      const float theta = table.Theta(static_cast<int32_t>(layer), head, L);
      thr[h] = std::isnan(theta) ? -1.0f
               : post            ? theta * d_full[h]
                                 : std::exp(theta - row_max[h]);
    }
  }

  // Pass 2: walk the stored V rows; gather the kept ones.
  std::fill(og, og + group * d, 0.0f);
  float d_kept[kMaxGroup] = {};
  int64_t kept[kMaxGroup] = {};
  int64_t rows_read = 0, evicted_hits = 0;
  int32_t* hits = seq.pages.hits ? seq.pages.hits + lh * seq.pages.hits_stride : nullptr;
  float* hit_mass = seq.pages.hit_mass ? seq.pages.hit_mass + lh * seq.pages.hits_stride : nullptr;
  const float retain = cfg.retain_factor;
  auto visit = [&](int64_t j, const float* vr) {
    bool any = false, strong = false;
    float mass = 0.0f;
    for (int64_t h = 0; h < group; ++h) {
      const float ej = e[h * L + j];
      if (ej > thr[h]) {
        if (vr) {
          Axpy(ej, vr, og + h * d, d);
          d_kept[h] += ej;
          ++kept[h];
        }
        any = true;
        strong |= ej > retain * thr[h];
        mass += ej / d_full[h];
      }
    }
    if (!any) return;
    if (vr) {
      ++rows_read;
    } else {
      ++evicted_hits;  // retained, but its V row was dropped: its mass stays in D_miss
    }
    if (hit_mass) {
      std::atomic_ref<float>(hit_mass[j]).fetch_add(mass, std::memory_order_relaxed);
    }
    if (hits && strong) {
      // Latest retaining query: several prefill queries may race for the same row.
      std::atomic_ref<int32_t> h(hits[j]);
      int32_t seen = h.load(std::memory_order_relaxed);
      while (seen < pos && !h.compare_exchange_weak(seen, static_cast<int32_t>(pos),
                                                     std::memory_order_relaxed)) {
      }
    }
  };
  const int32_t tail_start = std::min<int32_t>(seq.pages.v_tail_start, static_cast<int32_t>(L));
  const int32_t sparse_n = seq.pages.SparseCount(lh);
  const int32_t* sparse_pos = sparse_n ? seq.pages.v_sparse_pos + lh * seq.pages.sparse_pos_stride : nullptr;
  int32_t r = 0;
  for (int64_t j = 0; j < tail_start; ++j) {
    if (r < sparse_n && sparse_pos[r] == j) {
      const int32_t page = seq.pages.v_sparse_pages[lh * seq.pages.sparse_stride + r / bs];
      visit(j, kv_pool + layout.RowOffset(page, r % bs));
      ++r;
    } else {
      visit(j, nullptr);
    }
  }
  for (int64_t j = tail_start; j < L; ++j) {
    visit(j, kv_pool + layout.RowOffset(seq.pages.VPage(lh, j, bs), int32_t(j % bs)));
  }

  // Compensation.
  const float inv_L = 1.0f / static_cast<float>(L);
  int64_t elements = 0;
  for (int64_t h = 0; h < group; ++h) {
    float* oh = og + h * d;
    float denom = d_kept[h];
    switch (cfg.sdc) {
      case SdcMode::kNone: break;
      case SdcMode::kExact: denom = d_full[h]; break;
      case SdcMode::kExpThreshold:
        if (thr[h] > 0) denom = d_kept[h] + float(L - kept[h]) * thr[h];
        break;
      case SdcMode::kOffline:
        if (thr[h] > 0) {
          denom = d_kept[h] * (1.0f + table.SdcRatio(static_cast<int32_t>(layer),
                                                     static_cast<int32_t>(first_head + h), L));
        }
        break;
    }
    const bool have_mean = cfg.vmc && vsum != nullptr;
    if (denom > 0) {
      Scale(1.0f / denom, oh, d);
      if (have_mean) {
        // VMC: the pruned probability mass goes to the mean of all V rows so far.
        const float missing = std::max(0.0f, 1.0f - d_kept[h] / denom);
        if (missing > 0) Axpy(missing * inv_L, vsum, oh, d);
      }
    } else if (have_mean) {
      for (int64_t c = 0; c < d; ++c) oh[c] = vsum[c] * inv_L;  // nothing kept: the mean
    }
    elements += kept[h];
  }
  AttentionStats& st = scratch.stats;
  st.v_rows_read += rows_read;
  st.v_rows_read_dense += L;
  st.elements_kept += elements;
  st.elements_dense += L * group;
  st.retained_but_evicted += evicted_hits;
  st.layer_kept[layer] += elements;
  st.layer_dense[layer] += L * group;
}

}  // namespace

void PagedAttention(ThreadPool& pool, const ForwardBatch& batch, const AttentionShape& shape,
                    int64_t layer, const float* q, const KvPoolLayout& layout,
                    const float* kv_pool, const float* vsum_rows, const TopThetaConfig& config,
                    float* o) {
  const int64_t d = shape.head_dim;
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  const int64_t q_dim = shape.num_heads * d;
  const int64_t kv_dim = shape.num_kv_heads * d;
  CHECK_LE(group, kMaxGroup);

  std::vector<Unit> units;
  for (int32_t s = 0; s < static_cast<int32_t>(batch.seqs.size()); ++s) {
    for (int32_t t = 0; t < batch.seqs[s].num_tokens; ++t) {
      for (int32_t g = 0; g < shape.num_kv_heads; ++g) units.push_back({s, t, g});
    }
  }
  std::mutex stats_mu;
  pool.ParallelFor(static_cast<int64_t>(units.size()), 1, [&](int64_t begin, int64_t end) {
    thread_local Scratch scratch;
    scratch.stats.Reset(shape.num_layers);
    for (int64_t u = begin; u < end; ++u) {
      const Unit& unit = units[u];
      const SeqChunk& seq = batch.seqs[unit.seq];
      const int64_t row = seq.token_offset + unit.token;
      const int64_t pos = seq.start_pos + unit.token;
      const int64_t lh = layer * shape.num_kv_heads + unit.kv_head;
      const float* qg = q + row * q_dim + unit.kv_head * group * d;  // [group, d]
      float* og = o + row * q_dim + unit.kv_head * group * d;        // [group, d]
      if (config.active()) {
        // VMC needs the sequence's running V sums (WriteKv fills these rows only then).
        const float* vsum = vsum_rows && seq.pages.v_sum
                                ? vsum_rows + row * kv_dim + unit.kv_head * d
                                : nullptr;
        TopThetaUnit(seq, layer, lh, pos, group, unit.kv_head * group, shape, layout, kv_pool,
                     qg, vsum, og, config, scratch);
      } else {
        DenseUnit(seq, lh, pos + 1, group, d, shape.scale, layout, kv_pool, qg, og, scratch.e);
        AttentionStats& st = scratch.stats;
        st.v_rows_read += pos + 1;
        st.v_rows_read_dense += pos + 1;
        st.elements_kept += (pos + 1) * group;
        st.elements_dense += (pos + 1) * group;
        st.layer_kept[layer] += (pos + 1) * group;
        st.layer_dense[layer] += (pos + 1) * group;
      }
    }
    if (batch.stats) {
      std::lock_guard<std::mutex> lock(stats_mu);
      batch.stats->Add(scratch.stats);
    }
  });
}

}  // namespace thetaserve::kernels::cpu
