// Elementwise and row kernels of the CUDA forward pass: embedding gather, RMSNorm, SwiGLU,
// bias + RoPE + paged K/V write, VMC's running V sums, KV row copies, and the greedy pick of a
// row of logits.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace thetaserve::kernels::cuda {
namespace {

__global__ void EmbedKernel(const uint16_t* table, const int32_t* tokens, int64_t hidden,
                            float* out) {
  const int64_t t = blockIdx.x;
  const uint16_t* src = table + int64_t(tokens[t]) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    out[t * hidden + i] = Bf16ToF32(src[i]);
  }
}

template <typename Out>
__device__ __forceinline__ void Store(Out* p, float v);
template <>
__device__ __forceinline__ void Store<float>(float* p, float v) { *p = v; }
template <>
__device__ __forceinline__ void Store<uint16_t>(uint16_t* p, float v) { *p = F32ToBf16(v); }

template <typename Out>
__global__ void RmsNormKernel(const float* x, const int32_t* rows, const float* w, int64_t n,
                              float eps, Out* y) {
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const float* xr = x + (rows ? int64_t(rows[t]) : t) * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = BlockSum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) Store(y + t * n + i, xr[i] * inv * w[i]);
}

__global__ void SiluMulKernel(const float* gu, int64_t T, int64_t inter, uint16_t* out) {
  const int64_t n = T * inter;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / inter, c = i % inter;
    const float g = gu[t * 2 * inter + c];
    const float u = gu[t * 2 * inter + inter + c];
    out[i] = F32ToBf16(g / (1.0f + expf(-g)) * u);
  }
}

__global__ void F32ToBf16Kernel(const float* x, int64_t n, uint16_t* y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    y[i] = F32ToBf16(x[i]);
  }
}

// One thread per (row, head slot, rotation pair). Head slots: q heads, then k, then v.
// qkv [T, (num_heads + 2·num_kv_heads)·d] f32, q | k | v; bias as one such row, or null;
// inv_freq [d/2] (LaunchRopeWriteKv).
__global__ void RopeWriteKvKernel(float* qkv, const float* bias, int64_t T, DevKv kv,
                                  const float* inv_freq, bool interleaved, uint16_t* pool) {
  const AttnShape& shape = kv.shape;
  const int32_t d = shape.head_dim, half = d / 2;
  const int32_t slots = shape.num_heads + 2 * shape.num_kv_heads;
  const int64_t per_row = int64_t(slots) * half;
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= T * per_row) return;
  const int64_t t = idx / per_row;
  const int32_t slot = int32_t((idx % per_row) / half);
  const int32_t i = int32_t(idx % half);
  const int32_t a = interleaved ? 2 * i : i;
  const int32_t b = interleaved ? 2 * i + 1 : i + half;
  const int64_t width = int64_t(slots) * d;
  float* head = qkv + t * width + int64_t(slot) * d;
  float x0 = head[a], x1 = head[b];
  if (bias) {
    x0 += bias[slot * d + a];
    x1 += bias[slot * d + b];
  }
  const DevRow row = kv.rows[t];
  if (slot < shape.num_heads + shape.num_kv_heads) {
    // Angles in double, as the CPU reference: positions reach 1e5+.
    double s, c;
    sincos(double(row.pos) * double(inv_freq[i]), &s, &c);
    const float cs = float(c), sn = float(s);
    const float r0 = x0 * cs - x1 * sn;
    const float r1 = x0 * sn + x1 * cs;
    x0 = r0;
    x1 = r1;
  }
  head[a] = x0;
  head[b] = x1;
  if (slot < shape.num_heads) return;
  const DevSeq& seq = kv.seqs[row.seq];
  const bool is_k = slot < shape.num_heads + shape.num_kv_heads;
  const int32_t g = is_k ? slot - shape.num_heads : slot - shape.num_heads - shape.num_kv_heads;
  const int64_t lh = int64_t(kv.layer) * shape.num_kv_heads + g;
  const int32_t bs = kv.layout.block_size;
  const int32_t page = is_k ? seq.pages.KPage(lh, row.pos, bs) : seq.pages.VPage(lh, row.pos, bs);
  uint16_t* dst = pool + kv.layout.RowOffset(page, row.pos % bs);
  dst[a] = F32ToBf16(x0);
  dst[b] = F32ToBf16(x1);
}

// One thread per (sequence, kv head, element): a running sum down the sequence's new rows.
// qkv as RopeWriteKvKernel's; vsum_rows [T, num_kv_heads·d].
__global__ void VSumKernel(const float* qkv, DevKv kv, float* vsum_rows) {
  const DevSeq& seq = kv.seqs[blockIdx.x];
  const AttnShape& shape = kv.shape;
  const int32_t layer = kv.layer;
  if (!seq.pages.v_sum) return;
  const int32_t d = shape.head_dim;
  const int64_t kv_dim = int64_t(shape.num_kv_heads) * d;
  const int64_t width = int64_t(shape.num_heads) * d + 2 * kv_dim;
  const int64_t v_col = int64_t(shape.num_heads) * d + kv_dim;
  for (int32_t e = threadIdx.x; e < shape.num_kv_heads * d; e += blockDim.x) {
    const int32_t g = e / d, c = e % d;
    float* sum = seq.pages.v_sum + (int64_t(layer) * shape.num_kv_heads + g) * d + c;
    float acc = *sum;
    for (int32_t i = 0; i < seq.num_tokens; ++i) {
      const int64_t row = seq.token_offset + i;
      acc += qkv[row * width + v_col + e];
      if (vsum_rows) vsum_rows[row * kv_dim + e] = acc;
    }
    *sum = acc;
  }
}

// A block per table, a thread per element: the table's V rows summed in position order (what
// VSumKernel added while writing them, but from the stored bf16 rows).
__global__ void SumVRowsKernel(const int32_t* v_pages, int64_t length, KvPoolLayout layout,
                               const uint16_t* pool, float* v_sum) {
  const int64_t t = blockIdx.x;
  const int64_t blocks = (length + layout.block_size - 1) / layout.block_size;
  for (int32_t e = threadIdx.x; e < layout.head_dim; e += blockDim.x) {
    float acc = 0.0f;
    for (int64_t pos = 0; pos < length; ++pos) {
      const int32_t page = v_pages[t * blocks + pos / layout.block_size];
      acc += Bf16ToF32(pool[layout.RowOffset(page, int32_t(pos % layout.block_size)) + e]);
    }
    v_sum[t * layout.head_dim + e] = acc;
  }
}

// One block walks the copies in order. Thread e copies element e of every row, so a row that
// one copy writes and a later one reads is read by the thread that wrote it: program order
// keeps the copies in order, and the barriers are guards only (the emulator's barrier sweep
// passes without them).
__global__ void CopyKvRowsKernel(const KvRowCopy* copies, int32_t n, KvPoolLayout layout,
                                 uint16_t* pool) {
  for (int32_t i = 0; i < n; ++i) {
    const KvRowCopy c = copies[i];
    const uint16_t* src = pool + layout.RowOffset(c.src_page, c.src_row);
    uint16_t* dst = pool + layout.RowOffset(c.dst_page, c.dst_row);
    uint16_t v = 0;
    if (threadIdx.x < layout.head_dim) v = src[threadIdx.x];
    __syncthreads();
    if (threadIdx.x < layout.head_dim) dst[threadIdx.x] = v;
    __syncthreads();
  }
}

// Copies to the host pool (the offload policy): the rows are independent (no copy reads what
// another writes), so a block takes rows_per_block of them, a thread one element each.
__global__ void OffloadKvRowsKernel(const KvRowCopy* copies, int32_t n, KvPoolLayout layout,
                                    const uint16_t* pool, uint16_t* host_pool) {
  const int32_t d = layout.head_dim;
  const int32_t i = blockIdx.x * (blockDim.x / d) + threadIdx.x / d;
  const int32_t e = threadIdx.x % d;
  if (threadIdx.x >= blockDim.x / d * d || i >= n) return;
  const KvRowCopy c = copies[i];
  host_pool[layout.RowOffset(c.dst_page, c.dst_row) + e] = pool[layout.RowOffset(c.src_page, c.src_row) + e];
}

__device__ __forceinline__ uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

__global__ void FillRandomKernel(uint16_t* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = Mix(seed * 0x9e3779b97f4a7c15ull + uint64_t(i));
    // Box-Muller from two 24-bit uniforms in (0, 1].
    const float u1 = (float((h >> 40) & 0xffffff) + 1.0f) * (1.0f / 16777216.0f);
    const float u2 = float((h >> 8) & 0xffffff) * (1.0f / 16777216.0f);
    p[i] = F32ToBf16(scale * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
  }
}

// The greedy pick of each row of logits: the first index of its largest value, NaN never, 0
// when no value is above -inf (scheduler/sampler.cc's ArgMax). A block per row; each thread
// walks its strided share in index order (strict >: the first of equal values stays), then the
// (value, index) pairs meet in shuffles and shared memory, the lower index winning a tie.
constexpr int kArgmaxThreads = 512;
constexpr int32_t kNoIndex = 0x7fffffff;

__device__ __forceinline__ void BetterOf(float& v, int32_t& i, float ov, int32_t oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__global__ void __launch_bounds__(kArgmaxThreads) ArgmaxRowsKernel(const float* logits,
                                                                   int64_t vocab, int32_t* out) {
  __shared__ float s_v[kArgmaxThreads / 32];
  __shared__ int32_t s_i[kArgmaxThreads / 32];
  const float* x = logits + int64_t(blockIdx.x) * vocab;
  float v = -INFINITY;
  int32_t i = kNoIndex;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float xj = x[j];
    if (xj > v) {
      v = xj;
      i = int32_t(j);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    BetterOf(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    s_v[warp] = v;
    s_i[warp] = i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x >> 5); ++w) BetterOf(v, i, s_v[w], s_i[w]);
    out[blockIdx.x] = i == kNoIndex ? 0 : i;
  }
}

int GridFor(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return int(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

}  // namespace

cudaError_t LaunchEmbed(const bf16* table, const int32_t* tokens, int64_t T, int64_t hidden,
                        float* out, cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  EmbedKernel<<<T, 256, 0, stream>>>(table, tokens, hidden, out);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNormBf16(const float* x, const int32_t* rows, const float* w, int64_t T,
                              int64_t n, float eps, bf16* y, cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  RmsNormKernel<uint16_t><<<T, 256, 0, stream>>>(x, rows, w, n, eps, y);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNormF32(const float* x, const int32_t* rows, const float* w, int64_t T,
                             int64_t n, float eps, float* y, cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  RmsNormKernel<float><<<T, 256, 0, stream>>>(x, rows, w, n, eps, y);
  return cudaGetLastError();
}

cudaError_t LaunchSiluMul(const float* gu, int64_t T, int64_t inter, bf16* out,
                          cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  SiluMulKernel<<<GridFor(T * inter, 256), 256, 0, stream>>>(gu, T, inter, out);
  return cudaGetLastError();
}

cudaError_t LaunchF32ToBf16(const float* x, int64_t n, bf16* y, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  F32ToBf16Kernel<<<GridFor(n, 256), 256, 0, stream>>>(x, n, y);
  return cudaGetLastError();
}

cudaError_t LaunchRopeWriteKv(float* qkv, const float* bias, int64_t T, const DevKv& kv,
                              const float* inv_freq, bool interleaved, bf16* pool,
                              cudaStream_t stream) {
  const AttnShape& shape = kv.shape;
  const int64_t n = T * (shape.num_heads + 2 * shape.num_kv_heads) * (shape.head_dim / 2);
  if (n == 0) return cudaSuccess;
  RopeWriteKvKernel<<<(n + 255) / 256, 256, 0, stream>>>(qkv, bias, T, kv, inv_freq,
                                                         interleaved, pool);
  return cudaGetLastError();
}

cudaError_t LaunchVSum(const float* qkv, const DevKv& kv, int32_t num_seqs, float* vsum_rows,
                       cudaStream_t stream) {
  if (num_seqs == 0) return cudaSuccess;
  VSumKernel<<<num_seqs, 256, 0, stream>>>(qkv, kv, vsum_rows);
  return cudaGetLastError();
}

cudaError_t LaunchArgmaxRows(const float* logits, int64_t rows, int64_t vocab, int32_t* out,
                            cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (rows > 0x7fffffff || vocab < 1 || vocab > kNoIndex) return cudaErrorInvalidValue;
  ArgmaxRowsKernel<<<unsigned(rows), kArgmaxThreads, 0, stream>>>(logits, vocab, out);
  return cudaGetLastError();
}

cudaError_t LaunchFillRandomBf16(bf16* p, int64_t n, uint64_t seed, float scale,
                                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FillRandomKernel<<<GridFor(n, 256), 256, 0, stream>>>(p, n, seed, scale);
  return cudaGetLastError();
}

cudaError_t LaunchSumVRows(const int32_t* v_pages, int32_t tables, int64_t length,
                           const KvPoolLayout& layout, const bf16* pool, float* v_sum,
                           cudaStream_t stream) {
  if (tables == 0) return cudaSuccess;
  const int threads = ((layout.head_dim + 31) / 32) * 32;
  SumVRowsKernel<<<tables, threads, 0, stream>>>(v_pages, length, layout,
                                                 reinterpret_cast<const uint16_t*>(pool), v_sum);
  return cudaGetLastError();
}

cudaError_t LaunchCopyKvRows(const KvRowCopy* copies, int32_t n, const KvPoolLayout& layout,
                             bf16* pool, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = ((layout.head_dim + 31) / 32) * 32;
  CopyKvRowsKernel<<<1, threads, 0, stream>>>(copies, n, layout, pool);
  return cudaGetLastError();
}

cudaError_t LaunchOffloadKvRows(const KvRowCopy* copies, int32_t n, const KvPoolLayout& layout,
                                const bf16* pool, bf16* host_pool, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int32_t rows_per_block = std::max(1, 256 / layout.head_dim);
  const int threads = rows_per_block * layout.head_dim;
  const int blocks = (n + rows_per_block - 1) / rows_per_block;
  OffloadKvRowsKernel<<<blocks, threads, 0, stream>>>(copies, n, layout,
                                                      reinterpret_cast<const uint16_t*>(pool),
                                                      reinterpret_cast<uint16_t*>(host_pool));
  return cudaGetLastError();
}

namespace {

// Grid (copy, slice): the slices of a copy stride over its elements.
__global__ void TableCopiesKernel(const DevTableCopy* copies, const int32_t* src) {
  const DevTableCopy c = copies[blockIdx.x];
  const int64_t n = int64_t(c.width) * c.rows;
  for (int64_t i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.y) * blockDim.x) {
    const int64_t r = i / c.width, e = i % c.width;
    c.dst[r * c.dst_stride + e] = src[c.src_offset + i];
  }
}

}  // namespace

cudaError_t LaunchTableCopies(const DevTableCopy* copies, int32_t n, int64_t largest,
                              const int32_t* src, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  // Most copies are a column or a few rows (one block each); arrays sent anew (a new
  // sequence, a new stride) are up to a few MB: at most 8 slices of 256 threads each.
  const unsigned slices = static_cast<unsigned>(std::clamp<int64_t>((largest + 4095) / 4096, 1, 8));
  TableCopiesKernel<<<dim3(n, slices), 256, 0, stream>>>(copies, src);
  return cudaGetLastError();
}

}  // namespace thetaserve::kernels::cuda
