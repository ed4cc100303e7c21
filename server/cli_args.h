// A small command-line parser for the subcommands: `--name value`, `--name=value`, `--flag`.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace thetaserve::server {

// --threads N: 0 means every core; more than this is a typo, not a machine.
inline constexpr int64_t kMaxThreadsFlag = 1024;
// Counts of tokens, sequences, layers: the engine and the θ file hold them as int32.
inline constexpr int64_t kMaxCountFlag = std::numeric_limits<int32_t>::max();

class CliArgs {
 public:
  // `known` maps each accepted flag to whether it takes a value. Unknown flags are an error
  // that names the flag.
  static absl::StatusOr<CliArgs> Parse(const std::vector<std::string>& args,
                                       const std::map<std::string, bool>& known);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string GetString(const std::string& name, const std::string& fallback = "") const;
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const;
  // An integer flag that must lie in [lo, hi]; outside it, an error that names the range.
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback, int64_t lo,
                                 int64_t hi) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;
  // A number flag that must lie in [lo, hi] (NaN never does).
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback, double lo,
                                   double hi) const;

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace thetaserve::server
