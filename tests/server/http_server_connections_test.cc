// The HTTP/1.1 server's connections, over real loopback sockets: a vanished client seen by a
// waiting handler, the connection cap and the bound on request bytes held, stalled, slow and
// idle clients closed on time, threads for requests and not for connections, Stop, running out
// of descriptors, and an address in use.
#include "server/http_server.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
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
