// SIGINT and SIGTERM for `thetaserve serve`: blocked in every thread and taken by one thread
// that waits for them. While the server starts (the model loading) the first ends the process
// at once: nothing is in flight, and a blocked signal used to wait for the whole load and then
// drain a server that had just begun to listen. Once it serves, the first starts the drain
// (WaitForFirst returns) and a second ends the process without waiting for the drain.
#pragma once

#include <signal.h>

#include <condition_variable>
#include <mutex>

namespace thetaserve::server {

class ShutdownSignals {
 public:
  // On the first call blocks SIGINT and SIGTERM in this thread (so in every thread it starts
  // later: call it before any other starts) and starts the thread that waits for them. Never
  // destroyed: that thread may take a signal while the process exits.
  static ShutdownSignals& Install();
  ShutdownSignals(const ShutdownSignals&) = delete;
  ShutdownSignals& operator=(const ShutdownSignals&) = delete;

  // From now on the first signal drains instead of ending the process.
  void Serving();
  // Waits for the first signal once serving; returns it.
  int WaitForFirst();

 private:
  ShutdownSignals();
  // The waiting thread (detached: it ends with the process, in sigwait).
  void Watch();

  sigset_t signals_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool serving_ = false;
  int first_ = 0;
};

// "SIGINT" or "SIGTERM".
const char* ShutdownSignalName(int sig);

}  // namespace thetaserve::server
