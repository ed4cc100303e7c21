#include "server/cli_args.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string_view>

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
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (it->second && !has_inline) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
      value = args[++i];
    } else if (!it->second) {
      // --ignore-eos=false was taken as the switch given (Has() saw the name).
      if (has_inline && value != "true" && value != "false") {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " is a switch: --", name, " or --", name,
                         "=true|false, not '", value, "'"));
      }
      if (value == "false") {
        out.values_.erase(name);
        continue;
      }
      value = "true";
    }
    out.values_[name] = value;
  }
  return out;
}

int ReportFailure(const char* command, const absl::Status& status, int exit_code) {
  std::fprintf(stderr, "thetaserve %s: %s\n", command, std::string(status.message()).c_str());
  return exit_code;
}

absl::Status CheckAddressFlag(const std::string& addr) {
  // A target with a scheme (dns:///, unix:, ipv4:, ipv6:, ...) is gRPC's to read.
  for (const char* scheme :
       {"dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:", "xds:", "google-c2p:"}) {
    if (addr.rfind(scheme, 0) == 0) return absl::OkStatus();
  }
  std::string port;
  // A port is required: without one gRPC dials 443, which no thetaserve listens on by default.
  if (!addr.empty() && addr[0] == '[') {  // [V6]:PORT
    const size_t close = addr.find(']');
    if (close != std::string::npos && close + 1 < addr.size() && addr[close + 1] == ':') {
      port = addr.substr(close + 2);
    }
  } else {
    const size_t colon = addr.find(':');
    // More than one colon without brackets: a bare IPv6 address, gRPC's to read.
    if (colon != std::string::npos && addr.find(':', colon + 1) != std::string::npos) {
      return absl::OkStatus();
    }
    if (colon == 0) {  // ":50051": gRPC tried to resolve the empty host (a DNS error, exit 1)
      return absl::InvalidArgumentError(
          absl::StrCat("--addr '", addr, "' is not HOST:PORT: the host is missing (localhost?)"));
    }
    if (colon != std::string::npos) port = addr.substr(colon + 1);
  }
  int64_t value = 0;
  if (port.empty() ||
      !std::all_of(port.begin(), port.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) ||
      !absl::SimpleAtoi(port, &value) || value < 1 || value > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--addr '", addr, "' is not HOST:PORT with a port in [1, 65535]"));
  }
  return absl::OkStatus();
}

std::optional<int> ParseCommandLine(const char* command, const std::vector<std::string>& argv,
                                    std::map<std::string, bool> known, const std::string& usage,
                                    CliArgs* args) {
  known.emplace("help", false);
  if (argv.size() == 1 && argv[0] == "-h") {  // as `thetaserve -h` (it was an unexpected argument)
    std::fputs(usage.c_str(), stdout);
    return 0;
  }
  absl::StatusOr<CliArgs> parsed = CliArgs::Parse(argv, known);
  if (!parsed.ok()) {
    std::fprintf(stderr, "thetaserve %s: %s\nrun 'thetaserve %s --help' for its flags\n", command,
                 std::string(parsed.status().message()).c_str(), command);
    return kExitUsage;
  }
  if (parsed->Has("help")) {
    std::fputs(usage.c_str(), stdout);
    return 0;
  }
  *args = std::move(*parsed);
  return std::nullopt;
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

absl::StatusOr<std::optional<uint64_t>> CliArgs::GetUint64(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  uint64_t v;
  if (it->second.find('-') != std::string::npos || !absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be an integer in [0, ",
                     std::numeric_limits<uint64_t>::max(), "], got '", it->second, "'"));
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

std::string ApiKeyFlag(const CliArgs& args) {
  std::string key = args.GetString("api-key");
  if (key.empty()) {
    if (const char* env = std::getenv("THETASERVE_API_KEY")) key = env;
  }
  return key;
}

absl::Status SamplingErrorAsFlag(const absl::Status& st) {
  std::string message(st.message());
  constexpr std::string_view kPrefix = "sampling.";
  if (message.rfind(kPrefix, 0) != 0) return st;
  const size_t end = message.find_first_of(" .[", kPrefix.size());
  std::string field = message.substr(kPrefix.size(), end - kPrefix.size());
  std::replace(field.begin(), field.end(), '_', '-');
  return absl::InvalidArgumentError(
      absl::StrCat("--", field, end == std::string::npos ? "" : message.substr(end)));
}

}  // namespace thetaserve::server
