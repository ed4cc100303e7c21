#include "server/http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace thetaserve::server {
namespace {

constexpr int kPollSliceMs = 200;  // how often a waiting connection looks at stopping_
// While more than half the connections are open, a connection that has waited this long for a
// request, or for more bytes of one, makes room (closes).
constexpr auto kPressureAfter = std::chrono::seconds(5);
// A refused connection (over the limit) has the 503 sent, then what the client sends is read
// and dropped for up to this long before it closes: closed with the request unread, the socket
// sent a reset that could reach the client before it read the 503 (a client that writes its
// head and body apart got a broken pipe instead). At most kMaxDraining at once.
constexpr auto kDrainRefused = std::chrono::seconds(1);
constexpr int kMaxDraining = 64;

// Reads and drops what the peer sends until it closes, or for `limit`; then closes `fd`.
void DrainAndClose(int fd, std::chrono::steady_clock::duration limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  char buf[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          until - std::chrono::steady_clock::now()).count();
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0 || ::recv(fd, buf, sizeof(buf), 0) <= 0) break;
  }
  ::close(fd);
}

constexpr const char* kBareLineEnd = "a bare CR or LF in the request head; lines end with CRLF";

// Whether s[i] ends a line other than by CRLF: an LF after no CR, or a CR before no LF (the
// caller keeps i short of a CR that is last in s, whose LF may be still to come).
bool BareLineEndAt(const std::string& s, size_t i) {
  return (s[i] == '\n' && (i == 0 || s[i - 1] != '\r')) ||
         (s[i] == '\r' && (i + 1 == s.size() || s[i + 1] != '\n'));
}

// (Debian's Abseil has its own string_view, so these take std::string_view by hand.)
std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = absl::ascii_tolower(static_cast<unsigned char>(c));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> Split(std::string_view s, std::string_view sep) {
  std::vector<std::string_view> out;
  for (size_t pos; (pos = s.find(sep)) != std::string_view::npos; s.remove_prefix(pos + sep.size())) {
    out.push_back(s.substr(0, pos));
  }
  out.push_back(s);
  return out;
}

// RFC 9110 token characters (header names).
bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s) {
    const bool symbol = std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
    if (!absl::ascii_isalnum(c) && !symbol) return false;
  }
  return true;
}

bool ContainsToken(std::string_view header_value, std::string_view token) {
  for (std::string_view part : Split(header_value, ",")) {
    if (Lower(Trim(part)) == Lower(token)) return true;
  }
  return false;
}

// The error bodies the transport itself sends, in the OpenAI shape the API's handlers use
// (messages are the server's own, with nothing to escape).
std::string ErrorBody(int status, std::string_view message,
                      std::string_view type = "server_error") {
  return absl::StrCat(R"({"error":{"message":")", std::string(message), R"(","type":")",
                      std::string(type), R"(","param":null,"code":)", status, "}}");
}

// A chunk's size line (hex digits and any extensions) or one trailer line.
constexpr size_t kMaxChunkLineBytes = 4096;

// The interim answer to Expect: 100-continue, before the client sends the body. False if the
// client is gone.
bool SendContinue(int fd) {
  const std::string_view cont = "HTTP/1.1 100 Continue\r\n\r\n";
  return ::send(fd, cont.data(), cont.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(cont.size());
}

// 0-15 for a hex digit, else -1.
int HexDigit(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

// Decodes a chunked request body (RFC 9112 7.1) from the front of `in`, calling `read_more` to
// append what the client sends next (false: it went, or was too slow). Returns 0 with the body in
// *body and the chunks and trailers consumed from `in`; -1 when the client went; else the HTTP
// status to refuse it with and *why. The size lines and trailers are held to the head's rules
// (no control character, no bare CR or LF) so that a proxy in front cannot frame the body
// differently (request smuggling). Parsed from an offset, `in` shifted once per read: a body of
// one-byte chunks costs linear time.
int DecodeChunkedBody(std::string& in, const std::function<bool()>& read_more,
                      size_t max_body_bytes, size_t max_trailer_bytes, std::string* body,
                      std::string* why) {
  size_t pos = 0;
  auto more = [&] {
    in.erase(0, pos);
    pos = 0;
    return read_more();
  };
  auto refuse = [&](int status, std::string message) {
    *why = std::move(message);
    return status;
  };
  // The next line, without its CRLF, into *line (a view of `in`, good until the next read).
  // 0, -1, or a status as the function returns.
  auto next_line = [&](std::string_view* line) {
    size_t eol;
    while ((eol = in.find("\r\n", pos)) == std::string::npos) {
      if (in.size() - pos > kMaxChunkLineBytes) return refuse(400, "a chunk line is too long");
      if (!more()) return -1;
    }
    if (eol - pos > kMaxChunkLineBytes) return refuse(400, "a chunk line is too long");
    *line = std::string_view(in).substr(pos, eol - pos);
    for (unsigned char ch : *line) {
      if ((ch < 0x20 && ch != '\t') || ch == 0x7f) {
        return refuse(400, "a control character, or a bare CR or LF, in a chunk line");
      }
    }
    pos = eol + 2;
    return 0;
  };
  std::string_view line;
  while (true) {
    if (int status = next_line(&line); status != 0) return status;
    // chunk-size = 1*HEXDIG, then optional whitespace and ";extensions" (ignored).
    uint64_t size = 0;
    size_t i = 0;
    for (; i < line.size() && HexDigit(line[i]) >= 0; ++i) {
      if (size >> 56) return refuse(400, "a chunk size past 64 bits");
      size = size * 16 + static_cast<uint64_t>(HexDigit(line[i]));
    }
    if (i == 0) return refuse(400, "a chunk size must begin with hexadecimal digits");
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    if (i < line.size() && line[i] != ';') {
      return refuse(400, "a chunk size must be hexadecimal digits");
    }
    if (size == 0) break;
    if (body->size() + size > max_body_bytes) {
      return refuse(413, absl::StrCat("the request body is over ", max_body_bytes,
                                      " bytes; at most that many are accepted"));
    }
    while (in.size() - pos < size + 2) {
      if (!more()) return -1;
    }
    if (in.compare(pos + size, 2, "\r\n") != 0) return refuse(400, "a chunk must end with CRLF");
    body->append(in, pos, size);
    pos += size + 2;
  }
  size_t trailer_bytes = 0;
  while (true) {  // trailers, ignored, up to the empty line
    if (int status = next_line(&line); status != 0) return status;
    if (line.empty()) break;
    trailer_bytes += line.size();
    if (trailer_bytes > max_trailer_bytes) return refuse(431, "the trailers are too long");
  }
  in.erase(0, pos);
  return 0;
}

}  // namespace

const char* HttpReason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
  }
  return "Unknown";
}

std::string HttpRequest::Header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

// ---- HttpResponder -------------------------------------------------------------------------

bool HttpResponder::WriteAll(std::string_view data) {
  if (failed_) return false;
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      // A slow reader: wait for room, a bounded time, in slices so a stop is noticed.
      pollfd p{fd_, POLLOUT, 0};
      int waited = 0;
      int r = 0;
      while (waited < 30'000 && !stopping_->load() &&
             (r = ::poll(&p, 1, kPollSliceMs)) == 0) {
        waited += kPollSliceMs;
      }
      if (r > 0 && (p.revents & POLLOUT)) continue;
      if (r < 0 && errno == EINTR) continue;
    }
    failed_ = true;
    return false;
  }
  return true;
}

std::string HttpResponder::Head(int status, std::string_view content_type,
                                const HttpHeaders& extra) const {
  std::string head = absl::StrCat("HTTP/1.1 ", status, " ", HttpReason(status), "\r\n");
  if (!content_type.empty()) head += "Content-Type: " + std::string(content_type) + "\r\n";
  if (!keep_alive_) {
    absl::StrAppend(&head, "Connection: close\r\n");
  } else if (!http11_) {
    absl::StrAppend(&head, "Connection: keep-alive\r\n");  // 1.0 closes unless told
  }
  for (const auto& [name, value] : headers_) absl::StrAppend(&head, name, ": ", value, "\r\n");
  for (const auto& [name, value] : extra) absl::StrAppend(&head, name, ": ", value, "\r\n");
  return head;
}

bool HttpResponder::Send(int status, std::string_view content_type, std::string_view body,
                         const HttpHeaders& extra) {
  if (state_ != State::kNone) return false;
  state_ = State::kDone;
  if (stopping_->load()) keep_alive_ = false;
  std::string out = Head(status, content_type, extra);
  absl::StrAppend(&out, "Content-Length: ", body.size(), "\r\n\r\n");
  if (!head_only_) out.append(body);  // a HEAD's answer says the length and sends no body
  return WriteAll(out);
}

bool HttpResponder::StartChunked(int status, std::string_view content_type,
                                 const HttpHeaders& extra) {
  if (state_ != State::kNone) return false;
  state_ = State::kChunked;
  // 1.0: the body ends with the connection; HEAD: the head does.
  if (!http11_ || stopping_->load() || head_only_) keep_alive_ = false;
  std::string out = Head(status, content_type, extra);
  const bool chunked = http11_ && !head_only_;
  absl::StrAppend(&out, chunked ? "Transfer-Encoding: chunked\r\n\r\n" : "\r\n");
  return WriteAll(out);
}

bool HttpResponder::WriteChunk(std::string_view data) {
  if (state_ != State::kChunked) return false;
  if (data.empty() || head_only_) return !failed_;  // an empty chunk would end the body
  if (!http11_) return WriteAll(data);
  char size[24];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  std::string out = size;
  out.append(data);
  out.append("\r\n");
  return WriteAll(out);
}

bool HttpResponder::EndChunked() {
  if (state_ != State::kChunked) return false;
  state_ = State::kDone;
  return http11_ && !head_only_ ? WriteAll("0\r\n\r\n") : !failed_;
}

bool HttpResponder::ClientGone() {
  if (failed_) return true;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  const int r = ::poll(&p, 1, 0);
  if (r <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    // Readable: either the client pipelined its next request (still there) or end of stream.
    char c;
    const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  return false;
}

// ---- HttpServer ----------------------------------------------------------------------------

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
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
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
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  std::unique_ptr<HttpServer> server(
      new HttpServer(fd, pipe_fds[0], pipe_fds[1], bound, std::move(handler), options));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

HttpServer::HttpServer(int listen_fd, int wake_read, int wake_write, int port, HttpHandler handler,
                       HttpServerOptions options)
    : listen_fd_(listen_fd),
      wake_read_(wake_read),
      wake_write_(wake_write),
      port_(port),
      handler_(std::move(handler)),
      options_(options) {}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::connections() const {
  std::lock_guard<std::mutex> lock(conns_->mu);
  return static_cast<int>(conns_->fds.size());
}

void HttpServer::Stop() {
  {
    std::lock_guard<std::mutex> lock(conns_->mu);
    if (conns_->stopped) return;
    conns_->stopped = true;
  }
  stopping_.store(true);
  const char byte = 0;
  [[maybe_unused]] ssize_t w = ::write(wake_write_, &byte, 1);
  if (accept_thread_.joinable()) accept_thread_.join();
  ::close(listen_fd_);
  std::unique_lock<std::mutex> lock(conns_->mu);
  // Connections notice stopping_ within a poll slice; a handler still waiting on the engine
  // after a few seconds has its socket shut down, so its writes fail and it returns.
  auto none = [&] { return conns_->fds.empty(); };
  if (!conns_->idle.wait_for(lock, std::chrono::seconds(5), none)) {
    for (int fd : conns_->fds) ::shutdown(fd, SHUT_RDWR);
    conns_->idle.wait(lock, none);
  }
  lock.unlock();
  ::close(wake_read_);
  ::close(wake_write_);
}

void HttpServer::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents != 0 || stopping_.load()) break;
    if (!(fds[0].revents & POLLIN)) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors or memory: the pending connection stays, so wait instead of spinning.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      continue;
    }
    bool admitted = false;
    {
      std::lock_guard<std::mutex> lock(conns_->mu);
      if (static_cast<int>(conns_->fds.size()) < options_.max_connections) {
        conns_->fds.insert(fd);
        admitted = true;
      }
    }
    auto refuse = [&] {
      std::atomic<bool> no{false};
      HttpResponder r(fd, /*http11=*/true, /*keep_alive=*/false, &no);
      r.Send(503, "application/json",
             ErrorBody(503, "too many open connections; retry later"),
             {{"Retry-After", "1"}});
      ::shutdown(fd, SHUT_WR);  // the 503, then FIN
      if (draining_->fetch_add(1) < kMaxDraining) {
        try {
          std::thread([fd, draining = draining_] {
            DrainAndClose(fd, kDrainRefused);
            draining->fetch_sub(1);
          }).detach();
          return;
        } catch (const std::exception&) {
        }
      }
      draining_->fetch_sub(1);
      ::close(fd);
    };
    if (!admitted) {
      refuse();
      continue;
    }
    try {
      std::thread([this, fd, conns = conns_] {
        Serve(fd);  // the last use of `this`
        {
          // Out of the set before it closes, so Stop never shuts down a reused descriptor.
          std::lock_guard<std::mutex> lock(conns->mu);
          conns->fds.erase(fd);
          conns->idle.notify_all();
        }
        ::close(fd);
      }).detach();
    } catch (const std::exception&) {  // no thread to be had (a pids limit, memory)
      {
        std::lock_guard<std::mutex> lock(conns_->mu);
        conns_->fds.erase(fd);
      }
      refuse();
    }
  }
}

bool HttpServer::WaitReadable(int fd, int timeout_ms) const {
  for (int waited = 0; waited < timeout_ms && !stopping_.load(); waited += kPollSliceMs) {
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, std::min(kPollSliceMs, timeout_ms - waited));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
  return false;
}

void HttpServer::Serve(int fd) {
  using Clock = std::chrono::steady_clock;
  std::string in;  // bytes read and not yet consumed (may hold a pipelined request)
  char buf[16 << 10];
  // Closes the connection to make room when more than half the connections are open: leaves
  // the set at once, under the lock, so that connections deciding together close only until
  // half are left, not all of them.
  auto make_room = [&] {
    std::lock_guard<std::mutex> lock(conns_->mu);
    if (2 * static_cast<int>(conns_->fds.size()) <= options_.max_connections) return false;
    conns_->fds.erase(fd);
    conns_->idle.notify_all();
    return true;
  };
  Clock::time_point last_bytes;  // when the request being read last brought bytes
  // Reads more into `in` by `deadline`; false when the client is gone, too slow, or the server
  // stops, or when the request has stalled (no bytes) for kPressureAfter and make_room closes
  // it: a client that sends part of a request and stops held its thread for io_timeout_ms, and
  // 512 of them shut the API out while idle connections made room. A request still arriving
  // (a large body on a slow link) is not cut.
  auto read_more = [&](Clock::time_point deadline) {
    while (true) {
      if (Clock::now() - last_bytes >= kPressureAfter && make_room()) return false;
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0 || stopping_.load()) return false;
      pollfd p{fd, POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, kPollSliceMs)));
      if (r < 0 && errno != EINTR) return false;
      if (r > 0) break;
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return false;
    in.append(buf, static_cast<size_t>(n));
    last_bytes = Clock::now();
    return true;
  };
  auto reject = [&](int status, const std::string& message) {
    HttpResponder r(fd, /*http11=*/true, /*keep_alive=*/false, &stopping_);
    r.Send(status, "application/json", ErrorBody(status, message, "invalid_request_error"));
  };

  while (!stopping_.load()) {
    // The head: request line and headers. An idle connection waits up to idle_timeout_ms for
    // a request; the request, once begun, must arrive whole within io_timeout_ms.
    // Waiting for a request: up to idle_timeout_ms, or 5 s while over half the connections
    // are open (checked as it waits, so idle connections make room when the server fills).
    const auto idle_since = Clock::now();
    int empty_lines = 0;
    while (true) {
      // Empty lines before a request line are ignored (RFC 9112 2.2), a few of them.
      size_t skip = 0;
      while (in.compare(skip, 2, "\r\n") == 0) skip += 2;
      empty_lines += static_cast<int>(skip / 2);
      in.erase(0, skip);
      if (empty_lines > 8) return reject(400, "empty lines instead of a request");
      if (!in.empty() && in != "\r") break;
      const auto idle = Clock::now() - idle_since;
      if (idle >= std::chrono::milliseconds(options_.idle_timeout_ms)) return;
      if (idle >= kPressureAfter && make_room()) return;
      if (WaitReadable(fd, kPollSliceMs)) {
        const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) return;
        in.append(buf, static_cast<size_t>(n));
      } else if (stopping_.load()) {
        return;
      }
    }
    last_bytes = Clock::now();
    const auto deadline = last_bytes + std::chrono::milliseconds(options_.io_timeout_ms);
    size_t head_end;
    // A bare CR or LF inside a line is a line end to some proxies and not to us (request
    // smuggling). The head is scanned for one as it arrives — a head whose lines end with bare
    // LFs never shows CRLF CRLF, and was left to io_timeout_ms — and the rest of it once whole
    // (after the control characters, below).
    size_t checked = 0;  // bytes of the head seen free of a bare CR or LF
    auto bare_before = [&](size_t end) {
      for (; checked < end; ++checked) {
        if (BareLineEndAt(in, checked)) return true;
      }
      return false;
    };
    while ((head_end = in.find("\r\n\r\n")) == std::string::npos) {
      if (bare_before(!in.empty() && in.back() == '\r' ? in.size() - 1 : in.size())) {
        return reject(400, kBareLineEnd);
      }
      if (in.size() > options_.max_head_bytes) {
        return reject(431, "the request line and headers exceed 64 KiB");
      }
      if (!read_more(deadline)) return;
    }
    if (head_end > options_.max_head_bytes) {
      return reject(431, "the request line and headers exceed 64 KiB");
    }
    const std::string head = in.substr(0, head_end);

    HttpRequest req;
    // No control characters but tab anywhere in the head, and no bare CR or LF.
    for (unsigned char ch : head) {
      if ((ch < 0x20 && ch != '\t' && ch != '\r' && ch != '\n') || ch == 0x7f) {
        return reject(400, "control character in the request head");
      }
    }
    if (bare_before(head_end)) return reject(400, kBareLineEnd);
    in.erase(0, head_end + 4);
    const std::vector<std::string_view> lines = Split(head, "\r\n");
    const std::vector<std::string_view> parts = Split(lines[0], " ");
    if (parts.size() != 3 || parts[0].empty() || parts[1].empty() || parts[1][0] != '/' ||
        !parts[2].starts_with("HTTP/1.")) {
      if (parts.size() == 3 && parts[2].starts_with("HTTP/") && !parts[2].starts_with("HTTP/1.")) {
        return reject(505, "only HTTP/1.0 and HTTP/1.1 are served");
      }
      return reject(400, "malformed request line");
    }
    req.method = std::string(parts[0]);
    const std::string_view target = parts[1];
    const size_t q = target.find('?');
    req.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) req.query = std::string(target.substr(q + 1));
    const bool http11 = parts[2] == "HTTP/1.1";
    for (size_t i = 1; i < lines.size(); ++i) {
      const size_t colon = lines[i].find(':');
      if (colon == std::string_view::npos || colon == 0) return reject(400, "malformed header line");
      // A name is a token: "Content-Length : 5" is refused, not read as another header (a proxy
      // in front might frame the body by it: request smuggling).
      if (!IsToken(lines[i].substr(0, colon))) return reject(400, "malformed header name");
      std::string name = Lower(lines[i].substr(0, colon));
      std::string value(Trim(lines[i].substr(colon + 1)));
      auto [it, inserted] = req.headers.emplace(name, value);
      if (!inserted) it->second += ", " + value;
    }
    const std::string connection = req.Header("connection");
    const bool keep_alive = http11 ? !ContainsToken(connection, "close")
                                   : ContainsToken(connection, "keep-alive");

    // The body: Content-Length bytes, or chunked (RFC 9112 7.1), which clients send for a body
    // whose length they do not know up front (a stream, a generator, a proxy that does not
    // buffer). Both at once, or another coding, is refused: framing a proxy might read
    // differently is request smuggling.
    // A compressed body is not decoded: said so (RFC 9110 15.5.16), rather than parsed as JSON
    // and refused for its first byte. Before the body when the client waits for 100 Continue
    // (it sends none); else after it, so the answer is read, not lost to a reset.
    const std::string content_coding =
        Lower(std::string(absl::StripAsciiWhitespace(req.Header("content-encoding"))));
    const bool unsupported_coding = !content_coding.empty() && content_coding != "identity";
    const std::string coding_refusal = absl::StrCat(
        "Content-Encoding ", content_coding, " is not supported; send the body uncompressed");
    if (unsupported_coding && ContainsToken(req.Header("expect"), "100-continue")) {
      return reject(415, coding_refusal);
    }
    const bool chunked = req.headers.count("transfer-encoding") > 0;
    if (chunked) {
      if (!http11) return reject(400, "Transfer-Encoding needs HTTP/1.1");
      if (req.headers.count("content-length")) {
        return reject(400, "a request with both Content-Length and Transfer-Encoding");
      }
      const std::string coding = Lower(req.Header("transfer-encoding"));
      if (coding.empty()) return reject(400, "an empty Transfer-Encoding");
      if (coding != "chunked") return reject(501, "the only transfer coding accepted is chunked");
      if (in.empty() && ContainsToken(req.Header("expect"), "100-continue") && !SendContinue(fd)) {
        return;
      }
      std::string why;
      const int status = DecodeChunkedBody(
          in, [&] { return read_more(deadline); }, options_.max_body_bytes,
          options_.max_head_bytes, &req.body, &why);
      if (status < 0) return;  // the client went, or was too slow
      if (status > 0) return reject(status, why);
    }
    size_t length = 0;
    if (req.headers.count("content-length")) {
      const std::string cl = req.Header("content-length");
      uint64_t v;
      if (cl.empty() || cl.size() > 18 ||
          !std::all_of(cl.begin(), cl.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) ||
          !absl::SimpleAtoi(cl, &v)) {
        return reject(400, "Content-Length must be one decimal number");
      }
      if (v > options_.max_body_bytes) {
        return reject(413, absl::StrCat("the request body is ", v, " bytes; at most ",
                                        options_.max_body_bytes, " are accepted"));
      }
      length = static_cast<size_t>(v);
    }
    if (length > in.size() && ContainsToken(req.Header("expect"), "100-continue") &&
        !SendContinue(fd)) {
      return;
    }
    while (in.size() < length) {
      if (!read_more(deadline)) return;
    }
    if (!chunked) {
      req.body = in.substr(0, length);
      in.erase(0, length);
    }
    if (unsupported_coding) return reject(415, coding_refusal);

    HttpResponder responder(fd, http11, keep_alive && !stopping_.load(), &stopping_);
    if (req.method == "HEAD") responder.HeadOnly();
    try {
      handler_(req, responder);
    } catch (const std::exception& e) {  // a bug in a handler fails its request, not the server
      if (responder.responded()) return;
      responder.CloseAfter();
      responder.Send(500, "application/json",
                     ErrorBody(500, "internal error"));
      return;
    }
    if (!responder.responded()) {
      responder.Send(500, "application/json",
                     ErrorBody(500, "the handler sent no response"));
    }
    if (!responder.reusable()) return;
  }
}

}  // namespace thetaserve::server
