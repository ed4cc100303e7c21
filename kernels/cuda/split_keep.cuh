// Top-θ's keep test in the split kernels: the row's threshold from every split's pass-1
// partials (WarpThreshold), the decision on 16-bit scores against per-split bands (RowKeep,
// exact scores near a band), the stored V rows of a (sequence, layer, KV head) (VStores), and
// the gather of a split's kept rows into its partials (GatherListed).
#pragma once

#include "kernels/cuda/split_scores.cuh"

namespace thetaserve::kernels::cuda {

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
// read where null: stored rows are then the positions). smem: the kernel's dynamic shared
// memory, where the row groups' sums meet (ReduceRowGroups).
template <int D, int GT, typename Weight>
__device__ __forceinline__ void GatherListed(
    const SplitArgs& a, const SplitBlock& b, int32_t G, const uint32_t* list_row, int32_t seg,
    int32_t listed, const float (&dk)[GT > 0 ? GT : kMaxGroup],
    const float (&kc)[GT > 0 ? GT : kMaxGroup], unsigned host_kept,
    const unsigned long long* retained, Weight weight, float* smem) {
  constexpr int kG = GT > 0 ? GT : kMaxGroup;
  constexpr int kWarps = kThreads / 32;
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

}  // namespace thetaserve::kernels::cuda
