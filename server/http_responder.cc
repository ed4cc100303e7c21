#include "server/http_responder.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace thetaserve::server {
namespace {

constexpr int kPollSliceMs = 200;  // how often a waiting writer looks at stopping_

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

std::string HttpErrorBody(int status, std::string_view message, std::string_view type) {
  return absl::StrCat(R"({"error":{"message":")", std::string(message), R"(","type":")",
                      std::string(type), R"(","param":null,"code":)", status, "}}");
}

std::string HttpResponseHead(int status, std::string_view content_type, bool keep_alive,
                             bool http11, const HttpHeaders& headers, const HttpHeaders& extra) {
  std::string head = absl::StrCat("HTTP/1.1 ", status, " ", HttpReason(status), "\r\n");
  if (!content_type.empty()) {
    absl::StrAppend(&head, "Content-Type: ", std::string(content_type), "\r\n");
  }
  if (!keep_alive) {
    absl::StrAppend(&head, "Connection: close\r\n");
  } else if (!http11) {
    absl::StrAppend(&head, "Connection: keep-alive\r\n");  // 1.0 closes unless told
  }
  for (const auto& [name, value] : headers) absl::StrAppend(&head, name, ": ", value, "\r\n");
  for (const auto& [name, value] : extra) absl::StrAppend(&head, name, ": ", value, "\r\n");
  return head;
}

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

bool HttpResponder::Send(int status, std::string_view content_type, std::string_view body,
                         const HttpHeaders& extra) {
  if (state_ != State::kNone) return false;
  state_ = State::kDone;
  if (stopping_->load()) keep_alive_ = false;
  std::string out = HttpResponseHead(status, content_type, keep_alive_, http11_, headers_, extra);
  absl::StrAppend(&out, "Content-Length: ", body.size(), "\r\n\r\n");
  if (!head_only_) out.append(body);  // a HEAD's answer says the length and sends no body
  if (on_status_) on_status_(status);
  return WriteAll(out);
}

bool HttpResponder::StartChunked(int status, std::string_view content_type,
                                 const HttpHeaders& extra) {
  if (state_ != State::kNone) return false;
  state_ = State::kChunked;
  // 1.0: the body ends with the connection; HEAD: the head does.
  if (!http11_ || stopping_->load() || head_only_) keep_alive_ = false;
  std::string out = HttpResponseHead(status, content_type, keep_alive_, http11_, headers_, extra);
  const bool chunked = http11_ && !head_only_;
  absl::StrAppend(&out, chunked ? "Transfer-Encoding: chunked\r\n\r\n" : "\r\n");
  if (on_status_) on_status_(status);
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

}  // namespace thetaserve::server
