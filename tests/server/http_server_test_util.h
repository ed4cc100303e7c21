// What the HTTP server's tests share (http_server_*_test.cc): a handler that echoes what it
// parsed, a server started on a free loopback port, and what the server tells its options'
// callbacks.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "server/http_server.h"

namespace thetaserve::testing {

// Echoes what it parsed: "METHOD PATH?QUERY|x-test header|body".
inline void Echo(const server::HttpRequest& req, server::HttpResponder& out) {
  out.Send(200, "text/plain",
           req.method + " " + req.path + "?" + req.query + "|" + req.Header("x-test") + "|" + req.body,
           {{"X-Echo", "1"}});
}

// What a server tells its options' on_connections and on_refused (must outlive the server).
class Told {
 public:
  void Into(server::HttpServerOptions& o) {
    o.on_connections = [this](int n) {
      std::lock_guard<std::mutex> lock(mu_);
      open_.push_back(n);
    };
    o.on_refused = [this](server::HttpTransportRefusal why) {
      std::lock_guard<std::mutex> lock(mu_);
      ++refused_[static_cast<int>(why)];
    };
  }
  int refused(server::HttpTransportRefusal why) {
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
  int refused_[server::kHttpTransportRefusals] = {};
};

inline std::unique_ptr<server::HttpServer> StartOrDie(server::HttpHandler h,
                                                      server::HttpServerOptions o = {}) {
  auto s = server::HttpServer::Start("127.0.0.1", 0, std::move(h), o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

}  // namespace thetaserve::testing
