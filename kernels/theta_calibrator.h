// Accumulates calibration rows into a θ table: for each (layer, head, length bucket), the
// mean + 0.1·std of the per-row thresholds θ_row (the (k+1)-th largest value, so exactly k
// survive), and the mean pruned-mass ratio for offline SDC. Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "kernels/top_theta.h"
#include "model/theta_table.h"

namespace thetaserve::kernels {

class ThetaCalibrator : public CalibrationRecorder {
 public:
  // `table` supplies the shape, buckets, k per layer and placement; Build fills its values.
  explicit ThetaCalibrator(const model::ThetaTable& shape);

  void Record(int32_t layer, int32_t head, int64_t L, float theta_row, float miss_ratio) override;
  // mean + std_factor · std per bucket (buckets with fewer than `min_rows` rows stay empty).
  model::ThetaTable Build(double std_factor = 0.1, int64_t min_rows = 4) const;
  int64_t rows() const;

 private:
  struct Acc {
    int64_t n = 0;
    double sum = 0, sumsq = 0, miss = 0;
  };
  model::ThetaTable table_;
  mutable std::mutex mu_;
  std::vector<Acc> acc_;  // [layers, heads, buckets]; guarded by mu_
};

}  // namespace thetaserve::kernels
