// Reads HTTP/1.1 requests from the bytes a connection has received, a piece at a time: the
// HTTP server's event loop feeds it what each read brings and learns whether a request is whole,
// needs more bytes, wants a 100 Continue sent, or must be refused (and with which status). No
// socket and no clock here: the loop owns those (timeouts, the connection limit).
//
// The rules are strict where a proxy in front could read the framing differently (request
// smuggling): no bare CR or LF, no control character in the head or a chunk line, a header name
// is a token, Content-Length and Transfer-Encoding never together, chunked the only transfer
// coding, one Host (and an HTTP/1.1 request must have it). Linear in the bytes received, however
// they are split.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

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

// A path segment as the client percent-encoded it (RFC 3986: a model named "org/name" comes as
// org%2Fname): each %XX decoded; a '%' not followed by two hex digits is kept as it is.
std::string PercentDecoded(std::string_view segment);

struct HttpRequestLimits {
  size_t max_head_bytes = 64 << 10;  // request line + headers (and the trailers of a chunked body)
  size_t max_body_bytes = 8 << 20;
};

class HttpRequestReader {
 public:
  enum class Next {
    kMore,      // feed more bytes
    kContinue,  // send "100 Continue" (the client waits for it before its body), then go on
    kReady,     // a whole request: request(), http11(), keep_alive()
    kRefuse,    // answer refusal_status() with refusal() and close
  };

  explicit HttpRequestReader(HttpRequestLimits limits = {}) : limits_(limits) {}

  // Parses what it can of `in`, erasing what it consumed (a pipelined request's bytes stay).
  // After kContinue, call again; after kReady, take the request and Reset before the next one.
  Next Advance(std::string& in);
  // Ready for the connection's next request.
  void Reset();

  // A request has begun: a byte other than the empty lines that may come before one.
  bool started() const { return phase_ != Phase::kStart; }
  HttpRequest& request() { return req_; }
  bool http11() const { return http11_; }
  bool keep_alive() const { return keep_alive_; }
  int refusal_status() const { return status_; }
  const std::string& refusal() const { return why_; }

 private:
  enum class Phase { kStart, kHead, kBody, kChunkLine, kChunkData, kChunkEnd, kTrailer, kDone };
  Next Refuse(int status, std::string why);
  Next ParseHead(std::string& in, size_t head_end);
  // After the body: the request, or the refusal a compressed body waited for.
  Next Finish();
  Next AdvanceChunked(std::string& in);

  HttpRequestLimits limits_;
  Phase phase_ = Phase::kStart;
  HttpRequest req_;
  bool http11_ = false;
  bool keep_alive_ = false;
  int empty_lines_ = 0;       // before the request line
  size_t checked_ = 0;        // bytes of the head seen free of a bare CR or LF
  bool continue_sent_ = false;
  std::string coding_refusal_;  // a Content-Encoding not served: 415 once the body is read
  size_t length_ = 0;           // Content-Length
  uint64_t chunk_left_ = 0;     // bytes of the current chunk still to come
  size_t trailer_bytes_ = 0;
  int status_ = 0;
  std::string why_;
};

}  // namespace thetaserve::server
