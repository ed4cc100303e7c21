// How the HTTP server (http_server.h) writes a response on a connection: HttpResponder, for a
// request's handler, whole or streamed; and the heads and error bodies the transport sends
// itself.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace thetaserve::server {

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
  // Called with the status as Send or StartChunked is about to write it: what it does (a
  // count) is done before the client can have read the response.
  void OnStatus(std::function<void(int status)> on_status) { on_status_ = std::move(on_status); }
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

  enum class State { kNone, kChunked, kDone };
  int fd_;
  bool http11_;
  bool keep_alive_;
  const std::atomic<bool>* stopping_;
  State state_ = State::kNone;
  bool failed_ = false;
  bool head_only_ = false;
  HttpHeaders headers_;  // AddHeader's
  std::function<void(int)> on_status_;
};

// "OK", "Not Found", ... for a status code.
const char* HttpReason(int status);

// A response's head up to its framing (Content-Length or Transfer-Encoding, then the blank
// line, are the caller's to append): the status line, Content-Type, the Connection header the
// client needs, then `headers` and `extra`.
std::string HttpResponseHead(int status, std::string_view content_type, bool keep_alive,
                             bool http11, const HttpHeaders& headers,
                             const HttpHeaders& extra = {});

// The error bodies the transport itself sends, in the OpenAI shape the API's handlers use
// (messages are the server's own, with nothing to escape).
std::string HttpErrorBody(int status, std::string_view message,
                          std::string_view type = "server_error");

}  // namespace thetaserve::server
