// Dense causal prefill attention on the GPU (DESIGN.md §5): a block takes one tile of a
// prompt chunk's query rows (token × head of one KV group) and walks that sequence's K/V pages
// with an online softmax: on the tensor cores with its fragments in registers (PrefillMmaKernel,
// the default) or through CUDA's warp matrix functions (PrefillWmmaKernel), or in f32 FMAs
// (PrefillKernel). The CPU backend's attention is the reference; Top-θ prefill tiles are
// prefill_theta.cu's.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>

#include <cuda_pipeline.h>
#include <mma.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/prefill_block.cuh"
#include "kernels/cuda/warp_mma.cuh"

namespace thetaserve::kernels::cuda {
namespace {

constexpr int kTileRows = 32;  // query rows (token × head) per block
constexpr int kKeyTile = 32;   // keys per step
constexpr int kRowsPerWarp = kTileRows / 4;

template <int D>
__global__ void __launch_bounds__(128) PrefillKernel(PrefillArgs a) {
  constexpr int kPerLane = D / 32;
  __shared__ float qs[kTileRows][D];
  __shared__ float ks[kKeyTile][D + 1];
  __shared__ __align__(16) uint16_t vs[kKeyTile][D];  // bf16: keeps D = 128 under 48 KB
  const PrefillBlock blk(a);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  for (int i = threadIdx.x; i < kTileRows * D; i += blockDim.x) {
    qs[i / D][i % D] = blk.Query(a, i / D, i % D, D, a.kv.shape.scale);
  }
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kPerLane];
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
    m[k] = -INFINITY;
    l[k] = 0.0f;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) acc[k][e] = 0.0f;
  }
  const int32_t bs = a.kv.layout.block_size;
  for (int32_t j0 = 0; j0 <= blk.last_pos; j0 += kKeyTile) {
    __syncthreads();
    for (int i = threadIdx.x; i < kKeyTile * (D / 8); i += blockDim.x) {
      const int jj = i / (D / 8), c = (i % (D / 8)) * 8;
      const int32_t j = j0 + jj;
      float kf[8] = {};
      uint4 vraw = make_uint4(0, 0, 0, 0);
      if (j <= blk.last_pos) {
        const int32_t k_page = blk.seq.pages.KPage(blk.lh, j, bs);
        LoadBf16x8(a.pool + a.kv.layout.RowOffset(k_page, j % bs) + c, kf);
        vraw = *reinterpret_cast<const uint4*>(
            a.pool + a.kv.layout.RowOffset(blk.seq.pages.VPage(blk.lh, j, bs), j % bs) + c);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) ks[jj][c + e] = kf[e];
      *reinterpret_cast<uint4*>(&vs[jj][c]) = vraw;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) {
      const int rr = warp + 4 * k;
      if (rr >= blk.rows) continue;  // uniform across the warp
      const int32_t pos = blk.Pos(rr);
      if (j0 > pos) continue;
      const int32_t j = j0 + lane;
      float s = -INFINITY;
      if (j <= pos) {
        s = 0.0f;
#pragma unroll 16
        for (int c = 0; c < D; ++c) s = fmaf(qs[rr][c], ks[lane][c], s);
      }
      const float m_new = fmaxf(m[k], WarpMax(s));
      const float p = j <= pos ? expf(s - m_new) : 0.0f;
      const float corr = expf(m[k] - m_new);  // 0 on the first tile (m = -inf)
      l[k] = l[k] * corr + WarpSum(p);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) acc[k][e] *= corr;
#pragma unroll 8
      for (int jj = 0; jj < kKeyTile; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) {
          acc[k][e] = fmaf(pj, Bf16ToF32(vs[jj][lane + 32 * e]), acc[k][e]);
        }
      }
      m[k] = m_new;
    }
  }
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
    const int rr = warp + 4 * k;
    if (rr >= blk.rows) continue;
    float* out = blk.Out(a, rr, D);
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) out[lane + 32 * e] = acc[k][e] / l[k];
  }
}

// Dense causal prefill on the tensor cores through CUDA's warp matrix functions
// (PrefillWay::kWmma; PrefillMmaKernel below keeps its fragments in registers instead): a
// block holds 64 query rows (token × head of one KV group; 16 per warp) and walks the
// sequence's keys 64 at a time. A
// warp forms its rows' scores S = Q·Kᵀ with warp matrix products (16×16×16 bf16 → f32), keeps
// the online softmax in f32 (a lane per half row, S through shared memory, as a fragment's
// layout is unspecified), and adds P·V with products again, each tile's P·V through shared
// memory into the lane's own f32 accumulators. bf16 operands keep the f32 kernel's accuracy by
// halves: q·scale = hi + lo and p = hi + lo, each rounded to bf16 (K and V are bf16 already),
// so a product is two: their sum is within ~2^-16 of the f32 one, where one rounded operand
// would be ~2^-9 off. Keys past the tile's last position are read as zeros (a row that was
// never written may hold anything, NaN included) and masked.
namespace wmma = nvcuda::wmma;
constexpr int kWmmaLdp = kMmaKeys + 8;  // P's rows, bf16
template <int D>
constexpr int kWmmaLds = (D > kMmaKeys ? D : kMmaKeys) + 8;  // S's, then P·V's rows, f32

template <int D>
constexpr size_t PrefillWmmaSmemBytes() {
  return 2 * size_t(kMmaKeys) * kMmaLdk<D> * 2 +                      // K, V tiles
         4 * (size_t(16) * kWmmaLds<D> * 4 + 2 * size_t(16) * kWmmaLdp * 2);  // per warp: S, P
}

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragBc = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major>;
using FragBr = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// The warp's 16 rows of A, held as bf16 halves (hi + lo, kK fragments each along the sum),
// times B, 16 output columns at a time for kN blocks: B's tile (n, k) loaded as FragB from
// b_at(n, k) with leading dimension ldb, each product done for both halves into one f32
// accumulator, block n stored row-major at out + 16n (leading dimension ldo).
template <typename FragB, int kN, int kK, typename BAt>
__device__ __forceinline__ void SplitProduct(const FragA (&hi)[kK], const FragA (&lo)[kK],
                                             BAt b_at, unsigned ldb, float* out, unsigned ldo) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int k = 0; k < kK; ++k) {
      FragB b;
      wmma::load_matrix_sync(b, b_at(n, k), ldb);
      wmma::mma_sync(acc, hi[k], b, acc);
      wmma::mma_sync(acc, lo[k], b, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, ldo, wmma::mem_row_major);
  }
}

template <int D>
__global__ void __launch_bounds__(128) PrefillWmmaKernel(PrefillArgs a) {
  static_assert(D % 16 == 0 && kMmaRows == 4 * 16);
  static_assert(kMmaRows <= kMmaKeys);  // Q is staged in the K and V tiles' rows
  constexpr int kLdk = kMmaLdk<D>, kLds = kWmmaLds<D>, kKSteps = D / 16, kHalf = D / 2;
  // 128-byte aligned: a matrix load or store needs 32 bytes, and the areas below keep it.
  extern __shared__ __align__(128) float wmma_smem[];
  uint16_t* ks = reinterpret_cast<uint16_t*>(wmma_smem);  // [kMmaKeys][kLdk]
  uint16_t* vs = ks + kMmaKeys * kLdk;                // [kMmaKeys][kLdk]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* sw = reinterpret_cast<float*>(vs + kMmaKeys * kLdk) +
              warp * (16 * kLds + 16 * kWmmaLdp);       // this warp's S, then P·V: [16][kLds]
  uint16_t* p_hi = reinterpret_cast<uint16_t*>(sw + 16 * kLds);  // [16][kWmmaLdp]
  uint16_t* p_lo = p_hi + 16 * kWmmaLdp;
  auto bf = [](uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); };

  const PrefillBlock blk(a);

  // Q·scale as bf16 halves, hi where K goes and lo where V goes, for the fragments.
  StageQueryHalves<D>(a, blk, a.kv.shape.scale, ks, vs, kLdk);
  __syncthreads();
  FragA q_hi[kKSteps], q_lo[kKSteps];
#pragma unroll
  for (int k = 0; k < kKSteps; ++k) {
    wmma::load_matrix_sync(q_hi[k], bf(ks + warp * 16 * kLdk + k * 16), kLdk);
    wmma::load_matrix_sync(q_lo[k], bf(vs + warp * 16 * kLdk + k * 16), kLdk);
  }

  // The lane's half row: row r of the warp's 16, and of every 8 columns (of S, P, P·V and
  // the output) the 4 from `quad` on, read and written 16 (P: 8) bytes at a time. With rows
  // 8 mod 32 words apart in shared memory, the 8 lanes of a 16-byte access (16 of an 8-byte
  // one) meet no bank twice.
  const int r = lane >> 1;
  const int rr = warp * 16 + r;
  const bool live = rr < blk.rows;
  const int32_t pos = blk.Pos(rr);
  const int quad = (lane & 1) * 4;
  float m = -INFINITY, l = 0.0f, o[kHalf];
#pragma unroll
  for (int e = 0; e < kHalf; ++e) o[e] = 0.0f;
  const Divisor bs(a.kv.layout.block_size);

  for (int32_t j0 = 0; j0 <= blk.last_pos; j0 += kMmaKeys) {
    __syncthreads();  // every warp is done with the last tile (and, first, with Q)
    for (int i = threadIdx.x; i < kMmaKeys * (D / 8); i += blockDim.x) {
      const int jj = i / (D / 8), c = (i % (D / 8)) * 8;
      const int32_t j = j0 + jj;
      uint4 kraw = make_uint4(0, 0, 0, 0), vraw = make_uint4(0, 0, 0, 0);
      if (j <= blk.last_pos) {
        const int32_t slot = bs.Mod(j);
        kraw = *reinterpret_cast<const uint4*>(
            a.pool + a.kv.layout.RowOffset(blk.KPages()[bs.Div(j)], slot) + c);
        const int32_t v_page = blk.VPages()[bs.Div(j - blk.seq.pages.v_tail_start)];
        vraw = *reinterpret_cast<const uint4*>(a.pool + a.kv.layout.RowOffset(v_page, slot) + c);
      }
      *reinterpret_cast<uint4*>(ks + jj * kLdk + c) = kraw;
      *reinterpret_cast<uint4*>(vs + jj * kLdk + c) = vraw;
    }
    __syncthreads();

    // S = Q·Kᵀ: the key tile as Kᵀ is K's rows read column-major.
    SplitProduct<FragBc, kMmaKeys / 16, kKSteps>(
        q_hi, q_lo, [&](int n, int k) { return bf(ks + n * 16 * kLdk + k * 16); }, kLdk, sw, kLds);
    __syncwarp();

    // Online softmax over the tile, a half row per lane (the pair meet in one shuffle).
    float tile_max = -INFINITY;
#pragma unroll
    for (int c0 = quad; c0 < kMmaKeys; c0 += 8) {
      const float4 s4 = *reinterpret_cast<const float4*>(sw + r * kLds + c0);
      const float sv[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (live && j0 + c0 + e <= pos) tile_max = fmaxf(tile_max, sv[e]);
      }
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const float alpha = m_new == -INFINITY ? 1.0f : expf(m - m_new);  // 0 on a row's first keys
    float sum = 0.0f;
#pragma unroll
    for (int c0 = quad; c0 < kMmaKeys; c0 += 8) {
      const float4 s4 = *reinterpret_cast<const float4*>(sw + r * kLds + c0);
      const float sv[4] = {s4.x, s4.y, s4.z, s4.w};
      uint16_t hi[4], lo[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = live && j0 + c0 + e <= pos ? expf(sv[e] - m_new) : 0.0f;
        SplitBf16(p, hi[e], lo[e]);
        sum += p;
      }
      *reinterpret_cast<uint2*>(p_hi + r * kWmmaLdp + c0) =
          make_uint2(hi[0] | uint32_t(hi[1]) << 16, hi[2] | uint32_t(hi[3]) << 16);
      *reinterpret_cast<uint2*>(p_lo + r * kWmmaLdp + c0) =
          make_uint2(lo[0] | uint32_t(lo[1]) << 16, lo[2] | uint32_t(lo[3]) << 16);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;
#pragma unroll
    for (int e = 0; e < kHalf; ++e) o[e] *= alpha;
    __syncwarp();  // P written, S read: the area takes P·V next

    // P·V, 16 output columns at a time, through the S area into the lanes' accumulators.
    FragA pa_hi[kMmaKeys / 16], pa_lo[kMmaKeys / 16];
#pragma unroll
    for (int k = 0; k < kMmaKeys / 16; ++k) {
      wmma::load_matrix_sync(pa_hi[k], bf(p_hi + k * 16), kWmmaLdp);
      wmma::load_matrix_sync(pa_lo[k], bf(p_lo + k * 16), kWmmaLdp);
    }
    SplitProduct<FragBr, D / 16, kMmaKeys / 16>(
        pa_hi, pa_lo, [&](int n, int k) { return bf(vs + k * 16 * kLdk + n * 16); }, kLdk, sw,
        kLds);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {  // o[4i + e]: column 8i + quad + e
      const float4 v4 = *reinterpret_cast<const float4*>(sw + r * kLds + 8 * i + quad);
      o[4 * i] += v4.x;
      o[4 * i + 1] += v4.y;
      o[4 * i + 2] += v4.z;
      o[4 * i + 3] += v4.w;
    }
    __syncwarp();  // read before the next tile's S overwrites it
  }
  if (!live) return;
  float* out = blk.Out(a, rr, D) + quad;
  const float inv = 1.0f / l;
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    *reinterpret_cast<float4*>(out + 8 * i) =
        make_float4(o[4 * i] * inv, o[4 * i + 1] * inv, o[4 * i + 2] * inv, o[4 * i + 3] * inv);
  }
}

// PrefillWmmaKernel takes more than 48 KB of dynamic shared memory (54 KB at d 64, 86 KB at
// 128): the opt-in, until it succeeds once per head size (for the current device: the backend
// uses device 0 only).
template <int D>
cudaError_t LaunchPrefillWmma(const PrefillArgs& a, dim3 grid, cudaStream_t stream) {
  constexpr size_t kSmem = PrefillWmmaSmemBytes<D>();
  static std::atomic<bool> opted{false};
  if (!opted.load(std::memory_order_acquire)) {
    const cudaError_t e = cudaFuncSetAttribute(
        PrefillWmmaKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem));
    if (e != cudaSuccess) return e;
    opted.store(true, std::memory_order_release);
  }
  PrefillWmmaKernel<D><<<grid, 128, kSmem, stream>>>(a);
  return cudaGetLastError();
}

// Dense causal prefill with its matrix fragments in registers (PrefillWay::kMma, the default):
// PTX mma.sync m16n8k16 (warp_mma.cuh). A block holds 64 query rows (token × head of one KV
// group; 16 per warp) and walks the sequence's keys 64 at a time, each tile of K and V copied
// into shared memory with cp.async (V's copies land while the warps form S and its softmax,
// the next tile's K while they add P·V). The score accumulators of S = Q·Kᵀ (8 keys × 16 rows
// a fragment) are, element for element, where P's A fragments for P·V need them, so S, P and
// the output O never leave registers; ldmatrix reads K (and V, transposed) as B fragments. A
// lane holds rows g and g + 8 of its warp's 16 (lane = 4g + t) and columns 2t, 2t + 1 of every
// 8; a row's max and sum meet across its 4 lanes in shuffles (the sum once, at the end: each
// lane's part is rescaled alike). Q·scale and P are split in bf16 halves (hi + lo, two
// products each) for f32 accuracy, as in PrefillWmmaKernel; log2(e) rides in Q's scale, so
// the softmax takes exp2f: one ex2, where expf adds a range reduction (on paper, at d 64,
// expf's exponentials take about as long as the four products per score, ex2 alone about
// half). Keys past the tile's last position are not read from the pool (a row never written
// may hold NaN): zeros in shared memory, and masked; a warp skips the tiles that lie wholly
// after its rows' positions.
template <int D>
__global__ void __launch_bounds__(128) PrefillMmaKernel(PrefillArgs a) {
  static_assert(D % 16 == 0 && kMmaRows == 4 * 16 && kMmaKeys == 64);
  static_assert(kMmaRows <= kMmaKeys);  // Q is staged in the K and V tiles' rows
  static_assert(128 % (D / 8) == 0 && kMmaKeys % (128 / (D / 8)) == 0);  // the copy passes
  constexpr int kLdk = kMmaLdk<D>, kKSteps = D / 16, kKeyTiles = kMmaKeys / 8, kOutTiles = D / 8;
  __shared__ __align__(16) uint16_t ks[kMmaKeys * kLdk];
  __shared__ __align__(16) uint16_t vs[kMmaKeys * kLdk];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  // ldmatrix .x4: this lane gives row (lane & 7) of matrix (lane >> 3).
  const int mat = lane >> 3, mat_row = lane & 7;

  const PrefillBlock blk(a);

  // Q·scale·log2(e) as bf16 halves, hi where K goes and lo where V goes; then A fragments.
  // Scores are then in base 2 (s·log2 e), and exp2f of their differences is the softmax's e.
  StageQueryHalves<D>(a, blk, a.kv.shape.scale * 1.4426950408889634f, ks, vs, kLdk);
  __syncthreads();
  uint32_t q_hi[kKSteps][4], q_lo[kKSteps][4];
  {
    // A's matrices: rows +0/+8 (mat & 1), columns +0/+8 (mat >> 1).
    const int off = (warp * 16 + (mat & 1) * 8 + mat_row) * kLdk + (mat >> 1) * 8;
#pragma unroll
    for (int k = 0; k < kKSteps; ++k) {
      LdMatrixX4(q_hi[k], ks + off + k * 16);
      LdMatrixX4(q_lo[k], vs + off + k * 16);
    }
  }
  __syncthreads();  // Q's halves are read: their rows take K and V

  const int r0 = warp * 16 + g, r1 = r0 + 8;  // the lane's rows in the block
  LaneRows rows{r0 < blk.rows, r1 < blk.rows, blk.Pos(r0), blk.Pos(r1)};
  // The warp's last row's position: tiles past it hold no key its rows see.
  const int warp_last_row = min(warp * 16 + 15, blk.rows - 1);
  const int32_t warp_last_pos = warp * 16 < blk.rows ? blk.Pos(warp_last_row) : -1;
  float o[kOutTiles][4];
#pragma unroll
  for (int n = 0; n < kOutTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  const Divisor bs(a.kv.layout.block_size);
  const int32_t* k_pages = blk.KPages();
  const int32_t* v_pages = blk.VPages();
  const int32_t v_first = blk.seq.pages.v_tail_start;  // V: the position of the tail's first page
  auto issue = [&](uint16_t* dst, const int32_t* pages, int32_t first, int32_t j0) {
    CopyKeyRows<D>(a, blk, bs, dst, kLdk, pages, first, j0);
  };

  // Copy groups: K of the first tile here; then per tile V, and (once every warp has read
  // this tile's K) the next tile's K, which lands while P·V runs.
  issue(ks, k_pages, 0, 0);
  for (int32_t j0 = 0; j0 <= blk.last_pos; j0 += kMmaKeys) {
    __syncthreads();  // every warp is done with the last tile's V
    issue(vs, v_pages, v_first, j0);
    __pipeline_wait_prior(1);  // this thread's copies of this tile's K
    __syncthreads();           // everyone's
    const bool active = j0 <= warp_last_pos;  // uniform across the warp

    // S = Q·Kᵀ: K's rows are Bᵀ, so ldmatrix reads them as B fragments without .trans; one
    // .x4 gives two key tiles (mat >> 1) × both column halves (mat & 1) of a k step.
    float s[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    if (active) {
#pragma unroll
      for (int k = 0; k < kKSteps; ++k) {
#pragma unroll
        for (int n = 0; n < kKeyTiles; n += 2) {
          uint32_t kb[4];
          LdMatrixX4(kb, ks + ((n + (mat >> 1)) * 8 + mat_row) * kLdk + k * 16 + (mat & 1) * 8);
          MmaBf16M16N8K16(s[n], q_hi[k], kb[0], kb[1]);
          MmaBf16M16N8K16(s[n], q_lo[k], kb[0], kb[1]);
          MmaBf16M16N8K16(s[n + 1], q_hi[k], kb[2], kb[3]);
          MmaBf16M16N8K16(s[n + 1], q_lo[k], kb[2], kb[3]);
        }
      }

      // Online softmax: s becomes P.
      const float2 alpha = OnlineSoftmaxStep<true>(s, j0, t, rows);
#pragma unroll
      for (int n = 0; n < kOutTiles; ++n) {
        o[n][0] *= alpha.x;
        o[n][1] *= alpha.x;
        o[n][2] *= alpha.y;
        o[n][3] *= alpha.y;
      }
    }

    __pipeline_wait_prior(0);  // this thread's V copies
    __syncthreads();           // everyone's; and every warp is done with K
    if (j0 + kMmaKeys <= blk.last_pos) issue(ks, k_pages, 0, j0 + kMmaKeys);
    if (!active) continue;
    // O += P·V, 16 keys a step.
#pragma unroll
    for (int kk = 0; kk < kKeyTiles / 2; ++kk) AddPVStep<D>(o, s, kk, vs, kLdk, lane);
  }
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    rows.l0 += __shfl_xor_sync(0xffffffffu, rows.l0, x);
    rows.l1 += __shfl_xor_sync(0xffffffffu, rows.l1, x);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int rr = half ? r1 : r0;
    if (rr >= blk.rows) continue;
    const float inv = 1.0f / (half ? rows.l1 : rows.l0);
    float* out = blk.Out(a, rr, D);
#pragma unroll
    for (int n = 0; n < kOutTiles; ++n) {
      *reinterpret_cast<float2*>(out + 8 * n + 2 * t) =
          make_float2(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
    }
  }
}

// The instructions PrefillMmaKernel is built on, alone (LaunchWarpMmaProbe): A (16×16) times
// B (16×16: two tiles of 8 columns) plus C, B read both ways the kernel reads K and V.
__global__ void __launch_bounds__(32) WarpMmaProbeKernel(const uint16_t* a, const uint16_t* bt,
                                                         const uint16_t* b, const float* c,
                                                         float* d) {
  constexpr int kLd = 24;  // 48-byte rows in shared memory: every row 16-byte aligned
  __shared__ __align__(16) uint16_t as[16 * kLd], bts[16 * kLd], bs[16 * kLd];
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3, mat = lane >> 3, row = lane & 7;
  for (int i = lane; i < 16 * 16; i += 32) {
    as[i / 16 * kLd + i % 16] = a[i];
    bts[i / 16 * kLd + i % 16] = bt[i];
    bs[i / 16 * kLd + i % 16] = b[i];
  }
  __syncwarp();
  uint32_t af[4], kb[4], vb[4];
  // As the kernel reads Q; K (matrices: column tiles 0, 1 × k halves); V (k halves × tiles).
  LdMatrixX4(af, as + ((mat & 1) * 8 + row) * kLd + (mat >> 1) * 8);
  LdMatrixX4(kb, bts + ((mat >> 1) * 8 + row) * kLd + (mat & 1) * 8);
  LdMatrixX4Trans(vb, bs + ((mat & 1) * 8 + row) * kLd + (mat >> 1) * 8);
  for (int n = 0; n < 2; ++n) {
    float from_bt[4], from_b[4];
    for (int i = 0; i < 4; ++i) {
      from_bt[i] = from_b[i] = c[(g + 8 * (i >> 1)) * 16 + 8 * n + 2 * t + (i & 1)];
    }
    MmaBf16M16N8K16(from_bt, af, kb[2 * n], kb[2 * n + 1]);
    MmaBf16M16N8K16(from_b, af, vb[2 * n], vb[2 * n + 1]);
    for (int i = 0; i < 4; ++i) {
      const int at = (g + 8 * (i >> 1)) * 16 + 8 * n + 2 * t + (i & 1);
      d[at] = from_bt[i];
      d[256 + at] = from_b[i];
    }
  }
}

}  // namespace

// THETASERVE_ATTN_PREFILL's values.
constexpr KnobValue<PrefillWay> kPrefillWayNames[] = {
    {"mma", PrefillWay::kMma}, {"wmma", PrefillWay::kWmma}, {"fma", PrefillWay::kFma}};

const char* PrefillWayName(PrefillWay way) { return KnobName(way, kPrefillWayNames); }

PrefillWay DefaultPrefillWay() {
  return KnobFromEnv("THETASERVE_ATTN_PREFILL", kPrefillWayNames, PrefillWay::kMma);
}

int32_t PrefillTileTokens(int32_t group, PrefillWay way) {
  return std::max(1, (way == PrefillWay::kFma ? kTileRows : kMmaRows) / group);
}

bool PrefillSupports(int32_t head_dim) { return head_dim == 64 || head_dim == 128; }

cudaError_t LaunchPrefillAttention(const PrefillTile* tiles, int32_t num_tiles, const DevKv& kv,
                                   const bf16* pool, const DevQueries& q, PrefillWay way,
                                   float* o, cudaStream_t stream) {
  if (num_tiles == 0) return cudaSuccess;
  const AttnShape& shape = kv.shape;
  if (shape.num_heads / shape.num_kv_heads > kTileRows) return cudaErrorInvalidValue;
  PrefillArgs a{tiles, kv, pool, q, o, ThetaArgs{}};
  const dim3 grid(num_tiles, shape.num_kv_heads);
  if (way == PrefillWay::kWmma) {
    switch (shape.head_dim) {
      case 64: return LaunchPrefillWmma<64>(a, grid, stream);
      case 128: return LaunchPrefillWmma<128>(a, grid, stream);
      default: return cudaErrorInvalidValue;
    }
  }
  const bool mma = way == PrefillWay::kMma;
  switch (shape.head_dim) {
    case 64:
      if (mma) PrefillMmaKernel<64><<<grid, 128, 0, stream>>>(a);
      else PrefillKernel<64><<<grid, 128, 0, stream>>>(a);
      break;
    case 128:
      if (mma) PrefillMmaKernel<128><<<grid, 128, 0, stream>>>(a);
      else PrefillKernel<128><<<grid, 128, 0, stream>>>(a);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchWarpMmaProbe(const bf16* a, const bf16* bt, const bf16* b, const float* c,
                               float* d, cudaStream_t stream) {
  WarpMmaProbeKernel<<<1, 32, 0, stream>>>(a, bt, b, c, d);
  return cudaGetLastError();
}

}  // namespace thetaserve::kernels::cuda
