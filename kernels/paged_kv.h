// Plain views of the paged KV cache that kernels read and write. The cache module owns page
// ids and page tables; the backend owns the storage; the engine fills these structs.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define TS_HOST_DEVICE __host__ __device__
#else
#define TS_HOST_DEVICE
#endif

namespace thetaserve::kernels {

// Storage of the page pool: page p holds `block_size` rows of `head_dim` floats, for one
// (layer, KV head) of one sequence. K and V pages come from the same pool.
struct KvPoolLayout {
  int32_t block_size = 16;
  int32_t head_dim = 64;
  int64_t num_pages = 0;

  TS_HOST_DEVICE size_t PageElems() const { return size_t(block_size) * head_dim; }
  TS_HOST_DEVICE size_t RowOffset(int32_t page, int32_t row) const {
    return (size_t(page) * block_size + row) * head_dim;
  }
};

// Page tables of one sequence. Table index lh = layer * num_kv_heads + kv_head.
// Position `pos` of (layer, kv head) lives in page table[lh * stride + pos / block_size],
// row pos % block_size.
struct SeqPageTables {
  const int32_t* k_pages = nullptr;  // [num_layers * num_kv_heads, stride]
  const int32_t* v_pages = nullptr;  // [num_layers * num_kv_heads, stride]
  int32_t stride = 0;                // pages per (layer, kv head) row of the tables

  TS_HOST_DEVICE int32_t KPage(int64_t lh, int64_t pos, int32_t block_size) const {
    return k_pages[lh * stride + pos / block_size];
  }
  TS_HOST_DEVICE int32_t VPage(int64_t lh, int64_t pos, int32_t block_size) const {
    return v_pages[lh * stride + pos / block_size];
  }
};

}  // namespace thetaserve::kernels
