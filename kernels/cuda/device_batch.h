// A step's batch on the device: page tables, per-row positions, VMC sums and hit marks,
// uploaded in one copy from a pinned staging buffer; sums, hits and retained mass go back after the step.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_memory.h"

namespace thetaserve::kernels::cuda {

class DeviceBatch {
 public:
  // `num_tables` = layers × KV heads. Hits are copied for positions below each sequence's
  // end (start_pos + num_tokens), V sums whole.
  // Hit marks and retained mass travel only `with_hits` (Top-θ: dense attention never writes
  // them).
  absl::Status Upload(const ForwardBatch& batch, int32_t num_tables, int32_t head_dim,
                      cudaStream_t stream, bool with_hits = true);
  // Copies the sequences' V sums and hit marks back into the host arrays they came from
  // (synchronizes the stream).
  absl::Status Download(cudaStream_t stream);

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
  struct Back {  // a region to copy back: rows × width elements of `elem` bytes
    void* host;
    size_t host_stride;  // bytes
    size_t offset;       // in the staging and device buffers
    size_t width;        // bytes per row
    size_t rows;
  };
  PinnedBuffer staging_;
  DeviceBuffer device_;
  std::vector<Back> back_;
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
