// `thetaserve health`: asks a server's grpc.health.v1 service; exit 0 when SERVING. For
// container health checks and scripts.
#include <cstdio>
#include <string>
#include <vector>

#include "server/cli_args.h"
#include "server/commands.h"
#include "server/health_probe.h"

namespace thetaserve::server {

int RunHealth(const std::vector<std::string>& argv) {
  CliArgs args;
  if (auto exit = ParseCommandLine(
          "health", argv, {{"addr", true}, {"service", true}, {"timeout", true}},
          "usage: thetaserve health [--addr HOST:PORT] [--service NAME] [--timeout S]\n"
          "exit 0 when the server reports SERVING, 1 otherwise, 2 for a bad command line\n",
          &args)) {
    return *exit;
  }
  auto timeout = args.GetDouble("timeout", 3, 0.01, 3600);
  if (!timeout.ok()) return ReportFailure("health", timeout.status(), kExitUsage);
  const std::string addr = args.GetString("addr", "localhost:50051");
  if (absl::Status st = CheckAddressFlag(addr); !st.ok()) {
    return ReportFailure("health", st, kExitUsage);
  }
  auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  const std::string status = ProbeHealth(channel, args.GetString("service", ""), *timeout);
  // The answer (SERVING, NOT_SERVING, ...) on stdout; a failed call on stderr, as elsewhere.
  if (status.rfind("error: ", 0) == 0) {
    std::fprintf(stderr, "thetaserve health: %s\n", status.c_str() + 7);
  } else {
    std::printf("%s\n", status.c_str());
  }
  return status == "SERVING" ? 0 : kExitFailed;
}

}  // namespace thetaserve::server
