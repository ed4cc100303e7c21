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
  auto args = CliArgs::Parse(argv, {{"addr", true}, {"service", true}, {"timeout", true},
                                    {"help", false}});
  if (!args.ok() || args->Has("help")) {
    std::fprintf(stderr,
                 "usage: thetaserve health [--addr HOST:PORT] [--service NAME] [--timeout S]\n"
                 "exit 0 when the server reports SERVING, 1 otherwise\n");
    return args.ok() ? 0 : 2;
  }
  auto timeout = args->GetDouble("timeout", 3, 0.01, 3600);
  if (!timeout.ok()) {
    std::fprintf(stderr, "thetaserve health: %s\n",
                 std::string(timeout.status().message()).c_str());
    return 2;
  }
  auto channel = grpc::CreateChannel(args->GetString("addr", "localhost:50051"),
                                     grpc::InsecureChannelCredentials());
  const std::string status = ProbeHealth(channel, args->GetString("service", ""), *timeout);
  // The answer (SERVING, NOT_SERVING, ...) on stdout; a failed call on stderr, as elsewhere.
  if (status.rfind("error: ", 0) == 0) {
    std::fprintf(stderr, "thetaserve health: %s\n", status.c_str() + 7);
  } else {
    std::printf("%s\n", status.c_str());
  }
  return status == "SERVING" ? 0 : 1;
}

}  // namespace thetaserve::server
