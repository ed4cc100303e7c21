// The gRPC Generation service on the callback API. Each Generate call is a ServerWriteReactor
// fed by a StreamSink the engine pushes into; reactions never block.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "model/model.h"
#include "scheduler/engine.h"
#include "server/metrics.h"
#include "server/service_sink.h"
#include "thetaserve/v1/generation.grpc.pb.h"

namespace thetaserve::server {

struct ServiceOptions {
  std::string api_key;      // empty: no authentication
  std::string theta_mode = "dense";
  std::string kv_policy = "full";
  std::string kv_cache_dtype = "f32";
  std::string matmul_activations = "int8";  // Backend::matmul_activations
  std::string calibration_fingerprint;
  bool log_requests = false;  // a line per finished request on stderr (RequestLogLine)
};

// Generate is registered raw (ByteBuffer in and out) so that a request protobuf cannot parse —
// proto3 strings that are not UTF-8 — is answered INVALID_ARGUMENT instead of gRPC's generic
// failure; everything else goes through the typed handlers.
using GenerationBase = v1::Generation::WithRawCallbackMethod_Generate<v1::Generation::CallbackService>;

class GenerationService final : public GenerationBase {
 public:
  GenerationService(scheduler::Engine& engine, const model::Model& model,
                    const std::string& backend_name, Metrics* metrics, ServiceOptions options);

  // Generate answers UNAVAILABLE until the server is ready (loaded and warmed up).
  void SetReady(bool ready) { ready_.store(ready); }
  bool ready() const { return ready_.load(); }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* raw) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx,
                                  const v1::AbortRequest* request,
                                  v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* GetServerStatus(grpc::CallbackServerContext* ctx,
                                            const v1::GetServerStatusRequest* request,
                                            v1::ServerStatus* response) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;

  // Submits `n` completions of `req` (a checked request with its id set; n <= 1: one) to the
  // engine, completion i reporting to make_sink(i, its request id); SplitChoices says how a
  // group is formed. Tracks req.id until the last completion finishes, and the completions'
  // own ids. Errors: ALREADY_EXISTS for an id in flight, and Engine::SubmitAll's. Thread-safe.
  using SinkFactory =
      std::function<std::shared_ptr<ServiceSink>(int index, const std::string& request_id)>;
  absl::Status SubmitChoices(scheduler::Request req, int n, const SinkFactory& make_sink);
  // What SubmitPrompts does when the call's id, or one it makes of it, is in flight.
  enum class TakenId {
    kRefuse,  // ALREADY_EXISTS
    kSuffix,  // the call goes on as `<id>-<8 random hex digits>`
  };
  // The same for a call of several prompts (checked requests; their ids are set here): prompt
  // p is request `*id`-p (its completions `*id`-p/<i>), completion i of prompt p reports to
  // make_sink(p * n + i, …), and all are queued or none. `*id` names the call, for Abort and
  // Engine::Cancel, until the last completion finishes (with TakenId::kSuffix it is set to the
  // name taken); a completion that fails cancels the call. One prompt is SubmitChoices (its
  // request takes the id). When the engine refuses one prompt for itself (Engine::SubmitAll's
  // `refused`), `refused_prompt` (if given) is set to p.
  absl::Status SubmitPrompts(std::string* id, std::vector<scheduler::Request> prompts, int n,
                             const SinkFactory& make_sink, TakenId taken = TakenId::kRefuse,
                             int* refused_prompt = nullptr);
  // Request ids in flight (Abort's "found", duplicate detection). Thread-safe.
  void Untrack(const std::string& id);

  scheduler::Engine& engine() { return *engine_; }
  Metrics* metrics() { return metrics_; }
  const ServiceOptions& options() const { return options_; }

 private:
  grpc::Status CheckAuth(grpc::CallbackServerContext* ctx) const;
  // Adds all of `ids` to the ids in flight, or none when one of them already is: then returns
  // that one.
  std::optional<std::string> Track(const std::vector<std::string>& ids);
  // Tracks the ids a call named `id` of `prompts` prompts, n completions each, takes
  // (SplitChoices' names: the call's for several prompts, each prompt's — its group's for
  // n > 1, else its one completion's — and each completion's for n > 1) and returns them, or
  // the error naming the one in flight.
  absl::StatusOr<std::vector<std::string>> TrackCall(const std::string& id, size_t prompts, int n);

  scheduler::Engine* engine_;
  const model::Model* model_;
  std::string backend_name_;
  Metrics* metrics_;
  ServiceOptions options_;
  std::atomic<bool> ready_{false};
  std::atomic<uint64_t> next_id_{1};
  std::mutex mu_;
  std::set<std::string> active_;  // guarded by mu_
};

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace thetaserve::server
