// Host side of the GPU attention of one step: which rows take the split (flash-decoding)
// kernels and which the tiled prefill kernel, the workspace, Top-θ's per-row thresholds, and
// the counters that become AttentionStats. Used by the CUDA backend and the GPU tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_batch.h"
#include "kernels/cuda/device_memory.h"

namespace thetaserve::kernels::cuda {

// The key length a step's split plan (chunk, splits) and Top-θ's score rows are sized for: the
// longest split row's, rounded up to a multiple of 256 keys, and past 4,096 keys to a multiple
// of an eighth of the power of two at or below it (at most 255 keys more, or 12.5% past 4,096;
// the blocks past a row's end return at once). Decode steps replay a CUDA graph keyed by the plan; sized from the exact
// length, the key changed every 4 tokens under Top-θ (the score stride) and every chunk under
// dense attention, and each change cost a capture.
int64_t PlannedLength(int64_t max_len);

class CudaAttention {
 public:
  explicit CudaAttention(int num_sms) : num_sms_(num_sms) {}

  // Plans the step: single-token (decode) rows go to the split kernels and prefill chunks to
  // the tiled kernels (dense, or Top-θ's unless set_theta_prefill says split: then Top-θ's
  // chunks go to the split kernels a row at a time), with θ (and the offline SDC ratio) of
  // every layer, row and head computed here from the table.
  absl::Status Prepare(const ForwardBatch& batch, const DeviceBatch& db, const AttnShape& shape,
                       int32_t num_layers, const TopThetaConfig& config, cudaStream_t stream);

  // o [T, num_heads·d] = attention of layer `layer` for every row of the step.
  absl::Status Run(int32_t layer, const DeviceBatch& db, const float* q, int64_t q_stride,
                   const KvPoolLayout& layout, const bf16* pool, const float* vsum_rows,
                   float* o, cudaStream_t stream);

  // Adds this step's counters to `stats` (synchronizes the stream when Top-θ counted).
  absl::Status Finish(AttentionStats* stats, cudaStream_t stream);

  const SplitPlan& plan() const { return plan_; }
  // For tests: the split rows (device), how many run per launch, and the workspace, which
  // holds the last launch's pass-1 partials and Top-θ scores after Run.
  const int32_t* row_ids() const { return row_ids_; }
  int32_t num_split_rows() const { return num_split_rows_; }
  int32_t row_batch() const { return row_batch_; }
  const AttentionWorkspace& workspace() const { return ws_; }
  // How pass 1 reads K from the next Prepare on (default: DefaultKLoad()).
  void set_k_load(KLoad k) { k_load_ = k; }
  // How Top-θ's passes run from the next Prepare on (default: DefaultThetaPasses()).
  void set_theta_passes(ThetaPasses p) { theta_passes_ = p; }
  // How dense prefill tiles are computed from the next Prepare on (default:
  // DefaultPrefillWay()).
  void set_prefill_way(PrefillWay w) { prefill_way_ = w; }
  // Where Top-θ's prefill rows go from the next Prepare on (default: DefaultThetaPrefill()).
  void set_theta_prefill(ThetaPrefill w) { theta_prefill_ = w; }
  // For the benchmark's time per kernel: from the next Prepare on, Run launches only the
  // first n kernels of the split path (SplitPlan::kernel_limit; the output is then not
  // written, and Finish's Top-θ counts lack the kernels left out); 0, the default, launches
  // them all.
  void set_kernel_limit(int32_t n) { kernel_limit_ = n; }
  // Everything a captured launch sequence depends on (pointers and launch shapes): two steps
  // with equal signatures can replay the same CUDA graph.
  std::string Signature() const;
  // A replayed graph ran every layer without calling Run.
  void MarkAllLayersRan() { ran_.assign(num_layers_, true); }
  void set_num_sms(int n) { num_sms_ = n; }
  // The host pool the offload policy's rows live in (device-visible pointer), or null.
  void set_host_pool(const bf16* host_pool) { host_pool_ = host_pool; }

 private:
  int num_sms_;
  AttnShape shape_;
  int32_t num_layers_ = 0;
  TopThetaConfig config_;
  SplitPlan plan_;
  KLoad k_load_ = DefaultKLoad();
  ThetaPasses theta_passes_ = DefaultThetaPasses();
  PrefillWay prefill_way_ = DefaultPrefillWay();
  PrefillWay tiles_way_ = PrefillWay::kMma;  // the way Prepare cut this step's tiles for
  ThetaPrefill theta_prefill_ = DefaultThetaPrefill();
  bool theta_tiles_ = false;  // this step's tiles are Top-θ's (LaunchPrefillThetaAttention)
  int32_t kernel_limit_ = 0;
  int32_t num_split_rows_ = 0;
  int32_t row_batch_ = 1;        // split rows per launch (workspace and grid bound)
  std::vector<bool> ran_;        // layers Run saw since Prepare
  int32_t num_tiles_ = 0;
  int64_t sum_len_ = 0;  // Σ over rows of L
  AttentionWorkspace ws_;
  const int32_t* row_ids_ = nullptr;
  const PrefillTile* tiles_ = nullptr;
  const float* theta_ = nullptr;      // [layers, T, heads]
  const float* sdc_ratio_ = nullptr;  // [layers, T, heads]
  unsigned long long* counters_ = nullptr;  // [layers, kThetaCounters]
  const bf16* host_pool_ = nullptr;
  int64_t num_rows_ = 0;
  PinnedBuffer staging_;
  DeviceBuffer inputs_;
  DeviceBuffer workspace_;
  std::vector<unsigned long long> host_counters_;
};

}  // namespace thetaserve::kernels::cuda
