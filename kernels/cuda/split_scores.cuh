// How a split reads K and forms its scores (per thread, per quad of threads, or staged
// through shared memory by cp.async), and the exact score of one key in the order each way
// adds its products (ExactScore), which Top-θ's keep test falls back on near a threshold.
#pragma once

#include <cuda_pipeline.h>

#include "kernels/cuda/split_block.cuh"

namespace thetaserve::kernels::cuda {

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

// The split's queries (scaled) into smem [G, D] (the kernel's dynamic shared memory) and their scores of keys [j0, j0 + n) into
// smem + G·D, [G, chunk], read from K the way kK says (staged: through the ring after the
// scores); ends with a barrier.
template <int D, int GT, KLoad kK>
__device__ __forceinline__ void ScoreSplit(const SplitArgs& a, int32_t t, int32_t first_head,
                                           const DevSeq& seq, int64_t lh, int32_t j0, int32_t n,
                                           int32_t G, float* smem) {
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

}  // namespace thetaserve::kernels::cuda
