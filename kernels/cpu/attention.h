// Causal GQA attention over the paged KV cache, on the CPU.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/paged_kv.h"

namespace thetaserve::kernels::cpu {

struct AttentionShape {
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;  // 1/sqrt(head_dim)
};

// Writes K and V rows of this step's tokens into their pages for `layer`.
void WriteKv(const ForwardBatch& batch, const AttentionShape& shape, int64_t layer,
             const float* k,      // [num_tokens, num_kv_heads * head_dim]
             const float* v,      // [num_tokens, num_kv_heads * head_dim]
             const KvPoolLayout& layout,
             float* pool);        // [num_pages, block_size, head_dim]

// o = softmax(q·Kᵀ·scale, causal) · V for every new token of every sequence in `batch`.
// Token t of a sequence at position p attends to positions [0, p].
void PagedAttention(ThreadPool& pool, const ForwardBatch& batch, const AttentionShape& shape,
                    int64_t layer,
                    const float* q,         // [num_tokens, num_heads * head_dim]
                    const KvPoolLayout& layout,
                    const float* kv_pool,   // [num_pages, block_size, head_dim]
                    float* o);              // [num_tokens, num_heads * head_dim]

}  // namespace thetaserve::kernels::cpu
