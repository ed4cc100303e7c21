// Paged attention on the GPU (DESIGN.md §5): flash-decoding split kernels, dense and Top-θ
// (pass 1: scores, row max and D_full over every K row; pass 2: keep test, gather of the
// retained V rows only, hit marks; SDC and VMC in the final reduction). Dense prefill tiles
// are prefill.cu's. The CPU backend's attention is the reference.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>

#include <cooperative_groups.h>
#include <cuda_pipeline.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace thetaserve::kernels::cuda {
namespace {

constexpr int kMaxGroup = 8;    // query heads per KV head the kernels support
constexpr int kThreads = 128;   // split kernels

struct SplitArgs {
  const int32_t* row_ids;
  DevKv kv;
  const uint16_t* pool;
  DevQueries q;
  int32_t chunk;
  AttentionWorkspace ws;
  ThetaArgs theta;
  bool top_theta;
  float* o;
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

// acc[h] += q_h[c .. c + 8) · kf for the group's heads, one fmaf per element in order; q points
// at element c of head 0's query in shared memory ([G, D]). Every way of reading K scores its
// pieces with it (ExactScore repeats the order for one head).
template <int D, int kG>
__device__ __forceinline__ void AddPieceDots(float (&acc)[kG], const float* q,
                                             const float (&kf)[8], int32_t G) {
#pragma unroll
  for (int h = 0; h < kG; ++h) {
    if (h < G) {
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[h] = fmaf(q[h * D + e], kf[e], acc[h]);
    }
  }
}

// Scores of this block's keys for the group's heads: sc[h * chunk + jl] = q_h · k_j · scale.
// A thread per key: eight independent 16-byte loads per key, two keys in flight. (Eight lanes
// per key with coalesced 512-byte warp loads and shuffled dots measured ~20% slower on the
// H200: docs/results.md.)
template <int D, int GT>
__device__ void ScoresPerThread(const SplitArgs& a, const DevSeq& seq, int64_t lh, int32_t j0,
                                int32_t n, int32_t G, const float* qs, float* sc) {
  constexpr int kG = GT > 0 ? GT : kMaxGroup;  // compile-time group size when known
  const Divisor bs(a.kv.layout.block_size);
  const int32_t* k_pages = seq.pages.k_pages + lh * seq.pages.stride;
#pragma unroll 2
  for (int32_t jl = threadIdx.x; jl < n; jl += blockDim.x) {
    const int32_t j = j0 + jl;
    const uint16_t* kr = a.pool + a.kv.layout.RowOffset(k_pages[bs.Div(j)], bs.Mod(j));
    float acc[kG];
#pragma unroll
    for (int h = 0; h < kG; ++h) acc[h] = 0.0f;
#pragma unroll
    for (int c = 0; c < D; c += 8) {
      float kf[8];
      LoadBf16x8(kr + c, kf);
      AddPieceDots<D, kG>(acc, qs + c, kf, G);
    }
#pragma unroll
    for (int h = 0; h < kG; ++h) {
      if (h < G) sc[h * a.chunk + jl] = acc[h];
    }
  }
}

// K per quad (KLoad::kQuad): four threads score a key, thread s of the quad over pieces
// s, s + 4, ... of its row (8 bf16 each), and the quad adds its partial sums with two shuffles
// per head, (p0 + p1) + (p2 + p3). A load instruction of a warp then covers 64 contiguous bytes
// of each of 8 rows, where a thread per key touches 32 rows (16 bytes of each): a quarter of
// the L1 lines per instruction (pass 1 per thread keeps the L1 93% busy at 53% of the DRAM
// bandwidth on the H200: docs/results.md). Each thread keeps kQuadKeys keys' loads in flight.
constexpr int kQuad = 4;
__host__ __device__ constexpr int QuadPiece(int s, int i) { return i * kQuad + s; }
template <int D>
__host__ __device__ constexpr int QuadKeys() {
  return D <= 64 ? 4 : 2;  // 8 loads in flight per thread
}

template <int D, int GT>
__device__ void ScoresQuad(const SplitArgs& a, const DevSeq& seq, int64_t lh, int32_t j0,
                           int32_t n, int32_t G, const float* qs, float* sc) {
  constexpr int kG = GT > 0 ? GT : kMaxGroup;
  constexpr int kMine = D / 8 / kQuad;  // pieces per thread
  constexpr int kKeys = QuadKeys<D>();
  constexpr int32_t kRound = kThreads / kQuad;  // keys a block scores per key slot
  const Divisor bs(a.kv.layout.block_size);
  const int32_t* k_pages = seq.pages.k_pages + lh * seq.pages.stride;
  const int s = threadIdx.x % kQuad;
  for (int32_t base = 0; base < n; base += kKeys * kRound) {  // the same trips for every thread
    uint4 raw[kKeys][kMine];
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      const int32_t jl = base + u * kRound + int32_t(threadIdx.x) / kQuad;
      if (jl < n) {
        const int32_t j = j0 + jl;
        const uint16_t* kr = a.pool + a.kv.layout.RowOffset(k_pages[bs.Div(j)], bs.Mod(j));
#pragma unroll
        for (int i = 0; i < kMine; ++i) {
          raw[u][i] = *reinterpret_cast<const uint4*>(kr + QuadPiece(s, i) * 8);
        }
      } else {
#pragma unroll
        for (int i = 0; i < kMine; ++i) raw[u][i] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      const int32_t jl = base + u * kRound + int32_t(threadIdx.x) / kQuad;
      float acc[kG];
#pragma unroll
      for (int h = 0; h < kG; ++h) acc[h] = 0.0f;
#pragma unroll
      for (int i = 0; i < kMine; ++i) {
        const int c = QuadPiece(s, i) * 8;
        float kf[8];
        Bf16x8ToF32(raw[u][i], kf);
        AddPieceDots<D, kG>(acc, qs + c, kf, G);
      }
#pragma unroll
      for (int h = 0; h < kG; ++h) {
        if (h < G) {  // every lane takes part
          acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 1);
          acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 2);
          if (s == 0 && jl < n) sc[h * a.chunk + jl] = acc[h];
        }
      }
    }
  }
}

// Staged K and V (KLoad::kStaged): the chunk's K rows, then (dense) its V rows, pass through
// shared memory in tiles of kStageKeys rows, copied with cp.async: 16 bytes a copy,
// consecutive threads on consecutive bytes of a page (coalesced), no registers held while the
// copies are in flight, through a ring of StageCount tiles (the others load while one is
// read); the first V tiles load while the block forms the softmax. Two threads score a key,
// each over half the row, and add their halves with one shuffle per head. A row's 16-byte
// pieces are stored at piece ^ (row & 7), so the eight threads of a quarter-warp write and
// read eight different bank groups.
constexpr int kStageKeys = kThreads / 2;
__host__ __device__ constexpr bool CanStage(int d) { return d == 64 || d == 128; }
__host__ __device__ constexpr int StageCount(int d) {
  return d <= 64 ? 3 : 2;  // rings of 24 KB (d 64) and 32 KB (d 128): 16 KB loading
}
__host__ __device__ constexpr size_t StageBytes(int d) {
  return size_t(StageCount(d)) * kStageKeys * d * sizeof(uint16_t);
}

// The piece (8 elements) of the row that the thread of half h reads at step s of its
// half-row dot product. The halves walk their pieces in orders that keep a quarter-warp's K
// reads on distinct bank groups, and the warp's two query reads (qs, one address per half)
// on different banks, at d 128 as at d 64. ExactScore follows the same order.
template <int D>
__host__ __device__ constexpr int StagedPiece(int h, int s) {
  constexpr int kHalf = D / 16;  // pieces per half row
  return h * kHalf + ((s ^ (h * 5)) & (kHalf - 1));
}

// Starts the copies of K (or V) tile `tile` (rows [tile·kStageKeys, +kStageKeys) of the
// chunk, those below n) into its ring slot, then closes the thread's group of copies. Every
// thread commits a group for every tile, even one past the end (empty), so the counts that
// __pipeline_wait_prior relies on agree.
template <int D, bool kV>
__device__ __forceinline__ void IssueTile(const SplitArgs& a, const DevSeq& seq, int64_t lh,
                                          int32_t j0, int32_t n, int32_t tile, uint4* stage) {
  constexpr int kPieces = D / 8;
  const Divisor bs(a.kv.layout.block_size);
  const int32_t* pages = (kV ? seq.pages.v_pages : seq.pages.k_pages) + lh * seq.pages.stride;
  const int32_t first = kV ? seq.pages.v_tail_start : 0;  // V: positions of the tail's pages
  uint4* buf = stage + (tile % StageCount(D)) * kStageKeys * kPieces;
#pragma unroll
  for (int i = threadIdx.x; i < kStageKeys * kPieces; i += kThreads) {
    const int kl = i / kPieces, c = i % kPieces;
    const int32_t jl = tile * kStageKeys + kl;
    if (jl < n) {
      const int32_t j = j0 + jl;
      const int32_t page = pages[bs.Div(j - first)];
      const uint16_t* src = a.pool + a.kv.layout.RowOffset(page, bs.Mod(j)) + c * 8;
      __pipeline_memcpy_async(buf + kl * kPieces + (c ^ (kl & 7)), src, 16);
    }
  }
  __pipeline_commit();
}

// Starts the ring: tiles 0 .. StageCount − 2.
template <int D, bool kV>
__device__ __forceinline__ void StartRing(const SplitArgs& a, const DevSeq& seq, int64_t lh,
                                          int32_t j0, int32_t n, uint4* stage) {
#pragma unroll
  for (int p = 0; p < StageCount(D) - 1; ++p) IssueTile<D, kV>(a, seq, lh, j0, n, p, stage);
}

// Waits for tile t of the ring (this thread's copies, then everyone's, at the barrier, which
// also means tile t - 1 is read by no one), then starts tile t + StageCount − 1 into its slot.
template <int D, bool kV>
__device__ __forceinline__ const uint4* NextTile(const SplitArgs& a, const DevSeq& seq,
                                                 int64_t lh, int32_t j0, int32_t n, int32_t t,
                                                 uint4* stage) {
  constexpr int kS = StageCount(D);
  __pipeline_wait_prior(kS - 2);
  __syncthreads();
  IssueTile<D, kV>(a, seq, lh, j0, n, t + kS - 1, stage);
  return stage + (t % kS) * kStageKeys * (D / 8);
}

// Scores of this block's keys for the group's heads, as ScoresPerThread, through staged K.
template <int D, int GT>
__device__ void ScoresStaged(const SplitArgs& a, const DevSeq& seq, int64_t lh, int32_t j0,
                             int32_t n, int32_t G, const float* qs, float* sc, uint4* stage) {
  constexpr int kG = GT > 0 ? GT : kMaxGroup;
  constexpr int kPieces = D / 8, kHalf = D / 16;
  const int32_t tiles = (n + kStageKeys - 1) / kStageKeys;
  StartRing<D, false>(a, seq, lh, j0, n, stage);
  const int kl = threadIdx.x >> 1, half = threadIdx.x & 1;
  for (int32_t t = 0; t < tiles; ++t) {
    const uint4* row = NextTile<D, false>(a, seq, lh, j0, n, t, stage) + kl * kPieces;
    const int32_t jl = t * kStageKeys + kl;
    float acc[kG];
#pragma unroll
    for (int h = 0; h < kG; ++h) acc[h] = 0.0f;
    if (jl < n) {
#pragma unroll
      for (int s = 0; s < kHalf; ++s) {
        const int c = StagedPiece<D>(half, s);
        float kf[8];
        Bf16x8ToF32(row[c ^ (kl & 7)], kf);
        AddPieceDots<D, kG>(acc, qs + c * 8, kf, G);
      }
    }
#pragma unroll
    for (int h = 0; h < kG; ++h) {
      if (h < G) {
        const float other = __shfl_xor_sync(0xffffffffu, acc[h], 1);  // every lane takes part
        if (half == 0 && jl < n) sc[h * a.chunk + jl] = acc[h] + other;
      }
    }
  }
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

// The split's queries (scaled) into smem [G, D] and their scores of keys [j0, j0 + n) into
// smem + G·D, [G, chunk], read from K the way kK says (staged: through the ring after the
// scores); ends with a barrier.
template <int D, int GT, KLoad kK>
__device__ __forceinline__ void ScoreSplit(const SplitArgs& a, int32_t t, int32_t first_head,
                                           const DevSeq& seq, int64_t lh, int32_t j0, int32_t n,
                                           int32_t G) {
  extern __shared__ __align__(16) float smem[];
  float* qs = smem;
  float* sc = smem + G * D;
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
    qs[i] = a.q.data[int64_t(t) * a.q.stride + int64_t(first_head) * D + i] * a.kv.shape.scale;
  }
  __syncthreads();
  if constexpr (kK == KLoad::kStaged) {
    uint4* stage = reinterpret_cast<uint4*>(smem + StageOffsetFloats(D, G, a.chunk));
    ScoresStaged<D, GT>(a, seq, lh, j0, n, G, qs, sc, stage);
  } else if constexpr (kK == KLoad::kQuad) {
    ScoresQuad<D, GT>(a, seq, lh, j0, n, G, qs, sc);
  } else {
    ScoresPerThread<D, GT>(a, seq, lh, j0, n, G, qs, sc);
  }
  __syncthreads();
}

// Dense split: scores, chunk max and Σe, and Σ e·V over the chunk.
// Top-θ pass 1: scores to the workspace (EncodeScore), chunk max and Σe; no V.
// kK: how K is read (per thread, per quad, or staged: through shared memory, ScoresStaged,
// its tiles after the scores). One split's work; SplitPass1Kernel and SplitFusedKernel run it.
template <int D, int GT, KLoad kK>
__device__ __forceinline__ void SplitPass1(const SplitArgs& a, int32_t split_index) {
  constexpr int kG = GT > 0 ? GT : kMaxGroup;  // compile-time group size when known
  constexpr bool kStaged = kK == KLoad::kStaged;
  extern __shared__ __align__(16) float smem[];  // 16 bytes: cp.async and uint4 reads of the ring
  __shared__ float scratch[32];
  const int32_t G = GT > 0 ? GT : a.kv.shape.num_heads / a.kv.shape.num_kv_heads;
  const auto [r, t, row, L, split, j0, g, first_head, lh] = ThisSplit(a, G, split_index);
  if (j0 >= L) return;
  const DevSeq& seq = a.kv.seqs[row.seq];
  const int32_t n = min(a.chunk, L - j0);

  float* sc = smem + G * D;     // [G, chunk]; later the row-group reduction
  ScoreSplit<D, GT, kK>(a, t, first_head, seq, lh, j0, n, G);
  if constexpr (kStaged) {
    // Every K tile is read (ScoreSplit's last barrier): the ring takes V (dense), loading
    // during the softmax.
    uint4* stage = reinterpret_cast<uint4*>(smem + StageOffsetFloats(D, G, a.chunk));
    if (!a.top_theta) StartRing<D, true>(a, seq, lh, j0, n, stage);
  }

  // Chunk max and Σ exp(s - m) per head; e replaces s in shared memory.
  for (int h = 0; h < G; ++h) {
    float m = -INFINITY;
    for (int jl = threadIdx.x; jl < n; jl += blockDim.x) m = fmaxf(m, sc[h * a.chunk + jl]);
    m = BlockMax(m, scratch);
    float l = 0.0f;
    const int64_t srow = (int64_t(r) * a.kv.shape.num_heads + first_head + h) * a.ws.score_stride;
    for (int jl = threadIdx.x; jl < n; jl += blockDim.x) {
      const float s = sc[h * a.chunk + jl];
      if (a.top_theta) a.ws.scores[srow + j0 + jl] = EncodeScore(s, m);
      const float e = expf(s - m);
      sc[h * a.chunk + jl] = e;
      l += e;
    }
    l = BlockSum(l, scratch);
    if (threadIdx.x == 0) {
      a.ws.part_m[PartIndex(a, r, first_head + h, split)] = m;
      a.ws.part_l[PartIndex(a, r, first_head + h, split)] = l;
    }
  }
  if (a.top_theta) return;
  __syncthreads();

  // Σ e_j · V_j: row groups of D/8 threads, 16 bytes of the row each; every thread sums its
  // rows rg, rg + kRowGroups, ... in that order, staged or not.
  constexpr int kRowGroups = kThreads / (D / 8);
  const int rg = threadIdx.x / (D / 8), lane8 = threadIdx.x % (D / 8);
  float acc[kG][8];
#pragma unroll
  for (int h = 0; h < kG; ++h)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[h][e] = 0.0f;
  if constexpr (kStaged) {
    uint4* stage = reinterpret_cast<uint4*>(smem + StageOffsetFloats(D, G, a.chunk));
    for (int32_t tv = 0; tv * kStageKeys < n; ++tv) {
      const uint4* tile = NextTile<D, true>(a, seq, lh, j0, n, tv, stage);
#pragma unroll
      for (int kl = rg; kl < kStageKeys; kl += kRowGroups) {
        const int32_t jl = tv * kStageKeys + kl;
        if (jl < n) {
          float vf[8];
          Bf16x8ToF32(tile[kl * (D / 8) + (lane8 ^ (kl & 7))], vf);
          AccumulateV<kG>(acc, vf, sc + jl, a.chunk, G);
        }
      }
    }
  } else {
    const Divisor bs(a.kv.layout.block_size);
    const int32_t* v_pages = seq.pages.v_pages + lh * seq.pages.stride;
    const int32_t tail = seq.pages.v_tail_start;
#pragma unroll 8  // several 16-byte loads in flight per thread
    for (int32_t jl = rg; jl < n; jl += kRowGroups) {
      const int32_t j = j0 + jl;
      float vf[8];
      LoadBf16x8(a.pool + a.kv.layout.RowOffset(v_pages[bs.Div(j - tail)], bs.Mod(j)) + lane8 * 8,
                 vf);
      AccumulateV<kG>(acc, vf, sc + jl, a.chunk, G);
    }
  }
  ReduceRowGroups<D, GT>(a, acc, G, sc, r, first_head, split);
}

// Staged K's shared memory holds pass 1 to 5 blocks per SM at 1024-key chunks (d 64, group 3)
// and 7 at 512, so it is given the registers of 6 (80).
template <int GT, KLoad kK>
constexpr int Pass1MinBlocks() {
  return (GT > 0 && GT <= 4) ? (kK == KLoad::kStaged ? 6 : 8) : 4;
}

template <int D, int GT, KLoad kK>
__global__ void __launch_bounds__(kThreads, Pass1MinBlocks<GT, kK>())
    SplitPass1Kernel(SplitArgs a) {
  SplitPass1<D, GT, kK>(a, blockIdx.x);
}

// Top-θ between the passes: global max, D_full and the keep threshold of (row r, head) from
// every split's pass-1 partials. Called by a whole warp (lanes stride over the splits);
// every lane gets the results.
__device__ __forceinline__ void WarpThreshold(const SplitArgs& a, int64_t r, int32_t t, int32_t L,
                                              int32_t head, float* m_out, float* d_out,
                                              float* thr_out) {
  const int lane = threadIdx.x & 31;
  const int32_t splits = (L + a.chunk - 1) / a.chunk;
  float m = -INFINITY;
  for (int s = lane; s < splits; s += 32) m = fmaxf(m, a.ws.part_m[PartIndex(a, r, head, s)]);
  m = WarpMax(m);
  float d_full = 0.0f;
  for (int s = lane; s < splits; s += 32) {
    const int64_t p = PartIndex(a, r, head, s);
    d_full += a.ws.part_l[p] * expf(a.ws.part_m[p] - m);
  }
  d_full = WarpSum(d_full);
  float thr = -1.0f;  // keeps everything: e > 0 > -1
  if (L > a.theta.k) {
    const float theta = a.theta.theta[int64_t(t) * a.kv.shape.num_heads + head];
    if (!isnan(theta)) thr = a.theta.post_softmax ? theta * d_full : expf(theta - m);
  }
  *m_out = m;
  *d_out = d_full;
  *thr_out = thr;
}

// A row whose 16-bit score lies within kNearSteps steps (1/2048 nat) of a threshold's is
// decided on its exact score instead (ExactScore): four times the encoding's worst error
// (half a step), so a decision never depends on the encoding, and the GPU keeps exactly the
// rows the f32 scores keep. Such rows are rare (a band of ±1/2048 nat around each threshold).
constexpr float kNearSteps = 2.0f;

// q_head · k_j · scale exactly as pass 1 computed it (same products, same order: per thread;
// staged, as two half rows, each in StagedPiece order, then added; per quad, as four quarter
// rows in QuadPiece order, added (p0 + p1) + (p2 + p3)). kr: the key's row, qr: the head's
// query. Out of line and rolled: pass 2 calls it for the rare rows near a threshold, and
// inlined at each of its call sites it cost the kernel registers, spills and code size.
template <int D, KLoad kK>
TS_NOINLINE __device__ float ExactScore(const uint16_t* kr, const float* qr, float scale) {
  if constexpr (kK == KLoad::kQuad) {
    float p[kQuad];
#pragma unroll 1
    for (int s = 0; s < kQuad; ++s) {
      float acc = 0.0f;
#pragma unroll 1
      for (int i = 0; i < D / 8 / kQuad; ++i) {
        const int c = QuadPiece(s, i) * 8;
        float kf[8];
        LoadBf16x8(kr + c, kf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc = fmaf(qr[c + e] * scale, kf[e], acc);
      }
      p[s] = acc;
    }
    return (p[0] + p[1]) + (p[2] + p[3]);
  }
  if constexpr (kK == KLoad::kStaged) {
    auto half_dot = [&](int h) {
      float acc = 0.0f;
#pragma unroll 1
      for (int s = 0; s < D / 16; ++s) {
        const int c = StagedPiece<D>(h, s);
        float kf[8];
        LoadBf16x8(kr + c * 8, kf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc = fmaf(qr[c * 8 + e] * scale, kf[e], acc);
      }
      return acc;
    };
    const float h0 = half_dot(0);
    return h0 + half_dot(1);
  }
  float acc = 0.0f;
#pragma unroll 1
  for (int c = 0; c < D; c += 8) {
    float kf[8];
    LoadBf16x8(kr + c, kf);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc = fmaf(qr[c + e] * scale, kf[e], acc);
  }
  return acc;
}

// ExactScore of position j (K row from the page tables) for query head `head` of token t.
template <int D, KLoad kK>
__device__ __forceinline__ float ExactScoreAt(const SplitArgs& a, const DevSeq& seq, int64_t lh,
                                              int32_t t, int32_t head, int32_t j) {
  const int32_t bs = a.kv.layout.block_size;
  const uint16_t* kr = a.pool + a.kv.layout.RowOffset(seq.pages.KPage(lh, j, bs), j % bs);
  return ExactScore<D, kK>(kr, a.q.data + int64_t(t) * a.q.stride + int64_t(head) * D,
                           a.kv.shape.scale);
}

// Tests (LaunchExactScores): ExactScore of every position j < L of row r for every query head,
// at out[(r · heads + head) · max_len + j]; NaN from L to max_len. Grid (rows, heads).
template <int D, KLoad kK>
__global__ void __launch_bounds__(kThreads)
    ExactScoresKernel(SplitArgs a, int32_t max_len, float* out) {
  const int64_t r = blockIdx.x;
  const int32_t head = blockIdx.y;
  const int32_t t = a.row_ids[r];
  const DevRow row = a.kv.rows[t];
  const DevSeq& seq = a.kv.seqs[row.seq];
  const int32_t G = a.kv.shape.num_heads / a.kv.shape.num_kv_heads;
  const int64_t lh = int64_t(a.kv.layer) * a.kv.shape.num_kv_heads + head / G;
  float* o = out + (r * a.kv.shape.num_heads + head) * max_len;
  for (int32_t j = threadIdx.x; j < max_len; j += blockDim.x) {
    o[j] = j <= row.pos ? ExactScoreAt<D, kK>(a, seq, lh, t, head, j) : NAN;
  }
}

// Pass 2's values for each query head of the block's group (shared memory; WarpThreshold).
template <int kG>
struct GroupStats {
  float m[kG];           // the row's max score
  float thr[kG];         // keep threshold on e = exp(s − m); < 0 keeps everything
  float log_thr[kG];     // LogThreshold(thr)
  float log_retain[kG];  // LogThreshold(retain_factor · thr)
  float inv_d[kG];       // 1 / D_full
};

// log of a keep threshold on e for the 16-bit score domain: −inf where it is negative (every
// row kept, e >= 0 > thr), NaN where it is 0 or NaN (decided on exact scores: e > 0 depends on
// whether e underflows).
__device__ __forceinline__ float LogThreshold(float thr) {
  return thr > 0.0f ? logf(thr) : thr < 0.0f ? -INFINITY : NAN;
}

// One head's keep test over the 16-bit scores of one split (RowKeep): with off = m_split − m,
// e > thr ⟺ q < keep and e > retain_factor · thr ⟺ q < strong.
struct ScoreBands {
  float off;     // m_split − m; e = exp(off − q / kScoreSteps)
  float keep;    // (off − log thr) · kScoreSteps (BandOf)
  float strong;  // the same for retain_factor · thr
};

// (off − log_t) · kScoreSteps, the score below which e passes the threshold, clamped to
// kSaturated: a saturated score (it only bounds e from above) is then within the near band
// wherever it might pass. Where log_t is −inf every row passes (kSaturated: all but the
// saturated ones surely), also in a split whose max is −inf (−inf − −inf would be NaN). NaN,
// every row decided on its exact scores, where off or log_t is NaN and where the threshold is
// so small that an e just above it could underflow (log_t < −87, where exp leaves the normal
// floats).
__device__ __forceinline__ float BandOf(float off, float log_t) {
  if (isnan(off) || !(log_t == -INFINITY || log_t >= -87.0f)) return NAN;
  const float at = log_t == -INFINITY ? INFINITY : (off - log_t) * kScoreSteps;
  return isnan(at) ? NAN : fminf(at, float(kSaturated));
}

__device__ __forceinline__ ScoreBands BandsOf(float off, float log_thr, float log_retain) {
  return ScoreBands{off, BandOf(off, log_thr), BandOf(off, log_retain)};
}

// Keep decisions of position j for each head of the group from its 16-bit scores q: bit h of
// the result is set where head h keeps j (e > thr), bit h of *strong where it keeps it by the
// retain factor (e > retain_factor · thr), and x[h] = s − m (e = exp(x[h])) where head h keeps
// j, NaN where it drops it. Decided in the score domain, on float compares against the bands
// (own: this block's split, in registers; a position of another split, a row of the sparse or
// host store or of a tail that starts in an earlier split, reads its split's max from the
// pass-1 partials), so a row costs no exp here: pass 2 takes the exps of the kept rows only,
// a lane per listed row. When any head's score is within kNearSteps of either band (NaN bands
// included), the row is decided on its exact scores instead.
template <int D, int kG, KLoad kK>
__device__ __forceinline__ unsigned RowKeep(const SplitArgs& a, const SplitBlock& b,
                                            const DevSeq& seq, const Divisor& chunk, int32_t G,
                                            int32_t j, const uint16_t (&q)[kG],
                                            const GroupStats<kG>& st,
                                            const ScoreBands (&own)[kG], float (&x)[kG],
                                            unsigned* strong) {
  const int32_t sj = chunk.Div(j);
  bool near = false;
  unsigned keep = 0, str = 0;
#pragma unroll
  for (int h = 0; h < kG; ++h) {
    x[h] = NAN;
    if (h < G) {
      const ScoreBands bd =
          sj == b.split ? own[h]
                        : BandsOf(a.ws.part_m[PartIndex(a, b.r, b.first_head + h, sj)] - st.m[h],
                                  st.log_thr[h], st.log_retain[h]);
      const float qf = float(q[h]);
      const float keep_by = bd.keep - qf, strong_by = bd.strong - qf;  // > 0: passes
      near |= !(fabsf(keep_by) > kNearSteps) || !(fabsf(strong_by) > kNearSteps);
      if (keep_by > 0.0f) {
        keep |= 1u << h;
        x[h] = bd.off - qf * (1.0f / kScoreSteps);
      }
      if (strong_by > 0.0f) str |= 1u << h;
    }
  }
  if (near) {
    keep = str = 0;
#pragma unroll
    for (int h = 0; h < kG; ++h) {
      if (h < G) {
        const float xe = ExactScoreAt<D, kK>(a, seq, b.lh, b.t, b.first_head + h, j) - st.m[h];
        const float e = expf(xe);
        const bool kept = e > st.thr[h];
        x[h] = kept ? xe : NAN;
        keep |= unsigned(kept) << h;
        str |= unsigned(e > a.theta.retain_factor * st.thr[h]) << h;
      }
    }
  }
  *strong = str;
  return keep;
}

// Pass 2's kept list names a V row by its index in the pool (page · block_size + slot), with
// this bit set for a row of the host pool (the offload policy). The CUDA backend keeps both
// pools under 2^31 rows.
constexpr uint32_t kHostRow = 0x80000000u;

// Rows of pass 2's loops one thread holds at a time: their scores are all loaded before any
// is tested, so a thread waits for memory once per batch, not once per row.
// Two for groups of more than 4 heads (their scores and exps held for 4 rows spilled).
template <int kG>
constexpr int kRowsPerBatch = kG <= 4 ? 4 : 2;

// First index of the sorted v[0, n) at or above x (n when none is).
__device__ __forceinline__ int32_t LowerBound(const int32_t* v, int32_t n, int32_t x) {
  int32_t lo = 0, hi = n;
  while (lo < hi) {
    const int32_t mid = (lo + hi) / 2;
    if (v[mid] < x) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// The stored V rows of one (sequence, layer, KV head), read from the sequence's tables once: the
// sparse store's and the host store's (positions sorted), and the dense tail's; each kind's
// row as its place in the pools (page · block_size + slot; kHostRow for the host pool's).
struct VStores {
  Divisor bs;
  const int32_t* v_pages;  // the tail's pages, from position v_tail_start
  int32_t v_tail_start;
  int32_t sparse_n, host_n;
  const int32_t *sparse_pos, *sparse_pages, *host_pos, *host_pages;

  __device__ VStores(const SplitArgs& a, const DevSeq& seq, int64_t lh)
      : bs(a.kv.layout.block_size),
        v_pages(seq.pages.v_pages ? seq.pages.v_pages + lh * seq.pages.stride : nullptr),
        v_tail_start(seq.pages.v_tail_start),
        sparse_n(seq.pages.SparseCount(lh)),
        host_n(seq.pages.HostCount(lh)),
        sparse_pos(sparse_n ? seq.pages.v_sparse_pos + lh * seq.pages.sparse_pos_stride : nullptr),
        sparse_pages(sparse_n ? seq.pages.v_sparse_pages + lh * seq.pages.sparse_stride : nullptr),
        host_pos(host_n ? seq.pages.v_host_pos + lh * seq.pages.host_pos_stride : nullptr),
        host_pages(host_n ? seq.pages.v_host_pages + lh * seq.pages.host_stride : nullptr) {}

  __device__ __forceinline__ uint32_t SparseRow(int32_t i) const {
    return uint32_t(sparse_pages[bs.Div(i)]) * uint32_t(bs.d) + uint32_t(bs.Mod(i));
  }
  __device__ __forceinline__ uint32_t HostRow(int32_t i) const {
    return (uint32_t(host_pages[bs.Div(i)]) * uint32_t(bs.d) + uint32_t(bs.Mod(i))) | kHostRow;
  }
  __device__ __forceinline__ uint32_t TailRow(int32_t j) const {  // position j >= v_tail_start
    return uint32_t(v_pages[bs.Div(j - v_tail_start)]) * uint32_t(bs.d) + uint32_t(bs.Mod(j));
  }
};

// The end of a Top-θ split (pass 2, one pass), after each warp listed its kept rows (list_row:
// pool rows, kHostRow for the host pool's; warp w's `listed` entries from w · seg on) and each
// lane summed D_kept (dk) and kept counts (kc) over its share of them: the warps' sums (added
// in warp order, every run alike) and the host rows read are published, then row groups of
// D/8 threads gather the listed V rows, several loads in flight, each weighted by
// weight(entry, head); then the split's partials (part_o, part_dk, part_n) and the counters:
// rows read, and positions retained (*retained, read after the block's barrier, or the rows
// read where null: stored rows are then the positions).
template <int D, int GT, typename Weight>
__device__ __forceinline__ void GatherListed(
    const SplitArgs& a, const SplitBlock& b, int32_t G, const uint32_t* list_row, int32_t seg,
    int32_t listed, const float (&dk)[GT > 0 ? GT : kMaxGroup],
    const float (&kc)[GT > 0 ? GT : kMaxGroup], unsigned host_kept,
    const unsigned long long* retained, Weight weight) {
  constexpr int kG = GT > 0 ? GT : kMaxGroup;
  constexpr int kWarps = kThreads / 32;
  extern __shared__ __align__(16) float smem[];
  __shared__ float s_dk[kWarps][kG], s_kc[kWarps][kG];  // per warp: summed in warp order
  __shared__ int s_kept[kWarps];                        // rows each warp listed
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int h = 0; h < kG; ++h) {
    if (h < G) {
      const float d = WarpSum(dk[h]), n = WarpSum(kc[h]);
      if (lane == 0) {
        s_dk[warp][h] = d;
        s_kc[warp][h] = n;
      }
    }
  }
  if (lane == 0) s_kept[warp] = listed;
  if (host_kept) atomicAdd(a.theta.counters + 3, (unsigned long long)host_kept);
  __syncthreads();
  constexpr int kRowGroups = kThreads / (D / 8);
  const int rg = threadIdx.x / (D / 8), lane8 = threadIdx.x % (D / 8);
  // List position k lives in warp w's segment, w = how many of p1 <= p2 <= p3 are <= k
  // (scalars, not an array: a dynamically indexed array would sit in local memory).
  static_assert(kWarps == 4, "the segment lookup below is written for four warps");
  const int p1 = s_kept[0], p2 = p1 + s_kept[1], p3 = p2 + s_kept[2];
  const int count = p3 + s_kept[3];
  float acc[kG][8];
#pragma unroll
  for (int h = 0; h < kG; ++h)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[h][e] = 0.0f;
#pragma unroll 8
  for (int k = rg; k < count; k += kRowGroups) {
    const int w = (k >= p1) + (k >= p2) + (k >= p3);
    const int before = k >= p3 ? p3 : k >= p2 ? p2 : k >= p1 ? p1 : 0;
    const int at = w * seg + (k - before);
    float vf[8];
    const uint32_t lr = list_row[at];
    const uint16_t* src = lr & kHostRow ? a.theta.host_pool + size_t(lr & ~kHostRow) * D
                                        : a.pool + size_t(lr) * D;
    LoadBf16x8(src + lane8 * 8, vf);
#pragma unroll
    for (int h = 0; h < kG; ++h) {
      if (h < G) {
        const float p = weight(at, h);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[h][e] = fmaf(p, vf[e], acc[h][e]);
      }
    }
  }
  ReduceRowGroups<D, GT>(a, acc, G, smem, b.r, b.first_head, b.split);  // syncs first
  if (threadIdx.x < G) {
    float d = 0.0f, n = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      d += s_dk[w][threadIdx.x];
      n += s_kc[w][threadIdx.x];
    }
    const int64_t p = PartIndex(a, b.r, b.first_head + threadIdx.x, b.split);
    a.ws.part_dk[p] = d;  // not part_l: other splits still read it (pass 2)
    a.ws.part_n[p] = n;
  }
  if (threadIdx.x == 0) {
    if (count) atomicAdd(a.theta.counters + 0, (unsigned long long)count);
    const unsigned long long kept = retained ? *retained : (unsigned long long)count;
    if (kept) atomicAdd(a.theta.counters + 2, kept);
  }
}

// Top-θ pass 2 over one split: positions [j0, j0 + chunk) for hit marks and the retained
// count, and stored V rows [i0, i0 + chunk) (sparse store first, then the host store, then the
// tail) for the gather of retained rows. kK: how pass 1 read K (ExactScore follows its order).
// One split's work; SplitPass2Kernel and SplitFusedKernel run it.
template <int D, int GT, KLoad kK>
__device__ __forceinline__ void SplitPass2(const SplitArgs& a, int32_t split_index) {
  constexpr int kG = GT > 0 ? GT : kMaxGroup;  // compile-time group size when known
  extern __shared__ __align__(16) float smem[];
  constexpr int kWarps = kThreads / 32;
  __shared__ GroupStats<kG> st;
  __shared__ ScoreBands s_own[kG];  // this split's bands (RowKeep)
  __shared__ unsigned long long s_retained;
  const int32_t G = GT > 0 ? GT : a.kv.shape.num_heads / a.kv.shape.num_kv_heads;
  const SplitBlock blk = ThisSplit(a, G, split_index);
  const auto& [r, t, row, L, split, j0, g, first_head, lh] = blk;
  if (j0 >= L) return;
  const DevSeq& seq = a.kv.seqs[row.seq];
  // Every split of the row computes the thresholds, a warp per head (a few partials per
  // split); split 0 keeps them for the final reduction.
  for (int h = threadIdx.x >> 5; h < G; h += blockDim.x >> 5) {
    float m, d_full, thr;
    WarpThreshold(a, r, t, L, first_head + h, &m, &d_full, &thr);
    if ((threadIdx.x & 31) == 0) {
      st.m[h] = m;
      st.thr[h] = thr;
      st.log_thr[h] = LogThreshold(thr);
      st.log_retain[h] = LogThreshold(a.theta.retain_factor * thr);
      st.inv_d[h] = 1.0f / d_full;
      s_own[h] = BandsOf(a.ws.part_m[PartIndex(a, r, first_head + h, split)] - m,
                         st.log_thr[h], st.log_retain[h]);
      if (split == 0) {
        float* stat = a.ws.row_stat + (r * a.kv.shape.num_heads + first_head + h) * 3;
        stat[0] = m;
        stat[1] = d_full;
        stat[2] = thr;
      }
    }
  }
  if (threadIdx.x == 0) {
    s_retained = 0;
  }
  __syncthreads();
  const uint16_t* srow0 = a.ws.scores + (r * a.kv.shape.num_heads + first_head) * a.ws.score_stride;
  const int64_t stride = a.ws.score_stride;
  const int lane = threadIdx.x & 31;
  const int32_t step = kRowsPerBatch<kG> * blockDim.x;
  const Divisor chunk(a.chunk);
  // RowKeep reads the bands for every row: from registers for groups of up to 4, from
  // shared memory for larger ones (8 heads' bands in registers spilled in the row loop).
  ScoreBands own_regs[kG <= 4 ? kG : 1];
  if constexpr (kG <= 4) {
#pragma unroll
    for (int h = 0; h < kG; ++h) own_regs[h] = h < G ? s_own[h] : ScoreBands{};
  }
  const ScoreBands(&own)[kG] = *[&] {
    if constexpr (kG <= 4) {
      return &own_regs;
    } else {
      return &s_own;
    }
  }();

  // Positions: any head of the group keeps j -> retained, and the hit mark. Without a
  // sparse store (tail at 0) stored rows are the positions, and the gather loop below does
  // this itself: the scores are read once.
  const int32_t tail = min(seq.pages.v_tail_start, L);
  // Marks and mass are recorded from position hits_begin on, at entry j - mark_from.
  const int32_t mark_from = seq.pages.hits_begin;
  int32_t* hits = seq.pages.hits ? seq.pages.hits + lh * seq.pages.hits_stride : nullptr;
  // Retained mass: Σ over the group's heads that keep j of its probability e/D_full.
  float* hit_mass = seq.pages.hit_mass ? seq.pages.hit_mass + lh * seq.pages.hits_stride : nullptr;
  if (tail > 0) {
    const int32_t n = min(a.chunk, L - j0);
    unsigned long long retained = 0;
    for (int32_t base = 0; base < n; base += step) {
      uint16_t q[kRowsPerBatch<kG>][kG];
#pragma unroll
      for (int b = 0; b < kRowsPerBatch<kG>; ++b) {
        const int32_t jl = base + b * int32_t(blockDim.x) + int32_t(threadIdx.x);
#pragma unroll
        for (int h = 0; h < kG; ++h) q[b][h] = h < G && jl < n ? srow0[h * stride + j0 + jl] : 0;
      }
#pragma unroll
      for (int b = 0; b < kRowsPerBatch<kG>; ++b) {
        const int32_t jl = base + b * int32_t(blockDim.x) + int32_t(threadIdx.x);
        if (jl >= n) continue;
        const int32_t j = j0 + jl;
        float x[kG];
        unsigned strong_heads;
        const unsigned kept =
            RowKeep<D, kG, kK>(a, blk, seq, chunk, G, j, q[b], st, own, x, &strong_heads);
        if (kept) {
          ++retained;
          if (j >= mark_from) {
            if (hits && strong_heads) atomicMax(hits + (j - mark_from), row.pos);
            if (hit_mass) {
              float mass = 0.0f;
#pragma unroll
              for (int h = 0; h < kG; ++h) {
                if (kept >> h & 1u) mass += expf(x[h]) * st.inv_d[h];
              }
              atomicAdd(hit_mass + (j - mark_from), mass);
            }
          }
        }
      }
    }
    if (retained) atomicAdd(&s_retained, retained);
  }

  // Stored V rows: the sparse store's rows below the tail, then the host store's (the offload
  // policy, read from host memory), then the tail.
  const VStores vs(a, seq, lh);
  const int32_t sparse_vis = LowerBound(vs.sparse_pos, vs.sparse_n, tail);
  const int32_t host_vis = LowerBound(vs.host_pos, vs.host_n, tail);
  const int32_t below = sparse_vis + host_vis;  // stored rows before the tail's
  const int32_t stored = below + (L - tail);
  const int32_t i0 = split * a.chunk;
  const int32_t ni = max(0, min(a.chunk, stored - i0));

  // Keep test over this split's stored rows, a thread per row: kept rows go to a compact list
  // in shared memory, each warp's to its own segment in row order, so every run sums the same
  // rows in the same order (no atomic decides a place); an entry holds the row's index i among
  // the stored rows (kStrongRow: a strong hit mark) and x = s − m per head (NaN: dropped)...
  const int warp = threadIdx.x >> 5;
  const int32_t seg = ListCapacity(a.chunk) / kWarps;        // the most rows a warp tests
  uint32_t* list_row = reinterpret_cast<uint32_t*>(smem);      // [kWarps, seg]
  float* list_e = smem + ListCapacity(a.chunk);                // [kWarps, seg, G]
  // Bit 31 of an entry: a strong mark until phase B below replaces the entry with the V row's
  // place, where the same bit is kHostRow (stored indices stay below 2^31, as pool rows do).
  constexpr uint32_t kStrongRow = 0x80000000u;
  int32_t listed = 0;  // this warp's rows so far (the same in every lane)
  for (int32_t base = 0; base < ni; base += step) {  // the same trips for every thread
    int32_t jb[kRowsPerBatch<kG>];
    uint16_t q[kRowsPerBatch<kG>][kG];
#pragma unroll
    for (int b = 0; b < kRowsPerBatch<kG>; ++b) {
      const int32_t il = base + b * int32_t(blockDim.x) + int32_t(threadIdx.x);
      const int32_t i = i0 + il;
      jb[b] = il >= ni          ? -1
              : i < sparse_vis ? vs.sparse_pos[i]
              : i < below      ? vs.host_pos[i - sparse_vis]
                               : tail + (i - below);
    }
#pragma unroll
    for (int b = 0; b < kRowsPerBatch<kG>; ++b) {
#pragma unroll
      for (int h = 0; h < kG; ++h) q[b][h] = h < G && jb[b] >= 0 ? srow0[h * stride + jb[b]] : 0;
    }
#pragma unroll
    for (int b = 0; b < kRowsPerBatch<kG>; ++b) {
      float x[kG];
      unsigned kept = 0, strong_heads = 0;
      if (jb[b] >= 0) {
        kept = RowKeep<D, kG, kK>(a, blk, seq, chunk, G, jb[b], q[b], st, own, x, &strong_heads);
      }
      const unsigned voted = __ballot_sync(0xffffffffu, kept != 0);
      const int k = warp * seg + listed + __popc(voted & ((1u << lane) - 1u));
      listed += __popc(voted);
      if (!kept) continue;
      const int32_t i = i0 + base + b * int32_t(blockDim.x) + int32_t(threadIdx.x);
      list_row[k] = uint32_t(i) | ((kept & strong_heads) ? kStrongRow : 0u);
#pragma unroll
      for (int h = 0; h < kG; ++h) {
        if (h < G) list_e[k * G + h] = x[h];
      }
    }
  }
  __syncwarp();

  // ...then each warp turns its entries into what the gather reads, a lane per listed row
  // (with ~20% of rows kept, a quarter of the passes a thread per row would take, each of
  // those with most lanes idle): e = exp(x) per head, and the V row's place in the pools
  // (kHostRow: the host store). Also the sums for D_kept and the kept count, and the hit marks.
  float dk[kG], kc[kG];
#pragma unroll
  for (int h = 0; h < kG; ++h) dk[h] = kc[h] = 0.0f;
  unsigned host_kept = 0;  // this thread's listed rows from the host store
  for (int32_t kl = lane; kl < listed; kl += 32) {
    const int k = warp * seg + kl;
    const uint32_t entry = list_row[k];
    const int32_t i = int32_t(entry & ~kStrongRow);
    host_kept += i >= sparse_vis && i < below;
    list_row[k] = i < sparse_vis ? vs.SparseRow(i)
                  : i < below    ? vs.HostRow(i - sparse_vis)
                                 : vs.TailRow(tail + (i - below));
    float mass = 0.0f;
#pragma unroll
    for (int h = 0; h < kG; ++h) {
      if (h < G) {
        const float xv = list_e[k * G + h];
        const bool kept = !isnan(xv);
        const float e = kept ? expf(xv) : 0.0f;
        list_e[k * G + h] = e;
        dk[h] += e;
        kc[h] += kept ? 1.0f : 0.0f;
        mass += e * st.inv_d[h];
      }
    }
    // Marks here only without a sparse store (then stored row i is position i); with one, the
    // positions loop above marked them.
    if (tail > 0 || i < mark_from) continue;
    if (hits && (entry & kStrongRow)) atomicMax(hits + (i - mark_from), row.pos);
    if (hit_mass) atomicAdd(hit_mass + (i - mark_from), mass);
  }

  // ...then the gather of the listed rows, weighted by e, and the split's partials.
  GatherListed<D, GT>(a, blk, G, list_row, seg, listed, dk, kc, host_kept,
                      tail > 0 ? &s_retained : nullptr,
                      [&](int at, int h) { return list_e[at * G + h]; });
}

template <int D, int GT, KLoad kK>
__global__ void __launch_bounds__(kThreads, (GT > 0 && GT <= 4) ? 8 : 4)
    SplitPass2Kernel(SplitArgs a) {
  SplitPass2<D, GT, kK>(a, blockIdx.x);
}

// Top-θ in one pass, for pre-softmax thresholds (SplitPlan::one_pass): keep ⇔ s > θ, which
// nothing else in the row decides, so a split scores its keys as pass 1 does, keeps the scores
// in shared memory, and gathers the V rows it keeps among the stored rows whose positions lie
// in it: K read once, V only where retained, no scores through DRAM and no second kernel.
// The partials are relative to the split's max (part_m; part_l its share of D_full), and
// ThetaCombineKernel<D, true> rescales them and forms D_full and the threshold for SDC. Hit
// marks as pass 2 sets them; the retained mass (hit_mass) needs D_full, so steps that record
// it take the two passes (CudaAttention::Prepare).
// Shared memory (OnePassAreaFloats): the queries [G, D]; e = exp(s − m_split) [G, chunk], 0
// where the head drops the key; flags [chunk], bit h where head h keeps the key and bit 8 + h
// where it does by the retain factor; the kept list's rows and keys, 2 × ListCapacity(chunk).
// Staged K's ring, after the scores, is dead before the flags are written.
template <int D, int GT, KLoad kK>
__device__ __forceinline__ void SplitOnePass(const SplitArgs& a, int32_t split_index) {
  constexpr int kG = GT > 0 ? GT : kMaxGroup;  // compile-time group size when known
  constexpr int kWarps = kThreads / 32;
  extern __shared__ __align__(16) float smem[];
  __shared__ float scratch[32];
  __shared__ unsigned long long s_retained;
  const int32_t G = GT > 0 ? GT : a.kv.shape.num_heads / a.kv.shape.num_kv_heads;
  const SplitBlock blk = ThisSplit(a, G, split_index);
  const auto& [r, t, row, L, split, j0, g, first_head, lh] = blk;
  if (j0 >= L) return;
  const DevSeq& seq = a.kv.seqs[row.seq];
  const int32_t n = min(a.chunk, L - j0);
  float* sc = smem + G * D;
  uint32_t* flags = reinterpret_cast<uint32_t*>(sc + G * a.chunk);
  if (threadIdx.x == 0) s_retained = 0;
  ScoreSplit<D, GT, kK>(a, t, first_head, seq, lh, j0, n, G);  // ends with a barrier

  // Per head: the split's max and Σe (its share of D_full), and the keep test on the f32
  // score, s > θ, as DESIGN.md §4 states it (the CPU and pass 2 test e > e^(θ − m), the same
  // but where e^(θ − m) leaves the normal floats, θ more than 87 below the row's max: there
  // they drop keys of weight 0 that this keeps, counts and marks differ, outputs do not). θ is
  // NaN in a dense row (L <= k, or a NaN in the table): every key is kept, as the reference's
  // threshold of −1 on e keeps it. retain_factor >= 1 (theta_options.cc).
  const float log_retain = logf(a.theta.retain_factor);
  for (int h = 0; h < G; ++h) {
    const float theta =
        L > a.theta.k ? a.theta.theta[int64_t(t) * a.kv.shape.num_heads + first_head + h] : NAN;
    const float keep_at = isnan(theta) ? -INFINITY : theta;
    const float strong_at = isnan(theta) ? -INFINITY : theta + log_retain;
    float m = -INFINITY;
    for (int jl = threadIdx.x; jl < n; jl += blockDim.x) m = fmaxf(m, sc[h * a.chunk + jl]);
    m = BlockMax(m, scratch);
    float l = 0.0f;
    for (int jl = threadIdx.x; jl < n; jl += blockDim.x) {  // the same keys per thread as below
      const float s = sc[h * a.chunk + jl];
      const float e = expf(s - m);
      l += e;
      const bool keep = s > keep_at;
      sc[h * a.chunk + jl] = keep ? e : 0.0f;
      const uint32_t f = uint32_t(keep) << h | uint32_t(s > strong_at) << (8 + h);
      flags[jl] = h == 0 ? f : flags[jl] | f;
    }
    l = BlockSum(l, scratch);
    if (threadIdx.x == 0) {
      a.ws.part_m[PartIndex(a, r, first_head + h, split)] = m;
      a.ws.part_l[PartIndex(a, r, first_head + h, split)] = l;
    }
  }

  // Positions (each thread its own keys' flags): retained by any head of the group, and the
  // hit mark where one keeps it by the retain factor (and keeps it).
  const int32_t mark_from = seq.pages.hits_begin;
  int32_t* hits = seq.pages.hits ? seq.pages.hits + lh * seq.pages.hits_stride : nullptr;
  unsigned retained_here = 0;
  for (int jl = threadIdx.x; jl < n; jl += blockDim.x) {
    const uint32_t f = flags[jl];
    if (!(f & 0xffu)) continue;
    ++retained_here;
    const int32_t j = j0 + jl;
    if (hits && (f >> 8 & f & 0xffu) && j >= mark_from) atomicMax(hits + (j - mark_from), row.pos);
  }
  if (retained_here) atomicAdd(&s_retained, (unsigned long long)retained_here);
  __syncthreads();  // every key's e and flags

  // The stored V rows whose positions lie in [j0, j0 + n): the sparse store's and the host
  // store's below the tail (each a run of its sorted positions), then the tail's.
  const int32_t tail = min(seq.pages.v_tail_start, L);
  const int32_t below_to = min(j0 + n, tail);  // stores hold positions [j0, below_to)
  const VStores vs(a, seq, lh);
  int32_t sa = 0, ns = 0, ha = 0, nh = 0;
  if (below_to > j0) {
    sa = LowerBound(vs.sparse_pos, vs.sparse_n, j0);
    ns = LowerBound(vs.sparse_pos, vs.sparse_n, below_to) - sa;
    ha = LowerBound(vs.host_pos, vs.host_n, j0);
    nh = LowerBound(vs.host_pos, vs.host_n, below_to) - ha;
  }
  const int32_t tail_from = max(j0, tail);
  const int32_t ni = ns + nh + max(0, j0 + n - tail_from);

  // Keep test over those rows, a thread per row: kept rows go to a compact list, each warp's
  // to its own segment in row order (list_row: the row's index among them; list_j: its key),
  // so every run sums the same rows in the same order...
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int32_t seg = ListCapacity(a.chunk) / kWarps;  // the most rows a warp tests
  uint32_t* list_row = flags + a.chunk;                // [kWarps, seg]
  int32_t* list_j = reinterpret_cast<int32_t*>(list_row + ListCapacity(a.chunk));
  int32_t listed = 0;  // this warp's rows so far (the same in every lane)
  for (int32_t base = 0; base < ni; base += blockDim.x) {  // the same trips for every thread
    const int32_t il = base + int32_t(threadIdx.x);
    int32_t jl = 0;
    bool kept = false;
    if (il < ni) {
      const int32_t j = il < ns        ? vs.sparse_pos[sa + il]
                        : il < ns + nh ? vs.host_pos[ha + (il - ns)]
                                       : tail_from + (il - ns - nh);
      jl = j - j0;
      kept = (flags[jl] & 0xffu) != 0;
    }
    const unsigned voted = __ballot_sync(0xffffffffu, kept);
    const int k = warp * seg + listed + __popc(voted & ((1u << lane) - 1u));
    listed += __popc(voted);
    if (kept) {
      list_row[k] = uint32_t(il);
      list_j[k] = jl;
    }
  }
  __syncwarp();

  // ...then each warp turns its entries into the V rows' places in the pools, a lane per
  // listed row (kHostRow: the host store), with the sums for D_kept and the kept count.
  float dk[kG], kc[kG];
#pragma unroll
  for (int h = 0; h < kG; ++h) dk[h] = kc[h] = 0.0f;
  unsigned host_kept = 0;  // this thread's listed rows from the host store
  for (int32_t kl = lane; kl < listed; kl += 32) {
    const int k = warp * seg + kl;
    const int32_t il = int32_t(list_row[k]), jl = list_j[k];
    host_kept += il >= ns && il < ns + nh;
    list_row[k] = il < ns        ? vs.SparseRow(sa + il)
                  : il < ns + nh ? vs.HostRow(ha + (il - ns))
                                 : vs.TailRow(j0 + jl);
    const uint32_t f = flags[jl];
#pragma unroll
    for (int h = 0; h < kG; ++h) {
      if (h < G) {
        dk[h] += sc[h * a.chunk + jl];
        kc[h] += float(f >> h & 1u);
      }
    }
  }

  // ...then the gather of the listed rows, weighted by e, and the split's partials.
  GatherListed<D, GT>(a, blk, G, list_row, seg, listed, dk, kc, host_kept, &s_retained,
                      [&](int at, int h) { return sc[h * a.chunk + list_j[at]]; });
}

template <int D, int GT, KLoad kK>
__global__ void __launch_bounds__(kThreads, Pass1MinBlocks<GT, kK>())
    SplitOnePassKernel(SplitArgs a) {
  SplitOnePass<D, GT, kK>(a, blockIdx.x);
}

// Top-θ's two passes in one launch (SplitPlan::fused): a (row, KV group) is one thread block
// cluster of gridDim.x blocks (at most 8), block b taking the row's splits b, b + gridDim.x, ...
// (the split kernels' chunks and shared memory: 8 blocks per SM as theirs, where a cluster
// holding a whole row's scores on chip ran 3 and lost, results.md). Pass 2 starts when
// cluster.sync() says every split's partials and 16-bit scores are written (the barrier orders
// the cluster's global writes before its reads) instead of at a kernel boundary: a row's scores
// are read back while they are likely still in L2, and clusters test and gather while others
// stream K, with no drain of the GPU between the passes. Every block reaches the barrier, also
// one whose splits lie past its row's end.
template <int D, int GT, KLoad kK>
__global__ void __launch_bounds__(kThreads, Pass1MinBlocks<GT, kK>())
    SplitFusedKernel(SplitArgs a) {
  // (The barriers between one split and the next are not needed by the passes as they are —
  // each first writes shared memory after a barrier that follows its last reads of it, and
  // the emulated tests pass without them — and keep a change to either end from racing.)
  for (int32_t split = blockIdx.x; split < a.ws.max_splits; split += gridDim.x) {
    if (split != int32_t(blockIdx.x)) __syncthreads();
    SplitPass1<D, GT, kK>(a, split);
  }
  cooperative_groups::this_cluster().sync();
  for (int32_t split = blockIdx.x; split < a.ws.max_splits; split += gridDim.x) {
    if (split != int32_t(blockIdx.x)) __syncthreads();
    SplitPass2<D, GT, kK>(a, split);
  }
}

// The reductions over splits: a block of kCombineWays · D threads per (row, query head); way w
// (threads [w·D, (w + 1)·D), a thread per output element) takes the splits w, w + kCombineWays,
// ..., and the ways' sums are added in way order, so every run adds in the same order. At
// batch 1 a row has ~170 splits (the plan aims at 4 blocks per SM), and one thread per element
// walking them all in turn waited for its loads ~43 times (the compiler unrolled the weighted
// loop 4 splits deep); now ~6 (43 splits per way, 8 deep).
constexpr int kCombineWays = 4;

template <int D>
__global__ void __launch_bounds__(kCombineWays * D) DenseCombineKernel(SplitArgs a) {
  const int64_t r = blockIdx.x;
  const int32_t head = blockIdx.y;
  const int way = threadIdx.x / D, e = threadIdx.x % D;
  const int32_t t = a.row_ids[r];
  const int32_t L = a.kv.rows[t].pos + 1;
  const int32_t splits = (L + a.chunk - 1) / a.chunk;
  __shared__ float s_m[kCombineWays], s_l[kCombineWays], s_o[kCombineWays][D];
  float m = -INFINITY;
  for (int s = way; s < splits; s += kCombineWays) {
    m = fmaxf(m, a.ws.part_m[PartIndex(a, r, head, s)]);
  }
  if (e == 0) s_m[way] = m;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kCombineWays; ++w) m = fmaxf(m, s_m[w]);
  float l = 0.0f, o = 0.0f;
#pragma unroll 8
  for (int s = way; s < splits; s += kCombineWays) {
    const int64_t p = PartIndex(a, r, head, s);
    const float w = expf(a.ws.part_m[p] - m);
    l += a.ws.part_l[p] * w;
    o += a.ws.part_o[p * D + e] * w;
  }
  s_o[way][e] = o;
  if (e == 0) s_l[way] = l;
  __syncthreads();
  if (way != 0) return;
  float sum_l = 0.0f, sum_o = 0.0f;
#pragma unroll
  for (int w = 0; w < kCombineWays; ++w) {
    sum_l += s_l[w];
    sum_o += s_o[w][e];
  }
  a.o[int64_t(t) * a.kv.shape.num_heads * D + int64_t(head) * D + e] = sum_o / sum_l;
}

// Top-θ reduction: Σ over splits of the gathered rows, then SDC and VMC.
// kOnePass: the partials of SplitOnePass, each relative to its split's max (part_m), are
// rescaled to the row's, which with D_full (from part_l) and the pre-softmax threshold
// e^(θ − m) is formed here; after pass 2 they are relative to the row's max already, and
// split 0 left m, D_full and the threshold in row_stat.
template <int D, bool kOnePass>
__global__ void __launch_bounds__(kCombineWays * D) ThetaCombineKernel(SplitArgs a) {
  const int64_t r = blockIdx.x;
  const int32_t head = blockIdx.y;
  const int way = threadIdx.x / D, e = threadIdx.x % D;
  const int32_t t = a.row_ids[r];
  const int32_t L = a.kv.rows[t].pos + 1;
  const int32_t splits = (L + a.chunk - 1) / a.chunk;
  __shared__ float s_m[kCombineWays], s_l[kCombineWays];
  __shared__ float s_dk[kCombineWays], s_n[kCombineWays], s_o[kCombineWays][D];
  float m = 0.0f;  // one pass: the row's max
  if constexpr (kOnePass) {
    float mw = -INFINITY;
    for (int s = way; s < splits; s += kCombineWays) {
      mw = fmaxf(mw, a.ws.part_m[PartIndex(a, r, head, s)]);
    }
    if (e == 0) s_m[way] = mw;
    __syncthreads();
    m = s_m[0];
#pragma unroll
    for (int w = 1; w < kCombineWays; ++w) m = fmaxf(m, s_m[w]);
  }
  float o = 0.0f, d_kept = 0.0f, kept = 0.0f, d_full = 0.0f;
#pragma unroll 8
  for (int s = way; s < splits; s += kCombineWays) {
    const int64_t p = PartIndex(a, r, head, s);
    if constexpr (kOnePass) {
      const float w = expf(a.ws.part_m[p] - m);
      o += a.ws.part_o[p * D + e] * w;
      d_kept += a.ws.part_dk[p] * w;
      d_full += a.ws.part_l[p] * w;
    } else {
      o += a.ws.part_o[p * D + e];
      d_kept += a.ws.part_dk[p];
    }
    kept += a.ws.part_n[p];
  }
  s_o[way][e] = o;
  if (e == 0) {
    s_dk[way] = d_kept;
    s_n[way] = kept;
    s_l[way] = d_full;
  }
  __syncthreads();
  if (way != 0) return;
  o = d_kept = kept = d_full = 0.0f;
#pragma unroll
  for (int w = 0; w < kCombineWays; ++w) {
    o += s_o[w][e];
    d_kept += s_dk[w];
    kept += s_n[w];
    d_full += s_l[w];
  }
  float thr;
  if constexpr (kOnePass) {
    const float theta =
        L > a.theta.k ? a.theta.theta[int64_t(t) * a.kv.shape.num_heads + head] : NAN;
    thr = isnan(theta) ? -1.0f : expf(theta - m);  // as WarpThreshold's, pre-softmax
  } else {
    const float* st = a.ws.row_stat + (r * a.kv.shape.num_heads + head) * 3;
    d_full = st[1];
    thr = st[2];
  }
  const float denom =
      SdcDenominator(a.theta.sdc, d_kept, d_full, kept, L, thr,
                     a.theta.sdc_ratio, int64_t(t) * a.kv.shape.num_heads + head);
  const int32_t G = a.kv.shape.num_heads / a.kv.shape.num_kv_heads;
  const bool has_sum = a.kv.seqs[a.kv.rows[t].seq].pages.v_sum != nullptr;
  const float* vsum = a.theta.vsum_rows && a.theta.vmc && has_sum
                          ? a.theta.vsum_rows + int64_t(t) * a.kv.shape.num_kv_heads * D +
                                int64_t(head / G) * D
                          : nullptr;
  const float inv_L = 1.0f / float(L);
  float out = 0.0f;
  if (denom > 0) {
    out = o * (1.0f / denom);
    if (vsum) {
      const float missing = fmaxf(0.0f, 1.0f - d_kept / denom);
      if (missing > 0) out = fmaf(missing * inv_L, vsum[e], out);
    }
  } else if (vsum) {
    out = vsum[e] * inv_L;
  }
  a.o[int64_t(t) * a.kv.shape.num_heads * D + int64_t(head) * D + e] = out;
  if (e == 0) atomicAdd(a.theta.counters + 1, (unsigned long long)(kept));
}

template <int D>
void LaunchExactScoresOf(KLoad k, dim3 grid, const SplitArgs& a, int32_t max_len, float* out,
                         cudaStream_t stream) {
  constexpr KLoad kThread = KLoad::kPerThread, kStaged = KLoad::kStaged, kQuadK = KLoad::kQuad;
  if constexpr (CanStage(D)) {
    if (k == kStaged) ExactScoresKernel<D, kStaged><<<grid, kThreads, 0, stream>>>(a, max_len, out);
    if (k == kQuadK) ExactScoresKernel<D, kQuadK><<<grid, kThreads, 0, stream>>>(a, max_len, out);
  }
  if (!CanStage(D) || k == kThread) {
    ExactScoresKernel<D, kThread><<<grid, kThreads, 0, stream>>>(a, max_len, out);
  }
}

// Dynamic shared memory of pass 1 (staged or not) and pass 2, or of the one-pass kernel.
size_t SplitSmemBytes(int D, int G, int chunk, bool staged, bool one_pass = false) {
  const size_t area =
      size_t(one_pass ? OnePassAreaFloats(D, G, chunk) : SplitAreaFloats(D, G, chunk)) *
      sizeof(float);
  if (!staged) return area;
  return std::max(area, size_t(StageOffsetFloats(D, G, chunk)) * sizeof(float) + StageBytes(D));
}
// Without the opt-in attribute a kernel's static and dynamic shared memory together stay within
// 48 KB; the split kernels' static arrays take under 0.7 KB (pass 2's per-head values, bands
// and per-warp sums at group 8: 544 bytes, ptxas; the fused kernel's 672), and the plan keeps
// dynamic memory 1 KB below the limit.
constexpr size_t kMaxSmem = (48 << 10) - 1024;
// Launches SplitFusedKernel: a cluster of up to kMaxClusterBlocks blocks per (row, KV group).
template <int D, int GT, KLoad kK>
cudaError_t LaunchFused(const SplitArgs& a, dim3 grid, size_t smem, cudaStream_t stream) {
  grid.x = std::min<unsigned>(grid.x, kMaxClusterBlocks);
  cudaLaunchAttribute cluster = {};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = grid.x;  // the row's blocks
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, SplitFusedKernel<D, GT, kK>, a);
}

template <int D, int GT>
cudaError_t RunSplit(const SplitArgs& a, int32_t num_rows, const SplitPlan& plan,
                     cudaStream_t stream) {
  const int32_t G = a.kv.shape.num_heads / a.kv.shape.num_kv_heads;
  const dim3 grid(plan.max_splits, num_rows, a.kv.shape.num_kv_heads);
  const size_t pass2_smem = SplitSmemBytes(D, G, plan.chunk, false);
  const KLoad k_load = CanStage(D) ? plan.k_load : KLoad::kPerThread;
  const size_t pass1_smem = SplitSmemBytes(D, G, plan.chunk, k_load == KLoad::kStaged);
  const int32_t limit = plan.kernel_limit > 0 ? plan.kernel_limit : 3;
  const bool one_pass = a.top_theta && plan.one_pass;
  if (one_pass && a.theta.post_softmax) return cudaErrorInvalidValue;  // a probability is no score
  cudaError_t launched = cudaSuccess;
  auto run = [&](auto k) {
    constexpr KLoad kK = decltype(k)::value;
    if (a.top_theta && plan.fused) {
      launched = LaunchFused<D, GT, kK>(a, grid, std::max(pass1_smem, pass2_smem), stream);
      return;
    }
    if (one_pass) {
      const size_t smem = SplitSmemBytes(D, G, plan.chunk, kK == KLoad::kStaged, true);
      SplitOnePassKernel<D, GT, kK><<<grid, kThreads, smem, stream>>>(a);
      return;
    }
    SplitPass1Kernel<D, GT, kK><<<grid, kThreads, pass1_smem, stream>>>(a);
    if (a.top_theta && limit >= 2) {
      SplitPass2Kernel<D, GT, kK><<<grid, kThreads, pass2_smem, stream>>>(a);
    }
  };
  if constexpr (CanStage(D)) {
    if (k_load == KLoad::kStaged) run(std::integral_constant<KLoad, KLoad::kStaged>{});
    if (k_load == KLoad::kQuad) run(std::integral_constant<KLoad, KLoad::kQuad>{});
  }
  if (k_load == KLoad::kPerThread) run(std::integral_constant<KLoad, KLoad::kPerThread>{});
  if (launched != cudaSuccess) {
    cudaGetLastError();  // returned here: not left to fail the next launch's check
    return launched;
  }
  if (limit <= (a.top_theta && !plan.fused && !one_pass ? 2 : 1)) return cudaGetLastError();
  const dim3 combine(num_rows, a.kv.shape.num_heads);
  if (one_pass) {
    ThetaCombineKernel<D, true><<<combine, kCombineWays * D, 0, stream>>>(a);
  } else if (a.top_theta) {
    ThetaCombineKernel<D, false><<<combine, kCombineWays * D, 0, stream>>>(a);
  } else {
    DenseCombineKernel<D><<<combine, kCombineWays * D, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <int D>
cudaError_t DispatchGroup(int group, const SplitArgs& a, int32_t num_rows, const SplitPlan& plan,
                          cudaStream_t stream) {
  switch (group) {
    case 1: return RunSplit<D, 1>(a, num_rows, plan, stream);
    case 2: return RunSplit<D, 2>(a, num_rows, plan, stream);
    case 3: return RunSplit<D, 3>(a, num_rows, plan, stream);
    case 4: return RunSplit<D, 4>(a, num_rows, plan, stream);
    case 5: return RunSplit<D, 5>(a, num_rows, plan, stream);
    case 6: return RunSplit<D, 6>(a, num_rows, plan, stream);
    case 7: return RunSplit<D, 7>(a, num_rows, plan, stream);
    case 8: return RunSplit<D, 8>(a, num_rows, plan, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

void WarnUnknownKnob(const char* var, const char* value, const char* known) {
  static std::mutex mu;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mu);
  if (!said.insert(std::string(var) + "=" + value).second) return;
  std::fprintf(stderr, "cuda: %s=%s is none of %s; using the default\n", var, value, known);
}

KLoad DefaultKLoad() {
  const char* v = std::getenv("THETASERVE_ATTN_K_LOAD");
  const std::string name = v ? v : "";
  if (name == "staged") return KLoad::kStaged;
  if (name == "quad") return KLoad::kQuad;
  if (name == "thread") return KLoad::kPerThread;
  if (!name.empty() && name != "auto") {
    WarnUnknownKnob("THETASERVE_ATTN_K_LOAD", name.c_str(), "thread|staged|quad|auto");
  }
  return KLoad::kAuto;
}

const char* KLoadName(KLoad k) {
  switch (k) {
    case KLoad::kStaged: return "staged";
    case KLoad::kQuad: return "quad";
    case KLoad::kAuto: return "auto";
    default: return "thread";
  }
}

ThetaPasses DefaultThetaPasses() {
  const char* v = std::getenv("THETASERVE_ATTN_THETA");
  const std::string name = v ? v : "";
  if (name == "fused") return ThetaPasses::kFused;
  if (name == "split") return ThetaPasses::kSplit;
  if (!name.empty() && name != "auto") {
    WarnUnknownKnob("THETASERVE_ATTN_THETA", name.c_str(), "split|fused|auto");
  }
  return ThetaPasses::kAuto;
}

SplitPlan PlanSplits(int64_t num_rows, const AttnShape& shape, int64_t max_len, int num_sms,
                     KLoad k_load, ThetaPasses passes) {
  SplitPlan plan;
  // THETASERVE_ATTN_CHUNK (below) makes attention batch-invariant; kAuto then reads K per
  // thread whatever the batch, as the ways add a score's products in different orders.
  const char* fixed_chunk = std::getenv("THETASERVE_ATTN_CHUNK");
  if (k_load == KLoad::kAuto) {
    k_load = !fixed_chunk && num_rows * max_len >= kStagedFromKeys ? KLoad::kStaged
                                                                    : KLoad::kPerThread;
  }
  plan.k_load = CanStage(shape.head_dim) ? k_load : KLoad::kPerThread;
  plan.fused = passes == ThetaPasses::kFused;
  plan.one_pass = passes == ThetaPasses::kOnePass;
  const int64_t units = std::max<int64_t>(1, num_rows * shape.num_kv_heads);
  // About four blocks per multiprocessor (THETASERVE_ATTN_BLOCKS_PER_SM changes it, for
  // measuring); chunks of 64..1024 keys.
  static const int64_t per_sm = [] {
    const char* v = std::getenv("THETASERVE_ATTN_BLOCKS_PER_SM");
    return v ? std::clamp<int64_t>(std::atoll(v), 1, 64) : int64_t(4);
  }();
  const int64_t want_splits = std::max<int64_t>(1, (per_sm * int64_t(num_sms) + units - 1) / units);
  int64_t chunk = (max_len + want_splits - 1) / want_splits;
  chunk = std::clamp<int64_t>((chunk + 63) / 64 * 64, 64, 1024);
  // The chunk follows the batch, so a row's reduction order (and the last bits of its output)
  // depends on what else runs with it. THETASERVE_ATTN_CHUNK fixes it (a multiple of 64, at
  // most 1024; for tests: a small chunk on long rows makes many splits and a large part_o):
  // attention then does not depend on the batch (kAuto reads K per thread then, above; the
  // GEMMs still may: cuBLAS picks kernels by shape).
  if (fixed_chunk) chunk = std::clamp<int64_t>(std::atoll(fixed_chunk) / 64 * 64, 64, 1024);
  // Pass 1's shared memory (scores of the chunk, and staged K) within 48 KB: a smaller chunk
  // only adds splits. Staged K at d 128 takes chunks of at most 896 (group 4) or 384 (8).
  const int group = shape.num_heads / shape.num_kv_heads;
  while (chunk > 64 && SplitSmemBytes(shape.head_dim, group, int(chunk),
                                      plan.k_load == KLoad::kStaged, plan.one_pass) > kMaxSmem) {
    chunk -= 64;
  }
  plan.chunk = static_cast<int32_t>(chunk);
  plan.max_splits = static_cast<int32_t>(std::max<int64_t>(1, (max_len + chunk - 1) / chunk));
  return plan;
}

cudaError_t LaunchSplitAttention(const int32_t* row_ids, int32_t num_rows, const DevKv& kv,
                                 const bf16* pool, const DevQueries& q, const SplitPlan& plan,
                                 const AttentionWorkspace& ws, const ThetaArgs* theta, float* o,
                                 cudaStream_t stream) {
  if (num_rows == 0) return cudaSuccess;
  const AttnShape& shape = kv.shape;
  if (shape.num_heads / shape.num_kv_heads > kMaxGroup) return cudaErrorInvalidValue;
  if (plan.k_load == KLoad::kAuto) return cudaErrorInvalidValue;  // PlanSplits resolves it
  SplitArgs a{row_ids, kv, pool, q, plan.chunk, ws, theta ? *theta : ThetaArgs{},
              theta != nullptr, o};
  // Group sizes are compile-time for the common head sizes (registers: the accumulators are
  // [group][8]); 16 and 32 (test models) take the generic kernels.
  const int group = shape.num_heads / shape.num_kv_heads;
  switch (shape.head_dim) {
    case 16: return RunSplit<16, 0>(a, num_rows, plan, stream);
    case 32: return RunSplit<32, 0>(a, num_rows, plan, stream);
    case 64: return DispatchGroup<64>(group, a, num_rows, plan, stream);
    case 128: return DispatchGroup<128>(group, a, num_rows, plan, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchExactScores(const int32_t* row_ids, int32_t num_rows, const DevKv& kv,
                              const bf16* pool, const DevQueries& q, KLoad k_load,
                              int32_t max_len, float* out, cudaStream_t stream) {
  if (num_rows == 0) return cudaSuccess;
  if (num_rows > 65535 || max_len < 1 || k_load == KLoad::kAuto) return cudaErrorInvalidValue;
  const AttnShape& shape = kv.shape;
  SplitArgs a{row_ids, kv, pool, q, 0, {}, {}, true, nullptr};
  const dim3 grid(num_rows, shape.num_heads);
  switch (shape.head_dim) {
    case 16: LaunchExactScoresOf<16>(KLoad::kPerThread, grid, a, max_len, out, stream); break;
    case 32: LaunchExactScoresOf<32>(KLoad::kPerThread, grid, a, max_len, out, stream); break;
    case 64: LaunchExactScoresOf<64>(k_load, grid, a, max_len, out, stream); break;
    case 128: LaunchExactScoresOf<128>(k_load, grid, a, max_len, out, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace thetaserve::kernels::cuda
