// The split kernels' common ground (attention.cu; DESIGN.md §5): their arguments, a block's
// split of a (row, KV group), where its partials go, the 16-bit score encoding, and the
// reduction of the row groups' V sums into the split's partial outputs.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace thetaserve::kernels::cuda {

constexpr int kMaxGroup = 8;    // query heads per KV head the kernels support
constexpr int kThreads = 128;   // split kernels

// The split kernels' one argument (attention.cu): split row r of this launch is token
// row_ids[r] of the step; a block takes one (row, KV head, split of `chunk` keys).
struct SplitArgs {
  const int32_t* row_ids;  // [num_rows]: indices into kv.rows (the step's tokens)
  DevKv kv;
  const uint16_t* pool;    // [num_pages, block_size, head_dim] bf16 (kv.layout)
  DevQueries q;
  int32_t chunk;           // keys per split
  AttentionWorkspace ws;
  ThetaArgs theta;
  bool top_theta;
  float* o;                // [T, num_heads * head_dim], indexed by the token row_ids[r], not r
};

// Pass 2's kept list holds a segment per warp, each as long as the rows that warp tests.
__host__ __device__ constexpr int32_t ListCapacity(int32_t chunk) {
  return (chunk + kThreads - 1) / kThreads * kThreads;
}

// Shared memory of a split block, in floats: the group's queries [G, D], then one area for
// pass 1's scores [G, chunk], pass 2's kept list or the row-group reduction.
__host__ __device__ constexpr int64_t SplitAreaFloats(int D, int G, int chunk) {
  const int64_t scores = int64_t(G) * chunk, list = int64_t(G + 1) * ListCapacity(chunk);
  const int64_t reduce = int64_t(kThreads / (D / 8)) * G * D;
  const int64_t area =
      scores > list ? (scores > reduce ? scores : reduce) : (list > reduce ? list : reduce);
  return int64_t(G) * D + area;
}
// Shared memory of a one-pass block (SplitOnePass), in floats: the queries, e [G, chunk],
// flags [chunk], the kept list (rows and keys), or the row-group reduction if larger.
__host__ __device__ constexpr int64_t OnePassAreaFloats(int D, int G, int chunk) {
  const int64_t used = int64_t(G) * D + int64_t(G) * chunk + chunk + 2 * ListCapacity(chunk);
  const int64_t reduce = int64_t(kThreads / (D / 8)) * G * D;
  return used > reduce ? used : reduce;
}
// Staged K (pass 1, KLoad::kStaged) starts after the scores, 16-byte aligned: it is dead
// before the reduction area above, which may overlap it, is used.
__host__ __device__ constexpr int64_t StageOffsetFloats(int D, int G, int chunk) {
  return (int64_t(G) * D + int64_t(G) * chunk + 3) / 4 * 4;
}

__device__ __forceinline__ int64_t PartIndex(const SplitArgs& a, int64_t r, int32_t head,
                                             int32_t split) {
  return (r * a.kv.shape.num_heads + head) * a.ws.max_splits + split;
}

// Top-θ scores between the passes: 16-bit fixed point below the split's max,
// q = (m_split − s)·4096 rounded, saturating at 16 nats. Half the bytes of f32 (pass 1 writes
// them and pass 2 reads them back: after K, the largest traffic of Top-θ), at most 1/8192 nat
// of rounding in a score: a 0.012% change of e, less than bf16 K moves a score by. A
// saturated score (kSaturated) only bounds e from above; a row with one is decided and
// weighted on its exact score whenever that bound could pass a threshold (RowKeep): a split
// holding an attention sink puts every other row of it there.
constexpr float kScoreSteps = 4096.0f;  // per nat
constexpr uint16_t kSaturated = 65535;
__device__ __forceinline__ uint16_t EncodeScore(float s, float m_split) {
  return static_cast<uint16_t>(fminf(65535.0f, fmaxf(0.0f, rintf((m_split - s) * kScoreSteps))));
}

// What a split-kernel block works on: grid (split, row, KV group); a fused block, several
// splits of its row in turn (SplitFusedKernel).
struct SplitBlock {
  int64_t r;           // row of the batch (index into row_ids)
  int32_t t;           // token the row belongs to
  DevRow row;
  int32_t L;           // keys in the row
  int32_t split;
  int32_t j0;          // first key of the split (≥ L: nothing to do)
  int32_t g;           // KV head
  int32_t first_head;  // first query head of the group
  int64_t lh;          // page-table index (layer, KV head)
};

__device__ __forceinline__ SplitBlock ThisSplit(const SplitArgs& a, int32_t G, int32_t split) {
  SplitBlock b;
  b.r = blockIdx.y;
  b.t = a.row_ids[b.r];
  b.row = a.kv.rows[b.t];
  b.L = b.row.pos + 1;
  b.split = split;
  b.j0 = b.split * a.chunk;
  b.g = blockIdx.z;
  b.first_head = b.g * G;
  b.lh = int64_t(a.kv.layer) * a.kv.shape.num_kv_heads + b.g;
  return b;
}

// Sums acc[h][0..8) of every row group into red and writes the group's partial outputs.
template <int D, int GT>
__device__ void ReduceRowGroups(const SplitArgs& a, float (&acc)[GT > 0 ? GT : kMaxGroup][8],
                                int32_t G, float* red, int64_t r, int32_t first_head,
                                int32_t split) {
  constexpr int kG = GT > 0 ? GT : kMaxGroup;  // compile-time group size when known
  constexpr int kRowGroups = kThreads / (D / 8);
  const int rg = threadIdx.x / (D / 8), lane8 = threadIdx.x % (D / 8);
  __syncthreads();
#pragma unroll
  for (int h = 0; h < kG; ++h) {
    if (h < G) {
#pragma unroll
      for (int e = 0; e < 8; ++e) red[(rg * G + h) * D + lane8 * 8 + e] = acc[h][e];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
    float s = 0.0f;
    for (int g = 0; g < kRowGroups; ++g) s += red[g * G * D + i];
    const int h = i / D, c = i % D;
    a.ws.part_o[PartIndex(a, r, first_head + h, split) * D + c] = s;
  }
}

// acc[h][e] += e_h · v[e] for the group's heads, e_h = p[h · chunk] (one V row's eight
// values, whichever way it was read).
template <int kG>
__device__ __forceinline__ void AccumulateV(float (&acc)[kG][8], const float (&v)[8],
                                            const float* p, int32_t chunk, int32_t G) {
#pragma unroll
  for (int h = 0; h < kG; ++h) {
    if (h < G) {
      const float e = p[h * chunk];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[h][i] = fmaf(e, v[i], acc[h][i]);
    }
  }
}

}  // namespace thetaserve::kernels::cuda
