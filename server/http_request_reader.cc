#include "server/http_request_reader.h"

#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace thetaserve::server {
namespace {

constexpr const char* kBareLineEnd = "a bare CR or LF in the request head; lines end with CRLF";
// Empty lines accepted before a request line (RFC 9112 2.2).
constexpr int kMaxEmptyLines = 8;
// A chunk's size line (hex digits and any extensions) or one trailer line.
constexpr size_t kMaxChunkLineBytes = 4096;

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

// A Host value (RFC 9110 7.2: uri-host [":" port]) has only the characters of a registered
// name, an IP literal in brackets, and a port; may be empty. (Not parsed further: no
// whitespace, userinfo, path or query gets through.)
bool ValidHost(std::string_view host) {
  for (unsigned char c : host) {
    const bool other = std::string_view("-._~%!$&'()*+,;=:[]").find(c) != std::string_view::npos;
    if (!absl::ascii_isalnum(c) && !other) return false;
  }
  return true;
}

// 0-15 for a hex digit, else -1.
int HexDigit(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

// A chunk line (size line or trailer) has no control character but tab, and so no bare CR or
// LF, as the head.
bool CleanChunkLine(std::string_view line) {
  for (unsigned char ch : line) {
    if ((ch < 0x20 && ch != '\t') || ch == 0x7f) return false;
  }
  return true;
}

}  // namespace

std::string HttpRequest::Header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

std::string PercentDecoded(std::string_view segment) {
  std::string out;
  for (size_t i = 0; i < segment.size(); ++i) {
    const bool escape = segment[i] == '%' && i + 2 < segment.size() &&
                        HexDigit(segment[i + 1]) >= 0 && HexDigit(segment[i + 2]) >= 0;
    if (escape) {
      out.push_back(static_cast<char>(HexDigit(segment[i + 1]) * 16 + HexDigit(segment[i + 2])));
      i += 2;
    } else {
      out.push_back(segment[i]);
    }
  }
  return out;
}

void HttpRequestReader::Reset() { *this = HttpRequestReader(limits_); }

HttpRequestReader::Next HttpRequestReader::Refuse(int status, std::string why) {
  status_ = status;
  why_ = std::move(why);
  phase_ = Phase::kDone;
  return Next::kRefuse;
}

HttpRequestReader::Next HttpRequestReader::Advance(std::string& in) {
  if (phase_ == Phase::kStart) {
    // Empty lines before a request line are ignored, a few of them.
    size_t skip = 0;
    while (in.compare(skip, 2, "\r\n") == 0) skip += 2;
    empty_lines_ += static_cast<int>(skip / 2);
    in.erase(0, skip);
    if (empty_lines_ > kMaxEmptyLines) return Refuse(400, "empty lines instead of a request");
    if (in.empty() || in == "\r") return Next::kMore;
    phase_ = Phase::kHead;
  }
  if (phase_ == Phase::kHead) {
    // A bare CR or LF inside a line is a line end to some proxies and not to us; no control
    // character but tab belongs in a head at all. The head is scanned as it arrives, so a head
    // whose lines end with bare LFs (it never shows CRLF CRLF), or bytes that are not HTTP (a
    // TLS hello), are refused at once rather than at the request's deadline.
    const size_t head_end = in.find("\r\n\r\n", checked_ >= 3 ? checked_ - 3 : 0);
    const size_t scan_to = head_end != std::string::npos ? head_end
                           : !in.empty() && in.back() == '\r' ? in.size() - 1
                                                              : in.size();
    for (; checked_ < scan_to; ++checked_) {
      if (BareLineEndAt(in, checked_)) return Refuse(400, kBareLineEnd);
      const unsigned char ch = static_cast<unsigned char>(in[checked_]);
      if ((ch < 0x20 && ch != '\t' && ch != '\r' && ch != '\n') || ch == 0x7f) {
        return Refuse(400, "control character in the request head");
      }
    }
    if ((head_end == std::string::npos ? in.size() : head_end) > limits_.max_head_bytes) {
      return Refuse(431, "the request line and headers exceed 64 KiB");
    }
    if (head_end == std::string::npos) return Next::kMore;
    if (Next next = ParseHead(in, head_end); next != Next::kMore) return next;
  }
  if (phase_ == Phase::kBody) {
    if (in.size() < length_) return Next::kMore;
    if (in.size() == length_) {  // the usual case, nothing pipelined: the bytes move, no copy
      req_.body = std::move(in);
      in = std::string();
    } else {
      req_.body = in.substr(0, length_);
      in.erase(0, length_);
    }
    return Finish();
  }
  if (phase_ >= Phase::kChunkLine && phase_ <= Phase::kTrailer) return AdvanceChunked(in);
  return Next::kMore;  // kDone: refused, or ready and not yet Reset
}

// The head is whole at in[0, head_end): the request line and headers, then how the body is
// framed. Leaves the phase at the body (kMore: go on) unless it refuses or asks for 100 Continue.
HttpRequestReader::Next HttpRequestReader::ParseHead(std::string& in, size_t head_end) {
  const std::string head = in.substr(0, head_end);  // scanned: no control character
  in.erase(0, head_end + 4);
  const std::vector<std::string_view> lines = Split(head, "\r\n");
  const std::vector<std::string_view> parts = Split(lines[0], " ");
  // HTTP-version = "HTTP/" DIGIT "." DIGIT (RFC 9112 2.3): 1.0, or 1.1 (a later 1.x is answered
  // as 1.1); another major version is 505.
  auto digit = [](char ch) { return ch >= '0' && ch <= '9'; };
  if (parts.size() != 3 || parts[0].empty() || parts[1].empty() || parts[2].size() != 8 ||
      !parts[2].starts_with("HTTP/") || !digit(parts[2][5]) || parts[2][6] != '.' ||
      !digit(parts[2][7])) {
    return Refuse(400, "malformed request line");
  }
  if (parts[2][5] != '1') return Refuse(505, "only HTTP/1.0 and HTTP/1.1 are served");
  http11_ = parts[2][7] != '0';
  req_.method = std::string(parts[0]);
  // The target: origin-form (/path?query), or absolute-form (http://host/path?query), which a
  // server must accept too (RFC 9112 3.2.2); the host part is not checked.
  std::string_view target = parts[1];
  const std::string scheme = Lower(target.substr(0, std::min<size_t>(target.size(), 8)));
  if (scheme.starts_with("http://") || scheme.starts_with("https://")) {
    const size_t authority = target.find("//") + 2;
    const size_t slash = target.find_first_of("/?", authority);
    target = slash == std::string_view::npos ? std::string_view() : target.substr(slash);
  } else if (target[0] != '/' && !(target == "*" && req_.method == "OPTIONS")) {
    // Else the origin-form, or the asterisk-form of an OPTIONS about the server as a whole
    // (RFC 9112 3.2.4): its path is "*".
    return Refuse(400, "malformed request line");
  }
  const size_t q = target.find('?');
  const std::string_view path = target.substr(0, q);
  req_.path = path.empty() ? std::string(1, '/') : std::string(path);  // "http://host" is "/"
  if (q != std::string_view::npos) req_.query = std::string(target.substr(q + 1));
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string_view::npos || colon == 0) return Refuse(400, "malformed header line");
    // A name is a token: "Content-Length : 5" is refused, not read as another header (a proxy
    // in front might frame the body by it).
    if (!IsToken(lines[i].substr(0, colon))) return Refuse(400, "malformed header name");
    std::string name = Lower(lines[i].substr(0, colon));
    std::string value(Trim(lines[i].substr(colon + 1)));
    auto [it, inserted] = req_.headers.emplace(name, value);
    if (inserted) continue;
    // Two Hosts: a proxy in front and this server could each take another one.
    if (name == "host") return Refuse(400, "more than one Host header");
    it->second += ", " + value;
  }
  // RFC 9112 3.2: a server must refuse an HTTP/1.1 request without Host, and one whose Host is
  // not a host.
  if (auto host = req_.headers.find("host"); host == req_.headers.end()) {
    if (http11_) return Refuse(400, "an HTTP/1.1 request needs a Host header");
  } else if (!ValidHost(host->second)) {
    return Refuse(400, "the Host header is not a host[:port]");
  }
  const std::string connection = req_.Header("connection");
  keep_alive_ = http11_ ? !ContainsToken(connection, "close")
                        : ContainsToken(connection, "keep-alive");

  // The body: Content-Length bytes, or chunked (RFC 9112 7.1), which clients send for a body
  // whose length they do not know up front. Both at once, or another coding, is refused.
  // A compressed body is not decoded: said so (RFC 9110 15.5.16), rather than parsed as JSON
  // and refused for its first byte. Before the body when the client waits for 100 Continue
  // (it sends none); else after it, so the answer is read, not lost to a reset.
  // (An HTTP/1.0 client's expectation is ignored: it cannot know 100 Continue, RFC 9110 10.1.1.)
  const bool expects_continue =
      http11_ && ContainsToken(req_.Header("expect"), "100-continue");
  const std::string content_coding =
      Lower(std::string(absl::StripAsciiWhitespace(req_.Header("content-encoding"))));
  if (!content_coding.empty() && content_coding != "identity") {
    coding_refusal_ = absl::StrCat("Content-Encoding ", content_coding,
                                   " is not supported; send the body uncompressed");
    if (expects_continue) return Refuse(415, coding_refusal_);
  }
  if (req_.headers.count("transfer-encoding")) {
    if (!http11_) return Refuse(400, "Transfer-Encoding needs HTTP/1.1");
    if (req_.headers.count("content-length")) {
      return Refuse(400, "a request with both Content-Length and Transfer-Encoding");
    }
    const std::string coding = Lower(req_.Header("transfer-encoding"));
    if (coding.empty()) return Refuse(400, "an empty Transfer-Encoding");
    if (coding != "chunked") return Refuse(501, "the only transfer coding accepted is chunked");
    phase_ = Phase::kChunkLine;
    if (in.empty() && expects_continue) {
      continue_sent_ = true;
      return Next::kContinue;
    }
    return Next::kMore;
  }
  if (req_.headers.count("content-length")) {
    const std::string cl = req_.Header("content-length");
    uint64_t v;
    if (cl.empty() || cl.size() > 18 ||
        !std::all_of(cl.begin(), cl.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) ||
        !absl::SimpleAtoi(cl, &v)) {
      return Refuse(400, "Content-Length must be one decimal number");
    }
    if (v > limits_.max_body_bytes) {
      return Refuse(413, absl::StrCat("the request body is ", v, " bytes; at most ",
                                      limits_.max_body_bytes, " are accepted"));
    }
    length_ = static_cast<size_t>(v);
  }
  phase_ = Phase::kBody;
  if (length_ > in.size() && expects_continue) {
    continue_sent_ = true;
    return Next::kContinue;
  }
  return Next::kMore;
}

HttpRequestReader::Next HttpRequestReader::Finish() {
  if (!coding_refusal_.empty()) return Refuse(415, coding_refusal_);
  phase_ = Phase::kDone;
  return Next::kReady;
}

// The chunked body (RFC 9112 7.1), as far as `in` goes: the chunks into the request's body,
// then the trailers (ignored) up to the empty line. The size lines and trailers are held to the
// head's rules. Parsed from an offset, `in` erased once per call.
HttpRequestReader::Next HttpRequestReader::AdvanceChunked(std::string& in) {
  size_t pos = 0;
  auto consume = [&](Next next) {
    in.erase(0, pos);
    return next;
  };
  // The next line, without its CRLF, into *line; false when it has not all arrived (or refused:
  // then phase_ is kDone).
  auto next_line = [&](std::string_view* line) {
    const size_t eol = in.find("\r\n", pos);
    if (eol == std::string::npos) {
      if (in.size() - pos > kMaxChunkLineBytes) Refuse(400, "a chunk line is too long");
      return false;
    }
    if (eol - pos > kMaxChunkLineBytes) {
      Refuse(400, "a chunk line is too long");
      return false;
    }
    *line = std::string_view(in).substr(pos, eol - pos);
    if (!CleanChunkLine(*line)) {
      Refuse(400, "a control character, or a bare CR or LF, in a chunk line");
      return false;
    }
    pos = eol + 2;
    return true;
  };
  std::string_view line;
  while (true) {
    switch (phase_) {
      case Phase::kChunkLine: {
        if (!next_line(&line)) return consume(phase_ == Phase::kDone ? Next::kRefuse : Next::kMore);
        // chunk-size = 1*HEXDIG, then optional whitespace and ";extensions" (ignored).
        uint64_t size = 0;
        size_t i = 0;
        for (; i < line.size() && HexDigit(line[i]) >= 0; ++i) {
          if (size >> 56) return consume(Refuse(400, "a chunk size past 64 bits"));
          size = size * 16 + static_cast<uint64_t>(HexDigit(line[i]));
        }
        if (i == 0) return consume(Refuse(400, "a chunk size must begin with hexadecimal digits"));
        while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
        if (i < line.size() && line[i] != ';') {
          return consume(Refuse(400, "a chunk size must be hexadecimal digits"));
        }
        if (size == 0) {
          phase_ = Phase::kTrailer;
          break;
        }
        if (req_.body.size() + size > limits_.max_body_bytes) {
          return consume(Refuse(413, absl::StrCat("the request body is over ",
                                                  limits_.max_body_bytes,
                                                  " bytes; at most that many are accepted")));
        }
        chunk_left_ = size;
        phase_ = Phase::kChunkData;
        break;
      }
      case Phase::kChunkData: {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(chunk_left_, in.size() - pos));
        req_.body.append(in, pos, take);
        pos += take;
        chunk_left_ -= take;
        if (chunk_left_ > 0) return consume(Next::kMore);
        phase_ = Phase::kChunkEnd;
        break;
      }
      case Phase::kChunkEnd:
        if (in.size() - pos < 2) return consume(Next::kMore);
        if (in.compare(pos, 2, "\r\n") != 0) return consume(Refuse(400, "a chunk must end with CRLF"));
        pos += 2;
        phase_ = Phase::kChunkLine;
        break;
      case Phase::kTrailer:
        if (!next_line(&line)) return consume(phase_ == Phase::kDone ? Next::kRefuse : Next::kMore);
        if (line.empty()) return consume(Finish());
        trailer_bytes_ += line.size();
        if (trailer_bytes_ > limits_.max_head_bytes) {
          return consume(Refuse(431, "the trailers are too long"));
        }
        break;
      default:
        return consume(Next::kMore);
    }
  }
}

}  // namespace thetaserve::server
