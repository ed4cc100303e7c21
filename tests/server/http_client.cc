#include "tests/server/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>

namespace thetaserve::testing {

HttpConnection::HttpConnection(int port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

HttpConnection::~HttpConnection() { Close(); }

void HttpConnection::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool HttpConnection::SendRaw(const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool HttpConnection::Fill(size_t n, double timeout_s) {
  char tmp[8192];
  while (n == 0 ? buf_.find("\r\n") == std::string::npos : buf_.size() < n) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout_s * 1000)) <= 0) return false;
    const ssize_t got = ::recv(fd_, tmp, sizeof(tmp), 0);
    if (got <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(got));
  }
  return true;
}

std::string HttpConnection::ReadLine(double timeout_s, bool* ok) {
  *ok = Fill(0, timeout_s);
  if (!*ok) return "";
  const size_t end = buf_.find("\r\n");
  std::string line = buf_.substr(0, end);
  buf_.erase(0, end + 2);
  return line;
}

HttpResult HttpConnection::Read(double timeout_s) {
  HttpResult r = ReadHead(timeout_s);
  if (r.status != 0) ReadBody(&r, timeout_s);
  return r;
}

HttpResult HttpConnection::ReadHead(double timeout_s) {
  HttpResult r;
  bool ok;
  std::string status_line;
  do {  // skip interim responses (100 Continue)
    status_line = ReadLine(timeout_s, &ok);
    if (!ok || status_line.size() < 12) return r;
    r.status = std::atoi(status_line.substr(9, 3).c_str());
    r.headers.clear();
    for (std::string line = ReadLine(timeout_s, &ok); ok && !line.empty();
         line = ReadLine(timeout_s, &ok)) {
      const size_t colon = line.find(':');
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t v = colon + 1;
      while (v < line.size() && line[v] == ' ') ++v;
      r.headers[name] = line.substr(v);
    }
    if (!ok) {
      r.status = 0;
      return r;
    }
  } while (r.status == 100);
  return r;
}

void HttpConnection::ReadBody(HttpResult* result, double timeout_s) {
  HttpResult& r = *result;
  bool ok;
  if (r.headers.count("transfer-encoding")) {
    while (true) {
      const std::string size_line = ReadLine(timeout_s, &ok);
      if (!ok) {
        r.status = 0;
        return;
      }
      const size_t size = std::strtoul(size_line.c_str(), nullptr, 16);
      if (!Fill(size + 2, timeout_s)) {
        r.status = 0;
        return;
      }
      if (size == 0) {
        buf_.erase(0, 2);
        break;
      }
      r.chunks.push_back(buf_.substr(0, size));
      r.body += r.chunks.back();
      buf_.erase(0, size + 2);
    }
  } else {
    const size_t length = std::strtoul(r.headers["content-length"].c_str(), nullptr, 10);
    // (Fill(0) waits for a line: an empty body needs no read.)
    if (length > 0 && !Fill(length, timeout_s)) {
      r.status = 0;
      return;
    }
    r.body = buf_.substr(0, length);
    buf_.erase(0, length);
  }
}

std::string HttpConnection::ReadToClose(double timeout_s, bool* closed) {
  char tmp[8192];
  *closed = false;
  while (true) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout_s * 1000)) <= 0) break;
    const ssize_t got = ::recv(fd_, tmp, sizeof(tmp), 0);
    if (got <= 0) {
      *closed = got == 0;
      break;
    }
    buf_.append(tmp, static_cast<size_t>(got));
  }
  std::string out;
  out.swap(buf_);
  return out;
}

bool HttpConnection::ReadChunk(std::string* data, double timeout_s) {
  bool ok;
  const std::string size_line = ReadLine(timeout_s, &ok);
  if (!ok) return false;
  const size_t size = std::strtoul(size_line.c_str(), nullptr, 16);
  if (size == 0 || !Fill(size + 2, timeout_s)) return false;
  *data = buf_.substr(0, size);
  buf_.erase(0, size + 2);
  return true;
}

bool HttpConnection::ClosedByServer(double timeout_s) {
  char c;
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout_s * 1000)) <= 0) return false;
  return ::recv(fd_, &c, 1, MSG_PEEK) == 0;
}

HttpResult HttpCall(int port, const std::string& method, const std::string& path,
                    const std::string& body, const std::map<std::string, std::string>& headers,
                    double timeout_s) {
  HttpConnection c(port);
  if (!c.connected()) return {};
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
  if (!body.empty() || method == "POST") {
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += "\r\n" + body;
  if (!c.SendRaw(req)) return {};
  return c.Read(timeout_s);
}

std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find('\n', pos);
    if (end == std::string::npos) end = body.size();
    const std::string line = body.substr(pos, end - pos);
    if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
    pos = end + 1;
  }
  return out;
}

}  // namespace thetaserve::testing
