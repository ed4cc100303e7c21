#include "kernels/theta_calibrator.h"

#include <cmath>

namespace thetaserve::kernels {

ThetaCalibrator::ThetaCalibrator(const model::ThetaTable& shape)
    : table_(shape),
      acc_(size_t(shape.num_layers()) * shape.num_heads() * shape.buckets().size()) {}

void ThetaCalibrator::Record(int32_t layer, int32_t head, int64_t L, float theta_row,
                             float miss_ratio) {
  if (!std::isfinite(theta_row)) return;
  const size_t i = (size_t(layer) * table_.num_heads() + head) * table_.buckets().size() +
                   table_.BucketOf(L);
  std::lock_guard<std::mutex> lock(mu_);
  Acc& a = acc_[i];
  ++a.n;
  a.sum += theta_row;
  a.sumsq += double(theta_row) * theta_row;
  a.miss += miss_ratio;
}

int64_t ThetaCalibrator::rows() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const Acc& a : acc_) n += a.n;
  return n;
}

model::ThetaTable ThetaCalibrator::Build(double std_factor, int64_t min_rows) const {
  model::ThetaTable out = table_;
  std::lock_guard<std::mutex> lock(mu_);
  const int32_t nb = static_cast<int32_t>(out.buckets().size());
  for (int32_t l = 0; l < out.num_layers(); ++l) {
    for (int32_t h = 0; h < out.num_heads(); ++h) {
      for (int32_t b = 0; b < nb; ++b) {
        const Acc& a = acc_[(size_t(l) * out.num_heads() + h) * nb + b];
        out.count_at(l, h, b) = a.n;
        if (a.n < min_rows) continue;
        const double mean = a.sum / a.n;
        const double var = std::max(0.0, a.sumsq / a.n - mean * mean);
        out.theta_at(l, h, b) = static_cast<float>(mean + std_factor * std::sqrt(var));
        out.sdc_at(l, h, b) = static_cast<float>(a.miss / a.n);
      }
    }
  }
  out.Finalize();
  return out;
}

}  // namespace thetaserve::kernels
