#include "kernels/top_theta.h"

namespace thetaserve::kernels {

const char* SdcModeName(SdcMode m) {
  switch (m) {
    case SdcMode::kNone: return "none";
    case SdcMode::kExact: return "exact";
    case SdcMode::kExpThreshold: return "exp-threshold";
    case SdcMode::kOffline: return "offline";
  }
  return "?";
}

void AttentionStats::Add(const AttentionStats& o) {
  v_rows_read += o.v_rows_read;
  v_rows_read_host += o.v_rows_read_host;
  v_rows_read_dense += o.v_rows_read_dense;
  elements_kept += o.elements_kept;
  elements_dense += o.elements_dense;
  retained_but_evicted += o.retained_but_evicted;
  if (layer_kept.size() < o.layer_kept.size()) {
    layer_kept.resize(o.layer_kept.size(), 0);
    layer_dense.resize(o.layer_dense.size(), 0);
  }
  for (size_t i = 0; i < o.layer_kept.size(); ++i) {
    layer_kept[i] += o.layer_kept[i];
    layer_dense[i] += o.layer_dense[i];
  }
}

void AttentionStats::Reset(int64_t num_layers) {
  *this = AttentionStats();
  layer_kept.assign(num_layers, 0);
  layer_dense.assign(num_layers, 0);
}

}  // namespace thetaserve::kernels
