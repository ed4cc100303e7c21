// A small HTTP/1.1 server for the OpenAI-compatible API (server/openai_http.h).
//
// One thread per connection: a handler may block while the engine works, and it can ask whether
// its client is still there (ClientGone), which is how a vanished client cancels its request
// even when nothing is being written (a non-streamed completion, a long prefill). Keep-alive,
// request bodies with Content-Length (and Expect: 100-continue), responses with a length or
// chunked (server-sent events). Connections beyond the limit get 503 at once.
//
// Threads: Start spawns the accept thread; each accepted connection runs on its own detached
// thread; Stop (or the destructor) ends them all before it returns.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace thetaserve::server {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string path;                            // without the query string
  std::string query;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;

  // The header's value, or "" (name lower-cased).
  std::string Header(const std::string& name) const;
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// Writes one response on a connection. Handler thread only.
class HttpResponder {
 public:
  // `http11`: the request was HTTP/1.1 (else 1.0: no chunked encoding, the body ends with the
  // connection).
  HttpResponder(int fd, bool http11, bool keep_alive, const std::atomic<bool>* stopping)
      : fd_(fd), http11_(http11), keep_alive_(keep_alive), stopping_(stopping) {}

  // A whole response with Content-Length. False if the client is gone.
  bool Send(int status, std::string_view content_type, std::string_view body,
            const HttpHeaders& extra = {});
  // A streamed response: StartChunked, WriteChunk..., EndChunked (chunked encoding; to an
  // HTTP/1.0 client the raw body, then the connection closes). False if the client is gone.
  bool StartChunked(int status, std::string_view content_type, const HttpHeaders& extra = {});
  bool WriteChunk(std::string_view data);
  bool EndChunked();

  // Non-blocking: the peer closed its side, reset, or a write failed.
  bool ClientGone();
  // Close the connection after this response (say so in it): before Send or StartChunked.
  void CloseAfter() { keep_alive_ = false; }
  // The request was HEAD: the head of the response only (RFC 9110 9.3.2). A streamed response
  // then closes the connection after its head.
  void HeadOnly() { head_only_ = true; }
  // A header for the response, whichever call sends it (before Send or StartChunked).
  void AddHeader(std::string name, std::string value) {
    headers_.emplace_back(std::move(name), std::move(value));
  }
  // Give up on the response (the client is gone): nothing more is written, the connection
  // closes.
  void Abandon() { failed_ = true; }
  // The server is shutting down.
  bool stopping() const { return stopping_->load(); }

  bool responded() const { return state_ != State::kNone || failed_; }
  // The connection may carry another request.
  bool reusable() const { return keep_alive_ && !failed_ && state_ == State::kDone; }

 private:
  bool WriteAll(std::string_view data);
  std::string Head(int status, std::string_view content_type, const HttpHeaders& extra) const;

  enum class State { kNone, kChunked, kDone };
  int fd_;
  bool http11_;
  bool keep_alive_;
  const std::atomic<bool>* stopping_;
  State state_ = State::kNone;
  bool failed_ = false;
  bool head_only_ = false;
  HttpHeaders headers_;  // AddHeader's
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponder&)>;

struct HttpServerOptions {
  int max_connections = 256;
  int idle_timeout_ms = 60'000;      // keep-alive connection with no request (5 s once more
                                     // than half the connections are open)
  int io_timeout_ms = 30'000;        // a whole request, head and body (a write: 30 s; 5 s
                                     // once more than half the connections are open)
  size_t max_head_bytes = 64 << 10;  // request line + headers
  size_t max_body_bytes = 8 << 20;  // a 128k-token prompt as text is about 0.5 MB
};

class HttpServer {
 public:
  // Binds host:port (port 0: any free port, see port()) and starts accepting.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& host, int port,
                                                           HttpHandler handler,
                                                           HttpServerOptions options = {});
  ~HttpServer();

  // Stops accepting, wakes every connection (handlers see stopping() and ClientGone()), and
  // waits for them to end.
  void Stop();
  int port() const { return port_; }
  // Connections open now (for tests).
  int connections() const;

 private:
  HttpServer(int listen_fd, int wake_read, int wake_write, int port, HttpHandler handler,
             HttpServerOptions options);
  void AcceptLoop();
  void Serve(int fd);
  // Waits until fd is readable; false on timeout, error or stop.
  bool WaitReadable(int fd, int timeout_ms) const;

  int listen_fd_;
  int wake_read_, wake_write_;  // a pipe that wakes the accept thread
  int port_;
  HttpHandler handler_;
  HttpServerOptions options_;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  // The open connections. Shared with the connection threads, which touch it last, so that
  // Stop may return (and the server be destroyed) while a thread is still leaving its lock.
  struct Connections {
    std::mutex mu;
    std::condition_variable idle;
    std::set<int> fds;     // guarded by mu
    bool stopped = false;  // guarded by mu
  };
  std::shared_ptr<Connections> conns_ = std::make_shared<Connections>();
  // Refused connections still being drained (their threads may outlive the server).
  std::shared_ptr<std::atomic<int>> draining_ = std::make_shared<std::atomic<int>>(0);
};

// "OK", "Not Found", ... for a status code.
const char* HttpReason(int status);

}  // namespace thetaserve::server
