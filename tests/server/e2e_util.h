// What the end-to-end tests share: a streamed Generate call collected whole, request builders,
// running the `thetaserve` binary, and a server shared by one test suite.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/server/server_process.h"
#include "thetaserve/v1/generation.grpc.pb.h"

namespace thetaserve::testing {

struct StreamResult {
  std::string text;
  std::vector<uint32_t> ids;
  v1::Complete complete;
  grpc::Status status;
  int chunks = 0;
};

// One Generate stream read to its end (with a deadline of `timeout_s`).
StreamResult Generate(v1::Generation::Stub& stub, const v1::GenerateRequest& req,
                      double timeout_s = 300, const std::string& api_key = "");

// A prompt with greedy (or `temperature`) sampling and max_tokens.
v1::GenerateRequest Prompt(const std::string& text, int max_tokens, float temperature = 0);

// The Tokenize RPC's answer to `req`. A failed call fails the test (and answers empty).
v1::TokenizeResponse TokenizeRpc(v1::Generation::Stub& stub, const v1::TokenizeRequest& req);

// The ids the Tokenize RPC gives for `text` (add_special_tokens unset: the server's default).
std::vector<uint32_t> TokenIds(v1::Generation::Stub& stub, const std::string& text,
                               std::optional<bool> add_special_tokens = std::nullopt);
std::vector<uint32_t> TokenIds(const v1::TokenizeResponse& response);

// Runs a shell command; returns its stdout and, through `rc`, pclose's status.
std::string RunCommand(const std::string& cmd, int* rc = nullptr);

// `thetaserve generate` on the default model with `args`: its stdout (the text and a newline).
std::string RunGenerateBinary(const std::string& args);

// One server for the whole suite: 32 sequences, a 256 MiB KV cache.
class ServerE2ETest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--max-num-seqs", "32", "--kv-cache-memory", "256M"}, 180,
                                /*report_failure=*/false);
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  inline static ServerProcess* server_ = nullptr;
};

}  // namespace thetaserve::testing
