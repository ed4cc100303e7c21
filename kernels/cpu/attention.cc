#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/vec.h"

namespace thetaserve::kernels::cpu {

void WriteKv(const ForwardBatch& batch, const AttentionShape& shape, int64_t layer,
             const float* k, const float* v, const KvPoolLayout& layout, float* pool) {
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
        std::memcpy(kd, k + row * kv_dim + g * d, d * sizeof(float));
        std::memcpy(vd, v + row * kv_dim + g * d, d * sizeof(float));
      }
    }
  }
}

namespace {

// One unit of work: the query heads of one KV group for one token.
constexpr int64_t kMaxGroup = 64;  // query heads per KV head

struct Unit {
  int32_t seq;
  int32_t token;  // index within the sequence's chunk
  int32_t kv_head;
};

}  // namespace

void PagedAttention(ThreadPool& pool, const ForwardBatch& batch, const AttentionShape& shape,
                    int64_t layer, const float* q, const KvPoolLayout& layout,
                    const float* kv_pool, float* o) {
  const int64_t d = shape.head_dim;
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  const int64_t q_dim = shape.num_heads * d;
  const int32_t bs = layout.block_size;
  CHECK_LE(group, kMaxGroup);

  std::vector<Unit> units;
  for (int32_t s = 0; s < static_cast<int32_t>(batch.seqs.size()); ++s) {
    for (int32_t t = 0; t < batch.seqs[s].num_tokens; ++t) {
      for (int32_t g = 0; g < shape.num_kv_heads; ++g) units.push_back({s, t, g});
    }
  }

  pool.ParallelFor(static_cast<int64_t>(units.size()), 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;  // [group, L]
    for (int64_t u = begin; u < end; ++u) {
      const Unit& unit = units[u];
      const SeqChunk& seq = batch.seqs[unit.seq];
      const int64_t row = seq.token_offset + unit.token;
      const int64_t L = seq.start_pos + unit.token + 1;  // causal: keys [0, pos]
      const int64_t lh = layer * shape.num_kv_heads + unit.kv_head;
      const float* qg = q + row * q_dim + unit.kv_head * group * d;  // [group, d]
      float* og = o + row * q_dim + unit.kv_head * group * d;        // [group, d]
      scores.resize(group * L);

      // Pass 1: scores and row maxima, one K row read serves the whole group.
      float row_max[kMaxGroup];
      std::fill(row_max, row_max + group, -std::numeric_limits<float>::infinity());
      for (int64_t j = 0; j < L; ++j) {
        const float* kr =
            kv_pool + layout.RowOffset(seq.pages.KPage(lh, j, bs), static_cast<int32_t>(j % bs));
        for (int64_t h = 0; h < group; ++h) {
          const float s = Dot(qg + h * d, kr, d) * shape.scale;
          scores[h * L + j] = s;
          row_max[h] = std::max(row_max[h], s);
        }
      }
      // Softmax weights.
      float denom[kMaxGroup];
      for (int64_t h = 0; h < group; ++h) {
        float sum = 0.0f;
        float* sh = scores.data() + h * L;
        for (int64_t j = 0; j < L; ++j) {
          sh[j] = std::exp(sh[j] - row_max[h]);
          sum += sh[j];
        }
        denom[h] = sum;
      }
      // Pass 2: weighted sum of V rows.
      std::fill(og, og + group * d, 0.0f);
      for (int64_t j = 0; j < L; ++j) {
        const float* vr =
            kv_pool + layout.RowOffset(seq.pages.VPage(lh, j, bs), static_cast<int32_t>(j % bs));
        for (int64_t h = 0; h < group; ++h) Axpy(scores[h * L + j], vr, og + h * d, d);
      }
      for (int64_t h = 0; h < group; ++h) Scale(1.0f / denom[h], og + h * d, d);
    }
  });
}

}  // namespace thetaserve::kernels::cpu
