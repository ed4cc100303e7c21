// Starts the real `thetaserve serve` binary on loopback ports for end-to-end tests.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "tests/test_util.h"
#include "thetaserve/v1/generation.grpc.pb.h"

namespace thetaserve::testing {

int FreePort();
// The value of one series (name and labels, as exposed) in a Prometheus exposition, or -1.
double MetricValue(const std::string& exposition, const std::string& series);
std::string BinaryPath();  // build/thetaserve
// GetServerStatus (a failed call fails the test).
v1::ServerStatus Status(v1::Generation::Stub& stub);
// Waits until the engine runs `running` requests and, when 0, holds no pages.
bool WaitForRunning(v1::Generation::Stub& stub, uint32_t running, double timeout_s = 10);

class ServerProcess {
 public:
  // Starts the server with the default model on the CPU backend (unless `extra` names a
  // --device) and `extra` flags; waits until health says
  // SERVING over plaintext (fails the test after `timeout_s`; timeout_s <= 0: no wait). A
  // start that lost its gRPC or metrics port to another process (bind: address in use) is
  // retried on new ports, twice. `report_failure` false (a suite's SetUpTestSuite): a failed
  // start is only recorded (started() false, start_error()), for each test to fail on; gtest
  // would otherwise skip the whole suite, and ctest count the skips as passes.
  // The server's stdout and stderr go to log_path(), in a directory of its own that goes with
  // the object (kept when the test failed).
  explicit ServerProcess(std::vector<std::string> extra = {}, double timeout_s = 180,
                         bool report_failure = true);
  ~ServerProcess();  // SIGKILL if still running

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return pid_; }
  bool started() const { return started_; }
  const std::string& start_error() const { return start_error_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  std::unique_ptr<v1::Generation::Stub> stub() const { return v1::Generation::NewStub(channel_); }

  // "SERVING", "NOT_SERVING", or an error string.
  std::string HealthStatus(const std::string& service = "") const;
  // Sends a signal; Wait returns the exit code (or -1 on timeout).
  void Signal(int sig) const;
  int Wait(double timeout_s);
  // GET /metrics over loopback.
  std::string ScrapeMetrics() const;
  const std::string& log_path() const { return log_path_; }

 private:
  // One attempt: new ports, fork and exec, wait for SERVING (or exit, or the timeout).
  void Start(const std::vector<std::string>& extra, double timeout_s);
  pid_t pid_ = -1;
  int port_ = 0;
  int metrics_port_ = 0;
  bool started_ = false;
  bool exited_ = false;
  std::string start_error_;
  ScopedTempDir dir_{"thetaserve-serve"};  // before log_path_, which is made from it
  std::string log_path_ = dir_.File("serve.log");
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace thetaserve::testing
