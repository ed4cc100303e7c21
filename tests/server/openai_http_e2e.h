// The OpenAI HTTP API's end-to-end tests' shared parts (openai_http_*_test.cc): one server
// of the real binary with SmolLM2 for a suite (OpenAiHttpTest), raw HTTP requests and streams
// taken apart, and the gRPC API's text beside them.
#pragma once

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/server/e2e_util.h"
#include "tests/server/http_client.h"
#include "tests/server/server_process.h"

namespace thetaserve::testing {

using Json = nlohmann::json;
inline constexpr char kModelName[] = "SmolLM2-135M-Instruct.Q4_1";

inline std::string GrpcText(v1::Generation::Stub& stub, const v1::GenerateRequest& req,
                     v1::Complete* complete = nullptr) {
  grpc::ClientContext ctx;
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse resp;
  std::string text;
  while (reader->Read(&resp)) {
    if (resp.has_chunk()) text += resp.chunk().text();
    if (resp.has_complete() && complete) *complete = resp.complete();
  }
  EXPECT_TRUE(reader->Finish().ok());
  return text;
}

inline std::string RequestHead(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Sends a streaming request on `c` and reads the response's head (sent with the stream's first
// event, or after --stream-head-timeout).
inline HttpResult OpenStream(HttpConnection& c, const Json& body) {
  if (!c.SendRaw(RequestHead("/v1/completions", body.dump()))) return {};
  return c.ReadHead(60);
}

// A streamed response of n choices taken apart: each choice's text (a completion's `text`, a
// chat reply's delta content), how many of its chunks named the role and how many carried a
// finish reason, and the usage when it was sent. A chunk for a choice outside [0, n) or after
// its choice finished fails the test; so does a stream that does not end with [DONE].
struct StreamedChoices {
  std::vector<std::string> texts;
  std::vector<int> roles, finishes;
  Json usage;
};

inline StreamedChoices CollectChoices(const std::string& sse_body, int n) {
  StreamedChoices out{std::vector<std::string>(n), std::vector<int>(n, 0),
                      std::vector<int>(n, 0), Json()};
  const std::vector<std::string> events = SseData(sse_body);
  EXPECT_TRUE(!events.empty() && events.back() == "[DONE]") << sse_body;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const Json e = Json::parse(events[i]);
    if (e.contains("usage") && !e["usage"].is_null()) out.usage = e["usage"];
    for (const Json& c : e["choices"]) {
      const int index = c["index"];
      if (index < 0 || index >= n) {
        ADD_FAILURE() << "choice index " << index << " in " << events[i];
        continue;
      }
      EXPECT_EQ(out.finishes[index], 0) << "a chunk after choice " << index << " finished";
      if (c.contains("text")) out.texts[index] += c["text"].get<std::string>();
      if (c.contains("delta")) {
        const Json& delta = c["delta"];
        if (delta.contains("role")) ++out.roles[index];
        if (delta.contains("content") && delta["content"].is_string()) {
          out.texts[index] += delta["content"].get<std::string>();
        }
      }
      if (!c["finish_reason"].is_null()) ++out.finishes[index];
    }
  }
  return out;
}

class OpenAiHttpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    http_port_ = FreePort();
    // 128 MiB of KV cache (f16) holds ~5,800 tokens of one sequence, fewer than SmolLM2's
    // context: the chat default's clamp to the cache is tested.
    server_ = new ServerProcess({"--http-port", std::to_string(http_port_), "--max-num-seqs", "16",
                                 "--kv-cache-memory", "128M"}, 180, /*report_failure=*/false);
  }
  static void TearDownTestSuite() { delete server_; }

  static HttpResult Post(const std::string& path, const Json& body) {
    return HttpCall(http_port_, "POST", path, body.dump());
  }
  // A completions request again, streamed: each choice's text is the whole response's.
  static StreamedChoices StreamedAlike(Json body, const Json& whole) {
    body["stream"] = true;
    const HttpResult s = Post("/v1/completions", body);
    EXPECT_EQ(s.status, 200) << s.body;
    const int n = int(whole["choices"].size());
    StreamedChoices parts = CollectChoices(s.body, n);
    for (int i = 0; i < n; ++i) EXPECT_EQ(parts.texts[i], whole["choices"][i]["text"]) << i;
    return parts;
  }
  // A greedy chat of one user message, for the gRPC side.
  static v1::GenerateRequest GreedyChat(const std::string& content, uint32_t max_tokens) {
    v1::GenerateRequest req;
    v1::ChatMessage* m = req.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(content);
    req.mutable_stopping()->set_max_tokens(max_tokens);
    req.mutable_sampling()->set_temperature(0);
    return req;
  }
  static inline ServerProcess* server_ = nullptr;
  static inline int http_port_ = 0;
};

}  // namespace thetaserve::testing
