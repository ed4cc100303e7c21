// Causal GQA attention over the paged KV cache, on the CPU: dense, or Top-θ (thresholds,
// SDC, VMC, sparse V store, hit bits) following DESIGN.md §4–5.
#pragma once

#include <cstdint>

#include "base/check.h"
#include "kernels/backend.h"
#include "kernels/cpu/kv_element.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/paged_kv.h"
#include "kernels/top_theta.h"

namespace thetaserve::kernels::cpu {

struct AttentionShape {
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;  // 1/sqrt(head_dim)
};

// Both functions take the pool in any KV element type T (float, F16, Bf16, Fp8E4M3, Fp8E5M2,
// Q8_0; kv_element.h), instantiated for those six in attention.cc. Rows are rounded (q8_0:
// quantized) to T when written and widened exactly when read, so a 16- or 8-bit pool gives the
// same bits as an f32 pool holding the values read back. `layout` addresses the pool in
// elements of T: StoredLayout<T> of the backend's (a q8_0 row is longer than head_dim).
template <typename T>
KvPoolLayout StoredLayout(KvPoolLayout layout) {
  if constexpr (kRowQuantized<T>) {
    CHECK_EQ(layout.head_dim % kQ8BlockElems, 0) << "q8_0 rows need a head_dim multiple of 32";
  }
  layout.head_dim = static_cast<int32_t>(RowUnits<T>(layout.head_dim));
  return layout;
}

// Writes K and V rows of this step's tokens into their pages for `layer`, adds the stored V
// rows to the sequences' running sums, and leaves in `vsum_rows` each token's running V sum
// including itself (what VMC's mean over rows 0..pos needs).
template <typename T>
void WriteKv(const ForwardBatch& batch, const AttentionShape& shape, int64_t layer,
             const float* k,      // [num_tokens, num_kv_heads * head_dim]
             const float* v,      // [num_tokens, num_kv_heads * head_dim]
             const KvPoolLayout& layout,
             T* pool,             // [num_pages, block_size, RowUnits<T>(head_dim)]
             float* vsum_rows);   // [num_tokens, num_kv_heads * head_dim] or nullptr

// One layer's tensors for PagedAttention: the queries, the pool they attend over (in
// elements of T), and where the output goes.
template <typename T>
struct LayerAttention {
  int64_t layer = -1;                // required: θ, k and the counters are the layer's
  const float* q = nullptr;          // [num_tokens, num_heads * head_dim]
  KvPoolLayout layout;               // StoredLayout<T> of the backend's
  const T* kv_pool = nullptr;        // [num_pages, block_size, row units]
  const T* host_pool = nullptr;      // [num_host_pages, block_size, row units] or null
  const float* vsum_rows = nullptr;  // [num_tokens, num_kv_heads * head_dim] (WriteKv's) or null
  float* o = nullptr;                // [num_tokens, num_heads * head_dim]
};

// o = attention(q, K, V) for every new token of every sequence in `batch`; token t of a
// sequence at position p attends to positions [0, p]. With an active Top-θ config, rows longer
// than the layer's k keep only x_j > θ and are compensated (VMC reads `vsum_rows`); counters
// go to batch.stats. Rows of a sequence's host store (the offload policy) are read from
// `host_pool`.
//
// Long decode rows may be split across threads by key chunks (SplitsDecodeRows, below); the
// results are the same bits either way, and the return value says whether they were. kNever
// and kAlways (every row long enough, whatever the balance or the number of threads) are for
// checks and benchmarks.
enum class DecodeSplit { kAuto, kNever, kAlways };
template <typename T>
bool PagedAttention(ThreadPool& pool, const ForwardBatch& batch, const AttentionShape& shape,
                    const TopThetaConfig& config, const LayerAttention<T>& io,
                    DecodeSplit split = DecodeSplit::kAuto);

// Whether PagedAttention, with `threads` threads, works this batch's long decode rows (one
// token, at least 2,048 keys) 512 keys at a time across the threads (flash-decoding), rather
// than each unit (one KV head's query heads for one tile of tokens) on one thread. kAuto: when
// the busiest thread, with the units handed out whole, would have more than a fifth more work
// than with those rows spread over the threads — a few long sequences (batch 1 has as many
// units as KV heads, fewer than most machines' threads) or one long sequence beside short
// ones — and the split rows' scores take no more memory than the threads' own score buffers
// may (in addition to them). The results are the same bits either way: a row's keys are
// always summed in chunks of 512.
bool SplitsDecodeRows(const ForwardBatch& batch, const AttentionShape& shape, int threads,
                      DecodeSplit split = DecodeSplit::kAuto);

}  // namespace thetaserve::kernels::cpu
