#include "tests/server/server_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "server/health_probe.h"
#include "tests/test_util.h"

namespace thetaserve::testing {
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

double MetricValue(const std::string& exposition, const std::string& series) {
  for (size_t pos = 0; (pos = exposition.find(series, pos)) != std::string::npos; pos += series.size()) {
    if (pos > 0 && exposition[pos - 1] != '\n') continue;
    size_t sp = pos + series.size();
    if (exposition[sp] != ' ') continue;
    return std::stod(exposition.substr(sp + 1));
  }
  return -1;
}

std::string BinaryPath() { return THETASERVE_BINARY; }

ServerProcess::ServerProcess(std::vector<std::string> extra, double timeout_s,
                             bool report_failure) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    Start(extra, timeout_s);
    if (started_ || !exited_) break;
    // FreePort's port can be taken again before the server binds it (another test's server,
    // a client's ephemeral port): that start is retried on new ports.
    if (ReadFileOrDie(log_path_).find("Address already in use") == std::string::npos) break;
    exited_ = false;
  }
  if (!started_ && report_failure) ADD_FAILURE() << start_error_;
}

void ServerProcess::Start(const std::vector<std::string>& extra, double timeout_s) {
  port_ = FreePort();
  metrics_port_ = FreePort();
  std::vector<std::string> args = {BinaryPath(), "serve", "--model", DefaultModelPath(),
                                   "--host", "127.0.0.1", "--port", std::to_string(port_),
                                   "--metrics-port", std::to_string(metrics_port_)};
  // The CPU backend unless a test names a device: the tests compare outputs bit for bit with
  // solo runs, which holds on the CPU (on a GPU the last bits depend on the batch's shape), and
  // `auto` would pick a GPU on a machine that has one.
  if (std::find(extra.begin(), extra.end(), "--device") == extra.end()) {
    args.insert(args.end(), {"--device", "cpu"});
  }
  args.insert(args.end(), extra.begin(), extra.end());
  pid_ = fork();
  if (pid_ == 0) {
    FILE* log = std::fopen(log_path_.c_str(), "w");
    if (log == nullptr) _exit(126);
    dup2(fileno(log), 1);
    dup2(fileno(log), 2);
    std::vector<char*> cargs;
    for (auto& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    execv(cargs[0], cargs.data());
    _exit(127);
  }
  channel_ = grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
  if (timeout_s <= 0) {  // the caller waits in its own way (e.g. over TLS)
    started_ = true;
    return;
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < until) {
    if (HealthStatus() == "SERVING") {
      started_ = true;
      return;
    }
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      start_error_ = "server exited during start; log: " + ReadFileOrDie(log_path_);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  start_error_ = "server not SERVING after " + std::to_string(timeout_s) +
                 " s; log: " + ReadFileOrDie(log_path_);
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
}

std::string ServerProcess::HealthStatus(const std::string& service) const {
  return server::ProbeHealth(channel_, service, 2.0);
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

v1::ServerStatus Status(v1::Generation::Stub& stub) {
  grpc::ClientContext ctx;
  v1::ServerStatus s;
  EXPECT_TRUE(stub.GetServerStatus(&ctx, {}, &s).ok());
  return s;
}

bool WaitForRunning(v1::Generation::Stub& stub, uint32_t running, double timeout_s) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (std::chrono::steady_clock::now() < until) {
    const v1::ServerStatus s = Status(stub);
    if (s.running() == running &&
        (running > 0 || s.pages().used_k() + s.pages().used_v() == 0)) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace thetaserve::testing
