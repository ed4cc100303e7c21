// --kv-cache-memory: a size ("512M", "2G") or a share of the memory still free once the model
// is loaded ("90%"), resolved against the backend's free memory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace thetaserve::server {

// Kept out of a share-sized pool for what grows per step (activations, logits, attention
// workspaces, cuBLAS's workspace).
constexpr int64_t kKvReserveBytes = int64_t(1) << 30;

// A size for the startup log: "0.25 GiB", "113.40 GiB"; under 0.1 GiB in MiB ("64.0 MiB"),
// where two decimals of GiB said 0.00 GiB for a megabyte.
std::string BytesText(int64_t bytes);

struct KvCacheSpec {
  int64_t bytes = 0;     // a size, or
  double percent = 0.0;  // a share in (0, 100] of free memory less kKvReserveBytes
};

// Checks the flag's form; says what was wrong and what is accepted.
absl::StatusOr<KvCacheSpec> ParseKvCacheSpec(const std::string& value);

struct KvCacheSize {
  int64_t bytes = 0;
  std::string description;  // for the startup log: "9.6 GiB (90% of ...)"
};

// The pool's bytes. A share needs `free_bytes` (Backend::FreeMemoryBytes after the model
// loaded) and more free memory than the reserve; it stops at `max_bytes`, the largest pool the
// backend can address (a small model on a large GPU: the CUDA kernels' 2^31 rows of 32 bytes
// at head size 16 are 64 GiB). A size is taken as given: the backend refuses one too large.
absl::StatusOr<KvCacheSize> ResolveKvCacheSize(const KvCacheSpec& spec,
                                               std::optional<int64_t> free_bytes,
                                               std::optional<int64_t> max_bytes = std::nullopt);

// The CPU backend's pool when --kv-cache-memory is not given: kCpuKvFloorBytes, or the K and V
// of one sequence as long as the model's context (`full_context_bytes`) when that is more, so
// every request the context allows fits; but a full context never takes more than a quarter
// of `free_bytes` (MemAvailable) when that is known. (A GPU's default is a share: 90%.)
constexpr int64_t kCpuKvFloorBytes = int64_t(256) << 20;
KvCacheSize DefaultCpuKvCacheSize(int64_t full_context_bytes, std::optional<int64_t> free_bytes);

}  // namespace thetaserve::server
