// What the tiled prefill kernels share (prefill.cu's dense kernels, prefill_theta.cu's Top-θ
// kernel): their arguments, the block's tile of query rows, the copies of key rows into shared
// memory, the online softmax's step, and the bf16 splits that keep tensor-core products at f32
// accuracy.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_pipeline.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/warp_mma.cuh"

namespace thetaserve::kernels::cuda {

// The tensor-core kernels: query rows per block (4 warps × 16), keys per tile.
constexpr int kMmaRows = 64;
constexpr int kMmaKeys = 64;
template <int D>
constexpr int kMmaLdk = D + 8;  // K, V (and Q) rows in shared memory, bf16

struct PrefillArgs {
  const PrefillTile* tiles;  // [num_tiles]: a block's tile is tiles[blockIdx.x]
  DevKv kv;
  const uint16_t* pool;      // [num_pages, block_size, head_dim] bf16 (kv.layout)
  DevQueries q;
  float* o;                  // [T, num_heads·head_dim], by token
  ThetaArgs theta;  // Top-θ's (prefill_theta.cu); the dense kernels do not read it
};

// What a prefill block works on: its tile of query rows, rr = token × G + head within the
// tile (token tok0 + rr / G of the sequence, query head kv_head · G + rr % G), and the keys of
// their KV head.
struct PrefillBlock {
  const PrefillTile tile;
  const DevSeq& seq;
  const int32_t G, kv_head, rows;
  const int64_t lh;                  // the (layer, KV head) page tables' row
  const int32_t first_pos, last_pos;  // positions of the tile's first and last tokens
  __device__ explicit PrefillBlock(const PrefillArgs& a)
      : tile(a.tiles[blockIdx.x]),
        seq(a.kv.seqs[tile.seq]),
        G(a.kv.shape.num_heads / a.kv.shape.num_kv_heads),
        kv_head(int32_t(blockIdx.y)),
        rows(tile.ntok * G),
        lh(int64_t(a.kv.layer) * a.kv.shape.num_kv_heads + kv_head),
        first_pos(seq.start_pos + tile.tok0),
        last_pos(first_pos + tile.ntok - 1) {}
  __device__ __forceinline__ int64_t Token(int rr) const {
    return seq.token_offset + tile.tok0 + rr / G;
  }
  __device__ __forceinline__ int32_t Pos(int rr) const { return first_pos + rr / G; }
  __device__ __forceinline__ int64_t Head(int rr) const { return int64_t(kv_head * G + rr % G); }
  // Element c of row rr's query times `scale`; 0 past the tile's rows.
  __device__ __forceinline__ float Query(const PrefillArgs& a, int rr, int c, int d,
                                         float scale) const {
    return rr < rows ? a.q.data[Token(rr) * a.q.stride + Head(rr) * d + c] * scale : 0.0f;
  }
  // The page tables of the block's KV head: K's, and V's tail (from seq.pages.v_tail_start).
  __device__ __forceinline__ const int32_t* KPages() const {
    return seq.pages.k_pages + lh * seq.pages.stride;
  }
  __device__ __forceinline__ const int32_t* VPages() const {
    return seq.pages.v_pages + lh * seq.pages.stride;
  }
  // Row rr's output (d floats).
  __device__ __forceinline__ float* Out(const PrefillArgs& a, int rr, int d) const {
    return a.o + Token(rr) * int64_t(a.kv.shape.num_heads) * d + Head(rr) * d;
  }
};

// Starts the copies of the block's key rows [j0, j0 + kMmaKeys) into dst (rows ldk elements
// apart; zeros past last_pos) as one cp.async group: row j from page pages[(j − first) / bs]
// (K's table from 0, V's tail from its first position). A thread takes one 16-byte piece of a
// row in each pass of 128 / (D / 8) rows.
template <int D>
__device__ __forceinline__ void CopyKeyRows(const PrefillArgs& a, const PrefillBlock& blk,
                                            const Divisor& bs, uint16_t* dst, int ldk,
                                            const int32_t* pages, int32_t first, int32_t j0) {
  constexpr int kPieces = D / 8, kRowsPerPass = 128 / kPieces;
  const int c = int(threadIdx.x) % kPieces * 8;
#pragma unroll
  for (int pass = 0; pass < kMmaKeys / kRowsPerPass; ++pass) {
    const int jj = int(threadIdx.x) / kPieces + pass * kRowsPerPass;
    const int32_t j = j0 + jj;
    if (j <= blk.last_pos) {
      const uint16_t* src =
          a.pool + a.kv.layout.RowOffset(pages[bs.Div(j - first)], bs.Mod(j)) + c;
      __pipeline_memcpy_async(dst + jj * ldk + c, src, 16);
    } else {  // zeros, not what the tile held (Q's parts first): 0 · NaN is no zero
      *reinterpret_cast<uint4*>(dst + jj * ldk + c) = make_uint4(0, 0, 0, 0);
    }
  }
  __pipeline_commit();
}

// An mma lane's two query rows (r0 = warp · 16 + g and r1 = r0 + 8; a row sees keys up to its
// position pos, none if not live) and its online softmax's state for each: the max m over the
// keys seen (base 2) and this lane's part l of the sum of e.
struct LaneRows {
  bool live0, live1;
  int32_t pos0, pos1;
  float m0 = -INFINITY, m1 = -INFINITY;
  float l0 = 0.0f, l1 = 0.0f;
};

// One key tile's step of the online softmax, in base 2, for a lane's two rows (s[n][e]: row
// r0's key j0 + 8n + 2t + e; s[n][2 + e]: row r1's): the rows' maxima over the keys seen (the
// quad agreeing), this lane's part of their sums rescaled and added to. With kWriteP, s becomes
// the e of each key (0 where the row does not see it), P for P·V. Returns the rescale factors
// of r0 and r1 (1 while a row has seen no key).
template <bool kWriteP>
__device__ __forceinline__ float2 OnlineSoftmaxStep(float (&s)[kMmaKeys / 8][4], int32_t j0,
                                                    int t, LaneRows& rows) {
  const bool live0 = rows.live0, live1 = rows.live1;
  const int32_t pos0 = rows.pos0, pos1 = rows.pos1;
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int n = 0; n < kMmaKeys / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int32_t j = j0 + 8 * n + 2 * t + e;
      if (live0 && j <= pos0) mx0 = fmaxf(mx0, s[n][e]);
      if (live1 && j <= pos1) mx1 = fmaxf(mx1, s[n][2 + e]);
    }
  }
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
  }
  const float mn0 = fmaxf(rows.m0, mx0), mn1 = fmaxf(rows.m1, mx1);
  const float alpha0 = mn0 == -INFINITY ? 1.0f : exp2f(rows.m0 - mn0);  // 0 on a row's first keys
  const float alpha1 = mn1 == -INFINITY ? 1.0f : exp2f(rows.m1 - mn1);
  float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
  for (int n = 0; n < kMmaKeys / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int32_t j = j0 + 8 * n + 2 * t + e;
      const float e0 = live0 && j <= pos0 ? exp2f(s[n][e] - mn0) : 0.0f;
      const float e1 = live1 && j <= pos1 ? exp2f(s[n][2 + e] - mn1) : 0.0f;
      if constexpr (kWriteP) {
        s[n][e] = e0;
        s[n][2 + e] = e1;
      }
      sum0 += e0;
      sum1 += e1;
    }
  }
  rows.l0 = rows.l0 * alpha0 + sum0;
  rows.l1 = rows.l1 * alpha1 + sum1;
  rows.m0 = mn0;
  rows.m1 = mn1;
  return make_float2(alpha0, alpha1);
}

// x as bf16 halves: hi = bf16(x), lo = bf16(x − hi); hi + lo is within ~2^-16 of x.
__device__ __forceinline__ void SplitBf16(float x, uint16_t& hi, uint16_t& lo) {
  hi = F32ToBf16(x);
  lo = F32ToBf16(x - Bf16ToF32(hi));
}

// Two values as bf16 halves, packed as a fragment register holds them (x0 in the low bits):
// hi = bf16(x), lo = bf16(x − hi).
__device__ __forceinline__ void SplitBf16Pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  uint16_t h0, h1, l0, l1;
  SplitBf16(x0, h0, l0);
  SplitBf16(x1, h1, l1);
  hi = h0 | uint32_t(h1) << 16;
  lo = l0 | uint32_t(l1) << 16;
}

// The block's kMmaRows query rows times `scale` as bf16 halves (SplitBf16), hi in `hi` and
// lo in `lo` (rows ld elements apart), where the tensor-core kernels load their A fragments.
template <int D>
__device__ void StageQueryHalves(const PrefillArgs& a, const PrefillBlock& blk, float scale,
                                 uint16_t* hi, uint16_t* lo, int ld) {
  for (int i = threadIdx.x; i < kMmaRows * D; i += blockDim.x) {
    const int rr = i / D, c = i % D;
    SplitBf16(blk.Query(a, rr, c, D, scale), hi[rr * ld + c], lo[rr * ld + c]);
  }
}

// O += P·V over keys [16kk, 16kk + 16) of a kMmaKeys-key tile (the mma kernels' step): key
// tiles 2kk and 2kk + 1 of P (the lane's S accumulators, s[n][e] row g's key 8n + 2t + e,
// s[n][2 + e] row g + 8's) are the A fragment, in bf16 halves; V's rows (shared memory, ldk
// elements apart) read transposed are B, one ldmatrix .x4 giving both key halves (matrix & 1)
// of two output tiles (matrix >> 1).
template <int D>
__device__ __forceinline__ void AddPVStep(float (&o)[D / 8][4], const float (&s)[kMmaKeys / 8][4],
                                          int kk, const uint16_t* vs, int ldk, int lane) {
  const int mat = lane >> 3, mat_row = lane & 7;
  uint32_t p_hi[4], p_lo[4];
  SplitBf16Pair(s[2 * kk][0], s[2 * kk][1], p_hi[0], p_lo[0]);
  SplitBf16Pair(s[2 * kk][2], s[2 * kk][3], p_hi[1], p_lo[1]);
  SplitBf16Pair(s[2 * kk + 1][0], s[2 * kk + 1][1], p_hi[2], p_lo[2]);
  SplitBf16Pair(s[2 * kk + 1][2], s[2 * kk + 1][3], p_hi[3], p_lo[3]);
  const uint16_t* v_rows = vs + (kk * 16 + (mat & 1) * 8 + mat_row) * ldk + (mat >> 1) * 8;
#pragma unroll
  for (int n = 0; n < D / 8; n += 2) {
    uint32_t vb[4];
    LdMatrixX4Trans(vb, v_rows + n * 8);
    MmaBf16M16N8K16(o[n], p_hi, vb[0], vb[1]);
    MmaBf16M16N8K16(o[n], p_lo, vb[0], vb[1]);
    MmaBf16M16N8K16(o[n + 1], p_hi, vb[2], vb[3]);
    MmaBf16M16N8K16(o[n + 1], p_lo, vb[2], vb[3]);
  }
}

}  // namespace thetaserve::kernels::cuda
