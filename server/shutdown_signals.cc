#include "server/shutdown_signals.h"

#include <cstdio>
#include <cstdlib>
#include <thread>

namespace thetaserve::server {

const char* ShutdownSignalName(int sig) { return sig == SIGTERM ? "SIGTERM" : "SIGINT"; }

ShutdownSignals& ShutdownSignals::Install() {
  static ShutdownSignals* const signals = new ShutdownSignals;
  return *signals;
}

ShutdownSignals::ShutdownSignals() {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGTERM);
  sigaddset(&signals_, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
  std::thread([this] { Watch(); }).detach();
}

void ShutdownSignals::Serving() {
  std::lock_guard<std::mutex> lock(mu_);
  serving_ = true;
}

int ShutdownSignals::WaitForFirst() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return first_ != 0; });
  return first_;
}

void ShutdownSignals::Watch() {
  while (true) {
    int sig = 0;
    if (sigwait(&signals_, &sig) != 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    if (!serving_) {
      std::fprintf(stderr, "received %s while starting: exiting\n", ShutdownSignalName(sig));
      std::_Exit(128 + sig);
    }
    if (first_ != 0) {
      std::fprintf(stderr, "received %s again: exiting without waiting for the drain\n",
                   ShutdownSignalName(sig));
      std::_Exit(128 + sig);
    }
    first_ = sig;
    cv_.notify_all();
  }
}

}  // namespace thetaserve::server
