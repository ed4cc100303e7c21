// A small HTTP/1.1 server for the OpenAI-compatible API (server/openai_http.h).
//
// One event-loop thread accepts connections and reads requests from all of them (epoll); a
// request, once whole, runs its handler on a thread of its own, which may block while the
// engine works and can ask whether its client is still there (ClientGone): that is how a
// vanished client cancels its request even when nothing is being written (a non-streamed
// completion, a long prefill). So threads go to requests being answered, not to connections:
// an idle keep-alive connection, or one whose request is still arriving however slowly, costs a
// descriptor and its buffer. Keep-alive and pipelining, request bodies with Content-Length or
// chunked (and Expect: 100-continue), responses with a length or chunked (server-sent events).
//
// Threads: Start spawns the loop; each request runs on its own detached thread, which hands a
// keep-alive connection back to the loop when it is done; Stop (or the destructor) ends them all
// before it returns.
#pragma once

#include <atomic>
#include <chrono>
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
#include "server/http_request_reader.h"
#include "server/http_responder.h"

namespace thetaserve::server {

using HttpHandler = std::function<void(const HttpRequest&, HttpResponder&)>;

// Why the transport answered a connection itself, before any handler saw a request.
enum class HttpTransportRefusal {
  kConnections,   // 503: a connection over max_connections
  kRequestBytes,  // 503: the read that took the request bytes held past max_buffered_bytes
  kThreads,       // 503: no thread to be had for a whole request
  kBadRequest,    // 4xx or 5xx: a request the reader refuses (HttpRequestReader::refusal_status)
};
inline constexpr int kHttpTransportRefusals = 4;  // how many reasons
// "connections", "request_bytes", "threads", "bad_request" (the metric's label).
const char* HttpTransportRefusalName(HttpTransportRefusal why);

struct HttpServerOptions {
  int max_connections = 256;         // open at once (being read or answered); more get 503
  int idle_timeout_ms = 60'000;      // keep-alive connection with no request (5 s once more
                                     // than half the connections are open)
  int io_timeout_ms = 30'000;        // a whole request, head and body (5 s without bytes once
                                     // more than half are open); a write waits 30 s at most
  size_t max_head_bytes = 64 << 10;  // request line + headers
  size_t max_body_bytes = 8 << 20;   // a 128k-token prompt as text is about 0.5 MB
  // Request bytes the loop holds across all connections (requests still arriving); the one
  // whose read passes it gets 503. Bounds what many large uploads at once can take.
  size_t max_buffered_bytes = 256 << 20;
  // Told the connections open (counted against max_connections) each time the number changes,
  // in order (on the loop's thread or a handler's, with the server's lock held: keep it quick,
  // and do not call the server), and each connection the transport refuses itself (the loop's
  // thread; answered, or closed at once while kMaxLingering others are closing). Neither is
  // called once Stop has returned.
  std::function<void(int open)> on_connections;
  std::function<void(HttpTransportRefusal why)> on_refused;
};

class HttpServer {
 public:
  // Connections closing (refused, or their handler is done with them) that are drained at
  // once, at most (beyond, they close at once): with max_connections and 4 of its own, the
  // descriptors the server may hold.
  static constexpr int kMaxLingering = 256;

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
  using Clock = std::chrono::steady_clock;
  // A connection: the loop's while it reads a request, then a handler thread's while the
  // request is answered, then the loop's again if it is kept alive.
  struct Conn {
    Conn(int fd, HttpRequestLimits limits, Clock::time_point now)
        : fd(fd), reader(limits), idle_since(now) {}
    int fd;
    std::string in;  // bytes read and not yet consumed (may hold a pipelined request)
    HttpRequestReader reader;
    Clock::time_point idle_since;  // waiting for a request since
    Clock::time_point began;       // the request's first byte (io_timeout_ms runs from here)
    Clock::time_point last_bytes;  // the request's last read
    // What the loop writes (a 100 Continue, a refusal) and the socket has not taken yet: a
    // pipelining client may not have read the last response. Written as the socket drains.
    std::string out;
    bool writing = false;          // EPOLLOUT armed for `out`
    bool ready = false;            // a whole request waits for `out` to go before its handler
    size_t counted = 0;            // of `in`, the bytes in the server's buffered_ total
    // Closing: refused, or its handler closed it. Shut for writing once `out` is sent, and
    // what comes is read and dropped (closed with bytes unread, the socket would send a reset
    // that can destroy the answer before the client reads it).
    bool lingering = false;
    bool close_after = false;      // handed back by a handler that is done with it
    Clock::time_point drop_until;  // lingering: closed then, if the client has not closed first
  };
  // Shared with the handler threads, which touch it last, so that Stop may return (and the
  // server be destroyed) while a thread is still leaving its lock.
  struct Connections {
    std::mutex mu;
    std::condition_variable idle;
    std::set<int> fds;  // the open connections, the loop's and the handlers' (not lingering)
    std::vector<std::unique_ptr<Conn>> returned;  // handed back by handlers, for the loop
    bool stopped = false;
    std::function<void(int open)> on_open;  // HttpServerOptions::on_connections
    // fd joins, or leaves, the open connections (mu held).
    void Admit(int fd) {
      fds.insert(fd);
      if (on_open) on_open(static_cast<int>(fds.size()));
    }
    void Forget(int fd) {
      if (fds.erase(fd) != 0 && on_open) on_open(static_cast<int>(fds.size()));
      idle.notify_all();
    }
  };

  HttpServer(int listen_fd, int epoll_fd, int wake_read, int wake_write, int port,
             HttpHandler handler, HttpServerOptions options);
  void StopOnce();
  // The event loop and its steps (loop thread only).
  void Loop();
  void Accept(Clock::time_point now);
  void Read(Conn& c, Clock::time_point now);
  void Send(Conn& c, std::string_view data);
  void Flush(Conn& c);
  void Advance(Conn& c, Clock::time_point now);
  void Dispatch(Conn& c);
  // Answers status with message (told to on_refused) and closes.
  void Refuse(Conn& c, HttpTransportRefusal why, int status, std::string_view message,
              Clock::time_point now);
  void Linger(Conn& c, Clock::time_point now);
  void Recount(Conn& c);
  void Watch(Conn& c);
  void Close(int fd);
  void TakeBack(Clock::time_point now);
  void Sweep(Clock::time_point now);
  // A handler thread: answers c's request, then hands c back (kept alive, or to close).
  void Answer(std::unique_ptr<Conn> c, std::shared_ptr<Connections> conns);

  int listen_fd_;
  int epoll_fd_;
  int wake_read_, wake_write_;  // a pipe that wakes the loop (a stop, a connection handed back)
  int port_;
  HttpHandler handler_;
  HttpServerOptions options_;
  HttpRequestLimits limits_;
  std::atomic<bool> stopping_{false};
  std::once_flag stop_once_;
  std::thread loop_thread_;
  std::shared_ptr<Connections> conns_ = std::make_shared<Connections>();
  // Loop thread only.
  std::map<int, std::unique_ptr<Conn>> loop_conns_;  // the connections the loop reads from
  int lingering_open_ = 0;                           // of them, lingering ones
  size_t buffered_ = 0;                              // bytes of their `in` (Conn::counted)
  bool accept_paused_ = false;                       // out of descriptors: accept again at
  Clock::time_point accept_again_;
  Clock::time_point last_sweep_;
};

}  // namespace thetaserve::server
