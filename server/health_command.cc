// `thetaserve health`: asks a server's grpc.health.v1 service; exit 0 when SERVING. For
// container health checks and scripts.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "server/cli_args.h"
#include "server/commands.h"

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
  auto timeout = args->GetDouble("timeout", 3);
  if (!timeout.ok()) return 2;
  auto channel = grpc::CreateChannel(args->GetString("addr", "localhost:50051"),
                                     grpc::InsecureChannelCredentials());
  // grpc.health.v1.HealthCheckRequest{service}: encoded by hand (Debian installs no health
  // proto stubs).
  const std::string service = args->GetString("service", "");
  std::string req;
  if (!service.empty()) {
    req.push_back(0x0a);
    req.push_back(static_cast<char>(service.size()));
    req += service;
  }
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(*timeout * 1000)));
  grpc::Slice slice(req);
  grpc::ByteBuffer request(&slice, 1), response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = s;
                   done = true;
                   cv.notify_all();
                 });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (!status.ok()) {
    std::printf("UNREACHABLE: %s\n", status.error_message().c_str());
    return 1;
  }
  std::vector<grpc::Slice> slices;
  response.Dump(&slices);
  std::string bytes;
  for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  const int value = bytes.size() >= 2 && bytes[0] == 0x08 ? bytes[1] : 0;
  const char* names[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  std::printf("%s\n", names[value >= 0 && value < 4 ? value : 0]);
  return value == 1 ? 0 : 1;
}

}  // namespace thetaserve::server
