#include "server/http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace thetaserve::server {
namespace {

using Clock = std::chrono::steady_clock;

// The loop looks at its connections' clocks this often (and wakes for it when nothing happens).
constexpr int kSweepMs = 100;
// While more than half the connections are open, a connection that has waited this long for a
// request, or for more bytes of one, makes room (closes).
constexpr auto kPressureAfter = std::chrono::seconds(5);
// A connection that closes (refused: a bad request, over the limit; or its handler is done with
// it) has its answer sent and is shut for writing, then what the client sends is read and
// dropped for up to this long before it closes: closed with bytes unread, the socket sent a
// reset that could reach the client before it read the answer (a client that writes its head
// and body apart got a broken pipe instead; a pipelining one lost responses already written).
// At most HttpServer::kMaxLingering at once; beyond, they close at once.
constexpr auto kDropRefused = std::chrono::seconds(1);
// A connection handed back keeps a read buffer this large at most (a large body grew it).
constexpr size_t kKeepBufferBytes = 64 << 10;
// Stop waits this long for the handlers to finish before it shuts their sockets down.
constexpr auto kStopGrace = std::chrono::seconds(5);

}  // namespace

const char* HttpTransportRefusalName(HttpTransportRefusal why) {
  switch (why) {
    case HttpTransportRefusal::kConnections: return "connections";
    case HttpTransportRefusal::kRequestBytes: return "request_bytes";
    case HttpTransportRefusal::kThreads: return "threads";
    case HttpTransportRefusal::kBadRequest: return "bad_request";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& host, int port,
                                                              HttpHandler handler,
                                                              HttpServerOptions options) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_str = std::to_string(port);
  if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_str.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve HTTP listen address '", host, "': ", gai_strerror(rc)));
  }
  int fd = -1;
  std::string error;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      error = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port, ": ", error));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int bound = port;
  if (addr.ss_family == AF_INET) bound = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) bound = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  int pipe_fds[2];
  const int epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0 || ::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    if (epoll_fd >= 0) ::close(epoll_fd);
    return absl::InternalError(absl::StrCat("cannot start the HTTP event loop: ", why));
  }
  for (int watched : {fd, pipe_fds[0]}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = watched;
    if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, watched, &ev) != 0) {
      const std::string why = std::strerror(errno);
      for (int open_fd : {fd, epoll_fd, pipe_fds[0], pipe_fds[1]}) ::close(open_fd);
      return absl::InternalError(absl::StrCat("cannot start the HTTP event loop: ", why));
    }
  }
  std::unique_ptr<HttpServer> server(new HttpServer(fd, epoll_fd, pipe_fds[0], pipe_fds[1], bound,
                                                    std::move(handler), options));
  try {
    server->loop_thread_ = std::thread([s = server.get()] { s->Loop(); });
  } catch (const std::exception& e) {  // the destructor's Stop closes the descriptors
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start the HTTP event loop's thread: ", e.what()));
  }
  return server;
}

HttpServer::HttpServer(int listen_fd, int epoll_fd, int wake_read, int wake_write, int port,
                       HttpHandler handler, HttpServerOptions options)
    : listen_fd_(listen_fd),
      epoll_fd_(epoll_fd),
      wake_read_(wake_read),
      wake_write_(wake_write),
      port_(port),
      handler_(std::move(handler)),
      options_(options),
      limits_{options.max_head_bytes, options.max_body_bytes} {
  conns_->on_open = options_.on_connections;
}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::connections() const {
  std::lock_guard<std::mutex> lock(conns_->mu);
  return static_cast<int>(conns_->fds.size());
}

void HttpServer::Stop() {
  // Once, and whole, even after the loop failed on its own and marked the connections stopped
  // (its thread is still to be joined, the handlers still to be waited for).
  std::call_once(stop_once_, [this] { StopOnce(); });
}

void HttpServer::StopOnce() {
  {
    std::lock_guard<std::mutex> lock(conns_->mu);
    conns_->stopped = true;  // from here on no handler hands its connection back
  }
  stopping_.store(true);
  const char byte = 0;
  [[maybe_unused]] ssize_t w = ::write(wake_write_, &byte, 1);
  if (loop_thread_.joinable()) loop_thread_.join();  // it closes every connection it holds
  ::close(listen_fd_);
  ::close(epoll_fd_);
  std::unique_lock<std::mutex> lock(conns_->mu);
  // Handlers see stopping() at once; one still waiting on the engine after a few seconds has
  // its socket shut down, so its writes fail and it returns.
  auto none = [&] { return conns_->fds.empty(); };
  if (!conns_->idle.wait_for(lock, kStopGrace, none)) {
    for (int fd : conns_->fds) ::shutdown(fd, SHUT_RDWR);
    conns_->idle.wait(lock, none);
  }
  lock.unlock();
  ::close(wake_read_);
  ::close(wake_write_);
}

void HttpServer::Loop() {
  epoll_event events[64];
  last_sweep_ = Clock::now();
  while (!stopping_.load()) {
    const int n = ::epoll_wait(epoll_fd_, events, 64, kSweepMs);
    if (n < 0 && errno != EINTR) {  // not expected (a bad descriptor): say so, and stop serving
      std::fprintf(stderr, "http: the event loop failed (%s); the HTTP API stops\n",
                   std::strerror(errno));
      break;
    }
    const Clock::time_point now = Clock::now();
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_read_) {
        char buf[64];
        while (::read(wake_read_, buf, sizeof(buf)) > 0) {
        }
      } else if (fd == listen_fd_) {
        Accept(now);
      } else {
        // Each may close the connection or hand it off: looked up again after the first.
        if (auto it = loop_conns_.find(fd); it != loop_conns_.end() && (events[i].events & EPOLLOUT)) {
          Flush(*it->second);
        }
        if (auto it = loop_conns_.find(fd); it != loop_conns_.end() &&
                                            (events[i].events & ~EPOLLOUT) != 0) {
          Read(*it->second, now);
        }
      }
    }
    if (stopping_.load()) break;
    TakeBack(now);
    if (now - last_sweep_ >= std::chrono::milliseconds(kSweepMs)) Sweep(now);
  }
  // Stopping: every connection the loop holds closes, and those handed back before the stop.
  while (!loop_conns_.empty()) Close(loop_conns_.begin()->first);
  std::lock_guard<std::mutex> lock(conns_->mu);
  conns_->stopped = true;  // when the loop failed on its own: no handler hands one back now
  for (const std::unique_ptr<Conn>& c : conns_->returned) {
    conns_->Forget(c->fd);
    ::close(c->fd);
  }
  conns_->returned.clear();
}

void HttpServer::Accept(Clock::time_point now) {
  for (int i = 0; i < 64; ++i) {  // a burst at a time, then the others' turn
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // Out of descriptors or memory: the pending connection stays, and the listening socket
      // stays readable, so it is left out of the wait for a while instead of spinning on it.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
        accept_paused_ = true;
        accept_again_ = now + std::chrono::milliseconds(kSweepMs);
      }
      return;
    }
    bool admitted = false;
    {
      std::lock_guard<std::mutex> lock(conns_->mu);
      if (static_cast<int>(conns_->fds.size()) < options_.max_connections) {
        conns_->Admit(fd);
        admitted = true;
      }
    }
    auto conn = std::make_unique<Conn>(fd, limits_, now);
    Conn& c = *conn;
    loop_conns_[fd] = std::move(conn);
    Watch(c);
    if (!admitted && loop_conns_.count(fd)) {
      Refuse(c, HttpTransportRefusal::kConnections, 503, "too many open connections; retry later",
             now);
    }
  }
}

void HttpServer::Watch(Conn& c) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = c.fd;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c.fd, &ev) != 0) Close(c.fd);
}

void HttpServer::Read(Conn& c, Clock::time_point now) {
  char buf[16 << 10];
  const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) return Close(c.fd);  // the client closed, or reset
  if (c.lingering) return;           // dropped
  c.in.append(buf, static_cast<size_t>(n));
  c.last_bytes = now;
  const int fd = c.fd;
  if (!c.ready) Advance(c, now);   // (a ready request's pipelined successor waits its turn)
  if (!loop_conns_.count(fd)) return;  // handed to its handler, or closed
  Recount(c);
  if (buffered_ > options_.max_buffered_bytes && !c.lingering) {
    Refuse(c, HttpTransportRefusal::kRequestBytes, 503,
           "the server holds too many request bytes from its clients now; retry later", now);
  }
}

void HttpServer::Recount(Conn& c) {
  buffered_ = buffered_ - c.counted + c.in.size();
  c.counted = c.in.size();
}

void HttpServer::Send(Conn& c, std::string_view data) {
  c.out.append(data);
  Flush(c);
}

// Writes what the socket takes of `out` now (the loop never waits on a client); the rest when
// it has room (EPOLLOUT). Once all is written: a refused connection is shut for writing, a
// ready request goes to its handler.
void HttpServer::Flush(Conn& c) {
  while (!c.out.empty()) {
    const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!c.writing) {
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP;
        ev.data.fd = c.fd;
        if (::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev) != 0) return Close(c.fd);
        c.writing = true;
      }
      return;
    }
    return Close(c.fd);  // the client is gone
  }
  if (c.writing) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = c.fd;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev) != 0) return Close(c.fd);
    c.writing = false;
  }
  if (c.lingering) {
    ::shutdown(c.fd, SHUT_WR);  // the answer, then FIN
  } else if (c.ready) {
    Dispatch(c);
  }
}

void HttpServer::Advance(Conn& c, Clock::time_point now) {
  while (true) {
    const bool was_started = c.reader.started();
    const HttpRequestReader::Next next = c.reader.Advance(c.in);
    if (!was_started && c.reader.started()) c.began = c.last_bytes = now;
    switch (next) {
      case HttpRequestReader::Next::kMore:
        return;
      case HttpRequestReader::Next::kContinue: {
        const int fd = c.fd;
        Send(c, "HTTP/1.1 100 Continue\r\n\r\n");
        if (!loop_conns_.count(fd)) return;  // the client is gone
        continue;
      }
      case HttpRequestReader::Next::kRefuse:
        return Refuse(c, HttpTransportRefusal::kBadRequest, c.reader.refusal_status(),
                      c.reader.refusal(), now);
      case HttpRequestReader::Next::kReady:
        // The handler writes to the socket itself: what the loop still has to write goes
        // first.
        if (!c.out.empty()) {
          c.ready = true;
          return;
        }
        return Dispatch(c);
    }
  }
}

void HttpServer::Dispatch(Conn& c) {
  const int fd = c.fd;
  c.ready = false;
  buffered_ -= c.counted;  // what is left of `in` (a pipelined request) goes with it
  c.counted = 0;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);  // the handler's until it hands it back
  std::unique_ptr<Conn> owned = std::move(loop_conns_.extract(fd).mapped());
  Conn* conn = owned.get();
  try {
    std::thread([this, conn, conns = conns_] { Answer(std::unique_ptr<Conn>(conn), conns); })
        .detach();
    owned.release();  // the thread's now (it may have run already: only the pointer is dropped)
  } catch (const std::exception&) {  // no thread to be had (a pids limit, memory)
    loop_conns_[fd] = std::move(owned);
    Watch(*conn);
    if (loop_conns_.count(fd)) {
      Refuse(*conn, HttpTransportRefusal::kThreads, 503,
             "the server cannot take another request now; retry later", Clock::now());
    }
  }
}

void HttpServer::Answer(std::unique_ptr<Conn> c, std::shared_ptr<Connections> conns) {
  HttpRequest req = std::move(c->reader.request());
  HttpResponder responder(c->fd, c->reader.http11(),
                          c->reader.keep_alive() && !stopping_.load(), &stopping_);
  c->reader.Reset();
  if (req.method == "HEAD") responder.HeadOnly();
  bool reuse = false;
  try {
    handler_(req, responder);
    if (!responder.responded()) {
      responder.Send(500, "application/json", HttpErrorBody(500, "the handler sent no response"));
    }
    reuse = responder.reusable();
  } catch (const std::exception& e) {  // a bug in a handler fails its request, not the server
    if (!responder.responded()) {
      responder.CloseAfter();
      responder.Send(500, "application/json", HttpErrorBody(500, "internal error"));
    }
  }
  const int fd = c->fd;
  {
    std::lock_guard<std::mutex> lock(conns->mu);
    if (!conns->stopped) {  // Stop has not begun: the loop and the pipe are there
      c->close_after = !reuse;  // then the loop lingers on it before it closes
      conns->returned.push_back(std::move(c));
      const char byte = 1;
      [[maybe_unused]] ssize_t w = ::write(wake_write_, &byte, 1);
      return;  // the last use of `this`, under the lock Stop takes first
    }
    // Out of the set before it closes, so Stop never shuts down a reused descriptor.
    conns->Forget(fd);
  }
  ::close(fd);
}

void HttpServer::TakeBack(Clock::time_point now) {
  std::vector<std::unique_ptr<Conn>> back;
  {
    std::lock_guard<std::mutex> lock(conns_->mu);
    back.swap(conns_->returned);
  }
  for (std::unique_ptr<Conn>& conn : back) {
    conn->idle_since = now;
    // A large body grew the read buffer; an idle connection keeps a small one.
    if (conn->in.capacity() > kKeepBufferBytes) std::string(conn->in).swap(conn->in);
    Conn& c = *conn;
    const int fd = c.fd;
    loop_conns_[fd] = std::move(conn);
    Watch(c);
    if (!loop_conns_.count(fd)) continue;
    if (c.close_after) {
      Linger(c, now);
      if (loop_conns_.count(fd)) Flush(c);  // nothing to write: shuts it for writing
      continue;
    }
    Recount(c);
    Advance(c, now);  // a pipelined request may be there already
    if (loop_conns_.count(fd)) Recount(c);
  }
}

void HttpServer::Refuse(Conn& c, HttpTransportRefusal why, int status, std::string_view message,
                        Clock::time_point now) {
  if (options_.on_refused) options_.on_refused(why);
  const int fd = c.fd;
  Linger(c, now);
  if (!loop_conns_.count(fd)) return;
  // After what the loop still had to write (a 100 Continue), then FIN. A 503 is for now: the
  // client may retry at once.
  const std::string body =
      HttpErrorBody(status, message, status == 503 ? "server_error" : "invalid_request_error");
  HttpHeaders headers;
  if (status == 503) headers.emplace_back("Retry-After", "1");
  Send(c, absl::StrCat(HttpResponseHead(status, "application/json", /*keep_alive=*/false,
                                    /*http11=*/true, headers),
                       "Content-Length: ", body.size(), "\r\n\r\n", body));
}

// From now on the connection closes: it leaves the open ones (the connection limit), what it
// sends is dropped, and it closes once the client has closed, or after kDropRefused.
void HttpServer::Linger(Conn& c, Clock::time_point now) {
  {
    std::lock_guard<std::mutex> lock(conns_->mu);
    conns_->Forget(c.fd);
  }
  c.lingering = true;
  c.ready = false;
  c.in.clear();
  c.in.shrink_to_fit();
  Recount(c);
  c.drop_until = now + kDropRefused;
  if (++lingering_open_ > kMaxLingering) Close(c.fd);
}

void HttpServer::Close(int fd) {
  auto it = loop_conns_.find(fd);
  if (it == loop_conns_.end()) return;
  buffered_ -= it->second->counted;
  if (it->second->lingering) {
    --lingering_open_;
  } else {
    std::lock_guard<std::mutex> lock(conns_->mu);
    conns_->Forget(fd);
  }
  loop_conns_.erase(it);
  ::close(fd);  // and out of the epoll set with it
}

// The clocks: a connection idle past idle_timeout_ms, or whose request has not arrived whole
// within io_timeout_ms, closes; while more than half the connections are open, so does one that
// has waited kPressureAfter for a request or for more bytes of one (a request still arriving is
// not cut), until half are left. Refused connections close after kDropRefused.
void HttpServer::Sweep(Clock::time_point now) {
  last_sweep_ = now;
  if (accept_paused_ && now >= accept_again_) {
    accept_paused_ = false;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listen_fd_;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  }
  int open;
  {
    std::lock_guard<std::mutex> lock(conns_->mu);
    open = static_cast<int>(conns_->fds.size());
  }
  std::vector<int> to_close;
  for (const auto& [fd, c] : loop_conns_) {
    if (c->lingering) {
      if (now >= c->drop_until) to_close.push_back(fd);
      continue;
    }
    const bool pressure = 2 * open > options_.max_connections;
    bool close;
    if (!c->reader.started()) {
      const auto idle = now - c->idle_since;
      close = idle >= std::chrono::milliseconds(options_.idle_timeout_ms) ||
              (pressure && idle >= kPressureAfter);
    } else {
      close = now - c->began >= std::chrono::milliseconds(options_.io_timeout_ms) ||
              (pressure && now - c->last_bytes >= kPressureAfter);
    }
    if (close) {
      to_close.push_back(fd);
      --open;
    }
  }
  for (int fd : to_close) Close(fd);
}

}  // namespace thetaserve::server
