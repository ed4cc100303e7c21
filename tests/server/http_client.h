// A minimal HTTP/1.1 client over a real loopback socket, for the HTTP server's tests: writes
// raw requests (so malformed ones can be sent too) and reads responses with a length or
// chunked, keeping the chunks apart.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace thetaserve::testing {

struct HttpResult {
  int status = 0;                             // 0: no response (closed, timed out)
  std::map<std::string, std::string> headers; // names lower-cased
  std::string body;                           // chunks joined
  std::vector<std::string> chunks;            // as sent, for chunked responses
};

class HttpConnection {
 public:
  explicit HttpConnection(int port);
  ~HttpConnection();
  bool connected() const { return fd_ >= 0; }
  bool SendRaw(const std::string& bytes);
  // Reads one response (timeout per read, seconds).
  HttpResult Read(double timeout_s = 120);
  // The same in two steps: status and headers (skipping 100 Continue), then the body.
  HttpResult ReadHead(double timeout_s = 120);
  void ReadBody(HttpResult* r, double timeout_s = 120);
  // True when the server closed the connection (reads EOF within timeout_s).
  bool ClosedByServer(double timeout_s = 5);
  void Close();
  // Everything until the server closes the connection (a body without length or chunks);
  // *closed says whether it did (false: timed out).
  std::string ReadToClose(double timeout_s, bool* closed);
  // The next chunk of a chunked body whose head was read (ReadHead); false at the last chunk,
  // on EOF or timeout. ReadBody then reads the rest.
  bool ReadChunk(std::string* data, double timeout_s = 120);
  // One line without its CRLF; *ok false on EOF or timeout.
  std::string ReadLine(double timeout_s, bool* ok);

 private:
  // Reads until `buf_` holds at least `n` bytes, or a line when n == 0; false on EOF/timeout.
  bool Fill(size_t n, double timeout_s);

  int fd_ = -1;
  std::string buf_;
};

// One request on a fresh connection ("Connection: close").
HttpResult HttpCall(int port, const std::string& method, const std::string& path,
                    const std::string& body = "",
                    const std::map<std::string, std::string>& headers = {},
                    double timeout_s = 300);

// The JSON payloads of a server-sent event stream's "data:" lines, in order ("[DONE]" kept).
std::vector<std::string> SseData(const std::string& body);

}  // namespace thetaserve::testing
