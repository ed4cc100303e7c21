// What the tiled prefill kernels share (prefill.cu's dense kernels, prefill_theta.cu's Top-θ
// kernel): their arguments, the block's tile of query rows, and the bf16 splits that keep
// tensor-core products at f32 accuracy.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace thetaserve::kernels::cuda {

// The tensor-core kernels: query rows per block (4 warps × 16), keys per tile.
constexpr int kMmaRows = 64;
constexpr int kMmaKeys = 64;
template <int D>
constexpr int kMmaLdk = D + 8;  // K, V (and Q) rows in shared memory, bf16

struct PrefillArgs {
  const PrefillTile* tiles;
  DevKv kv;
  const uint16_t* pool;
  DevQueries q;
  float* o;
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

}  // namespace thetaserve::kernels::cuda
