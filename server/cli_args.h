// A small command-line parser for the subcommands: `--name value`, `--name=value`, `--flag`.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace thetaserve::server {

// --threads N: 0 means every core; more than this is a typo, not a machine.
inline constexpr int64_t kMaxThreadsFlag = 1024;
// Counts of tokens, sequences, layers: the engine and the θ file hold them as int32.
inline constexpr int64_t kMaxCountFlag = std::numeric_limits<int32_t>::max();

// The subcommands' exit status: 0 done; kExitFailed for a failure while running (a file, the
// model, the server, a call); kExitUsage for a bad command line (an unknown flag, a value out of
// range, a required flag missing), found before anything slow starts.
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

// Prints "thetaserve COMMAND: MESSAGE" (the status's message, without its code) to stderr and
// returns `exit_code`.
int ReportFailure(const char* command, const absl::Status& status, int exit_code);

// A gRPC target from --addr: HOST:PORT or [V6]:PORT with a port in 1–65535 (gRPC took 99999
// as 34463, and a bare host as port 443). Targets with a scheme (dns:///…, unix:…) are gRPC's.
absl::Status CheckAddressFlag(const std::string& addr);

class CliArgs;
// --api-key, or THETASERVE_API_KEY when the flag is unset or empty ("": none); serve's key to
// require and client's to send.
std::string ApiKeyFlag(const CliArgs& args);

// The API's checks of sampling fields, as the flags that set them: "sampling.top_p = 7; ..."
// becomes "--top-p = 7; ..." (generate and client check their flags with the server's rules).
absl::Status SamplingErrorAsFlag(const absl::Status& st);

// The start of every subcommand: parses `argv` against `known` into *args. Returns the exit
// status when the command is to stop there: 0 after --help (`usage` on stdout), kExitUsage after a
// parse error (its message and a pointer to --help on stderr); nullopt to go on.
std::optional<int> ParseCommandLine(const char* command, const std::vector<std::string>& argv,
                                    std::map<std::string, bool> known, const std::string& usage,
                                    CliArgs* args);

class CliArgs {
 public:
  // `known` maps each accepted flag to whether it takes a value. Unknown flags are an error
  // that names the flag. A switch (no value) may be written --name=true or --name=false.
  static absl::StatusOr<CliArgs> Parse(const std::vector<std::string>& args,
                                       const std::map<std::string, bool>& known);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string GetString(const std::string& name, const std::string& fallback = "") const;
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const;
  // An integer flag that must lie in [lo, hi]; outside it, an error that names the range.
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback, int64_t lo,
                                 int64_t hi) const;
  // An optional unsigned 64-bit flag (a seed: the API's field is uint64): nullopt when unset; a
  // negative value is an error (it read as no seed).
  absl::StatusOr<std::optional<uint64_t>> GetUint64(const std::string& name) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;
  // A number flag that must lie in [lo, hi] (NaN never does).
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback, double lo,
                                   double hi) const;

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace thetaserve::server
