// The OpenAI-compatible HTTP front end (`thetaserve serve --http-port N`):
//   POST /v1/completions, POST /v1/chat/completions   JSON, or server-sent events with
//                                                      "stream": true
//   GET  /v1/models, /v1/models/{id}                   the served model
//   GET  /health                                       200 when serving, 503 otherwise
// Requests go to the same engine as gRPC's, through the same validation (BuildRequest), request
// ids (Abort over gRPC finds them), metrics and API key. A client that disconnects — while
// streaming or while waiting for a whole completion — cancels its request; its pages are freed
// at the next step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model.h"
#include "server/generation_service.h"
#include "server/openai_body.h"
#include "server/http_server.h"

namespace thetaserve::server {

struct OpenAiHttpOptions {
  std::string host = "0.0.0.0";
  int port = 0;                   // 0: any free port (tests)
  std::string served_model_name;  // the `model` clients send, responses carry, /v1/models lists
  std::vector<std::string> served_model_aliases;  // other names clients may send (listed too)
  std::string api_key;            // empty: no authentication
  int max_connections = 4096;     // open at once (--max-http-connections); more get 503
  // Origins a browser page may call from (CORS): "*" for any, as vLLM's default; empty: none.
  std::vector<std::string> allowed_origins = {"*"};
  // How long a stream's head (200) waits for its first event (--stream-head-timeout): a
  // request that fails before it gets its HTTP status. 0: sent at once, as vLLM sends it.
  double stream_head_timeout_s = 15;
};

class OpenAiHttpServer {
 public:
  static absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> Start(GenerationService& service,
                                                                 const model::Model& model,
                                                                 OpenAiHttpOptions options);
  // Stops accepting and ends every connection. Call after the engine stopped (its requests have
  // finished, so no handler waits on it).
  void Stop() { http_->Stop(); }
  int port() const { return http_->port(); }

 private:
  OpenAiHttpServer(GenerationService& service, const model::Model& model,
                   OpenAiHttpOptions options);
  // Handle, counted in the metrics by route and status.
  void Serve(const HttpRequest& req, HttpResponder& out);
  void Handle(const HttpRequest& req, HttpResponder& out);
  void Generate(const HttpRequest& req, HttpResponder& out, bool chat);
  void Models(const HttpRequest& req, HttpResponder& out);
  // vLLM's /tokenize and /detokenize.
  void Tokenize(const HttpRequest& req, HttpResponder& out);
  void Detokenize(const HttpRequest& req, HttpResponder& out);
  bool Authorized(const HttpRequest& req, HttpResponder& out);

  GenerationService* service_;
  const model::Model* model_;
  OpenAiHttpOptions options_;
  ServedModel served_;  // options_'s name and aliases
  int64_t created_;  // unix seconds at start, for /v1/models
  std::unique_ptr<HttpServer> http_;
};

}  // namespace thetaserve::server
