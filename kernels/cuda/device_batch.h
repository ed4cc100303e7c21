// A step's batch on the device: per-row positions, V sums, the windows of hit marks and
// retained mass, and the sequences' page tables, uploaded in one copy from a pinned staging
// buffer; sums, marks and mass go back after the step.
//
// Page tables of a sequence with an identity (SeqChunk::tables.id, kernels/paged_kv.h) stay
// on the device between steps: a step sends only the K and V-tail columns and the sparse and
// host-store rows added since the last one, and an array whole only when its epoch changed (a new stride, the
// V tail shifted by compaction). A copy a step does not use is freed. Sequences without an
// identity send their tables whole every step. Either way the tables a decode step sends no
// longer grow with the context.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_memory.h"

namespace thetaserve::kernels::cuda {

class DeviceBatch {
 public:
  // `num_tables` = layers × KV heads. V sums are copied whole; hit marks and retained mass
  // (each when the sequence has them) only for the window [hits_begin, end) of every table,
  // end = start_pos + num_tokens, and only `with_hits` (Top-θ: dense attention never writes
  // them).
  absl::Status Upload(const ForwardBatch& batch, int32_t num_tables, const KvPoolLayout& layout,
                      cudaStream_t stream, bool with_hits = true);
  // Copies the sequences' V sums, hit marks and retained mass back into the host arrays they
  // came from (synchronizes the stream).
  absl::Status Download(cudaStream_t stream);

  // Upload's host-side half, no device needed: lays out the copy, decides what the retained
  // table copies need, and returns the bytes sent to the device. host_rows() and host_seqs()
  // are filled (host pointers in the page tables until Upload). It records the retained
  // copies as updated: alone it is for tests (which apply table_copies() themselves); a
  // backend calls Upload, which plans and sends.
  size_t Plan(const ForwardBatch& batch, int32_t num_tables, const KvPoolLayout& layout,
              bool with_hits);
  // Bytes the last plan sends, and copies back after the step.
  size_t upload_bytes() const { return used_; }
  size_t download_bytes() const;

  // The retained copies, for tests that check the plan without a device.
  enum class Array : uint8_t { kK, kV, kSparsePages, kSparsePos, kHostPages, kHostPos };
  // Copy `rows` × `width` int32 from the staging buffer (at byte `src`, rows back to back)
  // into array `array` of sequence `id`, row r at element dst + r · dst_stride.
  struct TableCopy {
    uint64_t id;
    Array array;
    size_t dst;
    int64_t dst_stride;
    size_t src;
    int32_t width, rows;
  };
  // An array to (re)allocate with `elems` int32 before the copies (its contents are lost).
  struct TableAlloc {
    uint64_t id;
    Array array;
    size_t elems;
  };
  const std::vector<TableCopy>& table_copies() const { return copies_; }
  const std::vector<TableAlloc>& table_allocs() const { return allocs_; }
  // Writes what the plan sends (Plan's bytes) into `host`; the regions Upload fills with
  // device pointers (rows, sequences, copy list) are left as they are.
  void FillStaging(uint8_t* host) const;
  int64_t num_retained() const { return static_cast<int64_t>(mirrors_.size()); }
  // A retained copy that this many steps in a row did not use is freed.
  static constexpr uint64_t kRetainSteps = 4;

  const DevSeq* seqs() const { return seqs_; }
  const DevRow* rows() const { return rows_; }
  const int32_t* tokens() const { return tokens_; }
  int32_t num_seqs() const { return static_cast<int32_t>(host_seqs_.size()); }
  int32_t num_rows() const { return static_cast<int32_t>(host_rows_.size()); }
  const std::vector<DevRow>& host_rows() const { return host_rows_; }
  const std::vector<DevSeq>& host_seqs() const { return host_seqs_; }  // device pointers inside
  int64_t max_len() const { return max_len_; }
  bool any_vsum() const { return any_vsum_; }

 private:
  struct Back {  // a region to copy back: rows × width bytes
    void* host;
    size_t host_stride;  // bytes
    size_t offset;       // in the staging and device buffers
    size_t width;        // bytes per row
    size_t rows;
  };
  struct Piece {  // a region to copy to the device: rows × width bytes from src
    const void* src;  // null: filled by Upload
    size_t src_stride, width, rows;  // bytes
    size_t offset;
  };
  static constexpr size_t kNone = ~size_t(0);
  struct SeqOffsets {  // where each of a sequence's arrays lies in the buffers
    size_t k = kNone, v = kNone, sp = kNone, spos = kNone, scount = kNone, hp = kNone,
           hpos = kNone, hcount = kNone, vsum = kNone, hits = kNone, mass = kNone;
    uint64_t retained = 0;  // id of the retained copy holding its tables (0: none)
  };
  // A compact row store of a sequence (the sparse store, the host store) as the host has it.
  struct StoreView {
    const int32_t* pages;
    const int32_t* pos;
    const int32_t* count;  // null: no such store
    int32_t page_stride, pos_stride;
  };
  // Its copy on the device, and what it holds.
  struct StoreMirror {
    bool has = false;
    uint64_t epoch = 0;
    std::vector<int32_t> rows;  // [tables]: rows sent
    DeviceBuffer pages;         // [tables, page_stride] page ids
    DeviceBuffer pos;           // [tables, pos_stride] positions
  };
  // A sequence's tables kept on the device, and what they hold.
  struct Retained {
    TableVersion version;
    int32_t v_blocks = 0;
    DeviceBuffer k, v;  // [tables, stride] page ids
    StoreMirror sparse, host;
    uint64_t step = 0;  // the last step that used it
  };
  // Reserves `rows` × `width` bytes of the staging buffer for a copy from src (src_stride
  // bytes between rows); returns its offset.
  size_t Add(const void* src, size_t src_stride, size_t width, size_t rows);
  void PlanTables(const SeqChunk& c, int32_t num_tables, int32_t block_size, SeqOffsets* so);
  DeviceBuffer& Buffer(Retained& r, Array array);

  PinnedBuffer staging_;
  DeviceBuffer device_;
  std::vector<Piece> pieces_;
  std::vector<SeqOffsets> seq_offsets_;
  size_t tokens_off_ = 0, rows_off_ = 0, seqs_off_ = 0, copies_off_ = 0;
  std::vector<Back> back_;
  std::vector<TableCopy> copies_;
  std::vector<TableAlloc> allocs_;
  std::unordered_map<uint64_t, Retained> mirrors_;
  uint64_t step_ = 0;
  std::vector<DevSeq> host_seqs_;
  std::vector<DevRow> host_rows_;
  const DevSeq* seqs_ = nullptr;
  const DevRow* rows_ = nullptr;
  const int32_t* tokens_ = nullptr;
  size_t used_ = 0;
  int64_t max_len_ = 0;
  bool any_vsum_ = false;
};

}  // namespace thetaserve::kernels::cuda
