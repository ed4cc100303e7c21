#include "server/cli_args.h"

#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace thetaserve::server {

absl::StatusOr<CliArgs> CliArgs::Parse(const std::vector<std::string>& args,
                                       const std::map<std::string, bool>& known) {
  CliArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "'"));
    }
    std::string name = a.substr(2), value;
    bool has_inline = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_inline = true;
    }
    auto it = known.find(name);
    if (it == known.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    if (it->second && !has_inline) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
      value = args[++i];
    } else if (!it->second && !has_inline) {
      value = "true";
    }
    out.values_[name] = value;
  }
  return out;
}

std::string CliArgs::GetString(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<int64_t> CliArgs::GetInt(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " wants an integer, got '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<int64_t> CliArgs::GetInt(const std::string& name, int64_t fallback, int64_t lo,
                                        int64_t hi) const {
  absl::StatusOr<int64_t> v = GetInt(name, fallback);
  if (v.ok() && (*v < lo || *v > hi)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be in [", lo, ", ", hi, "], got ", *v));
  }
  return v;
}

absl::StatusOr<double> CliArgs::GetDouble(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  double v;
  if (!absl::SimpleAtod(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " wants a number, got '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<double> CliArgs::GetDouble(const std::string& name, double fallback, double lo,
                                          double hi) const {
  absl::StatusOr<double> v = GetDouble(name, fallback);
  if (v.ok() && !(*v >= lo && *v <= hi)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " must be in [", lo, ", ", hi,
                                                   "], got ",
                                                   Has(name) ? GetString(name) : absl::StrCat(*v)));
  }
  return v;
}

}  // namespace thetaserve::server
