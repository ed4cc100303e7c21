#include "tests/server/server_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace thetaserve::testing {
namespace {

// grpc.health.v1.HealthCheckRequest{service} and the status out of HealthCheckResponse,
// encoded by hand (the health proto's generated code is not installed by Debian).
std::string EncodeHealthRequest(const std::string& service) {
  std::string out;
  if (!service.empty()) {
    out.push_back(0x0a);
    out.push_back(static_cast<char>(service.size()));
    out += service;
  }
  return out;
}

}  // namespace

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

std::string BinaryPath() { return THETASERVE_BINARY; }

ServerProcess::ServerProcess(std::vector<std::string> extra, double timeout_s) {
  port_ = FreePort();
  metrics_port_ = FreePort();
  log_path_ = ::testing::TempDir() + "/thetaserve-" + std::to_string(port_) + ".log";
  std::vector<std::string> args = {BinaryPath(), "serve", "--model", DefaultModelPath(),
                                   "--host", "127.0.0.1", "--port", std::to_string(port_),
                                   "--metrics-port", std::to_string(metrics_port_)};
  args.insert(args.end(), extra.begin(), extra.end());
  pid_ = fork();
  if (pid_ == 0) {
    FILE* log = std::fopen(log_path_.c_str(), "w");
    dup2(fileno(log), 1);
    dup2(fileno(log), 2);
    std::vector<char*> cargs;
    for (auto& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    execv(cargs[0], cargs.data());
    _exit(127);
  }
  channel_ = grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < until) {
    if (HealthStatus() == "SERVING") {
      started_ = true;
      return;
    }
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      ADD_FAILURE() << "server exited during start; log: " << ReadFileOrDie(log_path_);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ADD_FAILURE() << "server not SERVING after " << timeout_s << " s; log: " << ReadFileOrDie(log_path_);
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
}

std::string ServerProcess::HealthStatus(const std::string& service) const {
  grpc::GenericStub stub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  std::string req = EncodeHealthRequest(service);
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
  // HealthCheckResponse{status = 1}: field 1 varint. Absent = UNKNOWN (0).
  int value = bytes.size() >= 2 && bytes[0] == 0x08 ? bytes[1] : 0;
  return value == 1 ? "SERVING" : value == 2 ? "NOT_SERVING" : "UNKNOWN";
}

void ServerProcess::Signal(int sig) const { kill(pid_, sig); }

int ServerProcess::Wait(double timeout_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < until) {
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

std::string ServerProcess::ScrapeMetrics() const {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(metrics_port_));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  auto body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

}  // namespace thetaserve::testing
