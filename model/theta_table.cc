#include "model/theta_table.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace thetaserve::model {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Buckets (8 per doubling) the extrapolation slope is fitted over: two doublings, since a
// slope fitted over half a doubling amplifies the noise of the per-bucket means.
constexpr int kSlopeBuckets = 16;

std::string Hex64(uint64_t v) { return absl::StrFormat("%016x", v); }

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

const char* PlacementName(ThetaPlacement p) {
  return p == ThetaPlacement::kPreSoftmax ? "pre" : "post";
}

std::vector<int32_t> ThetaTable::DefaultBuckets(int32_t max_len) {
  std::vector<int32_t> out;
  for (int i = 0;; ++i) {
    const int32_t L = static_cast<int32_t>(std::lround(std::pow(2.0, i / 8.0)));
    if (!out.empty() && L == out.back()) continue;
    out.push_back(L);
    if (L >= max_len) break;
  }
  return out;
}

ThetaTable::ThetaTable(int32_t num_layers, int32_t num_heads, std::vector<int32_t> buckets)
    : num_layers_(num_layers), num_heads_(num_heads), buckets_(std::move(buckets)) {
  const size_t n = size_t(num_layers) * num_heads * buckets_.size();
  theta_.assign(n, kNaN);
  sdc_.assign(n, kNaN);
  counts_.assign(n, 0);
  k_per_layer.assign(num_layers, 0);
}

int32_t ThetaTable::BucketOf(int64_t L) const {
  // Buckets are log-spaced: find the nearest in ln L by bisection.
  const double x = std::log(double(std::max<int64_t>(1, L)));
  size_t lo = 0, hi = buckets_.size() - 1;
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    (std::log(double(buckets_[mid])) <= x ? lo : hi) = mid;
  }
  const double dl = x - std::log(double(buckets_[lo]));
  const double dh = std::log(double(buckets_[hi])) - x;
  return static_cast<int32_t>(dl <= dh ? lo : hi);
}

bool ThetaTable::AnyCalibrated() const {
  return std::any_of(first_.begin(), first_.end(), [](int32_t b) { return b >= 0; });
}

void ThetaTable::Finalize() {
  const size_t curves = size_t(num_layers_) * num_heads_;
  const int32_t nb = static_cast<int32_t>(buckets_.size());
  first_.assign(curves, -1);
  last_.assign(curves, -1);
  slope_.assign(curves, 0.0f);
  log_buckets_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) log_buckets_[b] = std::log(double(buckets_[b]));
  for (size_t c = 0; c < curves; ++c) {
    const float* v = theta_.data() + c * nb;
    for (int32_t b = 0; b < nb; ++b) {
      if (!std::isnan(v[b])) {
        if (first_[c] < 0) first_[c] = b;
        last_[c] = b;
      }
    }
    if (last_[c] < 0) continue;
    // Least-squares slope of θ against ln L over the last calibrated buckets.
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int n = 0;
    for (int32_t b = last_[c]; b >= first_[c] && n < kSlopeBuckets; --b) {
      if (std::isnan(v[b])) continue;
      const double x = std::log(double(buckets_[b]));
      sx += x, sy += v[b], sxx += x * x, sxy += x * v[b];
      ++n;
    }
    if (n >= 2 && sxx * n - sx * sx > 1e-12) {
      slope_[c] = static_cast<float>((n * sxy - sx * sy) / (n * sxx - sx * sx));
    }
  }
  std::ostringstream ss;
  ss << model_fingerprint << PlacementName(placement);
  for (int32_t k : k_per_layer) ss << "," << k;
  for (const auto& [L, k] : k_schedule) ss << ";" << L << ":" << k;
  for (float t : theta_) ss << "," << t;
  fingerprint = Hex64(Fnv1a(ss.str()));
}

float ThetaTable::Interpolate(const std::vector<float>& values, int32_t layer, int32_t head,
                              int64_t L, bool extrapolate) const {
  const size_t c = size_t(layer) * num_heads_ + head;
  const int32_t nb = static_cast<int32_t>(buckets_.size());
  const float* v = values.data() + c * nb;
  const int32_t first = first_.empty() ? -1 : first_[c];
  const int32_t last = last_.empty() ? -1 : last_[c];
  if (first < 0) return kNaN;
  const double x = std::log(double(std::max<int64_t>(1, L)));
  if (L <= buckets_[first]) return v[first];
  if (L >= buckets_[last]) {
    if (!extrapolate) return v[last];
    return static_cast<float>(v[last] + slope_[c] * (x - log_buckets_[last]));
  }
  // Between two calibrated buckets: linear in ln L (skipping empty buckets). The last bucket
  // at or below L by binary search, then back over empty ones (the host evaluates this for
  // every layer, row and head of a GPU step).
  const auto from = buckets_.begin() + first, to = buckets_.begin() + last + 1;
  int32_t lo = static_cast<int32_t>(std::upper_bound(from, to, L) - buckets_.begin()) - 1;
  while (lo > first && std::isnan(v[lo])) --lo;
  int32_t hi = lo + 1;
  while (hi <= last && std::isnan(v[hi])) ++hi;
  const double x0 = log_buckets_[lo], x1 = log_buckets_[hi];
  const double t = (x - x0) / (x1 - x0);
  return static_cast<float>(v[lo] + t * (v[hi] - v[lo]));
}

int32_t ThetaTable::KAt(int32_t layer, int64_t L) const {
  const int32_t base = k_per_layer[layer];
  if (k_schedule.empty()) return base;
  int32_t k;
  if (L <= k_schedule.front().first) {
    k = k_schedule.front().second;
  } else if (L >= k_schedule.back().first) {
    k = k_schedule.back().second;
  } else {
    size_t i = 1;
    while (k_schedule[i].first < L) ++i;
    const auto& [L0, k0] = k_schedule[i - 1];
    const auto& [L1, k1] = k_schedule[i];
    const double t = std::log(double(L) / double(L0)) / std::log(double(L1) / double(L0));
    k = static_cast<int32_t>(std::lround(std::exp(std::log(double(k0)) +
                                                  t * std::log(double(k1) / double(k0)))));
  }
  return std::max(base, k);
}

absl::Status ThetaTable::ValidateKSchedule(const KSchedule& schedule) {
  for (size_t i = 0; i < schedule.size(); ++i) {
    const auto& [L, k] = schedule[i];
    if (k < 1 || k >= L) {
      return absl::InvalidArgumentError(
          absl::StrCat("k schedule point ", L, ":", k, ": need 1 <= k < L"));
    }
    if (i > 0 && (L <= schedule[i - 1].first || k < schedule[i - 1].second)) {
      return absl::InvalidArgumentError(
          "k schedule: lengths must increase and k must not decrease");
    }
  }
  return absl::OkStatus();
}

float ThetaTable::Theta(int32_t layer, int32_t head, int64_t L) const {
  return Interpolate(theta_, layer, head, L, /*extrapolate=*/true);
}

float ThetaTable::SdcRatio(int32_t layer, int32_t head, int64_t L) const {
  const float r = Interpolate(sdc_, layer, head, L, /*extrapolate=*/false);
  return std::isnan(r) ? 0.0f : r;
}

absl::Status ThetaTable::Save(const std::string& path) const {
  nlohmann::json j;
  j["format"] = "thetaserve-theta-v1";
  j["model_name"] = model_name;
  j["model_fingerprint"] = model_fingerprint;
  j["placement"] = PlacementName(placement);
  j["corpus"] = corpus;
  j["calibration_tokens"] = calibration_tokens;
  j["num_layers"] = num_layers_;
  j["num_heads"] = num_heads_;
  j["k_per_layer"] = k_per_layer;
  if (!k_schedule.empty()) j["k_schedule"] = k_schedule;  // [[L, k], ...]
  j["buckets"] = buckets_;
  j["fingerprint"] = fingerprint;
  // NaN is not JSON: empty buckets are written as null.
  auto to_json = [&](const std::vector<float>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (float x : v) a.push_back(std::isnan(x) ? nlohmann::json(nullptr) : nlohmann::json(x));
    return a;
  };
  j["theta"] = to_json(theta_);  // [layers][heads][buckets] flattened
  j["sdc_offline"] = to_json(sdc_);
  j["counts"] = counts_;
  std::ofstream out(path);
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  out << j.dump(1) << "\n";
  return out.good() ? absl::OkStatus() : absl::DataLossError(absl::StrCat("short write to ", path));
}

absl::StatusOr<ThetaTable> ThetaTable::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open θ file ", path));
  nlohmann::json j;
  try {
    in >> j;
    if (j.value("format", "") != "thetaserve-theta-v1") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " is not a thetaserve θ file (format thetaserve-theta-v1)"));
    }
    auto bad = [&path](const auto&... what) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", what...));
    };
    const int32_t layers = j.at("num_layers").get<int32_t>();
    const int32_t heads = j.at("num_heads").get<int32_t>();
    const auto buckets = j.at("buckets").get<std::vector<int32_t>>();
    if (layers < 1 || heads < 1) return bad("num_layers and num_heads must be >= 1");
    for (size_t b = 0; b < buckets.size(); ++b) {
      if (buckets[b] < 1 || (b > 0 && buckets[b] <= buckets[b - 1])) {
        return bad("buckets must be lengths >= 1 in increasing order");
      }
    }
    if (buckets.empty()) return bad("no buckets");
    // The arrays' lengths against the shape before anything is sized by it (a shape of 10^5
    // layers and heads threw bad_alloc).
    // (In double: 2^31 layers and heads overflow 64 bits; a product past 2^53 matches nothing.)
    const double entries = double(layers) * double(heads) * double(buckets.size());
    for (const char* key : {"theta", "sdc_offline", "counts"}) {
      if (double(j.at(key).size()) != entries) {
        return bad(key, " has ", j.at(key).size(), " entries; num_layers × num_heads × buckets = ",
                   layers, " × ", heads, " × ", buckets.size(), " = ",
                   absl::StrFormat("%.0f", entries));
      }
    }
    ThetaTable t(layers, heads, buckets);
    t.model_name = j.value("model_name", "");
    t.model_fingerprint = j.at("model_fingerprint").get<std::string>();
    // Any other placement was read as post: a file edited by hand took the wrong softmax side.
    const std::string placement = j.at("placement").get<std::string>();
    if (placement != "pre" && placement != "post") {
      return bad("placement is '", placement, "'; it must be pre or post");
    }
    t.placement = placement == "pre" ? ThetaPlacement::kPreSoftmax : ThetaPlacement::kPostSoftmax;
    t.corpus = j.value("corpus", "");
    t.calibration_tokens = j.value("calibration_tokens", int64_t(0));
    t.k_per_layer = j.at("k_per_layer").get<std::vector<int32_t>>();
    if (j.contains("k_schedule")) {
      t.k_schedule = j.at("k_schedule").get<KSchedule>();
      absl::Status st = ValidateKSchedule(t.k_schedule);
      if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", st.message()));
    }
    const size_t n = t.theta_.size();
    const auto& theta = j.at("theta");
    const auto& sdc = j.at("sdc_offline");
    const auto counts = j.at("counts").get<std::vector<int64_t>>();
    if (theta.size() != n || sdc.size() != n || counts.size() != n ||
        t.k_per_layer.size() != size_t(t.num_layers_)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": table sizes do not match its shape"));
    }
    for (size_t l = 0; l < t.k_per_layer.size(); ++l) {
      if (t.k_per_layer[l] < 1) {
        return bad("k_per_layer[", l, "] = ", t.k_per_layer[l], "; k must be >= 1");
      }
    }
    // null: a bucket without calibration rows. A post-softmax θ is a probability, a
    // pre-softmax one a scaled score; the offline SDC a ratio of denominators, D_miss / D_kept.
    // A value outside those (a hand edit, a corrupt file) was used as it stood: post θ = 5
    // kept nothing.
    const bool post = t.placement == ThetaPlacement::kPostSoftmax;
    const int64_t per_layer = int64_t(heads) * int64_t(buckets.size());
    auto where = [&](size_t i) {
      return absl::StrCat("[", i, "] (layer ", int64_t(i) / per_layer, ", head ",
                          int64_t(i) % per_layer / int64_t(buckets.size()), ", bucket ",
                          int64_t(i) % int64_t(buckets.size()), ")");
    };
    for (size_t i = 0; i < n; ++i) {
      t.theta_[i] = theta[i].is_null() ? kNaN : theta[i].get<float>();
      t.sdc_[i] = sdc[i].is_null() ? kNaN : sdc[i].get<float>();
      t.counts_[i] = counts[i];
      const float th = t.theta_[i], sd = t.sdc_[i];
      if (!theta[i].is_null() && (!std::isfinite(th) || (post && (th < 0.0f || th > 1.0f)))) {
        return bad("theta", where(i), " = ", th, "; a ",
                   post ? "post-softmax θ is a probability in [0, 1]"
                        : "pre-softmax θ must be finite");
      }
      if (!sdc[i].is_null() && (!std::isfinite(sd) || sd < 0.0f)) {
        return bad("sdc_offline", where(i), " = ", sd, "; it must be finite and >= 0");
      }
      if (counts[i] < 0) return bad("counts", where(i), " = ", counts[i], "; it must be >= 0");
    }
    t.Finalize();
    return t;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed θ file: ", e.what()));
  }
}

}  // namespace thetaserve::model
