#include "server/kv_cache_size.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace thetaserve::server {
namespace {

constexpr double kGiB = double(int64_t(1) << 30);

absl::Status BadValue(const std::string& value) {
  return absl::InvalidArgumentError(absl::StrCat(
      "--kv-cache-memory wants a size such as 512M or 8G, or a share of the memory free after "
      "the model loads such as 90%; got '", value, "'"));
}

}  // namespace

absl::StatusOr<KvCacheSpec> ParseKvCacheSpec(const std::string& value) {
  if (value.empty()) return BadValue(value);
  KvCacheSpec spec;
  std::string s = value;
  const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(s.back())));
  double v;
  if (last == '%') {
    s.pop_back();
    if (!absl::SimpleAtod(s, &v) || !(v > 0.0 && v <= 100.0)) return BadValue(value);
    spec.percent = v;
    return spec;
  }
  int64_t mult = 1;
  if (last == 'K') mult = int64_t(1) << 10;
  if (last == 'M') mult = int64_t(1) << 20;
  if (last == 'G') mult = int64_t(1) << 30;
  if (mult != 1) s.pop_back();
  if (!absl::SimpleAtod(s, &v) || !(v > 0.0)) return BadValue(value);
  spec.bytes = static_cast<int64_t>(v * double(mult));
  if (spec.bytes <= 0) return BadValue(value);
  return spec;
}

std::string BytesText(int64_t bytes) {
  if (double(bytes) < 0.1 * kGiB) return absl::StrFormat("%.1f MiB", double(bytes) / (1 << 20));
  return absl::StrFormat("%.2f GiB", double(bytes) / kGiB);
}

absl::StatusOr<KvCacheSize> ResolveKvCacheSize(const KvCacheSpec& spec,
                                               std::optional<int64_t> free_bytes,
                                               std::optional<int64_t> max_bytes) {
  KvCacheSize out;
  if (spec.percent <= 0.0) {
    out.bytes = spec.bytes;
    out.description = BytesText(spec.bytes);
    return out;
  }
  if (!free_bytes) {
    return absl::FailedPreconditionError(
        "--kv-cache-memory as a share needs the device's free memory, which this backend cannot "
        "tell: give a size such as 8G");
  }
  const int64_t usable = *free_bytes - kKvReserveBytes;
  if (usable <= 0) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "--kv-cache-memory %g%%: only %.2f GiB is free after the model loaded, and %.0f GiB stays "
        "free for per-step buffers; give a size such as 512M, or free memory",
        spec.percent, double(*free_bytes) / kGiB, double(kKvReserveBytes) / kGiB));
  }
  out.bytes = static_cast<int64_t>(double(usable) * spec.percent / 100.0);
  out.description = absl::StrFormat(
      "%.2f GiB (%g%% of the %.2f GiB free after the model, less %.0f GiB for per-step buffers)",
      double(out.bytes) / kGiB, spec.percent, double(*free_bytes) / kGiB,
      double(kKvReserveBytes) / kGiB);
  if (max_bytes && out.bytes > *max_bytes) {
    out.bytes = *max_bytes;
    out.description = absl::StrFormat(
        "%.2f GiB (the largest pool the backend can address; %g%% of the %.2f GiB free after "
        "the model, less %.0f GiB for per-step buffers, is more)",
        double(out.bytes) / kGiB, spec.percent, double(*free_bytes) / kGiB,
        double(kKvReserveBytes) / kGiB);
  }
  return out;
}

KvCacheSize DefaultCpuKvCacheSize(int64_t full_context_bytes, std::optional<int64_t> free_bytes) {
  KvCacheSize out;
  int64_t full = full_context_bytes;
  const bool capped = free_bytes && full > *free_bytes / 4;
  if (capped) full = *free_bytes / 4;
  out.bytes = std::max(kCpuKvFloorBytes, full);
  if (out.bytes == kCpuKvFloorBytes) {
    out.description = BytesText(out.bytes);
  } else if (!capped) {
    out.description = absl::StrFormat("%.2f GiB (one sequence of the model's full context)",
                                      double(out.bytes) / kGiB);
  } else {
    out.description = absl::StrFormat(
        "%.2f GiB (a quarter of the %.2f GiB free; the model's full context needs %.2f GiB)",
        double(out.bytes) / kGiB, double(*free_bytes) / kGiB, double(full_context_bytes) / kGiB);
  }
  return out;
}

}  // namespace thetaserve::server
