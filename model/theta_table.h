// Top-θ thresholds: calibrated, static, per (layer, query head), as a function of the row
// length L (keys visible to the query). Values are stored at log-spaced length buckets,
// interpolated in ln L, and extrapolated beyond the last calibrated bucket with the slope
// fitted over the last buckets (so long contexts do not reuse a short-context threshold).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace thetaserve::model {

enum class ThetaPlacement { kPreSoftmax, kPostSoftmax };

class ThetaTable {
 public:
  // Log-spaced bucket lengths: 8 per doubling from 1 to `max_len` (inclusive-ish).
  static std::vector<int32_t> DefaultBuckets(int32_t max_len);

  ThetaTable(int32_t num_layers, int32_t num_heads, std::vector<int32_t> buckets);

  static absl::StatusOr<ThetaTable> Load(const std::string& path);
  absl::Status Save(const std::string& path) const;

  int32_t num_layers() const { return num_layers_; }
  int32_t num_heads() const { return num_heads_; }
  const std::vector<int32_t>& buckets() const { return buckets_; }
  // Index of the bucket whose length is nearest to L in ln space.
  int32_t BucketOf(int64_t L) const;

  // θ for (layer, head) at row length L. Only meaningful for L > k(layer).
  float Theta(int32_t layer, int32_t head, int64_t L) const;
  // Offline SDC: the calibrated mean of D_miss / D_kept at (layer, head, L).
  float SdcRatio(int32_t layer, int32_t head, int64_t L) const;

  // Raw values at buckets; NaN where the bucket had no calibration rows.
  float& theta_at(int32_t layer, int32_t head, int32_t bucket) {
    return theta_[(size_t(layer) * num_heads_ + head) * buckets_.size() + bucket];
  }
  float& sdc_at(int32_t layer, int32_t head, int32_t bucket) {
    return sdc_[(size_t(layer) * num_heads_ + head) * buckets_.size() + bucket];
  }
  int64_t& count_at(int32_t layer, int32_t head, int32_t bucket) {
    return counts_[(size_t(layer) * num_heads_ + head) * buckets_.size() + bucket];
  }
  // Fills every (layer, head) curve's slope and edges from its calibrated buckets; call once
  // after the raw values are set.
  void Finalize();
  // Whether some curve has a calibrated bucket (after Finalize); a table without one leaves
  // attention dense.
  bool AnyCalibrated() const;

  // Survivors per row at calibration (and in exact top-k mode) for `layer` at row length L:
  // k_per_layer[layer], raised by the k schedule when there is one. Rows with L <= KAt are
  // dense.
  int32_t KAt(int32_t layer, int64_t L) const;
  // (row length L, k) points, lengths increasing.
  using KSchedule = std::vector<std::pair<int64_t, int32_t>>;
  // Checks a k schedule: lengths strictly increasing, k non-decreasing, 1 <= k < L at every
  // point (then k(L) < L for every L past the first point, so KAt and k_per_layer agree on
  // which rows are dense: the CUDA kernel's dense-row test uses k_per_layer).
  static absl::Status ValidateKSchedule(const KSchedule& schedule);

  // Rows with L <= k(layer) are dense. With a k schedule, the calibrated layers hold the
  // schedule's first k (its minimum) and the dense layers their own k.
  std::vector<int32_t> k_per_layer;
  // Optional: k grows with the row length, interpolated linearly in (ln L, ln k) between the
  // points and held constant outside them; k(L) = max(k_per_layer, schedule(L)). A fixed k
  // is a count, a smaller and smaller fraction of longer rows (docs/top-theta.md).
  KSchedule k_schedule;
  ThetaPlacement placement = ThetaPlacement::kPostSoftmax;
  std::string model_fingerprint;
  std::string model_name;
  std::string corpus;
  int64_t calibration_tokens = 0;
  // Short stable id of this file's contents (set by Load/Finalize).
  std::string fingerprint;

 private:
  float Interpolate(const std::vector<float>& values, int32_t layer, int32_t head, int64_t L,
                    bool extrapolate) const;

  int32_t num_layers_;
  int32_t num_heads_;
  std::vector<int32_t> buckets_;
  std::vector<float> theta_;     // [layers, heads, buckets]
  std::vector<float> sdc_;       // [layers, heads, buckets]
  std::vector<int64_t> counts_;  // [layers, heads, buckets]
  // Per (layer, head): first and last calibrated bucket, slope dθ/d ln L beyond the last.
  std::vector<int32_t> first_, last_;
  std::vector<float> slope_;
  std::vector<double> log_buckets_;  // ln of every bucket length
};

const char* PlacementName(ThetaPlacement p);

}  // namespace thetaserve::model
