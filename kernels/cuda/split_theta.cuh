// A Top-θ split's work after pass 1 (SplitPass2: keep test over the 16-bit scores, hit marks,
// gather) and in one pass for pre-softmax tables (SplitOnePass); attention.cu's kernels run
// them (SplitPass2Kernel, SplitFusedKernel, SplitOnePassKernel).
#pragma once

#include "kernels/cuda/split_keep.cuh"

namespace thetaserve::kernels::cuda {

// A warp's walk over its kept list (entries warp * seg + kl, kl < listed), a lane per listed
// row: each(k, dk, kc) rewrites entry k into its V row's place in the pools (kHostRow: the host
// store), adds the row's weight per head to dk[h] (for D_kept) and its kept heads to kc[h], says
// whether the row comes from the host store. dk and kc (kG each) start at zero here; returns
// this thread's count of host-store rows. GatherListed takes all three.
template <int kG, typename Each>
__device__ __forceinline__ unsigned WalkKeptList(int warp, int lane, int seg, int32_t listed,
                                                 float* dk, float* kc, Each&& each) {
#pragma unroll
  for (int h = 0; h < kG; ++h) dk[h] = kc[h] = 0.0f;
  unsigned host_kept = 0;
  for (int32_t kl = lane; kl < listed; kl += 32) {
    host_kept += each(warp * seg + kl, dk, kc);
  }
  return host_kept;
}

// Top-θ pass 2 over one split: positions [j0, j0 + chunk) for hit marks and the retained
// count, and stored V rows [i0, i0 + chunk) (sparse store first, then the host store, then the
// tail) for the gather of retained rows. kK: how pass 1 read K (ExactScore follows its order).
// One split's work; SplitPass2Kernel and SplitFusedKernel run it, smem their dynamic shared
// memory.
template <int D, int GT, KLoad kK>
__device__ __forceinline__ void SplitPass2(const SplitArgs& a, int32_t split_index,
                                             float* smem) {
  constexpr int kG = GT > 0 ? GT : kMaxGroup;  // compile-time group size when known
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
  // Head h's score of key j at a.ws.scores[srow + h · stride + j], in 32 bits
  // (CudaAttention::Prepare keeps a launch's scores under 2^31): with 64-bit offsets the
  // compiler, short of registers, rebuilt each load's address from the kernel's arguments
  // (~14 instructions a load, 12 loads per thread per batch of rows).
  const int32_t stride = int32_t(a.ws.score_stride);
  const int32_t srow = int32_t(r * a.kv.shape.num_heads + first_head) * stride;
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
  MassUnits* hit_mass =
      seq.pages.hit_mass ? seq.pages.hit_mass + lh * seq.pages.hits_stride : nullptr;
  if (tail > 0) {
    const int32_t n = min(a.chunk, L - j0);
    unsigned long long retained = 0;
    for (int32_t base = 0; base < n; base += step) {
      uint16_t q[kRowsPerBatch<kG>][kG];
#pragma unroll
      for (int b = 0; b < kRowsPerBatch<kG>; ++b) {
        const int32_t jl = base + b * int32_t(blockDim.x) + int32_t(threadIdx.x);
#pragma unroll
        for (int h = 0; h < kG; ++h) {
          q[b][h] = h < G && jl < n ? a.ws.scores[srow + h * stride + (j0 + jl)] : 0;
        }
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
              atomicAdd(hit_mass + (j - mark_from), ToMassUnits(mass));
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
      for (int h = 0; h < kG; ++h) {
        q[b][h] = h < G && jb[b] >= 0 ? a.ws.scores[srow + h * stride + jb[b]] : 0;
      }
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
  const unsigned host_kept =
      WalkKeptList<kG>(warp, lane, seg, listed, dk, kc, [&](int k, float* d_kept, float* n_kept) {
    const uint32_t entry = list_row[k];
    const int32_t i = int32_t(entry & ~kStrongRow);
    const bool host = i >= sparse_vis && i < below;
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
        d_kept[h] += e;
        n_kept[h] += kept ? 1.0f : 0.0f;
        mass += e * st.inv_d[h];
      }
    }
    // Marks here only without a sparse store (then stored row i is position i); with one, the
    // positions loop above marked them.
    if (tail == 0 && i >= mark_from) {
      if (hits && (entry & kStrongRow)) atomicMax(hits + (i - mark_from), row.pos);
      if (hit_mass) atomicAdd(hit_mass + (i - mark_from), ToMassUnits(mass));
    }
    return host;
  });

  // ...then the gather of the listed rows, weighted by e, and the split's partials.
  GatherListed<D, GT>(a, blk, G, list_row, seg, listed, dk, kc, host_kept,
                      tail > 0 ? &s_retained : nullptr,
                      [&](int at, int h) { return list_e[at * G + h]; }, smem);
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
// Staged K's ring, after the scores, is dead before the flags are written. SplitOnePassKernel
// runs it, smem its dynamic shared memory.
template <int D, int GT, KLoad kK>
__device__ __forceinline__ void SplitOnePass(const SplitArgs& a, int32_t split_index,
                                               float* smem) {
  constexpr int kG = GT > 0 ? GT : kMaxGroup;  // compile-time group size when known
  constexpr int kWarps = kThreads / 32;
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
  ScoreSplit<D, GT, kK>(a, t, first_head, seq, lh, j0, n, G, smem);  // ends with a barrier

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
  const unsigned host_kept =
      WalkKeptList<kG>(warp, lane, seg, listed, dk, kc, [&](int k, float* d_kept, float* n_kept) {
    const int32_t il = int32_t(list_row[k]), jl = list_j[k];
    const bool host = il >= ns && il < ns + nh;
    list_row[k] = il < ns        ? vs.SparseRow(sa + il)
                  : il < ns + nh ? vs.HostRow(ha + (il - ns))
                                 : vs.TailRow(j0 + jl);
    const uint32_t f = flags[jl];
#pragma unroll
    for (int h = 0; h < kG; ++h) {
      if (h < G) {
        d_kept[h] += sc[h * a.chunk + jl];
        n_kept[h] += float(f >> h & 1u);
      }
    }
    return host;
  });

  // ...then the gather of the listed rows, weighted by e, and the split's partials.
  GatherListed<D, GT>(a, blk, G, list_row, seg, listed, dk, kc, host_kept, &s_retained,
                      [&](int at, int h) { return sc[h * a.chunk + list_j[at]]; }, smem);
}

}  // namespace thetaserve::kernels::cuda
