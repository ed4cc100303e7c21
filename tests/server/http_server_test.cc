// The HTTP/1.1 server under the OpenAI-compatible API, over real loopback sockets with raw
// requests: keep-alive and pipelining, chunked responses, Expect: 100-continue, the limits and
// malformed input, a vanished client seen by a waiting handler, the connection cap, and Stop.
#include "server/http_server.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/server/http_client.h"

namespace thetaserve::server {
namespace {

using testing::HttpCall;
using testing::HttpConnection;
using testing::HttpResult;

// Echoes what it parsed: "METHOD PATH?QUERY|x-test header|body".
void Echo(const HttpRequest& req, HttpResponder& out) {
  out.Send(200, "text/plain",
           req.method + " " + req.path + "?" + req.query + "|" + req.Header("x-test") + "|" + req.body,
           {{"X-Echo", "1"}});
}

// Sends raw bytes on a new connection; the status of the answer, after which the server must
// close the connection.
int StatusOfRaw(int port, const std::string& bytes) {
  HttpConnection c(port);
  c.SendRaw(bytes);
  HttpResult r = c.Read(10);
  EXPECT_TRUE(c.ClosedByServer()) << bytes.substr(0, 40);
  return r.status;
}

// What a server tells its options' on_connections and on_refused (must outlive the server).
class Told {
 public:
  void Into(HttpServerOptions& o) {
    o.on_connections = [this](int n) {
      std::lock_guard<std::mutex> lock(mu_);
      open_.push_back(n);
    };
    o.on_refused = [this](HttpTransportRefusal why) {
      std::lock_guard<std::mutex> lock(mu_);
      ++refused_[static_cast<int>(why)];
    };
  }
  int refused(HttpTransportRefusal why) {
    std::lock_guard<std::mutex> lock(mu_);
    return refused_[static_cast<int>(why)];
  }
  // The counts told, in order.
  std::vector<int> open() {
    std::lock_guard<std::mutex> lock(mu_);
    return open_;
  }

 private:
  std::mutex mu_;
  std::vector<int> open_;
  int refused_[kHttpTransportRefusals] = {};
};

std::unique_ptr<HttpServer> StartOrDie(HttpHandler h, HttpServerOptions o = {}) {
  auto s = HttpServer::Start("127.0.0.1", 0, std::move(h), o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

TEST(HttpServerTest, KeepAliveAndPipelinedRequestsShareOneConnection) {
  auto server = StartOrDie(Echo);
  ASSERT_NE(server, nullptr);
  HttpConnection c(server->port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.SendRaw("POST /a?x=1 HTTP/1.1\r\nHost: h\r\nX-Test: one\r\nContent-Length: 5\r\n\r\nhello"));
  HttpResult r1 = c.Read(10);
  EXPECT_EQ(r1.status, 200);
  EXPECT_EQ(r1.body, "POST /a?x=1|one|hello");
  EXPECT_EQ(r1.headers["x-echo"], "1");
  EXPECT_EQ(r1.headers.count("connection"), 0u);  // kept open
  // Two requests in one write; header names in any case.
  ASSERT_TRUE(c.SendRaw("GET /b HTTP/1.1\r\nHost: t\r\nx-TEST: two\r\n\r\n"
                        "POST /c HTTP/1.1\r\nHost: t\r\ncontent-length: 3\r\n\r\nxyz"));
  HttpResult r2 = c.Read(10);
  HttpResult r3 = c.Read(10);
  EXPECT_EQ(r2.body, "GET /b?|two|");
  EXPECT_EQ(r3.body, "POST /c?||xyz");
  // Connection: close is honoured.
  ASSERT_TRUE(c.SendRaw("GET /d HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"));
  HttpResult r4 = c.Read(10);
  EXPECT_EQ(r4.status, 200);
  EXPECT_EQ(r4.headers["connection"], "close");
  EXPECT_TRUE(c.ClosedByServer());
}

TEST(HttpServerTest, Http10ClosesUnlessAskedToKeepAlive) {
  auto server = StartOrDie(Echo);
  ASSERT_NE(server, nullptr);
  HttpConnection c(server->port());
  ASSERT_TRUE(c.SendRaw("GET /x HTTP/1.0\r\n\r\n"));
  HttpResult closed = c.Read(10);
  EXPECT_EQ(closed.status, 200);
  EXPECT_EQ(closed.headers["connection"], "close");
  EXPECT_TRUE(c.ClosedByServer());
  HttpConnection k(server->port());
  ASSERT_TRUE(k.SendRaw("GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  HttpResult kept = k.Read(10);
  EXPECT_EQ(kept.status, 200);
  EXPECT_EQ(kept.headers["connection"], "keep-alive");  // a 1.0 client closes unless told
  ASSERT_TRUE(k.SendRaw("GET /y HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  EXPECT_EQ(k.Read(10).body, "GET /y?||");
}

TEST(HttpServerTest, ChunkedResponsesArriveChunkByChunk) {
  auto server = StartOrDie([](const HttpRequest&, HttpResponder& out) {
    ASSERT_TRUE(out.StartChunked(200, "text/event-stream"));
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(out.WriteChunk("data: " + std::to_string(i) + "\n\n"));
    ASSERT_TRUE(out.WriteChunk(""));  // no empty chunk on the wire: it would end the body
    ASSERT_TRUE(out.EndChunked());
  });
  ASSERT_NE(server, nullptr);
  HttpConnection c(server->port());
  for (int round = 0; round < 2; ++round) {  // and the connection stays usable
    ASSERT_TRUE(c.SendRaw("GET /s HTTP/1.1\r\nHost: t\r\n\r\n"));
    HttpResult r = c.Read(10);
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.headers["content-type"], "text/event-stream");
    ASSERT_EQ(r.chunks.size(), 3u);
    EXPECT_EQ(r.chunks[2], "data: 2\n\n");
    EXPECT_EQ(testing::SseData(r.body), (std::vector<std::string>{"0", "1", "2"}));
  }
}

TEST(HttpServerTest, AStreamToAnHttp10ClientIsItsRawBodyEndedByClosing) {
  auto server = StartOrDie([](const HttpRequest&, HttpResponder& out) {
    ASSERT_TRUE(out.StartChunked(200, "text/event-stream"));
    ASSERT_TRUE(out.WriteChunk("data: a\n\n"));
    ASSERT_TRUE(out.WriteChunk("data: b\n\n"));
    ASSERT_TRUE(out.EndChunked());
  });
  ASSERT_NE(server, nullptr);
  HttpConnection c(server->port());
  ASSERT_TRUE(c.SendRaw("GET /s HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  HttpResult head = c.ReadHead(10);
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.headers.count("transfer-encoding"), 0u);
  EXPECT_EQ(head.headers["connection"], "close");
  bool closed = false;
  EXPECT_EQ(c.ReadToClose(10, &closed), "data: a\n\ndata: b\n\n");  // raw, ...
  EXPECT_TRUE(closed);                                                // ... ended by closing
}

TEST(HttpServerTest, EmptyLinesBeforeARequestAreIgnored) {
  auto server = StartOrDie(Echo);
  ASSERT_NE(server, nullptr);
  HttpConnection c(server->port());
  ASSERT_TRUE(c.SendRaw("\r\n\r\nGET /a HTTP/1.1\r\nHost: t\r\n\r\n"));
  EXPECT_EQ(c.Read(10).body, "GET /a?||");
  ASSERT_TRUE(c.SendRaw("\r\nGET /b HTTP/1.1\r\nHost: t\r\n\r\n"));
  EXPECT_EQ(c.Read(10).body, "GET /b?||");
  // A few, not a stream of them.
  HttpConnection flood(server->port());
  std::string crlfs;
  for (int i = 0; i < 100; ++i) crlfs += "\r\n";
  ASSERT_TRUE(flood.SendRaw(crlfs));
  EXPECT_EQ(flood.Read(10).status, 400);
  EXPECT_TRUE(flood.ClosedByServer());
}

TEST(HttpServerTest, AmbiguousFramingIsRefused) {
  // What a proxy in front might read differently from us (request smuggling) is a 400.
  auto server = StartOrDie(Echo);
  ASSERT_NE(server, nullptr);
  auto status_of = [&](const std::string& bytes) { return StatusOfRaw(server->port(), bytes); };
  const std::string smuggled = "GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n";
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: t\r\nContent-Length : " + std::to_string(smuggled.size()) +
                      "\r\n\r\n" + smuggled), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: +5\r\n\r\nhello"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: \r\n\r\n"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 0x5\r\n\r\nhello"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding:\r\n\r\n"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                      "0\r\n\r\n"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), 400);
  // A bare LF or CR inside the head ends a line for some proxies and not for us.
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: t\r\nX-A: a\nContent-Length: 5\r\n\r\nhello"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: t\r\nX-A: a\rContent-Length: 5\r\n\r\nhello"), 400);
  EXPECT_EQ(status_of(std::string("GET / HTTP/1.1\r\nHost: t\r\nX-A: a\0b\r\n\r\n", 37)), 400);
}

// A head whose lines all end with bare LFs (hand-written clients, some scripts) never shows
// CRLF CRLF: it was left waiting for the I/O timeout (30 s) and then closed without an answer.
// Now it is a 400 at once; a CRLF split across two reads is still a line end.
TEST(HttpServerTest, AHeadOfBareLineFeedsIsRefusedAtOnce) {
  auto server = StartOrDie(Echo);
  ASSERT_NE(server, nullptr);
  for (const std::string& head :
       {std::string("GET /health HTTP/1.1\nHost: x\nConnection: close\n\n"),
        std::string("GET /a HTTP/1.1\r\nHost: x\n"), std::string("GET /a HTTP/1.1\rHost: x")}) {
    HttpConnection c(server->port());
    ASSERT_TRUE(c.SendRaw(head));
    const auto start = std::chrono::steady_clock::now();
    HttpResult r = c.Read(5);
    EXPECT_EQ(r.status, 400) << head;
    EXPECT_NE(r.body.find("a bare CR or LF in the request head"), std::string::npos) << r.body;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  }
  HttpConnection c(server->port());
  for (const char* piece : {"GET /split HTTP/1.1\r", "\nHost: x\r", "\n\r", "\n"}) {
    ASSERT_TRUE(c.SendRaw(piece));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(c.Read(10).body, "GET /split?||");
}

// Clients that do not know a body's length up front (a generator, a stream, a proxy that does not
// buffer) send it chunked: it was refused with 411.
TEST(HttpServerTest, ChunkedRequestBodiesAreDecoded) {
  HttpServerOptions o;
  o.max_body_bytes = 1000;
  auto server = StartOrDie(Echo, o);
  ASSERT_NE(server, nullptr);
  HttpConnection c(server->port());
  ASSERT_TRUE(c.connected());
  // Extensions and trailers are ignored; hex in either case; the connection stays usable.
  ASSERT_TRUE(c.SendRaw("POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: Chunked\r\n\r\n"
                        "5 ;name=value\r\nhello\r\nA\r\n, chunked!\r\n0\r\nX-Trailer: t\r\n\r\n"
                        "GET /next HTTP/1.1\r\nHost: t\r\n\r\n"));
  HttpResult r = c.Read(10);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "POST /c?||hello, chunked!");
  EXPECT_EQ(c.Read(10).body, "GET /next?||");
  // A chunk that arrives in pieces, after Expect: 100-continue.
  ASSERT_TRUE(c.SendRaw("POST /p HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
                        "Expect: 100-continue\r\n\r\n"));
  bool ok = false;
  EXPECT_EQ(c.ReadLine(10, &ok), "HTTP/1.1 100 Continue");
  EXPECT_EQ(c.ReadLine(10, &ok), "");
  for (const char* piece : {"3", "\r\nab", "c\r", "\n0\r", "\n\r\n"}) {
    ASSERT_TRUE(c.SendRaw(piece));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(c.Read(10).body, "POST /p?||abc");

  // A body of one-byte chunks (each shifted the whole buffer once: quadratic).
  std::string ones;
  for (int i = 0; i < 1000; ++i) ones += "1\r\n" + std::string(1, char('a' + i % 26)) + "\r\n";
  ASSERT_TRUE(c.SendRaw("POST /o HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + ones +
                        "0\r\n\r\n"));
  HttpResult one_byte = c.Read(10);
  EXPECT_EQ(one_byte.status, 200);
  ASSERT_EQ(one_byte.body.size(), std::string("POST /o?||").size() + 1000);
  EXPECT_EQ(one_byte.body.substr(10, 27), "abcdefghijklmnopqrstuvwxyza");

  auto raw = [&](const std::string& chunks) {
    return StatusOfRaw(server->port(),
                       "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks);
  };
  EXPECT_EQ(raw("zz\r\nhello\r\n0\r\n\r\n"), 400) << "not hex";
  EXPECT_EQ(raw("\r\n"), 400) << "no size";
  EXPECT_EQ(raw("5\r\nhelloXX0\r\n\r\n"), 400) << "no CRLF after the data";
  EXPECT_EQ(raw("fffffffffffffffffff\r\n"), 400) << "a size past 64 bits";
  EXPECT_EQ(raw("1;" + std::string(5000, 'x') + "\r\n"), 400) << "a size line past 4 KiB";
  EXPECT_EQ(raw("0\r\nX-T: " + std::string(5000, 'x') + "\r\n\r\n"), 400) << "a trailer, too";
  // Framing a proxy might read differently (a bare LF ends a line for some): refused, as in
  // the head.
  EXPECT_EQ(raw("5;a\nb\r\nhello\r\n0\r\n\r\n"), 400) << "a bare LF in an extension";
  EXPECT_EQ(raw("5\rX\r\nhello\r\n0\r\n\r\n"), 400) << "a bare CR";
  EXPECT_EQ(raw(" 5\r\nhello\r\n0\r\n\r\n"), 400) << "whitespace before the size";
  EXPECT_EQ(raw("5 x\r\nhello\r\n0\r\n\r\n"), 400) << "not an extension";
  EXPECT_EQ(raw("0\r\nX-T: a\nb\r\n\r\n"), 400) << "a bare LF in a trailer";
  EXPECT_EQ(raw("200\r\n" + std::string(512, 'a') + "\r\n200\r\n"), 413) << "over 1000 bytes";
  EXPECT_EQ(StatusOfRaw(server->port(),
                        "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            501);
  EXPECT_EQ(HttpCall(server->port(), "GET", "/ok").body, "GET /ok?||");
}

// A HEAD's answer is the head alone, with the length the body would have had: a body after it
// was read by a keep-alive client as the start of its next response.
// A gzip body reached the handler as it came, and the API refused it as "not valid JSON ...
// last read: '<U+001F>'" (gzip's first byte): now 415, naming the coding. identity is no coding.
TEST(HttpServerTest, ACompressedBodyIsUnsupportedMediaType) {
  auto server = StartOrDie(Echo);
  ASSERT_NE(server, nullptr);
  HttpConnection c(server->port());
  ASSERT_TRUE(c.SendRaw("POST /z HTTP/1.1\r\nHost: t\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\n\x1f\x8b\x08"));
  const HttpResult r = c.Read(10);
  EXPECT_EQ(r.status, 415);
  EXPECT_NE(r.body.find("Content-Encoding gzip is not supported; send the body uncompressed"),
            std::string::npos) << r.body;
  EXPECT_TRUE(c.ClosedByServer());
  // A client waiting for 100 Continue is answered before it sends the body.
  HttpConnection waiting(server->port());
  ASSERT_TRUE(waiting.SendRaw("POST /z HTTP/1.1\r\nHost: t\r\nContent-Encoding: br\r\nContent-Length: 3\r\n"
                              "Expect: 100-continue\r\n\r\n"));
  EXPECT_EQ(waiting.Read(10).status, 415);
  const HttpResult plain = HttpCall(server->port(), "POST", "/z", "{}",
                                    {{"Content-Encoding", "Identity"}});
  EXPECT_EQ(plain.status, 200);
  EXPECT_EQ(plain.body, "POST /z?||{}");
}

TEST(HttpServerTest, HeadGetsTheHeadWithoutTheBody) {
  auto server = StartOrDie(Echo);
  ASSERT_NE(server, nullptr);
  HttpConnection c(server->port());
  ASSERT_TRUE(c.SendRaw("HEAD /h HTTP/1.1\r\nHost: t\r\n\r\n"));
  bool ok = false;
  EXPECT_EQ(c.ReadLine(10, &ok), "HTTP/1.1 200 OK");
  std::string length;
  for (std::string line = c.ReadLine(10, &ok); ok && !line.empty(); line = c.ReadLine(10, &ok)) {
    if (line.rfind("Content-Length: ", 0) == 0) length = line.substr(16);
  }
  EXPECT_EQ(length, "10") << "the length of \"HEAD /h?||\"";
  ASSERT_TRUE(c.SendRaw("GET /after HTTP/1.1\r\nHost: t\r\n\r\n"));
  HttpResult next = c.Read(10);
  EXPECT_EQ(next.status, 200);
  EXPECT_EQ(next.body, "GET /after?||");
}

TEST(HttpServerTest, AThrowingHandlerFailsItsRequestNotTheServer) {
  auto server = StartOrDie([](const HttpRequest& req, HttpResponder& out) {
    if (req.path == "/throw") throw std::runtime_error("boom");
    out.Send(200, "text/plain", "fine");
  });
  ASSERT_NE(server, nullptr);
  HttpConnection c(server->port());
  ASSERT_TRUE(c.SendRaw("GET /throw HTTP/1.1\r\nHost: t\r\n\r\n"));
  HttpResult r = c.Read(10);
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(r.headers["connection"], "close");
  EXPECT_TRUE(c.ClosedByServer());
  EXPECT_EQ(HttpCall(server->port(), "GET", "/ok").body, "fine");
}

TEST(HttpServerTest, ExpectContinueGetsAnInterimResponseBeforeTheBody) {
  auto server = StartOrDie(Echo);
  ASSERT_NE(server, nullptr);
  HttpConnection c(server->port());
  ASSERT_TRUE(c.SendRaw("POST /e HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n"));
  // The interim response comes before any of the body is sent.
  bool ok = false;
  EXPECT_EQ(c.ReadLine(10, &ok), "HTTP/1.1 100 Continue");
  EXPECT_EQ(c.ReadLine(10, &ok), "");
  ASSERT_TRUE(ok);
  ASSERT_TRUE(c.SendRaw("body"));
  HttpResult r = c.Read(10);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "POST /e?||body");
}

TEST(HttpServerTest, MalformedAndOversizedRequestsGetTheirStatusAndTheServerGoesOn) {
  HttpServerOptions o;
  o.max_body_bytes = 1000;
  Told told;
  told.Into(o);
  auto server = StartOrDie(Echo, o);
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  auto raw = [&](const std::string& bytes) { return StatusOfRaw(port, bytes); };
  EXPECT_EQ(raw("GARBAGE\r\n\r\n"), 400);
  EXPECT_EQ(raw("GET nopath HTTP/1.1\r\nHost: t\r\n\r\n"), 400);
  EXPECT_EQ(raw("GET / HTTP/2.0\r\n\r\n"), 505);
  EXPECT_EQ(raw("GET / HTTP/1.1\r\nHost: t\r\nno colon here\r\n\r\n"), 400);
  EXPECT_EQ(raw("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1001\r\n\r\n"), 413);
  EXPECT_EQ(raw("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: many\r\n\r\n"), 400);
  EXPECT_EQ(raw("GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + std::string(70 << 10, 'a') + "\r\n\r\n"),
            431);
  EXPECT_EQ(raw("GET / HTTP/1.1\r\n\r\n"), 400);  // HTTP/1.1 without Host
  EXPECT_EQ(raw("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
  EXPECT_EQ(told.refused(HttpTransportRefusal::kBadRequest), 9);  // each told
  // Still serving.
  EXPECT_EQ(HttpCall(port, "GET", "/ok").body, "GET /ok?||");
}

TEST(HttpServerTest, AWaitingHandlerSeesItsClientVanish) {
  std::atomic<int> gone{-1};  // -1 running, 0 timed out, 1 saw it
  auto server = StartOrDie([&](const HttpRequest&, HttpResponder& out) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < until) {
      if (out.ClientGone()) {
        gone = 1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    gone = 0;
    out.Send(200, "text/plain", "late");
  });
  ASSERT_NE(server, nullptr);
  {
    HttpConnection c(server->port());
    ASSERT_TRUE(c.SendRaw("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n"));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(gone.load(), -1);  // a client that is there is not gone
  }  // closes
  for (int i = 0; i < 100 && gone.load() < 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(gone.load(), 1);
  for (int i = 0; i < 100 && server->connections() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(server->connections(), 0);  // its thread ended
}

TEST(HttpServerTest, AClientWithItsNextRequestQueuedIsNotGone) {
  std::atomic<int> seen{-1};
  auto server = StartOrDie([&](const HttpRequest& req, HttpResponder& out) {
    if (req.path == "/first") {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      seen = out.ClientGone() ? 1 : 0;
    }
    out.Send(200, "text/plain", req.path);
  });
  ASSERT_NE(server, nullptr);
  HttpConnection c(server->port());
  ASSERT_TRUE(c.SendRaw("GET /first HTTP/1.1\r\nHost: t\r\n\r\nGET /second HTTP/1.1\r\nHost: t\r\n\r\n"));
  EXPECT_EQ(c.Read(10).body, "/first");
  EXPECT_EQ(c.Read(10).body, "/second");
  EXPECT_EQ(seen.load(), 0);
}

TEST(HttpServerTest, ConnectionsBeyondTheLimitGet503) {
  HttpServerOptions o;
  o.max_connections = 2;
  Told told;
  told.Into(o);
  auto server = StartOrDie(Echo, o);
  ASSERT_NE(server, nullptr);
  HttpConnection a(server->port()), b(server->port());
  ASSERT_TRUE(a.SendRaw("GET /a HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(b.SendRaw("GET /b HTTP/1.1\r\nHost: t\r\n\r\n"));
  EXPECT_EQ(a.Read(10).status, 200);
  EXPECT_EQ(b.Read(10).status, 200);
  HttpConnection c(server->port());
  ASSERT_TRUE(c.SendRaw("GET /c HTTP/1.1\r\nHost: t\r\n\r\n"));
  HttpResult refused = c.Read(10);
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.headers["retry-after"], "1");
  // Told: two open (the refused one was never counted), one refusal for connections.
  EXPECT_EQ(told.open(), (std::vector<int>{1, 2}));
  EXPECT_EQ(told.refused(HttpTransportRefusal::kConnections), 1);
  a.Close();
  for (int i = 0; i < 100 && server->connections() > 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(told.open().back(), 1);
  EXPECT_EQ(HttpCall(server->port(), "GET", "/d").status, 200);
  // A client that writes its head, then its body (Python's http.client does): the 503 went
  // out and the socket closed with the head unread, so the body's write met a reset and the
  // client a broken pipe, or a reset before it read the 503. The refused request is read and
  // dropped now while the 503 waits to be read.
  for (int i = 0; i < 100 && server->connections() > 1; ++i) {  // /d's thread has left
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  HttpConnection filler(server->port());  // full again: b and this one
  ASSERT_TRUE(filler.SendRaw("GET /f HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_EQ(filler.Read(10).status, 200);
  for (int i = 0; i < 5; ++i) {
    HttpConnection late(server->port());
    ASSERT_TRUE(late.SendRaw("POST /e HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n"));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(late.SendRaw("hello")) << "try " << i << ": reset (closed with the head unread)";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const HttpResult r = late.Read(5);
    EXPECT_EQ(r.status, 503) << "try " << i;
  }
  EXPECT_EQ(told.refused(HttpTransportRefusal::kConnections), 6);
  EXPECT_EQ(told.refused(HttpTransportRefusal::kRequestBytes), 0);
  server.reset();  // every connection closes: the last count told is 0
  EXPECT_EQ(told.open().back(), 0);
}

// A connection that has sent part of a request and stalls makes room as an idle one does,
// once it has waited 5 s for more bytes with more than half the connections open: a client
// that sent one header line and stopped held its thread for the whole 30 s, and 512 of them
// locked the API. Below half, it keeps its 30 s; a request still arriving is not cut.
TEST(HttpServerTest, AStalledRequestMakesRoomWhenTheServerFills) {
  HttpServerOptions o;
  o.max_connections = 4;
  auto server = StartOrDie(Echo, o);
  ASSERT_NE(server, nullptr);
  std::vector<std::unique_ptr<HttpConnection>> stalled;
  for (int i = 0; i < 2; ++i) {  // a head, or a body, begun and never finished
    stalled.push_back(std::make_unique<HttpConnection>(server->port()));
    ASSERT_TRUE(stalled.back()->SendRaw(i == 1 ? "POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: 9\r\n\r\nabc"
                                               : "POST /p HTTP/1.1\r\nHost: x\r\n"));
  }
  // And a body still arriving, a byte every 0.5 s for 9 s: slow, not stalled.
  HttpConnection slow(server->port());
  ASSERT_TRUE(slow.SendRaw("POST /slow HTTP/1.1\r\nHost: t\r\nContent-Length: 18\r\n\r\n"));
  std::thread trickle([&] {
    for (int i = 0; i < 18; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      if (!slow.SendRaw(std::string(1, char('a' + i)))) return;
    }
  });
  for (int i = 0; i < 250 && server->connections() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(server->connections(), 3);
  const auto t0 = std::chrono::steady_clock::now();
  while (server->connections() > 2 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(15)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(server->connections(), 2);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "not io_timeout_ms";
  // At half, the two left keep waiting; the slow one was not the one cut.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(server->connections(), 2);
  trickle.join();
  const HttpResult r = slow.Read(10);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "POST /slow?||abcdefghijklmnopqr");
  EXPECT_EQ(HttpCall(server->port(), "GET", "/b").status, 200);
}

// Threads of this process now.
int ThreadCount() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// Threads go to requests being answered, not to connections: idle keep-alive connections and
// requests still arriving hold none (each held one, so a few hundred slow clients meant as many
// threads, and the connection cap was a thread cap). All of them are served when they go on.
TEST(HttpServerTest, IdleAndArrivingConnectionsHoldNoThread) {
  HttpServerOptions o;
  o.max_connections = 1000;
  auto server = StartOrDie(Echo, o);
  ASSERT_NE(server, nullptr);
  const int threads_before = ThreadCount();
  constexpr int kEach = 150;
  std::vector<std::unique_ptr<HttpConnection>> idle, arriving;
  for (int i = 0; i < kEach; ++i) {
    idle.push_back(std::make_unique<HttpConnection>(server->port()));
    ASSERT_TRUE(idle.back()->SendRaw("GET /first HTTP/1.1\r\nHost: t\r\n\r\n"));
    ASSERT_EQ(idle.back()->Read(10).status, 200);
    arriving.push_back(std::make_unique<HttpConnection>(server->port()));
    ASSERT_TRUE(arriving.back()->SendRaw(i % 2 ? "POST /part HTTP/1.1\r\nHost: t\r\nX-Test: " + std::to_string(i)
                                               : "POST /part HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nab"));
  }
  for (int i = 0; i < 250 && server->connections() < 2 * kEach; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(server->connections(), 2 * kEach);
  // The requests answered so far have let their threads go (detached: give them a moment).
  int threads = ThreadCount();
  for (int i = 0; i < 100 && threads > threads_before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    threads = ThreadCount();
  }
  EXPECT_LE(threads, threads_before) << 2 * kEach << " connections open";
  for (int i = 0; i < kEach; ++i) {
    ASSERT_TRUE(arriving[i]->SendRaw(i % 2 ? "\r\nContent-Length: 2\r\n\r\nok" : "cd"));
    HttpResult r = arriving[i]->Read(10);
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, i % 2 ? "POST /part?|" + std::to_string(i) + "|ok" : "POST /part?||abcd");
    ASSERT_TRUE(idle[i]->SendRaw("GET /again HTTP/1.1\r\nHost: t\r\n\r\n"));
    EXPECT_EQ(idle[i]->Read(10).body, "GET /again?||");
  }
}

// A connection whose handler is done with it (Connection: close) while the client has sent
// more (pipelined requests the server will not answer) is shut for writing and drained before
// it closes: closed with those bytes unread, the socket sent a reset, and the client lost the
// part of the response still on its way.
TEST(HttpServerTest, AClosingConnectionWithUnreadBytesDeliversItsResponseWhole) {
  const std::string big(4 << 20, 'x');
  auto server = StartOrDie([&](const HttpRequest&, HttpResponder& out) {
    out.Send(200, "text/plain", big);
  });
  ASSERT_NE(server, nullptr);
  std::string more;
  while (more.size() < (256 << 10)) more += "GET /never HTTP/1.1\r\nHost: t\r\n\r\n";
  HttpConnection c(server->port());
  ASSERT_TRUE(c.SendRaw("GET /big HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n" + more));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const HttpResult r = c.Read(10);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body.size(), big.size());
  EXPECT_TRUE(c.ClosedByServer());
}

// The request bytes the loop holds across connections are bounded: the read that passes the
// bound gets its connection 503, and the requests within it go on. (Each connection could hold
// a whole body: 4096 connections of 8 MiB were 32 GiB.)
TEST(HttpServerTest, RequestBytesHeldAtOnceAreBounded) {
  HttpServerOptions o;
  o.max_body_bytes = 1 << 20;
  o.max_buffered_bytes = 3 << 19;  // 1.5 MiB
  Told told;
  told.Into(o);
  auto server = StartOrDie([](const HttpRequest& req, HttpResponder& out) {
    out.Send(200, "text/plain", std::to_string(req.body.size()));
  }, o);
  ASSERT_NE(server, nullptr);
  const std::string head = "POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: 1048576\r\n\r\n";
  const std::string part(800 << 10, 'a');
  HttpConnection a(server->port()), b(server->port());
  ASSERT_TRUE(a.SendRaw(head + part));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(b.SendRaw(head + part));
  HttpResult refused = b.Read(10);
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.headers["retry-after"], "1");
  EXPECT_EQ(told.refused(HttpTransportRefusal::kRequestBytes), 1);
  EXPECT_EQ(told.refused(HttpTransportRefusal::kConnections), 0);
  ASSERT_TRUE(a.SendRaw(std::string((1 << 20) - part.size(), 'a')));
  const HttpResult whole = a.Read(10);
  EXPECT_EQ(whole.status, 200);
  EXPECT_EQ(whole.body, "1048576");
}

TEST(HttpServerTest, StopEndsIdleConnectionsPromptly) {
  auto server = StartOrDie(Echo);
  ASSERT_NE(server, nullptr);
  HttpConnection idle(server->port());
  ASSERT_TRUE(idle.SendRaw("GET /a HTTP/1.1\r\nHost: t\r\n\r\n"));
  EXPECT_EQ(idle.Read(10).status, 200);
  ASSERT_EQ(server->connections(), 1);
  const auto t0 = std::chrono::steady_clock::now();
  server->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_EQ(server->connections(), 0);
  EXPECT_TRUE(idle.ClosedByServer());
  EXPECT_FALSE(HttpConnection(server->port()).connected());
}

TEST(HttpServerTest, SlowAndIdleClientsAreClosedOnTime) {
  HttpServerOptions o;
  o.idle_timeout_ms = 400;
  o.io_timeout_ms = 400;
  auto server = StartOrDie(Echo, o);
  ASSERT_NE(server, nullptr);
  // A request trickling in a byte at a time is cut off at the request deadline, not per read.
  HttpConnection slow(server->port());
  const std::string head = "GET /slow HTTP/1.1\r\nHost: t\r\nX-Test: 1\r\n\r\n";
  const auto t0 = std::chrono::steady_clock::now();
  bool cut = false;
  for (char ch : head) {
    if (!slow.SendRaw(std::string(1, ch))) {
      cut = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (slow.ClosedByServer(0)) {
      cut = true;
      break;
    }
  }
  EXPECT_TRUE(cut);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500));
  // A keep-alive connection with nothing to say is closed after the idle timeout.
  HttpConnection idle(server->port());
  ASSERT_TRUE(idle.SendRaw("GET /a HTTP/1.1\r\nHost: t\r\n\r\n"));
  EXPECT_EQ(idle.Read(5).status, 200);
  EXPECT_TRUE(idle.ClosedByServer(3));
}

TEST(HttpServerTest, StopWaitsForRunningHandlersAndCutsOffStuckOnes) {
  std::atomic<int> polite{0}, stuck{0};
  auto server = StartOrDie([&](const HttpRequest& req, HttpResponder& out) {
    if (req.path == "/polite") {  // ends when it sees the stop
      ++polite;
      while (!out.stopping()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      out.Send(503, "text/plain", "stopping");
      return;
    }
    ++stuck;  // ignores the stop; only its client vanishing ends it
    while (!out.ClientGone()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  });
  ASSERT_NE(server, nullptr);
  HttpConnection a(server->port()), b(server->port());
  ASSERT_TRUE(a.SendRaw("GET /polite HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(b.SendRaw("GET /stuck HTTP/1.1\r\nHost: t\r\n\r\n"));
  for (int i = 0; i < 100 && (polite.load() == 0 || stuck.load() == 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(polite.load(), 1);
  ASSERT_EQ(stuck.load(), 1);
  const auto t0 = std::chrono::steady_clock::now();
  server->Stop();  // the polite one answers; after 5 s the stuck one's socket is shut down
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, std::chrono::seconds(4));
  EXPECT_LT(took, std::chrono::seconds(8));
  EXPECT_EQ(server->connections(), 0);
  HttpResult answered = a.Read(5);
  EXPECT_EQ(answered.status, 503);
  EXPECT_EQ(answered.headers["connection"], "close");
  EXPECT_TRUE(b.ClosedByServer());
  server.reset();  // and the server is destroyed with no thread left behind
}

TEST(HttpServerTest, IdleConnectionsMakeRoomWhenTheServerFills) {
  HttpServerOptions o;
  o.max_connections = 4;
  o.idle_timeout_ms = 60'000;
  auto server = StartOrDie(Echo, o);
  ASSERT_NE(server, nullptr);
  std::vector<std::unique_ptr<HttpConnection>> idle;
  for (int i = 0; i < 4; ++i) {  // the server is full of idle keep-alive connections
    idle.push_back(std::make_unique<HttpConnection>(server->port()));
    ASSERT_TRUE(idle.back()->SendRaw("GET /a HTTP/1.1\r\nHost: t\r\n\r\n"));
    EXPECT_EQ(idle.back()->Read(5).status, 200);
  }
  EXPECT_EQ(HttpCall(server->port(), "GET", "/full").status, 503);
  // Over half full, an idle connection gets 5 s, not 60: they close until half are left.
  const auto t0 = std::chrono::steady_clock::now();
  while (server->connections() > 2 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(9)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(server->connections(), 2);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
  EXPECT_EQ(HttpCall(server->port(), "GET", "/b").status, 200);
}

// CPU seconds this process has used.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

TEST(HttpServerTest, OutOfDescriptorsTheAcceptLoopWaitsInsteadOfSpinning) {
  auto server = StartOrDie(Echo);
  ASSERT_NE(server, nullptr);
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  // The lowest free descriptor + 1: the client's socket takes the last one, so the server's
  // accept fails with EMFILE while the connection waits in the backlog.
  const int probe = ::dup(0);
  ASSERT_GE(probe, 0);
  ::close(probe);
  rlimit tight = saved;
  tight.rlim_cur = static_cast<rlim_t>(probe + 1);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  HttpConnection c(server->port());
  const bool connected = c.connected() && c.SendRaw("GET /late HTTP/1.1\r\nHost: t\r\n\r\n");
  const double cpu0 = CpuSeconds();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double cpu = CpuSeconds() - cpu0;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_TRUE(connected);
  EXPECT_LT(cpu, 0.1) << "the accept loop spun on EMFILE";  // waiting: about 1 ms
  // Descriptors again: the waiting connection is served.
  EXPECT_EQ(c.Read(10).body, "GET /late?||");
}

TEST(HttpServerTest, AHandlerThatSendsNothingYields500) {
  auto server = StartOrDie([](const HttpRequest&, HttpResponder&) {});
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(HttpCall(server->port(), "GET", "/").status, 500);
}

TEST(HttpServerTest, AnAddressInUseIsAnError) {
  auto first = StartOrDie(Echo);
  ASSERT_NE(first, nullptr);
  auto second = HttpServer::Start("127.0.0.1", first->port(), Echo);
  EXPECT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(HttpServer::Start("no.such.host.invalid", 0, Echo).ok());
}

}  // namespace
}  // namespace thetaserve::server
