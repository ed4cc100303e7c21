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
#include "kernels/cuda/split_theta.cuh"

namespace thetaserve::kernels::cuda {
namespace {

// Dense split: scores, chunk max and Σe, and Σ e·V over the chunk.
// Top-θ pass 1: scores to the workspace (EncodeScore), chunk max and Σe; no V.
// kK: how K is read (per thread, per quad, or staged: through shared memory, ScoresStaged,
// its tiles after the scores). One split's work; SplitPass1Kernel and SplitFusedKernel run it,
// smem their dynamic shared memory (16-byte aligned: cp.async and uint4 reads of the ring).
template <int D, int GT, KLoad kK>
__device__ __forceinline__ void SplitPass1(const SplitArgs& a, int32_t split_index,
                                           float* smem) {
  constexpr int kG = GT > 0 ? GT : kMaxGroup;  // compile-time group size when known
  constexpr bool kStaged = kK == KLoad::kStaged;
  __shared__ float scratch[32];
  const int32_t G = GT > 0 ? GT : a.kv.shape.num_heads / a.kv.shape.num_kv_heads;
  const auto [r, t, row, L, split, j0, g, first_head, lh] = ThisSplit(a, G, split_index);
  if (j0 >= L) return;
  const DevSeq& seq = a.kv.seqs[row.seq];
  const int32_t n = min(a.chunk, L - j0);

  float* sc = smem + G * D;     // [G, chunk]; later the row-group reduction
  ScoreSplit<D, GT, kK>(a, t, first_head, seq, lh, j0, n, G, smem);
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
  extern __shared__ __align__(16) float smem[];
  SplitPass1<D, GT, kK>(a, blockIdx.x, smem);
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

template <int D, int GT, KLoad kK>
__global__ void __launch_bounds__(kThreads, (GT > 0 && GT <= 4) ? 8 : 4)
    SplitPass2Kernel(SplitArgs a) {
  extern __shared__ __align__(16) float smem[];
  SplitPass2<D, GT, kK>(a, blockIdx.x, smem);
}

template <int D, int GT, KLoad kK>
__global__ void __launch_bounds__(kThreads, Pass1MinBlocks<GT, kK>())
    SplitOnePassKernel(SplitArgs a) {
  extern __shared__ __align__(16) float smem[];
  SplitOnePass<D, GT, kK>(a, blockIdx.x, smem);
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
  extern __shared__ __align__(16) float smem[];
  // (The barriers between one split and the next are not needed by the passes as they are —
  // each first writes shared memory after a barrier that follows its last reads of it, and
  // the emulated tests pass without them — and keep a change to either end from racing.)
  for (int32_t split = blockIdx.x; split < a.ws.max_splits; split += gridDim.x) {
    if (split != int32_t(blockIdx.x)) __syncthreads();
    SplitPass1<D, GT, kK>(a, split, smem);
  }
  cooperative_groups::this_cluster().sync();
  for (int32_t split = blockIdx.x; split < a.ws.max_splits; split += gridDim.x) {
    if (split != int32_t(blockIdx.x)) __syncthreads();
    SplitPass2<D, GT, kK>(a, split, smem);
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

// THETASERVE_ATTN_K_LOAD's values.
constexpr KnobValue<KLoad> kKLoads[] = {{"thread", KLoad::kPerThread},
                                        {"staged", KLoad::kStaged},
                                        {"quad", KLoad::kQuad},
                                        {"auto", KLoad::kAuto}};

KLoad DefaultKLoad() { return KnobFromEnv("THETASERVE_ATTN_K_LOAD", kKLoads, KLoad::kAuto); }

const char* KLoadName(KLoad k) { return KnobName(k, kKLoads); }

ThetaPasses DefaultThetaPasses() {
  static constexpr KnobValue<ThetaPasses> kPasses[] = {
      {"split", ThetaPasses::kSplit}, {"fused", ThetaPasses::kFused}, {"auto", ThetaPasses::kAuto}};
  return KnobFromEnv("THETASERVE_ATTN_THETA", kPasses, ThetaPasses::kAuto);
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
