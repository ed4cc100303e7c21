// A small command-line parser for the subcommands: `--name value`, `--name=value`, `--flag`.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace thetaserve::server {

class CliArgs {
 public:
  // `known` maps each accepted flag to whether it takes a value. Unknown flags are an error
  // that names the flag.
  static absl::StatusOr<CliArgs> Parse(const std::vector<std::string>& args,
                                       const std::map<std::string, bool>& known);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string GetString(const std::string& name, const std::string& fallback = "") const;
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace thetaserve::server
