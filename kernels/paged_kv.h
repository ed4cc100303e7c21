// Plain views of the paged KV cache that kernels read and write. The cache module owns page
// ids and page tables; the backend owns the storage; the engine fills these structs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/mass_units.h"

#if defined(__CUDACC__)
#define TS_HOST_DEVICE __host__ __device__
#else
#define TS_HOST_DEVICE
#endif

namespace thetaserve::kernels {

// Storage of the page pool: page p holds `block_size` rows of `head_dim` elements of the KV
// dtype (bf16 on the GPU; f32, f16, fp8 or q8_0 blocks on the CPU, whose StoredLayout widens
// head_dim to a row's bytes), for one (layer, KV head) of one sequence: a pool is
// [num_pages, block_size, head_dim], row r of page p at RowOffset(p, r). K and V pages come from the same pool. The host pool
// (the offload policy's V rows, in host memory) has pages of the same shape, ids of its own.
struct KvPoolLayout {
  int32_t block_size = 16;
  int32_t head_dim = 64;
  int64_t num_pages = 0;
  int64_t num_host_pages = 0;

  TS_HOST_DEVICE size_t PageElems() const { return size_t(block_size) * head_dim; }
  TS_HOST_DEVICE size_t RowOffset(int32_t page, int32_t row) const {
    return (size_t(page) * block_size + row) * head_dim;
  }
};

// Page tables of one sequence. Table index lh = layer * num_kv_heads + kv_head.
// Position `pos` of (layer, kv head) lives in page table[lh * stride + pos / block_size],
// row pos % block_size.
//
// V has two parts per (layer, kv head): a dense tail holding positions >= v_tail_start (a
// multiple of block_size; tail page (pos - v_tail_start) / block_size), and a compact sparse
// store of older rows that attention retained, row r at sparse page r / block_size with its
// position in v_sparse_pos (ascending). Under the offload policy a third part, the host
// store, holds the older rows the sparse store did not keep, in the same layout with pages of
// the host pool. Positions below v_tail_start in neither store were dropped. Dense V:
// v_tail_start = 0 and no sparse rows.
struct SeqPageTables {
  const int32_t* k_pages = nullptr;  // [num_layers * num_kv_heads, stride]
  const int32_t* v_pages = nullptr;  // [num_layers * num_kv_heads, stride] (the V tail)
  int32_t stride = 0;                // pages per (layer, kv head) row of the tables
  int32_t v_tail_start = 0;

  const int32_t* v_sparse_pages = nullptr;  // [tables, sparse_stride]
  const int32_t* v_sparse_pos = nullptr;    // [tables, sparse_pos_stride]
  const int32_t* v_sparse_count = nullptr;  // [tables]
  int32_t sparse_stride = 0;
  int32_t sparse_pos_stride = 0;

  const int32_t* v_host_pages = nullptr;  // [tables, host_stride], pages of the host pool
  const int32_t* v_host_pos = nullptr;    // [tables, host_pos_stride]
  const int32_t* v_host_count = nullptr;  // [tables]; null: no host store
  int32_t host_stride = 0;
  int32_t host_pos_stride = 0;

  // Running fp32 sums of every V row ever written (dropped ones too), for VMC.
  float* v_sum = nullptr;  // [tables, head_dim]; null: no VMC
  // Hits: per row, the position of the latest query that retained it (-1: none yet). The
  // sparse policy keeps rows retained by the last queries before they leave the tail.
  // Recorded only for positions p with hits_begin <= p < hits_stride, at
  // hits[lh * hits_stride + p - hits_begin] for table lh: compaction reads only the tail's
  // rows, so the engine starts the window at v_tail_start (its arrays hold hits_stride
  // positions per table) and a device copies O(window), not O(context).
  int32_t* hits = nullptr;  // [tables, hits_stride]; null: not recorded
  int32_t hits_stride = 0;
  int32_t hits_begin = 0;
  // Retained mass: per row, the summed probability (over queries and the group's heads) with
  // which attention retained it; the sparse policy's mass budget ranks rows by it. Same
  // layout as `hits` (stride and window); null: not recorded.
  // Both are written by many threads of one attention call at once (the CPU's workers, a
  // kernel's blocks): every write is an atomic max (hits) or add (hit_mass, in fixed point:
  // base/mass_units.h, so that the sums do not depend on the order of the adds).
  MassUnits* hit_mass = nullptr;

  TS_HOST_DEVICE int32_t KPage(int64_t lh, int64_t pos, int32_t block_size) const {
    return k_pages[lh * stride + pos / block_size];
  }
  // The tail page of `pos` (pos >= v_tail_start).
  TS_HOST_DEVICE int32_t VPage(int64_t lh, int64_t pos, int32_t block_size) const {
    return v_pages[lh * stride + (pos - v_tail_start) / block_size];
  }
  TS_HOST_DEVICE int32_t SparseCount(int64_t lh) const {
    return v_sparse_count ? v_sparse_count[lh] : 0;
  }
  TS_HOST_DEVICE int32_t HostCount(int64_t lh) const {
    return v_host_count ? v_host_count[lh] : 0;
  }
};

// Identity and versions of one sequence's page tables, so that a device can keep its own copy
// and receive only what changed (kernels/cuda/device_batch.h). id 0: no identity; the tables
// travel whole every step. An id is never reused (a sequence whose pages were all released
// gets a new one). While the id and an array's epoch stay the same, that array only grows: the
// K and V-tail tables by whole columns (the first k_blocks of every K row are set; V-tail rows
// hold k_blocks - v_tail_start / block_size), the sparse and host stores by rows appended to
// each table.
struct TableVersion {
  uint64_t id = 0;
  uint64_t k_epoch = 0, v_epoch = 0, sparse_epoch = 0, host_epoch = 0;
  int32_t k_blocks = 0;
};

// One V row copied inside the pool (sparse-store compaction), or from the pool to the host
// pool (Backend::OffloadKvRows: dst_page is a host page).
struct KvRowCopy {
  int32_t src_page, src_row, dst_page, dst_row;
};

}  // namespace thetaserve::kernels
