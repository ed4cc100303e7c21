// The HTTP/1.1 server under the OpenAI-compatible API, over real loopback sockets with raw
// requests: keep-alive and pipelining, HTTP/1.0, chunked responses and chunked request bodies,
// Expect: 100-continue, HEAD, compressed bodies, ambiguous framing, the limits and malformed
// input, and handlers that throw or send nothing.
#include "server/http_server.h"

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/server/http_client.h"
#include "tests/server/http_server_test_util.h"

namespace thetaserve::server {
namespace {

using testing::Echo;
using testing::HttpCall;
using testing::HttpConnection;
using testing::HttpResult;
using testing::StartOrDie;
using testing::Told;

// Sends raw bytes on a new connection; the status of the answer, after which the server must
// close the connection.
int StatusOfRaw(int port, const std::string& bytes) {
  HttpConnection c(port);
  c.SendRaw(bytes);
  HttpResult r = c.Read(10);
  EXPECT_TRUE(c.ClosedByServer()) << bytes.substr(0, 40);
  return r.status;
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

  // A body of one-byte chunks, read whole (each once shifted the whole buffer: quadratic).
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

// A HEAD's answer is the head alone, with the length the body would have had: a body after it
// was read by a keep-alive client as the start of its next response.
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

TEST(HttpServerTest, AHandlerThatSendsNothingYields500) {
  auto server = StartOrDie([](const HttpRequest&, HttpResponder&) {});
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(HttpCall(server->port(), "GET", "/").status, 500);
}

}  // namespace
}  // namespace thetaserve::server
