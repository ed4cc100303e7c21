// Top-θ causal prefill attention on the GPU (DESIGN.md §5): a block takes one tile of a prompt
// chunk's query rows (token × head of one KV group, 64 rows, as prefill.cu's mma kernel does)
// and walks its sequence's keys twice on the tensor cores: first for each row's max and
// D_full, then for the keep test against the row's threshold (θ pre- or post-softmax), Σ e·V
// over the kept keys whose V rows are stored (the dense tail, the sparse store or the host
// store), hit marks, retained mass and the counters; SDC and VMC at the end. The CPU
// backend's attention is the reference (kernels/cpu/attention_unit.inc: KeepThresholds,
// KeepPass, Compensate), and the split kernels (attention.cu) set marks and counters alike.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>

#include <cuda_pipeline.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/prefill_block.cuh"
#include "kernels/cuda/warp_mma.cuh"

namespace thetaserve::kernels::cuda {
namespace {

constexpr float kLog2E = 1.4426950408889634f;
// A tile's V rows, as their places in the pools (page · block_size + slot): a host pool row
// has kHostRow set; kNoRow is a position whose V row is stored nowhere (dropped by the sparse
// store, or past the tile's last position).
constexpr uint32_t kHostRow = 0x80000000u;
constexpr uint32_t kNoRow = 0xffffffffu;

// Dynamic shared memory: Q·scale·log2(e) in three bf16 parts, then a K tile, a V tile and a
// second K tile (the first walk, which reads no V, takes the first two for K in turn; the
// second alternates the K tiles).
template <int D>
constexpr size_t PrefillThetaSmemBytes() {
  return 6 * size_t(kMmaRows) * kMmaLdk<D> * sizeof(uint16_t);
}

// x in three bf16 parts, hi + mid + lo within ~2^-26 of x: a score's three products with a bf16
// K row then hold the f32 product (the dense kernels' two halves leave ~2^-17 of each element),
// and the tensor cores' f32 sums leave the scores, and so the keep decisions, as near the f32
// scores the CPU decides on as the split kernels' exact scores are.
__device__ __forceinline__ void SplitBf16Three(float x, uint16_t& hi, uint16_t& mid,
                                               uint16_t& lo) {
  hi = F32ToBf16(x);
  const float r = x - Bf16ToF32(hi);
  mid = F32ToBf16(r);
  lo = F32ToBf16(r - Bf16ToF32(mid));
}

// The two 32-bit halves of x, each OR-ed across the 4 lanes of a quad (a row's lanes).
__device__ __forceinline__ unsigned long long QuadOr(unsigned long long x) {
  uint32_t lo = uint32_t(x), hi = uint32_t(x >> 32);
#pragma unroll
  for (int m = 1; m <= 2; m <<= 1) {
    lo |= __shfl_xor_sync(0xffffffffu, lo, m);
    hi |= __shfl_xor_sync(0xffffffffu, hi, m);
  }
  return uint64_t(hi) << 32 | lo;
}

// Top-θ prefill (LaunchPrefillThetaAttention). Fragments, copies and masking as in
// PrefillMmaKernel (prefill.cu): a lane holds rows g and g + 8 of its warp's 16 (lane = 4g + t)
// and keys 8n + 2t, 8n + 2t + 1 of every tile; Q's three parts are read from shared memory as
// A fragments at each k step (in registers they would take 96 at d 128).
//   Walk 1 (K only, double-buffered): each row's max m and D_full = Σ exp(s − m), the
//   latter summed online as the dense kernel sums l; then each row's keep threshold on e =
//   exp(s − m): θ·D_full post-softmax, exp(θ − m) pre-softmax, −1 (keep all) for a row of at
//   most k keys or a head without θ.
//   Walk 2 (K double-buffered too: the next tile's K lands during this tile's keep test and
//   P·V, which sparse tiles mostly skip): the same scores again (the same instructions on the
//   same data: the same bits, so e ≤ 1 with the max at 1), e > threshold keeps a key; a kept
//   key adds its e to the hit mass (e / D_full, summed per key over the block's rows in shared
//   memory, then one atomic per key and tile) and, where its V row is stored, to D_kept and
//   (as P) to Σ e·V. A tile's V rows come from the tail's pages or, below v_tail_start, from
//   the store entries that lie in the tile (found from running indices into each store's
//   sorted positions: no search); the host pool's only where some row of the block keeps
//   them, after the keep test.
//   The heads of a token that keep a key meet in per-token key masks in shared memory (a
//   token's G rows may lie in different warps), which count rows read, positions retained and
//   host rows once per (token, key), as the CPU does, and set hit marks (latest position).
//   A warp skips P·V for the 16-key steps where none of its rows keeps a stored key.
template <int D>
__global__ void __launch_bounds__(128) PrefillThetaKernel(PrefillArgs a) {
  static_assert(D % 16 == 0 && kMmaRows == 4 * 16 && kMmaKeys == 64 && kMmaRows == kMmaKeys);
  static_assert(128 % (D / 8) == 0 && kMmaKeys % (128 / (D / 8)) == 0);  // the copy passes
  constexpr int kLdk = kMmaLdk<D>, kKSteps = D / 16, kKeyTiles = kMmaKeys / 8, kOutTiles = D / 8;
  constexpr int kTileElems = kMmaRows * kLdk;
  extern __shared__ __align__(16) uint16_t theta_smem[];
  uint16_t* const q3 = theta_smem;  // Q's parts: hi, mid, lo, kTileElems apart
  uint16_t* const ks = theta_smem + 3 * kTileElems;
  uint16_t* const vs = ks + kTileElems;
  uint16_t* const ks2 = vs + kTileElems;
  __shared__ uint32_t s_vrow[2][kMmaKeys];  // the tile's V rows (double-buffered by tile)
  // Per token of the tile: the keys some head keeps, and keeps by the retain factor.
  __shared__ unsigned long long s_any[kMmaRows], s_strong[kMmaRows];
  __shared__ unsigned long long s_kept;  // the tile's keys any row of the block keeps
  __shared__ MassUnits s_mass[kMmaKeys];  // the tile's retained mass per key (hit_mass)
  __shared__ unsigned s_found[4];        // store entries each warp found in the tile
  __shared__ unsigned long long s_count[kThetaCounters];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int mat = lane >> 3, mat_row = lane & 7;  // ldmatrix .x4: this lane's matrix and row
  const PrefillBlock blk(a);
  const ThetaArgs& th = a.theta;
  const SeqPageTables& pages = blk.seq.pages;

  for (int i = threadIdx.x; i < kMmaRows * D; i += blockDim.x) {
    const int rr = i / D, c = i % D, at = rr * kLdk + c;
    SplitBf16Three(blk.Query(a, rr, c, D, a.kv.shape.scale * kLog2E), q3[at],
                   q3[kTileElems + at], q3[2 * kTileElems + at]);
  }
  if (threadIdx.x < kMmaRows) s_any[threadIdx.x] = s_strong[threadIdx.x] = 0;
  if (threadIdx.x < kMmaKeys) s_mass[threadIdx.x] = 0;
  if (threadIdx.x < kThetaCounters) s_count[threadIdx.x] = 0;

  // S = Q·Kᵀ over the K tile `kt`, as PrefillMmaKernel forms it (Q's parts hi, mid, lo).
  const int q_off = (warp * 16 + (mat & 1) * 8 + mat_row) * kLdk + (mat >> 1) * 8;
  auto scores = [&](const uint16_t* kt, float (&s)[kKeyTiles][4]) {
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int k = 0; k < kKSteps; ++k) {
      uint32_t qf[3][4];
#pragma unroll
      for (int p = 0; p < 3; ++p) LdMatrixX4(qf[p], q3 + p * kTileElems + q_off + k * 16);
#pragma unroll
      for (int n = 0; n < kKeyTiles; n += 2) {
        uint32_t kb[4];
        LdMatrixX4(kb, kt + ((n + (mat >> 1)) * 8 + mat_row) * kLdk + k * 16 + (mat & 1) * 8);
#pragma unroll
        for (int p = 0; p < 3; ++p) {
          MmaBf16M16N8K16(s[n], qf[p], kb[0], kb[1]);
          MmaBf16M16N8K16(s[n + 1], qf[p], kb[2], kb[3]);
        }
      }
    }
  };

  const int r0 = warp * 16 + g, r1 = r0 + 8;  // the lane's rows in the block
  const bool live0 = r0 < blk.rows, live1 = r1 < blk.rows;
  const int32_t pos0 = blk.Pos(r0), pos1 = blk.Pos(r1);
  const int warp_last_row = min(warp * 16 + 15, blk.rows - 1);
  const int32_t warp_last_pos = warp * 16 < blk.rows ? blk.Pos(warp_last_row) : -1;
  const Divisor bs(a.kv.layout.block_size);
  const int32_t* k_pages = blk.KPages();
  constexpr int kPieces = D / 8, kRowsPerPass = 128 / kPieces;
  const int c8 = int(threadIdx.x) % kPieces * 8;  // the thread's piece of each V row it copies
  // Starts the copies of K's rows [j0, j0 + 64) into `dst` (zeros past last_pos) as a group.
  auto issue_k = [&](uint16_t* dst, int32_t j0) {
    CopyKeyRows<D>(a, blk, bs, dst, kLdk, k_pages, 0, j0);
  };

  // Walk 1: each row's max and D_full (this lane's part of it, summed across the quad after).
  LaneRows rows{live0, live1, pos0, pos1};
  issue_k(ks, 0);
  for (int32_t j0 = 0, buf = 0; j0 <= blk.last_pos; j0 += kMmaKeys, buf ^= 1) {
    if (j0 + kMmaKeys <= blk.last_pos) {
      issue_k(buf ? ks : vs, j0 + kMmaKeys);  // read by no one since the last barrier
    } else {
      __pipeline_commit();  // an empty group: the count waited on below stays one
    }
    __pipeline_wait_prior(1);  // this thread's copies of this tile
    __syncthreads();           // everyone's (and Q's parts, on the first tile)
    if (j0 <= warp_last_pos) {
      float s[kKeyTiles][4];
      scores(buf ? vs : ks, s);
      OnlineSoftmaxStep<false>(s, j0, t, rows);
    }
    __syncthreads();  // every warp is done with this tile's buffer before it takes tile + 2
  }
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    rows.l0 += __shfl_xor_sync(0xffffffffu, rows.l0, x);
    rows.l1 += __shfl_xor_sync(0xffffffffu, rows.l1, x);
  }
  const float m0 = rows.m0, m1 = rows.m1, d_full0 = rows.l0, d_full1 = rows.l1;
  // Keep thresholds on e (KeepThresholds): −1 keeps every key the row sees.
  auto threshold = [&](int rr, bool live, float m, float d_full) {
    if (!live || blk.Pos(rr) + 1 <= th.k) return -1.0f;
    const float theta = th.theta[blk.Token(rr) * a.kv.shape.num_heads + blk.Head(rr)];
    if (isnan(theta)) return -1.0f;
    return th.post_softmax ? theta * d_full : exp2f(theta * kLog2E - m);
  };
  const float thr0 = threshold(r0, live0, m0, d_full0), thr1 = threshold(r1, live1, m1, d_full1);
  const float strong0 = th.retain_factor * thr0, strong1 = th.retain_factor * thr1;

  // Walk 2.
  const int32_t tail_start = pages.v_tail_start;
  const int32_t* v_pages = blk.VPages();  // the tail's, from tail_start
  const int32_t sparse_n = pages.SparseCount(blk.lh), host_n = pages.HostCount(blk.lh);
  const int32_t* sparse_pos =
      sparse_n ? pages.v_sparse_pos + blk.lh * pages.sparse_pos_stride : nullptr;
  const int32_t* sparse_pages =
      sparse_n ? pages.v_sparse_pages + blk.lh * pages.sparse_stride : nullptr;
  const int32_t* host_pos = host_n ? pages.v_host_pos + blk.lh * pages.host_pos_stride : nullptr;
  const int32_t* host_pages = host_n ? pages.v_host_pages + blk.lh * pages.host_stride : nullptr;
  const uint16_t* host_pool = th.host_pool;
  // Each store's entries before the current tile (its positions are sorted and distinct).
  int32_t sparse_base = 0, host_base = 0;
  const int32_t mark_from = pages.hits_begin;
  int32_t* hits = pages.hits ? pages.hits + blk.lh * pages.hits_stride : nullptr;
  MassUnits* hit_mass = pages.hit_mass ? pages.hit_mass + blk.lh * pages.hits_stride : nullptr;

  // The tile at j0's V rows from the tail, kNoRow elsewhere (the stores' are filled in later).
  auto tail_rows = [&](uint32_t* vrow, int32_t j0) {
    if (threadIdx.x < kMmaKeys) {
      const int32_t j = j0 + int32_t(threadIdx.x);
      vrow[threadIdx.x] = j <= blk.last_pos && j >= tail_start
                              ? uint32_t(v_pages[bs.Div(j - tail_start)]) * uint32_t(bs.d) +
                                    uint32_t(bs.Mod(j))
                              : kNoRow;
    }
  };
  // The store entries in the tile at j0: threads 0-63 take the sparse store's entries
  // sparse_base + 0..63, threads 64-127 the host store's (a tile holds at most 64 of each).
  auto store_rows = [&](uint32_t* vrow, int32_t j0) {
    const bool host = threadIdx.x >= 64;
    const int32_t idx = (host ? host_base : sparse_base) + int32_t(threadIdx.x & 63);
    bool found = false;
    if (idx < (host ? host_n : sparse_n)) {
      // >= j0 (the base counts those below) and below the tail, as the store keeps them; tested
      // all the same, as a broken table must not write outside vrow.
      const int32_t p = (host ? host_pos : sparse_pos)[idx];
      if (p >= j0 && p < j0 + kMmaKeys && p <= blk.last_pos && p < tail_start) {
        found = true;
        const int32_t* store_pages = host ? host_pages : sparse_pages;
        vrow[p - j0] = (uint32_t(store_pages[bs.Div(idx)]) * uint32_t(bs.d) +
                        uint32_t(bs.Mod(idx))) | (host ? kHostRow : 0u);
      }
    }
    const unsigned found_lanes = __ballot_sync(0xffffffffu, found);
    if (lane == 0) s_found[warp] = __popc(found_lanes);
  };
  // Starts V's rows of the tile into vs as a group; zeros for none, and for now for the host
  // pool's (read over the bus: only those some row keeps are loaded, by load_host_rows).
  auto issue_v = [&](const uint32_t* vrow) {
#pragma unroll
    for (int pass = 0; pass < kMmaKeys / kRowsPerPass; ++pass) {
      const int jj = int(threadIdx.x) / kPieces + pass * kRowsPerPass;
      const uint32_t row = vrow[jj];
      uint16_t* dst = vs + jj * kLdk + c8;
      if (row == kNoRow || (row & kHostRow)) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      } else {
        __pipeline_memcpy_async(dst, a.pool + size_t(row) * D + c8, 16);
      }
    }
    __pipeline_commit();
  };
  // The host pool's rows of the tile that some row keeps (kept: s_kept), by plain loads.
  auto load_host_rows = [&](const uint32_t* vrow, unsigned long long kept) {
#pragma unroll
    for (int pass = 0; pass < kMmaKeys / kRowsPerPass; ++pass) {
      const int jj = int(threadIdx.x) / kPieces + pass * kRowsPerPass;
      const uint32_t row = vrow[jj];
      if (row != kNoRow && (row & kHostRow) && (kept >> jj & 1)) {
        *reinterpret_cast<uint4*>(vs + jj * kLdk + c8) =
            *reinterpret_cast<const uint4*>(host_pool + size_t(row & ~kHostRow) * D + c8);
      }
    }
  };

  float o[kOutTiles][4];
#pragma unroll
  for (int n = 0; n < kOutTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float dk0 = 0.0f, dk1 = 0.0f;  // D_kept: Σ e over the kept stored keys (this lane's)
  int kc0 = 0, kc1 = 0;          // how many
  unsigned long long reads = 0, retained = 0, host_reads = 0;  // a token thread's counts
  tail_rows(s_vrow[0], 0);
  issue_k(ks, 0);
  for (int32_t j0 = 0, buf = 0; j0 <= blk.last_pos; j0 += kMmaKeys, buf ^= 1) {
    uint32_t* vrow = s_vrow[buf];
    uint16_t* const k_tile = buf ? ks2 : ks;
    __syncthreads();  // the tile's tail rows are listed; the last tile's K, V and masks are read
    if (threadIdx.x == 0) s_kept = 0;  // set again after the barrier below K's copies
    bool host_rows = false;  // the tile has host pool rows (the same for every thread)
    if (j0 < tail_start) {  // the same for every thread
      store_rows(vrow, j0);
      __syncthreads();
      sparse_base += int32_t(s_found[0] + s_found[1]);
      host_base += int32_t(s_found[2] + s_found[3]);
      host_rows = s_found[2] + s_found[3] > 0;
    }
    issue_v(vrow);
    // The next tile's K into the other K tile (the last tile's), landing during this one.
    if (j0 + kMmaKeys <= blk.last_pos) {
      issue_k(buf ? ks : ks2, j0 + kMmaKeys);
    } else {
      __pipeline_commit();  // an empty group: the counts waited on below stay the same
    }
    __pipeline_wait_prior(2);  // this thread's copies of this tile's K (V's, the next K's pend)
    __syncthreads();           // everyone's
    const bool active = j0 <= warp_last_pos;  // uniform across the warp
    float s[kKeyTiles][4];
    bool any_p = false;  // this lane has a kept stored key in the tile
    if (active) {
      scores(k_tile, s);
      unsigned long long any0 = 0, any1 = 0, str0 = 0, str1 = 0;
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int jj = 8 * n + 2 * t + e;
          const int32_t j = j0 + jj;
          const bool stored = vrow[jj] != kNoRow;
          const unsigned long long bit = 1ull << jj;
          float p0 = 0.0f, p1 = 0.0f;
          float mass = 0.0f;  // the two rows' retained mass at this key
          if (live0 && j <= pos0) {
            const float x = exp2f(s[n][e] - m0);
            if (x > thr0) {
              any0 |= bit;
              if (x > strong0) str0 |= bit;
              mass += x / d_full0;
              if (stored) {
                p0 = x;
                dk0 += x;
                ++kc0;
              }
            }
          }
          if (live1 && j <= pos1) {
            const float x = exp2f(s[n][2 + e] - m1);
            if (x > thr1) {
              any1 |= bit;
              if (x > strong1) str1 |= bit;
              mass += x / d_full1;
              if (stored) {
                p1 = x;
                dk1 += x;
                ++kc1;
              }
            }
          }
          s[n][e] = p0;
          s[n][2 + e] = p1;
          any_p |= p0 != 0.0f || p1 != 0.0f;
          if (hit_mass) {  // the warp's 16 rows' mass at this key, to one shared sum per key
#pragma unroll
            for (int x = 4; x <= 16; x <<= 1) mass += __shfl_xor_sync(0xffffffffu, mass, x);
            if (g == 0 && mass != 0.0f) atomicAdd(&s_mass[jj], ToMassUnits(mass));
          }
        }
      }
      any0 = QuadOr(any0);
      any1 = QuadOr(any1);
      str0 = QuadOr(str0);
      str1 = QuadOr(str1);
      if (t == 0) {
        if (any0 | any1) atomicOr(&s_kept, any0 | any1);
        if (any0) atomicOr(&s_any[r0 / blk.G], any0);
        if (any1) atomicOr(&s_any[r1 / blk.G], any1);
        if (str0) atomicOr(&s_strong[r0 / blk.G], str0);
        if (str1) atomicOr(&s_strong[r1 / blk.G], str1);
      }
    }
    __pipeline_wait_prior(1);  // this thread's V copies (the next K's may pend)
    __syncthreads();           // everyone's; every warp has set its masks
    if (j0 + kMmaKeys <= blk.last_pos) tail_rows(s_vrow[buf ^ 1], j0 + kMmaKeys);
    if (host_rows) {
      load_host_rows(vrow, s_kept);
      __syncthreads();  // before P·V reads them
    }
    // A thread per key adds the tile's retained mass (KeepPass adds a token's at a time).
    if (hit_mass && threadIdx.x < kMmaKeys) {
      const MassUnits mass = s_mass[threadIdx.x];
      s_mass[threadIdx.x] = 0;
      const int32_t j = j0 + int32_t(threadIdx.x);
      if (mass != 0 && j >= mark_from) atomicAdd(hit_mass + (j - mark_from), mass);
    }
    // A thread per token counts the tile's kept keys once and marks them (KeepPass's visit).
    if (int(threadIdx.x) < blk.tile.ntok) {
      unsigned long long any = s_any[threadIdx.x];
      const unsigned long long strong = s_strong[threadIdx.x];
      s_any[threadIdx.x] = s_strong[threadIdx.x] = 0;
      const int32_t pos = blk.first_pos + int32_t(threadIdx.x);
      while (any) {
        const int jj = __ffsll(static_cast<long long>(any)) - 1;
        any &= any - 1;
        const uint32_t row = vrow[jj];
        ++retained;
        if (row != kNoRow) {
          ++reads;
          host_reads += (row & kHostRow) != 0;
        }
        const int32_t j = j0 + jj;
        if (hits && (strong >> jj & 1) && j >= mark_from) atomicMax(hits + (j - mark_from), pos);
      }
    }
    if (!active || !__ballot_sync(0xffffffffu, any_p)) continue;  // uniform across the warp
    // O += P·V over the kept stored keys (AddPVStep), skipping a 16-key step no row keeps.
#pragma unroll
    for (int kk = 0; kk < kKeyTiles / 2; ++kk) {
      bool any_step = false;
#pragma unroll
      for (int e = 0; e < 4; ++e) any_step |= s[2 * kk][e] != 0.0f || s[2 * kk + 1][e] != 0.0f;
      if (__ballot_sync(0xffffffffu, any_step)) AddPVStep<D>(o, s, kk, vs, kLdk, lane);
    }
  }

  // Each row's D_kept and count across its quad, then SDC and VMC (Compensate) and the output.
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    dk0 += __shfl_xor_sync(0xffffffffu, dk0, x);
    dk1 += __shfl_xor_sync(0xffffffffu, dk1, x);
    kc0 += __shfl_xor_sync(0xffffffffu, kc0, x);
    kc1 += __shfl_xor_sync(0xffffffffu, kc1, x);
  }
  const int32_t H = a.kv.shape.num_heads;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int rr = half ? r1 : r0;
    if (rr >= blk.rows) continue;
    const float d_kept = half ? dk1 : dk0, kept = float(half ? kc1 : kc0);
    const float thr = half ? thr1 : thr0, d_full = half ? d_full1 : d_full0;
    const int32_t L = blk.Pos(rr) + 1;
    const int64_t token = blk.Token(rr), head = blk.Head(rr);
    const float denom =
        SdcDenominator(th.sdc, d_kept, d_full, kept, L, thr, th.sdc_ratio, token * H + head);
    const float* vsum = th.vsum_rows && th.vmc && pages.v_sum
                            ? th.vsum_rows + token * a.kv.shape.num_kv_heads * D +
                                  int64_t(blk.kv_head) * D
                            : nullptr;
    const float inv_L = 1.0f / float(L);
    const float inv = denom > 0 ? 1.0f / denom : 0.0f;
    const float missing = denom > 0 ? fmaxf(0.0f, 1.0f - d_kept / denom) : 0.0f;
    float* out = blk.Out(a, rr, D);
#pragma unroll
    for (int n = 0; n < kOutTiles; ++n) {
      float v[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = 8 * n + 2 * t + e;
        if (denom > 0) {
          v[e] = o[n][2 * half + e] * inv;
          if (vsum && missing > 0) v[e] = fmaf(missing * inv_L, vsum[c], v[e]);
        } else {
          v[e] = vsum ? vsum[c] * inv_L : 0.0f;  // nothing kept: the mean
        }
      }
      *reinterpret_cast<float2*>(out + 8 * n + 2 * t) = make_float2(v[0], v[1]);
    }
  }

  // The counters: elements kept (a row's, from its first lane), and the token threads' counts.
  if (t == 0) {
    const unsigned long long kept = (live0 ? kc0 : 0) + (live1 ? kc1 : 0);
    if (kept) atomicAdd(&s_count[1], kept);
  }
  if (reads) atomicAdd(&s_count[0], reads);
  if (retained) atomicAdd(&s_count[2], retained);
  if (host_reads) atomicAdd(&s_count[3], host_reads);
  __syncthreads();
  if (threadIdx.x < kThetaCounters && th.counters && s_count[threadIdx.x]) {
    atomicAdd(th.counters + threadIdx.x, s_count[threadIdx.x]);
  }
}

template <int D>
cudaError_t LaunchPrefillTheta(const PrefillArgs& a, dim3 grid, cudaStream_t stream) {
  constexpr size_t kSmem = PrefillThetaSmemBytes<D>();
  // Past 48 KB (d 128: 102 KB, d 64: 54 KB) the kernel needs the opt-in, once per head size
  // (device 0).
  static std::atomic<bool> opted{false};
  if (!opted.load(std::memory_order_acquire)) {
    const cudaError_t e = cudaFuncSetAttribute(
        PrefillThetaKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem));
    if (e != cudaSuccess) return e;
    opted.store(true, std::memory_order_release);
  }
  PrefillThetaKernel<D><<<grid, 128, kSmem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

// THETASERVE_ATTN_THETA_PREFILL's values.
constexpr KnobValue<ThetaPrefill> kThetaPrefills[] = {{"tiled", ThetaPrefill::kTiled},
                                                      {"split", ThetaPrefill::kSplit}};

const char* ThetaPrefillName(ThetaPrefill way) { return KnobName(way, kThetaPrefills); }

ThetaPrefill DefaultThetaPrefill() {
  return KnobFromEnv("THETASERVE_ATTN_THETA_PREFILL", kThetaPrefills, ThetaPrefill::kTiled);
}

cudaError_t LaunchPrefillThetaAttention(const PrefillTile* tiles, int32_t num_tiles,
                                        const DevKv& kv, const bf16* pool, const DevQueries& q,
                                        const ThetaArgs& theta, float* o, cudaStream_t stream) {
  if (num_tiles == 0) return cudaSuccess;
  const AttnShape& shape = kv.shape;
  if (shape.num_heads / shape.num_kv_heads > kMmaRows || !theta.theta) {
    return cudaErrorInvalidValue;
  }
  const PrefillArgs a{tiles, kv, pool, q, o, theta};
  const dim3 grid(num_tiles, shape.num_kv_heads);
  switch (shape.head_dim) {
    case 64: return LaunchPrefillTheta<64>(a, grid, stream);
    case 128: return LaunchPrefillTheta<128>(a, grid, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace thetaserve::kernels::cuda
