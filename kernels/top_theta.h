// Top-θ attention settings and the counters attention reports (arXiv 2502.08363, see
// DESIGN.md §4): calibrated static per-head thresholds, softmax-denominator compensation
// (SDC) and V-mean compensation (VMC).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "model/theta_table.h"

namespace thetaserve::kernels {

enum class SdcMode {
  kNone,          // normalize by the kept mass only
  kExact,         // D_miss = D_full - D_kept (free: pass 1 computed D_full)
  kExpThreshold,  // D_miss = (L - |S|) · e^(θ_s - m), an upper bound
  kOffline,       // D_miss = calibrated mean ratio · D_kept
};
const char* SdcModeName(SdcMode m);

// Receives one calibration row: the (k+1)-th largest value of the row (in the table's
// placement: a scaled score pre-softmax, a probability post-softmax) and the pruned mass ratio
// D_miss / D_kept under exact top-k. Called from several threads at once.
class CalibrationRecorder {
 public:
  virtual ~CalibrationRecorder() = default;
  virtual void Record(int32_t layer, int32_t head, int64_t L, float theta_row,
                      float miss_ratio) = 0;
};

struct TopThetaConfig {
  // Null: dense attention (no thresholds, no counters beyond dense ones).
  const model::ThetaTable* table = nullptr;
  SdcMode sdc = SdcMode::kExact;
  bool vmc = true;
  // Exact top-k per row (k = the table's KAt(layer, L)) instead of θ: the paper's baseline.
  bool top_k = false;
  // Hit marks (the sparse V store's retention signal) only for rows some head of the group
  // keeps with margin: e > retain_factor · threshold. 1 = every retained row (DESIGN.md §5);
  // larger values mark only strongly retained rows, so the sparse store keeps fewer.
  float retain_factor = 1.0f;
  // Calibration: exact top-k, and every row's (k+1)-th value goes to the recorder.
  CalibrationRecorder* recorder = nullptr;
  model::ThetaPlacement placement() const {
    return table ? table->placement : model::ThetaPlacement::kPostSoftmax;
  }
  bool active() const { return table != nullptr; }
};

// What attention did in one forward pass. Rows are counted per (layer, KV head) and query:
// "V rows read" = |∪ over the group's heads of kept rows| (the paper's definition).
struct AttentionStats {
  int64_t v_rows_read = 0;
  int64_t v_rows_read_host = 0;      // of v_rows_read: from the host store (policy offload)
  int64_t v_rows_read_dense = 0;
  int64_t elements_kept = 0;
  int64_t elements_dense = 0;
  int64_t retained_but_evicted = 0;  // kept by θ, but the V row had been dropped
  std::vector<int64_t> layer_kept;   // [num_layers] elements kept
  std::vector<int64_t> layer_dense;  // [num_layers]

  void Add(const AttentionStats& o);
  void Reset(int64_t num_layers);
};

}  // namespace thetaserve::kernels
