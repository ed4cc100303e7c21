#include "server/health_probe.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "grpcpp/generic/generic_stub.h"

namespace thetaserve::server {

std::string ProbeHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                        double timeout_s) {
  // HealthCheckRequest{service = 1}.
  std::string req;
  if (!service.empty()) {
    req.push_back(0x0a);
    req.push_back(static_cast<char>(service.size()));
    req += service;
  }
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
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
  if (!status.ok()) return "error: " + status.error_message();
  std::vector<grpc::Slice> slices;
  response.Dump(&slices);
  std::string bytes;
  for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse{status = 1 (varint)}; absent = UNKNOWN.
  const int value = bytes.size() >= 2 && bytes[0] == 0x08 ? bytes[1] : 0;
  const char* names[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  return names[value >= 0 && value < 4 ? value : 0];
}

}  // namespace thetaserve::server
